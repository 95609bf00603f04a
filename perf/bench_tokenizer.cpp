// bench_tokenizer: encode speed of model tokenizers next to the built-in GPT-2 tokenizer, on
// Austen's six novels (each novel one document, as `data prepare` encodes them), all measured
// in one run with the tokenizers interleaved, best of --reps, in thread CPU time (load time in
// wall time); prints bytes per CPU second and the ratio to
// the built-in gpt2. "cold": a fresh per-thread tokenizer (empty cache, as each prepare
// thread starts); "warm": the same tokenizer again (cache filled).
//   bench_tokenizer [--data-dir DIR] [--reps N] [TOKENIZER ...]
// Default tokenizers: gpt2 and DIR/tokenizers/{gpt2,llama3,mistral}/tokenizer.json (fetch-data).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "shardtrain/data/austen.h"
#include "shardtrain/data/paths.h"
#include "shardtrain/data/tokenizer.h"

using namespace shardtrain::data;

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
// This thread's CPU seconds: on a machine shared with other jobs, wall time mostly measures
// the scheduler; the encoding is single-threaded, so its CPU time is its cost.
double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
}  // namespace

int main(int argc, char** argv) {
  std::string data_dir = default_data_dir();
  int reps = 3;
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--data-dir") && i + 1 < argc) data_dir = argv[++i];
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else names.push_back(argv[i]);
  }
  if (names.empty()) {
    names.push_back("gpt2");
    for (const char* t : {"gpt2", "llama3", "mistral"}) {
      std::string p = data_dir + "/tokenizers/" + t + "/tokenizer.json";
      if (file_exists(p)) names.push_back(p);
      else std::fprintf(stderr, "bench_tokenizer: %s missing (scripts/fetch-data), skipped\n", p.c_str());
    }
  }
  const auto docs = read_austen(austen_rdx_path(data_dir));
  std::size_t bytes = 0;
  for (const auto& d : docs) bytes += d.text.size();

  struct Row {
    std::string name;
    std::unique_ptr<Tokenizer> tok;
    double load_s = 0, cold_s = 1e30, warm_s = 1e30;
    std::size_t ids = 0;
  };
  std::vector<Row> rows;
  for (const auto& n : names) {
    Row r;
    r.name = n;
    double t0 = now();
    r.tok = make_tokenizer(n, data_dir);
    r.load_s = now() - t0;
    rows.push_back(std::move(r));
  }
  std::vector<std::int32_t> ids;
  for (int rep = 0; rep < reps; ++rep)
    for (auto& r : rows) {
      auto t = r.tok->for_thread();
      for (int pass = 0; pass < 2; ++pass) {
        ids.clear();
        double t0 = cpu_now();
        for (const auto& d : docs) t->encode_append(d.text, ids);
        double s = cpu_now() - t0;
        (pass == 0 ? r.cold_s : r.warm_s) = std::min(pass == 0 ? r.cold_s : r.warm_s, s);
        r.ids = ids.size();
      }
    }
  std::printf("Austen, %zu documents, %.2f MB; best of %d, interleaved; MB per CPU second; ratio = that / built-in gpt2's\n\n",
              docs.size(), bytes / 1e6, reps);
  std::printf("| tokenizer | vocab | load s | ids | cold MB/s | warm MB/s | cold ratio | warm ratio |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
  const double base_cold = bytes / rows[0].cold_s, base_warm = bytes / rows[0].warm_s;
  for (const auto& r : rows) {
    std::string shown = r.name;
    if (shown.size() > 40) shown = "..." + shown.substr(shown.size() - 37);
    std::printf("| %s | %lld | %.2f | %zu | %.2f | %.2f | %.2f | %.2f |\n", shown.c_str(),
                static_cast<long long>(r.tok->vocab_size()), r.load_s, r.ids, bytes / r.cold_s / 1e6,
                bytes / r.warm_s / 1e6, bytes / r.cold_s / base_cold, bytes / r.warm_s / base_warm);
  }
  return 0;
}
