// How a token split becomes training windows (data.packing, docs/data.md "Rows whole and
// apart"): the token stream cut every T tokens, or whole rows (instruction rows, documents)
// placed into windows of T positions, each row computed as if alone. Torch-free: a window is a
// list of segments (its rows' token ranges); batch_tensors.h turns them into positions, targets
// and the attention's row boundaries.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/data/token_dataset.h"

namespace shardtrain::data {

enum class Packing { Stream, Packed, Padded };  // in the order of choices::kPackings
const char* to_string(Packing p);
// "stream" | "packed" | "padded" (UserError naming data.packing otherwise).
Packing parse_packing(const std::string& name);

struct PackingOptions {
  Packing mode = Packing::Stream;
  bool document_mask = false;  // stream: attention and positions restart at each document start
  bool truncate = true;        // data.overlong: a row keeps its first T tokens ("truncate"), or is an error
};

// A row as the packing places it: its first token in the split and the tokens it keeps (<= T).
struct PlacedRow {
  std::int64_t row = 0, start = 0, length = 0;
};

// The statistics data prepare, data info and train report (one split at one T).
struct PackingStats {
  std::int64_t rows = 0, windows = 0;
  std::int64_t placed = 0;        // tokens in the windows (rows after truncation)
  std::int64_t capacity = 0;      // windows x T
  std::int64_t truncated_rows = 0, dropped_tokens = 0;  // rows longer than T, and what they lose
  std::int64_t untrained_rows = 0;  // rows with no counted target (all prompt, or one token)
  std::int64_t min_len = 0, median_len = 0, max_len = 0;  // row lengths before truncation
  double square_sum = 0;  // the sum of the placed rows' squared lengths (their attention's work)
  // The attention length per placed token, sum L^2 / sum L (a stream window's: T).
  double attention_length() const { return placed > 0 ? square_sum / static_cast<double>(placed) : 0.0; }
  double fill() const { return capacity > 0 ? static_cast<double>(placed) / static_cast<double>(capacity) : 0.0; }
  std::string line(std::int64_t seq_len, Packing mode) const;  // one line for the console
};

// Whole rows of one split in windows of T positions, decided once (the same windows at any rank
// and thread count). packed: first-fit decreasing (rows by length, longest first, ties by row
// index; each into the first window with room); inside a window its rows in row order. padded:
// one row per window, in row order. Rows longer than T keep their first T tokens
// (data.overlong = "error" is sampler.h's check_packing, before any window is made).
class RowWindows {
 public:
  RowWindows(const TokenDataset& ds, std::int64_t seq_len, Packing mode);
  std::int64_t size() const { return static_cast<std::int64_t>(begin_.size()) - 1; }
  // The rows of window w, in order.
  const PlacedRow* rows_begin(std::int64_t w) const { return rows_.data() + begin_[w]; }
  const PlacedRow* rows_end(std::int64_t w) const { return rows_.data() + begin_[w + 1]; }
  const PackingStats& stats() const { return stats_; }

 private:
  std::vector<std::int64_t> begin_;  // window w's rows are rows_[begin_[w], begin_[w + 1])
  std::vector<PlacedRow> rows_;
  PackingStats stats_;
};

// Packing statistics of a split without keeping the windows (data prepare / data info).
PackingStats packing_stats(const TokenDataset& ds, std::int64_t seq_len, Packing mode);

// What data prepare and data info print of a dataset with rows: per split, the rows' lengths and
// how they pack (packed and padded fill, truncated rows) into windows of each of `seq_lens`.
// "" for a dataset without rows.
std::string packing_report(const std::string& dir, const std::vector<std::int64_t>& seq_lens);
inline const std::vector<std::int64_t> kReportSeqLens = {512, 1024, 2048, 4096};

// The first row whose length exceeds T, as "SOURCE:LINE (row R, N tokens)" ("" if none).
std::string first_overlong_row(const TokenDataset& ds, std::int64_t seq_len);

}  // namespace shardtrain::data
