// Rows whole and apart (data/packing.h): the row files of format version 3 and their checks,
// first-fit decreasing against a naive first-fit, truncation and data.overlong = "error", the
// windows' tokens, masks, positions, targets and cu_seqlens, the stream's document masks, and
// counted targets equal to what the batches count, at several world sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "shardtrain/data/batch_tensors.h"
#include "shardtrain/data/byte_tokenizer.h"
#include "shardtrain/data/identity.h"
#include "shardtrain/data/packing.h"
#include "shardtrain/data/sampler.h"
#include "shardtrain/util/error.h"

using namespace shardtrain;
using namespace shardtrain::data;
namespace fs = std::filesystem;

namespace {
struct TmpDir {
  fs::path p;
  TmpDir() {
    p = fs::temp_directory_path() / ("st_packing_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::create_directories(p);
  }
  ~TmpDir() { fs::remove_all(p); }
  std::string str() const { return p.string(); }
  static int& counter() {
    static int c = 0;
    return c;
  }
};

// A version-3 dataset whose rows are given: ids of row i are (i * 7 + t) % 200 + 1 (t its
// position), its mask 1 from position `prompt` on (no mask when prompt < 0). Rows of source 0,
// line i + 1. Val: the same rows.
void write_rows_dataset(const std::string& dir, const std::vector<std::int64_t>& lengths, std::int64_t prompt) {
  std::vector<std::int32_t> ids;
  std::vector<std::uint8_t> mask;
  std::vector<RowRecord> rows;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    rows.push_back({static_cast<std::int64_t>(ids.size()), RowRecord::make_origin(0, static_cast<std::int64_t>(i) + 1)});
    for (std::int64_t t = 0; t < lengths[i]; ++t) {
      ids.push_back(static_cast<std::int32_t>((i * 7 + t) % 200 + 1));
      mask.push_back(t >= prompt ? 1 : 0);
    }
  }
  TokenDatasetMeta m;
  m.tokenizer = "byte";
  m.vocab_size = 256;
  m.dtype = "uint16";
  m.train_tokens = m.val_tokens = static_cast<std::int64_t>(ids.size());
  m.rows = true;
  m.row_kind = "rows";
  m.train_rows = m.val_rows = static_cast<std::int64_t>(rows.size());
  m.sources.push_back({"rows.jsonl", 1, "0", m.train_tokens, m.val_tokens});
  if (prompt >= 0) {
    m.masked = true;
    m.chat_format = "plain";
    m.train_counted = m.val_counted = std::count(mask.begin(), mask.end(), std::uint8_t{1});
    for (const char* s : {"/train.mask", "/val.mask"}) write_mask(dir + s, mask);
  }
  for (const char* s : {"/train.bin", "/val.bin"}) write_ids(dir + s, ids, "uint16");
  for (const char* s : {"/train.rows", "/val.rows"}) write_rows(dir + s, rows);
  write_token_meta(dir, m);
}

SamplerConfig config(std::int64_t gb, int world = 1, int rank = 0, int micro = 1) {
  SamplerConfig c;
  c.global_batch = gb;
  c.world = world;
  c.rank = rank;
  c.micro_batches = micro;
  c.seed = 7;
  return c;
}

// Naive first-fit decreasing: each row (by length, longest first; ties by index) into the first
// window with room, scanning every window.
std::vector<std::vector<std::int64_t>> naive_ffd(const std::vector<std::int64_t>& len, std::int64_t T) {
  std::vector<std::int64_t> order(len.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::int64_t a, std::int64_t b) { return std::min(len[a], T) > std::min(len[b], T); });
  std::vector<std::int64_t> room;
  std::vector<std::vector<std::int64_t>> windows;
  for (std::int64_t i : order) {
    const std::int64_t l = std::min(len[i], T);
    std::size_t w = 0;
    while (w < room.size() && room[w] < l) ++w;
    if (w == room.size()) {
      room.push_back(T);
      windows.emplace_back();
    }
    room[w] -= l;
    windows[w].push_back(i);
  }
  for (auto& w : windows) std::sort(w.begin(), w.end());
  return windows;
}
}  // namespace

