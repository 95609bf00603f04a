// expand_corpus_sources / rank_ranges: which files a corpus is, and which bytes each rank takes.
#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include "shardtrain/data/austen.h"
#include "shardtrain/data/corpus.h"
#include "shardtrain/data/paths.h"
#include "shardtrain/util/error.h"

namespace shardtrain::data {
namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

CorpusSource file_source(const std::string& path, const std::string& given) {
  struct stat st {};
  ST_USER_CHECK(::stat(path.c_str(), &st) == 0, "data prepare: --source '", given, "': no such file or directory");
  ST_USER_CHECK(S_ISREG(st.st_mode), "data prepare: --source '", given, "': '", path,
                "' is not a regular file (a FIFO or device cannot be a corpus)");
  // Empty whatever its format (a 0-byte .jsonl beside good sources would otherwise be skipped
  // without a word): named, as an empty text source always was.
  ST_USER_CHECK(st.st_size > 0, "source '", path, "' is empty (0 bytes): nothing to tokenize");
  CorpusSource s;
  s.name = path;
  s.gzip = ends_with(path, ".gz");
  const std::string base = s.gzip ? path.substr(0, path.size() - 3) : path;
  s.format = ends_with(base, ".jsonl") || ends_with(base, ".ndjson") ? CorpusFormat::Jsonl : CorpusFormat::Text;
  s.bytes = static_cast<std::int64_t>(st.st_size);
  return s;
}

bool corpus_name(const fs::path& p) {
  std::string n = p.filename().string();
  if (n.empty() || n[0] == '.') return false;
  if (ends_with(n, ".gz")) n = n.substr(0, n.size() - 3);
  for (const char* e : {".txt", ".text", ".md", ".jsonl", ".ndjson"})
    if (ends_with(n, e)) return true;
  return false;
}

}  // namespace

std::vector<CorpusSource> expand_corpus_sources(const std::vector<std::string>& sources, const std::string& data_dir) {
  std::vector<CorpusSource> out;
  for (const std::string& src : sources) {
    ST_USER_CHECK(src != "mnist", "data prepare: mnist cannot be mixed with text sources");
    if (src == "austen") {
      for (auto& d : read_austen(austen_rdx_path(data_dir))) {
        CorpusSource s;
        s.name = d.name;  // as the novels were always named in meta.json
        s.in_memory = true;
        s.bytes = static_cast<std::int64_t>(d.text.size());
        s.text = std::move(d.text);
        out.push_back(std::move(s));
      }
      continue;
    }
    std::error_code ec;
    if (src.find_first_of("*?[") != std::string::npos && !fs::exists(src, ec)) {
      glob_t g{};
      const int rc = ::glob(src.c_str(), 0, nullptr, &g);
      std::vector<std::string> paths;
      if (rc == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
      ::globfree(&g);
      ST_USER_CHECK(rc == 0 || rc == GLOB_NOMATCH, "data prepare: --source '", src, "': the pattern cannot be read");
      ST_USER_CHECK(!paths.empty(), "data prepare: --source '", src, "': the pattern matches no file");
      std::sort(paths.begin(), paths.end());
      for (const auto& p : paths) {
        if (fs::is_directory(p, ec)) continue;
        out.push_back(file_source(p, src));
      }
      continue;
    }
    if (fs::is_directory(src, ec)) {
      std::vector<std::string> paths;
      for (auto it = fs::recursive_directory_iterator(src, fs::directory_options::skip_permission_denied, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (!name.empty() && name[0] == '.' && it->is_directory(ec)) {
          it.disable_recursion_pending();
          continue;
        }
        if (it->is_regular_file(ec) && corpus_name(it->path())) paths.push_back(it->path().string());
      }
      ST_USER_CHECK(!ec, "data prepare: --source '", src, "': cannot list the directory: ", ec.message());
      ST_USER_CHECK(!paths.empty(), "data prepare: --source '", src,
                    "': the directory holds no *.txt, *.text, *.md, *.jsonl or *.ndjson file (or .gz of one)");
      std::sort(paths.begin(), paths.end());
      for (const auto& p : paths) out.push_back(file_source(p, src));
      continue;
    }
    out.push_back(file_source(src, src));
  }
  ST_USER_CHECK(!out.empty(), "data prepare: no source documents to prepare");
  return out;
}

std::vector<SourceRange> rank_ranges(const std::vector<CorpusSource>& s, int rank, int size) {
  std::int64_t total = 0;
  for (const auto& x : s) total += std::max<std::int64_t>(x.bytes, 1);  // an empty file still has a place
  const auto cut = [&](int r) { return static_cast<std::int64_t>(static_cast<__int128>(total) * r / size); };
  const std::int64_t lo = cut(rank), hi = cut(rank + 1);
  std::vector<SourceRange> out;
  std::int64_t g = 0;
  for (int i = 0; i < static_cast<int>(s.size()); ++i) {
    const std::int64_t len = std::max<std::int64_t>(s[i].bytes, 1), g1 = g + len;
    if (s[i].splittable()) {
      const std::int64_t b = std::max(lo, g), e = std::min(hi, g1);
      if (b < e) out.push_back({i, b - g, e - g});
    } else if (g >= lo && g < hi) {
      out.push_back({i, 0, s[i].bytes});
    }
    g = g1;
  }
  return out;
}

}  // namespace shardtrain::data
