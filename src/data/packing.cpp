// RowWindows: whole rows in windows (first-fit decreasing, or one per window), and the packing
// statistics the commands report (packing.h).
#include "shardtrain/data/packing.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "shardtrain/util/choices.h"
#include "shardtrain/util/error.h"

namespace shardtrain::data {
namespace {

std::int64_t row_length(const TokenDataset& ds, std::int64_t i) { return ds.row_end(i) - ds.row(i).start; }

// Counted targets of a row keeping `kept` tokens: targets 0..kept-2 (token t+1), each counted
// iff its mask byte is 1.
std::int64_t row_targets(const TokenDataset& ds, std::int64_t start, std::int64_t kept) {
  if (kept < 2) return 0;
  return ds.masked() ? ds.counted(start + 1, kept - 1) : kept - 1;
}

std::string origin_text(const TokenDataset& ds, std::int64_t i) {
  const RowRecord r = ds.row(i);
  const auto& sources = ds.meta().sources;
  std::string where = r.source() < static_cast<std::int64_t>(sources.size()) ? sources[r.source()].name : "?";
  if (r.line() > 0) where += ":" + std::to_string(r.line());
  return where;
}

// The rows' length statistics (before truncation) and what truncation and prompts leave out.
PackingStats row_stats(const TokenDataset& ds, std::int64_t seq_len) {
  PackingStats st;
  st.rows = ds.row_count();
  std::vector<std::int64_t> lens(static_cast<std::size_t>(st.rows));
  for (std::int64_t i = 0; i < st.rows; ++i) {
    const std::int64_t len = row_length(ds, i), kept = std::min(len, seq_len);
    lens[i] = len;
    st.placed += kept;
    st.square_sum += static_cast<double>(kept) * static_cast<double>(kept);
    if (len > seq_len) {
      ++st.truncated_rows;
      st.dropped_tokens += len - seq_len;
    }
    if (row_targets(ds, ds.row(i).start, kept) == 0) ++st.untrained_rows;
  }
  if (!lens.empty()) {
    st.min_len = *std::min_element(lens.begin(), lens.end());
    st.max_len = *std::max_element(lens.begin(), lens.end());
    auto mid = lens.begin() + static_cast<std::ptrdiff_t>(lens.size() / 2);
    std::nth_element(lens.begin(), mid, lens.end());
    st.median_len = *mid;
  }
  return st;
}

// First-fit over windows of capacity T: a max-tree over the windows' free positions finds the
// first window with room for a row in O(log n).
class FirstFit {
 public:
  FirstFit(std::int64_t max_windows, std::int64_t seq_len) {
    while (leaves_ < max_windows) leaves_ *= 2;
    free_.assign(static_cast<std::size_t>(2 * leaves_), static_cast<std::int32_t>(seq_len));
  }
  // The first window with at least `len` free positions (one always exists: a window never
  // used has T), which then loses them.
  std::int64_t place(std::int64_t len) {
    std::int64_t node = 1;
    while (node < leaves_) node = free_[2 * node] >= len ? 2 * node : 2 * node + 1;
    free_[node] -= static_cast<std::int32_t>(len);
    for (std::int64_t p = node / 2; p >= 1; p /= 2) free_[p] = std::max(free_[2 * p], free_[2 * p + 1]);
    return node - leaves_;
  }

 private:
  std::int64_t leaves_ = 1;
  std::vector<std::int32_t> free_;
};

}  // namespace

static_assert(static_cast<int>(Packing::Padded) + 1 == choices::kPackings.size(), "Packing follows choices::kPackings");

const char* to_string(Packing p) { return choices::kPackings[static_cast<int>(p)]; }

Packing parse_packing(const std::string& name) { return choices::parse_choice<Packing>(choices::kPackings, name, "data.packing"); }

std::string PackingStats::line(std::int64_t seq_len, Packing mode) const {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s windows of %lld: %lld rows (tokens min %lld / median %lld / max %lld) in %lld windows, fill %.1f%% "
                "(padding %.1f%%)",
                to_string(mode), static_cast<long long>(seq_len), static_cast<long long>(rows),
                static_cast<long long>(min_len), static_cast<long long>(median_len), static_cast<long long>(max_len),
                static_cast<long long>(windows), 100.0 * fill(), 100.0 * (1.0 - fill()));
  std::string s = buf;
  if (truncated_rows > 0)
    s += "; " + std::to_string(truncated_rows) + " row(s) longer than " + std::to_string(seq_len) + " truncated (" +
         std::to_string(dropped_tokens) + " tokens dropped; data.overlong)";
  if (untrained_rows > 0)
    s += "; " + std::to_string(untrained_rows) + " row(s) with no counted target train nothing";
  return s;
}