TEST(DatasetRows, PrepareWritesOneRowPerDocumentPart) {
  TmpDir d;
  ByteTokenizer bt;
  auto m = prepare_token_dataset({{"a", std::string(40, 'x')}, {"b", "hello world"}}, bt, d.str(), 0.25);
  EXPECT_TRUE(m.rows);
  TokenDataset train(d.str(), "train"), val(d.str(), "val");
  ASSERT_TRUE(train.has_rows());
  ASSERT_EQ(train.row_count(), 2);
  EXPECT_EQ(train.row(0).start, 0);
  EXPECT_EQ(train.row(1).start, 30 + (bt.eot_id() >= 0 ? 1 : 0));
  EXPECT_EQ(train.row(1).source(), 1);
  EXPECT_EQ(train.row_end(1), train.size());
  ASSERT_EQ(val.row_count(), 2);
  EXPECT_EQ(val.row_end(0) - val.row(0).start, 10 + (bt.eot_id() >= 0 ? 1 : 0));
  std::ifstream meta(d.str() + "/meta.json");
  const std::string text((std::istreambuf_iterator<char>(meta)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"version\": 3"), std::string::npos);
  EXPECT_NE(text.find("\"row_count\": 2"), std::string::npos);
}

TEST(DatasetRows, BadRowFilesAreRefusedNamingTheFile) {
  TmpDir d;
  write_rows_dataset(d.str(), {4, 5, 6}, -1);
  auto expect_refused = [&](const std::vector<RowRecord>& rows, const std::string& want) {
    write_rows(d.str() + "/train.rows", rows);
    try {
      TokenDataset ds(d.str(), "train");
      ADD_FAILURE() << "accepted; wanted: " << want;
    } catch (const UserError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("train.rows"), std::string::npos) << msg;
      EXPECT_NE(msg.find(want), std::string::npos) << msg;
    }
  };
  expect_refused({{0, 0}, {9, 0}, {4, 0}}, "increase strictly");
  expect_refused({{1, 0}, {4, 0}, {9, 0}}, "not 0");
  expect_refused({{0, 0}, {4, 0}, {15, 0}}, "inside the split");
  expect_refused({{0, 0}, {4, 0}}, "does not match");
  expect_refused({{0, 0}, {4, 0}, {9, RowRecord::make_origin(3, 1)}}, "names source 3");
}

