// choose_bf16_gemm: fsdp.bf16_gemm -> model::set_bf16_gemm, measured once per CPU model and
// cached (see bf16_choice.h).
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/train/bf16_choice.h"

#include <sys/stat.h>
#include <cerrno>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "shardtrain/util/cpu_isa.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/file_io.h"
#include "shardtrain/util/log.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/torch_compat.h"

namespace shardtrain::train {
namespace {
// The reference layer: the perf/ddp GPT-2's MLP projection (512 tokens, d 384 -> 1536), the
// shapes issue #15 measured the candidates at.
constexpr int64_t kTokens = 512, kIn = 384, kOut = 1536;
constexpr int kReps = 3;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool make_dirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i)
    if (i == dir.size() || dir[i] == '/') {
      const std::string p = dir.substr(0, i);
      if (mkdir(p.c_str(), 0755) != 0 && errno != EEXIST) return false;
    }
  return true;
}

// One cache line: key \t path \t native GFLOP/s \t fp32 GFLOP/s.
struct Entry {
  std::string key, path;
  double native = 0, fp32 = 0;
};

std::vector<Entry> read_cache(const std::string& file) {
  std::vector<Entry> out;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    Entry e;
    if (std::getline(s, e.key, '\t') && std::getline(s, e.path, '\t') && (s >> e.native >> e.fp32) &&
        (e.path == "bf16" || e.path == "fp32"))
      out.push_back(e);
  }
  return out;
}

// Rewrites the cache with `e` replacing its key's line: a temporary of this process, renamed.
bool write_cache(const std::string& file, const Entry& e) {
  const size_t slash = file.rfind('/');
  if (slash == std::string::npos || !make_dirs(file.substr(0, slash))) return false;
  std::vector<Entry> all = read_cache(file);
  std::ostringstream text;
  for (const Entry& o : all)
    if (o.key != e.key) text << o.key << '\t' << o.path << '\t' << o.native << '\t' << o.fp32 << '\n';
  text << e.key << '\t' << e.path << '\t' << e.native << '\t' << e.fp32 << '\n';
  const std::string tmp = file + ".tmp." + std::to_string(getpid());
  // A temporary of this process, created exclusively and renamed (util/file_io.h): a cache
  // directory shared with others cannot make this write through a planted link.
  try {
    const int fd = io::create_temp(tmp, "bf16 cache");
    const std::string t = text.str();
    const bool ok = ::write(fd, t.data(), t.size()) == static_cast<ssize_t>(t.size());
    if (::close(fd) != 0 || !ok) {
      std::remove(tmp.c_str());
      return false;
    }
    io::commit_temp(tmp, file, "bf16 cache");
  } catch (const Error&) {
    return false;
  }
  return true;
}
}  // namespace

std::string Bf16GemmChoice::line() const {
  char buf[256];
  std::string s = std::string("# bf16 GEMM: ") +
                  (path == model::Bf16Gemm::Native ? "libtorch bf16 (oneDNN)" : "fp32 GEMM on bf16 operands") + " (" +
                  how;
  if (native_gflops > 0 || fp32_gflops > 0) {
    std::snprintf(buf, sizeof buf, ": libtorch bf16 %.0f GFLOP/s, fp32 on bf16 operands %.0f GFLOP/s per rank", native_gflops,
                  fp32_gflops);
    s += buf;
  }
  if (!native_exact) s += "; libtorch's bf16 matmul does not accumulate in fp32 on this CPU";
  return s + ")";
}

std::string bf16_gemm_cache_key() {
  const CpuIsa& i = cpu_isa();
  std::string name = i.model_name;
  for (char& c : name)
    if (c == '\t' || c == '\n') c = ' ';
  return i.vendor + "/" + std::to_string(i.family) + "/" + std::to_string(i.model) + "/" + name + "/" + i.isa_name() +
         "/torch " + torch_compat::version();
}

std::string bf16_gemm_cache_file() {
  std::string dir = env("SHARDTRAIN_CACHE_DIR");
  if (dir.empty() && !env("XDG_CACHE_HOME").empty()) dir = env("XDG_CACHE_HOME") + "/shardtrain";
  if (dir.empty() && !env("HOME").empty()) dir = env("HOME") + "/.cache/shardtrain";
  return dir.empty() ? "" : dir + "/bf16-gemm.tsv";
}

Bf16GemmChoice choose_bf16_gemm(MPI_Comm world, const std::string& setting) {
  Bf16GemmChoice c;
  if (setting == "bf16" || setting == "fp32") {
    c.path = setting == "bf16" ? model::Bf16Gemm::Native : model::Bf16Gemm::Fp32Operands;
    c.how = "fsdp.bf16_gemm = \"" + setting + "\"";
    model::set_bf16_gemm(c.path);
    return c;
  }
  int rank = 0, size = 1;
  ST_MPI_CHECK(MPI_Comm_rank(world, &rank));
  ST_MPI_CHECK(MPI_Comm_size(world, &size));
  const std::string file = bf16_gemm_cache_file(), key = bf16_gemm_cache_key();
  // Rank 0's cache entry, if any, decides for everyone: [found, native, fp32].
  double got[3] = {0, 0, 0};
  if (rank == 0 && !file.empty())
    for (const Entry& e : read_cache(file))
      if (e.key == key) got[0] = 1, got[1] = e.native, got[2] = e.fp32;
  runtime::broadcast(world, got, 0, "setup.bf16_gemm");
  if (got[0] == 1) {
    c.how = "cached in " + file;
    c.native_gflops = got[1];
    c.fp32_gflops = got[2];
  } else {  // every rank measures (on its own cores), the mean decides
    std::vector<double> sum = {model::bf16_gemm_gflops(model::Bf16Gemm::Native, kTokens, kIn, kOut, kReps),
                               model::bf16_gemm_gflops(model::Bf16Gemm::Fp32Operands, kTokens, kIn, kOut, kReps)};
    runtime::sum(world, sum, "setup.bf16_gemm");
    c.native_gflops = sum[0] / size;
    c.fp32_gflops = sum[1] / size;
    c.how = "measured";
  }
  // libtorch's bf16 kernel is taken only where it accumulates in fp32 on every rank's CPU
  // (checked at each start: a small product, not cached): elsewhere it rounds partial sums to
  // bf16, a different and less accurate computation than the deck asks for.
  std::vector<double> exact = {model::bf16_native_accumulates_in_fp32() ? 1.0 : 0.0};
  runtime::sum(world, exact, "setup.bf16_gemm");
  c.native_exact = exact[0] == size;
  c.path = !c.native_exact || c.fp32_gflops >= kBf16Fp32Margin * c.native_gflops ? model::Bf16Gemm::Fp32Operands
                                                                                 : model::Bf16Gemm::Native;
  if (got[0] != 1 && rank == 0 && !file.empty()) {
    if (write_cache(file, Entry{key, model::to_string(c.path), c.native_gflops, c.fp32_gflops}))
      c.how += ", cached in " + file;
    else
      log::info("note: the bf16 GEMM measurement could not be cached in " + file + " (it is measured at every start)");
  }
  model::set_bf16_gemm(c.path);
  return c;
}

}  // namespace shardtrain::train