RowWindows::RowWindows(const TokenDataset& ds, std::int64_t seq_len, Packing mode) {
  ST_CHECK(ds.has_rows() && mode != Packing::Stream && seq_len > 0, "RowWindows needs rows and packed / padded");
  stats_ = row_stats(ds, seq_len);
  const std::int64_t n = ds.row_count();
  std::vector<std::int64_t> window_of(static_cast<std::size_t>(n));
  std::int64_t windows = 0;
  if (mode == Packing::Padded) {
    std::iota(window_of.begin(), window_of.end(), 0);
    windows = n;
  } else {
    std::vector<std::int64_t> order(static_cast<std::size_t>(n)), kept(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) kept[i] = std::min(row_length(ds, i), seq_len);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return kept[a] > kept[b]; });
    FirstFit fit(std::max<std::int64_t>(n, 1), seq_len);
    for (std::int64_t i : order) {
      window_of[i] = fit.place(kept[i]);
      windows = std::max(windows, window_of[i] + 1);
    }
  }
  // Rows grouped by window, each window's rows in row order (a counting sort).
  begin_.assign(static_cast<std::size_t>(windows + 1), 0);
  for (std::int64_t i = 0; i < n; ++i) ++begin_[window_of[i] + 1];
  for (std::int64_t w = 0; w < windows; ++w) begin_[w + 1] += begin_[w];
  rows_.resize(static_cast<std::size_t>(n));
  std::vector<std::int64_t> next(begin_.begin(), begin_.end() - 1);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t start = ds.row(i).start;
    rows_[next[window_of[i]]++] = {i, start, std::min(ds.row_end(i) - start, seq_len)};
  }
  stats_.windows = windows;
  stats_.capacity = windows * seq_len;
}

PackingStats packing_stats(const TokenDataset& ds, std::int64_t seq_len, Packing mode) {
  if (mode != Packing::Stream) return RowWindows(ds, seq_len, mode).stats();
  PackingStats st = ds.has_rows() ? row_stats(ds, seq_len) : PackingStats{};
  // The stream cuts rows: it drops nothing, and no row is trained alone.
  st.truncated_rows = st.dropped_tokens = st.untrained_rows = 0;
  st.windows = seq_len > 0 && ds.size() > 0 ? (ds.size() - 1) / seq_len : 0;
  st.capacity = st.windows * seq_len;
  st.placed = st.capacity;
  st.square_sum = static_cast<double>(st.placed) * static_cast<double>(seq_len);
  return st;
}

std::string packing_report(const std::string& dir, const std::vector<std::int64_t>& seq_lens) {
  std::string out;
  for (const char* split : {"train", "val"}) {
    const TokenDataset ds(dir, split);
    if (!ds.has_rows()) return "";
    if (ds.row_count() == 0) continue;
    const PackingStats all = row_stats(ds, ds.size());
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s%s: %lld %s (tokens min %lld / median %lld / max %lld)", out.empty() ? "" : "\n",
                  split, static_cast<long long>(all.rows), ds.meta().row_kind.c_str(), static_cast<long long>(all.min_len),
                  static_cast<long long>(all.median_len), static_cast<long long>(all.max_len));
    out += buf;
    if (all.untrained_rows > 0) out += "; " + std::to_string(all.untrained_rows) + " with no counted target";
    for (std::int64_t T : seq_lens) {
      const PackingStats p = RowWindows(ds, T, Packing::Packed).stats();
      const double padded_fill = static_cast<double>(p.placed) / static_cast<double>(std::max<std::int64_t>(1, p.rows * T));
      std::snprintf(buf, sizeof buf, "\n  seq_len %5lld: packed %lld windows (fill %.1f%%), padded %lld (fill %.1f%%)",
                    static_cast<long long>(T), static_cast<long long>(p.windows), 100.0 * p.fill(),
                    static_cast<long long>(p.rows), 100.0 * padded_fill);
      out += buf;
      if (p.truncated_rows > 0)
        out += "; " + std::to_string(p.truncated_rows) + " row(s) truncated, " + std::to_string(p.dropped_tokens) +
               " tokens dropped";
    }
  }
  return out;
}

std::string first_overlong_row(const TokenDataset& ds, std::int64_t seq_len) {
  for (std::int64_t i = 0; i < ds.row_count(); ++i) {
    const std::int64_t len = row_length(ds, i);
    if (len > seq_len)
      return origin_text(ds, i) + " (row " + std::to_string(i) + " of " + ds.path() + ", " + std::to_string(len) +
             " tokens)";
  }
  return "";
}

}  // namespace shardtrain::data