TEST(Packing, FirstFitDecreasingPlacesEveryRowOnceAsTheNaiveOne) {
  std::mt19937 rng(5);
  std::vector<std::int64_t> lengths;
  for (int i = 0; i < 300; ++i) lengths.push_back(1 + static_cast<std::int64_t>(rng() % 60));
  lengths[17] = 90;  // the one row longer than T: truncated
  TmpDir d;
  write_rows_dataset(d.str(), lengths, -1);
  TokenDataset ds(d.str(), "train");
  const std::int64_t T = 64;
  RowWindows packed(ds, T, Packing::Packed);
  const auto want = naive_ffd(lengths, T);
  ASSERT_EQ(packed.size(), static_cast<std::int64_t>(want.size()));
  std::vector<int> seen(lengths.size(), 0);
  std::int64_t placed = 0;
  for (std::int64_t w = 0; w < packed.size(); ++w) {
    std::vector<std::int64_t> rows;
    std::int64_t used = 0;
    for (const PlacedRow* r = packed.rows_begin(w); r != packed.rows_end(w); ++r) {
      rows.push_back(r->row);
      used += r->length;
      ++seen[r->row];
      EXPECT_EQ(r->start, ds.row(r->row).start);
      EXPECT_EQ(r->length, std::min<std::int64_t>(lengths[r->row], T));
    }
    EXPECT_LE(used, T);
    EXPECT_EQ(rows, want[w]) << "window " << w;
    placed += used;
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  EXPECT_EQ(packed.stats().placed, placed);
  EXPECT_EQ(packed.stats().truncated_rows, 1);
  EXPECT_EQ(packed.stats().dropped_tokens, 90 - T);
  EXPECT_GT(packed.stats().fill(), 0.95);
  RowWindows padded(ds, T, Packing::Padded);
  ASSERT_EQ(padded.size(), 300);
  EXPECT_EQ(padded.rows_begin(42)->row, 42);
  // data.overlong = "error": the row's source line, from the check the samplers make.
  try {
    PackingOptions strict;
    strict.mode = Packing::Packed;
    strict.truncate = false;
    TokenSampler(ds, T, config(1), strict);
    ADD_FAILURE() << "an overlong row was accepted";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("data.overlong"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rows.jsonl:18"), std::string::npos) << msg;
  }
}

TEST(Packing, WindowsHoldWholeRowsWithTheirPositionsTargetsAndBoundaries) {
  TmpDir d;
  // Rows of 5, 3, 7, 2 and 9 tokens; prompts of 2 tokens (mask 0), T = 12.
  write_rows_dataset(d.str(), {5, 3, 7, 2, 9}, 2);
  TokenDataset ds(d.str(), "train");
  PackingOptions p;
  p.mode = Packing::Packed;
  TokenSampler s(ds, 12, config(1), p);
  std::int64_t counted_all = 0;
  for (std::int64_t w = 0; w < s.index().num_items(); ++w) {
    const TokenBatch b = s.windows({w});
    ASSERT_TRUE(b.rows_apart());
    const TokenTensors t = to_tensors(b);
    const std::int64_t T = t.inputs.size(1);
    ASSERT_LE(T, 12);
    const auto* in = t.inputs.data_ptr<std::int64_t>();
    const auto* tg = t.targets.data_ptr<std::int64_t>();
    const auto* pos = t.positions.data_ptr<std::int64_t>();
    std::int64_t at = 0, k = 0, counted = 0;
    ASSERT_EQ(t.cu_seqlens.front(), 0);
    for (std::int32_t n = 0; n < b.segment_count[0]; ++n) {
      const std::int64_t len = b.segments[k++];
      EXPECT_EQ(t.cu_seqlens[n + 1], at + len);
      // The row in the dataset whose first token is here: its ids, positions 0.., targets.
      for (std::int64_t i = 0; i < len; ++i) {
        EXPECT_EQ(pos[at + i], i);
        const bool last = i == len - 1;
        const bool counts = !last && i + 1 >= 2;  // token i+1 is a completion token
        EXPECT_EQ(tg[at + i], counts ? in[at + i + 1] : kIgnoredTarget) << "window " << w << " pos " << at + i;
        counted += counts ? 1 : 0;
      }
      at += len;
    }
    EXPECT_EQ(t.cu_seqlens.back(), T);
    for (std::int64_t i = at; i < T; ++i) EXPECT_EQ(tg[i], kIgnoredTarget);
    EXPECT_EQ(counted, s.window_targets(w));
    counted_all += counted;
  }
  // Every row's targets 2..L-1 count once: sum (L - 2).
  EXPECT_EQ(counted_all, 3 + 1 + 5 + 0 + 7);
  EXPECT_EQ(s.stats().untrained_rows, 1);  // the 2-token row: its one target is a prompt token
}

TEST(Packing, PaddedBatchesAreTrimmedToTheirLongestRow) {
  TmpDir d;
  write_rows_dataset(d.str(), {5, 3, 7, 2}, -1);
  TokenDataset ds(d.str(), "train");
  PackingOptions p;
  p.mode = Packing::Padded;
  TokenSampler s(ds, 16, config(2, 1, 0), p);
  const TokenTensors t = to_tensors(s.windows({0, 1}));
  EXPECT_EQ(t.inputs.sizes().vec(), (std::vector<std::int64_t>{2, 5}));
  EXPECT_EQ(t.cu_seqlens, (std::vector<std::int64_t>{0, 5, 8, 10}));
  EXPECT_EQ(t.targets[1][2].item<std::int64_t>(), kIgnoredTarget);  // the 3-token row's last token
  EXPECT_EQ(s.window_targets(0) + s.window_targets(1), 4 + 2);
}

TEST(Packing, StreamDocumentMaskCutsAttentionAndTargetsAtDocuments) {
  TmpDir d;
  write_rows_dataset(d.str(), {5, 3, 7, 2, 9}, -1);  // 26 tokens
  TokenDataset ds(d.str(), "train");
  PackingOptions p;
  p.document_mask = true;
  TokenSampler s(ds, 8, config(1), p);
  ASSERT_EQ(s.index().num_items(), 3);
  // Window 1: tokens 8..16; rows start at 5, 8, 15, 17: segments [8,15) and [15,17).
  const TokenTensors t = to_tensors(s.windows({1}));
  EXPECT_EQ(t.inputs.size(1), 8);
  EXPECT_EQ(t.cu_seqlens, (std::vector<std::int64_t>{0, 7, 8}));
  EXPECT_EQ(t.positions[0][7].item<std::int64_t>(), 0);
  EXPECT_EQ(t.positions[0][6].item<std::int64_t>(), 6);
  EXPECT_EQ(t.targets[0][6].item<std::int64_t>(), kIgnoredTarget);  // token 14 does not predict row 3
  EXPECT_NE(t.targets[0][7].item<std::int64_t>(), kIgnoredTarget);  // token 15 predicts 16 (same row)
  EXPECT_EQ(s.window_targets(1), 7);
  // Without the document mask the stream windows are as before: every target counts.
  TokenSampler plain(ds, 8, config(1));
  const TokenTensors u = to_tensors(plain.windows({1}));
  EXPECT_TRUE(u.cu_seqlens.empty());
  EXPECT_FALSE(u.positions.defined());
  EXPECT_EQ(plain.counted_targets({0, 0}), 8);
}

TEST(Packing, CountedTargetsAreWhatTheRanksBatchesCount) {
  std::mt19937 rng(9);
  std::vector<std::int64_t> lengths;
  for (int i = 0; i < 80; ++i) lengths.push_back(1 + static_cast<std::int64_t>(rng() % 20));
  TmpDir d;
  write_rows_dataset(d.str(), lengths, 3);
  TokenDataset ds(d.str(), "train");
  for (Packing mode : {Packing::Packed, Packing::Padded, Packing::Stream}) {
    PackingOptions p;
    p.mode = mode;
    p.document_mask = mode == Packing::Stream;
    for (int world : {1, 2, 4}) {
      SamplerCursor c{0, 0};
      TokenSampler one(ds, 16, config(8, 1, 0, 1), p);
      for (int step = 0; step < 3; ++step, c = one.next(c)) {
        std::int64_t counted = 0;
        for (int r = 0; r < world; ++r) {
          TokenSampler s(ds, 16, config(8, world, r, 2), p);
          for (int m = 0; m < 2; ++m) counted += to_tensors(s.batch(c, m)).targets.ne(kIgnoredTarget).sum().item<std::int64_t>();
        }
        EXPECT_EQ(counted, one.counted_targets(c)) << to_string(mode) << " world " << world << " step " << step;
      }
    }
  }
}

TEST(Packing, DatasetsWithoutRowsTrainAsStreamOnly) {
  TmpDir d;
  ByteTokenizer bt;
  prepare_token_dataset({{"a", std::string(64, 'y')}}, bt, d.str(), 0.0);
  // An older dataset: version 1, no row files.
  fs::remove(d.p / "train.rows");
  fs::remove(d.p / "val.rows");
  TokenDatasetMeta m = read_token_meta(d.str());
  m.rows = false;
  write_token_meta(d.str(), m);
  TokenDataset ds(d.str(), "train");
  EXPECT_FALSE(ds.has_rows());
  TokenSampler stream(ds, 8, config(1));
  EXPECT_GT(stream.index().num_items(), 0);
  for (bool doc : {false, true}) {
    PackingOptions p;
    p.mode = doc ? Packing::Stream : Packing::Packed;
    p.document_mask = doc;
    try {
      TokenSampler s(ds, 8, config(1), p);
      ADD_FAILURE() << "accepted";
    } catch (const UserError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(doc ? "data.document_mask" : "data.packing"), std::string::npos) << msg;
      EXPECT_NE(msg.find("version 1"), std::string::npos) << msg;
    }
  }
}

TEST(Packing, ADataIdentityRecordsTheRowsAndTheWindows) {
  TmpDir d;
  write_rows_dataset(d.str(), {5, 3, 7}, 1);
  const std::string packed = data_identity(d.str(), "packed of 64");
  EXPECT_EQ(data_identity_differences(packed, data_identity(d.str(), "packed of 64")), "");
  const std::string other = data_identity_differences(packed, data_identity(d.str(), "stream"));
  EXPECT_NE(other.find("windows: \"packed of 64\" -> \"stream\""), std::string::npos) << other;
  // A checkpoint from before windows were recorded: the files alone are compared.
  EXPECT_EQ(data_identity_differences(data_identity(d.str()), packed), "");
  // Other rows over the same tokens: other windows.
  write_rows(d.str() + "/train.rows", {{0, 0}, {4, 0}, {8, 0}});
  const std::string rows = data_identity_differences(packed, data_identity(d.str(), "packed of 64"));
  EXPECT_NE(rows.find("train.rows: content differs"), std::string::npos) << rows;
}
