// data_identity / data_identity_differences: see data_identity.h.
#include "shardtrain/data/identity.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "shardtrain/util/error.h"

namespace shardtrain::data {
namespace {

constexpr int64_t kSpan = int64_t{1} << 20;  // digest the first and the last MiB

uint64_t fnv1a(const unsigned char* p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

// Size and digest of one file, or nullopt-like {} when it cannot be read (then it is "missing").
nlohmann::json file_identity(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return nullptr;
  }
  const int64_t size = st.st_size;
  uint64_t h = 14695981039346656037ull;
  std::vector<unsigned char> buf(static_cast<size_t>(kSpan));
  // The first MiB, then the last MiB (the same bytes once when the file is at most 2 MiB).
  const int64_t second = std::max<int64_t>(std::min(kSpan, size), size - kSpan);
  for (int64_t start : {int64_t{0}, second}) {
    const int64_t want = std::min(kSpan, size - start);
    int64_t got = 0;
    while (got < want) {
      const ssize_t n = ::pread(fd, buf.data() + got, static_cast<size_t>(want - got), start + got);
      if (n <= 0) break;
      got += n;
    }
    h = fnv1a(buf.data(), static_cast<size_t>(got), h);
  }
  ::close(fd);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return {{"bytes", size}, {"digest", hex}};
}

}  // namespace

std::string data_identity(const std::string& dir, const std::string& windows) {
  namespace fs = std::filesystem;
  if (dir.empty()) return nlohmann::json{{"kind", "synthetic"}}.dump();
  nlohmann::json files = nlohmann::json::object();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    // The row boundaries decide packed windows: a run resumed on other rows would read other data.
    const auto ends = [&](const char* suffix) {
      const size_t n = std::char_traits<char>::length(suffix);
      return name.size() > n && name.compare(name.size() - n, n, suffix) == 0;
    };
    const bool wanted = ends(".bin") || ends(".json") || ends(".rows");
    if (!wanted || e.is_symlink(ec) || !e.is_regular_file(ec)) continue;
    nlohmann::json id = file_identity(e.path().string());
    if (!id.is_null()) files[name] = id;
  }
  nlohmann::json id = {{"kind", "files"}, {"files", files}};
  if (!windows.empty()) id["windows"] = windows;
  return id.dump();
}

std::string data_identity_differences(const std::string& saved_text, const std::string& now_text) {
  const nlohmann::json saved = nlohmann::json::parse(saved_text, nullptr, false);
  const nlohmann::json now = nlohmann::json::parse(now_text, nullptr, false);
  if (!saved.is_object() || !now.is_object()) return "the recorded data identity is not readable";
  const std::string ks = saved.value("kind", ""), kn = now.value("kind", "");
  if (ks != kn)
    return ks == "synthetic" ? "the checkpoint was trained on synthetic items, this run reads a dataset"
                             : "the checkpoint was trained on a dataset, this run uses synthetic items";
  if (ks != "files") return "";
  const nlohmann::json& a = saved.contains("files") ? saved["files"] : nlohmann::json::object();
  const nlohmann::json& b = now.contains("files") ? now["files"] : nlohmann::json::object();
  if (!a.is_object() || !b.is_object()) return "the recorded data identity is not readable";
  std::string out;
  auto add = [&](const std::string& s) { out += (out.empty() ? "" : "; ") + s; };
  for (const auto& [name, id] : a.items()) {
    if (!b.contains(name)) {
      add(name + ": missing now");
      continue;
    }
    const nlohmann::json& n = b[name];
    if (id.value("bytes", int64_t{-1}) != n.value("bytes", int64_t{-2}))
      add(name + ": " + std::to_string(id.value("bytes", int64_t{-1})) + " -> " +
          std::to_string(n.value("bytes", int64_t{-1})) + " bytes");
    else if (id.value("digest", std::string()) != n.value("digest", std::string()))
      add(name + ": content differs (same size)");
  }
  for (const auto& [name, id] : b.items())
    if (!a.contains(name)) add(name + ": new");
  // Other windows over the same files (data.packing changed): the cursor would index other data.
  if (saved.contains("windows") && now.contains("windows") && saved["windows"] != now["windows"])
    add("windows: " + saved["windows"].dump() + " -> " + now["windows"].dump());
  return out;
}

}  // namespace shardtrain::data
