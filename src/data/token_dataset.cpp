// Writing, describing and memory-mapping token datasets.
#include "shardtrain/data/token_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "shardtrain/data/checksum.h"
#include "shardtrain/data/paths.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/small_file.h"

namespace shardtrain::data {
namespace {
// Little-endian encoding, independent of the host's byte order.
std::string encode_ids(const std::vector<std::int32_t>& ids, int width) {
  std::string out(ids.size() * width, '\0');
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto v = static_cast<std::uint32_t>(ids[i]);
    for (int b = 0; b < width; ++b) out[i * width + b] = static_cast<char>((v >> (8 * b)) & 0xFF);
  }
  return out;
}
std::int32_t load_le(const unsigned char* p, int width) {
  std::uint32_t v = 0;
  for (int b = 0; b < width; ++b) v |= static_cast<std::uint32_t>(p[b]) << (8 * b);
  return static_cast<std::int32_t>(v);
}
int width_of(const std::string& dtype, const std::string& where) {
  if (dtype == "uint16") return 2;
  if (dtype == "uint32") return 4;
  throw UserError(where + ": dtype '" + dtype + "' is not 'uint16' or 'uint32'");
}
}  // namespace

std::string dtype_for_vocab(std::int64_t vocab_size) { return vocab_size <= 65536 ? "uint16" : "uint32"; }

TokenDatasetMeta prepare_token_dataset(const std::vector<TextDocument>& docs, Tokenizer& tok,
                                       const std::string& out_dir, double val_fraction) {
  ST_USER_CHECK(val_fraction >= 0 && val_fraction < 1, "--val-fraction must be in [0, 1), got ", val_fraction);
  ST_USER_CHECK(!docs.empty(), "no source documents to prepare");
  for (const auto& d : docs)
    ST_USER_CHECK(!d.text.empty(), "source '", d.name, "' is empty (0 bytes): nothing to tokenize");
  TokenDatasetMeta meta;
  meta.tokenizer = tok.name();
  meta.vocab_size = tok.vocab_size();
  meta.dtype = dtype_for_vocab(meta.vocab_size);
  meta.eot_id = tok.eot_id();
  meta.val_fraction = val_fraction;
  std::vector<std::int32_t> train, val, ids;
  std::vector<RowRecord> train_rows, val_rows;
  for (const auto& d : docs) {
    ids.clear();
    tok.encode_append(d.text, ids);
    auto n = static_cast<std::int64_t>(ids.size());
    auto n_val = static_cast<std::int64_t>(std::floor(val_fraction * static_cast<double>(n)));
    const std::int64_t origin = RowRecord::make_origin(static_cast<std::int64_t>(meta.sources.size()), 0);
    const auto train0 = static_cast<std::int64_t>(train.size()), val0 = static_cast<std::int64_t>(val.size());
    train.insert(train.end(), ids.begin(), ids.end() - n_val);
    val.insert(val.end(), ids.end() - n_val, ids.end());
    if (meta.eot_id >= 0) {
      train.push_back(meta.eot_id);
      if (n_val > 0) val.push_back(meta.eot_id);
    }
    if (static_cast<std::int64_t>(train.size()) > train0) train_rows.push_back({train0, origin});
    if (static_cast<std::int64_t>(val.size()) > val0) val_rows.push_back({val0, origin});
    meta.sources.push_back({d.name, static_cast<std::int64_t>(d.text.size()), hex64(fnv1a64(d.text)), n - n_val, n_val});
  }
  meta.train_tokens = static_cast<std::int64_t>(train.size());
  meta.val_tokens = static_cast<std::int64_t>(val.size());
  // One training sequence is at least 1 input token and its target; fewer cannot train at all.
  ST_USER_CHECK(meta.train_tokens >= kMinTrainTokens, "the sources give ", meta.train_tokens,
                " training token(s) (", tok.name(), " tokenizer, --val-fraction ", val_fraction,
                "), fewer than the ", kMinTrainTokens, " of the shortest training sequence; nothing written to '",
                out_dir, "'");
  make_dirs(out_dir);
  int w = meta.bytes_per_token();
  std::string bytes = encode_ids(train, w);
  write_file(out_dir + "/train.bin", bytes.data(), bytes.size());
  bytes = encode_ids(val, w);
  write_file(out_dir + "/val.bin", bytes.data(), bytes.size());
  meta.rows = true;
  meta.row_kind = "documents";
  meta.train_rows = static_cast<std::int64_t>(train_rows.size());
  meta.val_rows = static_cast<std::int64_t>(val_rows.size());
  write_rows(out_dir + "/train.rows", train_rows);
  write_rows(out_dir + "/val.rows", val_rows);
  write_token_meta(out_dir, meta);  // last: a dataset with meta.json is complete
  return meta;
}

void write_token_meta(const std::string& dir, const TokenDatasetMeta& m) {
  nlohmann::ordered_json j;
  j["format"] = kTokenFormat;
  j["version"] = m.rows ? kRowsTokenFormatVersion : m.masked ? kMaskedTokenFormatVersion : kTokenFormatVersion;
  j["tokenizer"] = m.tokenizer;
  j["vocab_size"] = m.vocab_size;
  j["dtype"] = m.dtype;
  j["byte_order"] = "little";
  j["eot_id"] = m.eot_id;
  j["splits"]["train"] = {{"file", "train.bin"}, {"tokens", m.train_tokens}};
  j["splits"]["val"] = {{"file", "val.bin"}, {"tokens", m.val_tokens}};
  if (m.masked) {
    j["splits"]["train"]["mask"] = "train.mask";
    j["splits"]["train"]["counted"] = m.train_counted;
    j["splits"]["val"]["mask"] = "val.mask";
    j["splits"]["val"]["counted"] = m.val_counted;
    j["mask"] = {{"bytes_per_token", 1},
                 {"chat_format", m.chat_format},
                 {"rule", "byte i is 1 when token i counts as a target (completion / assistant tokens, with the "
                          "assistant's end-of-turn token): the target at window position t (token t+1) enters the "
                          "loss iff mask[t+1] is 1"}};
  }
  if (m.rows) {
    j["splits"]["train"]["rows"] = "train.rows";
    j["splits"]["train"]["row_count"] = m.train_rows;
    j["splits"]["val"]["rows"] = "val.rows";
    j["splits"]["val"]["row_count"] = m.val_rows;
    j["rows"] = {{"bytes_per_row", kRowRecordBytes},
                 {"kind", m.row_kind},
                 {"rule", "one record per row (an instruction row, or a text document's part in the split): int64 "
                          "start (its first token's index in the split; strictly increasing from 0; the row ends "
                          "where the next starts), int64 origin (source index << 32 | 1-based JSONL line, 0 for a "
                          "whole text document), little-endian"}};
  }
  j["val_fraction"] = m.val_fraction;
  j["split_rule"] = !m.split_rule.empty()
                        ? m.split_rule
                        : "per document (a text file, a JSONL line, a novel): the last floor(val_fraction * n) of its n "
                          "tokens go to val, the rest to train; documents concatenated in order, each followed by eot_id "
                          "when eot_id >= 0";
  auto& src = j["sources"] = nlohmann::ordered_json::array();
  for (auto& s : m.sources) {
    nlohmann::ordered_json e = {{"name", s.name}, {"bytes", s.bytes}, {"fnv1a64", s.fnv1a64},
                                {"train_tokens", s.train_tokens}, {"val_tokens", s.val_tokens}};
    if (!s.format.empty()) e["format"] = s.format;
    if (s.documents >= 0) e["documents"] = s.documents;
    if (s.skipped >= 0) e["skipped_lines"] = s.skipped;
    src.push_back(e);
  }
  std::string text = j.dump(2) + "\n";
  write_file(dir + "/meta.json", text.data(), text.size());
}

TokenDatasetMeta read_token_meta(const std::string& dir) {
  std::string path = dir + "/meta.json";
  ST_USER_CHECK(path_exists(path), "'", path, "' not found: is '", dir,
                "' a dataset written by 'shardtrain data prepare'?");
  nlohmann::json j;
  try {
    const std::string text = read_file(path, kMaxMetaBytes, "dataset meta.json");
    check_json_depth(text, kMaxJsonDepth, "'" + path + "'");
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError("'" + path + "' is not valid JSON: " + e.what());
  }
  TokenDatasetMeta m;
  try {
    ST_USER_CHECK(j.at("format") == kTokenFormat, "'", path, "': format is ", j.at("format").dump(),
                  ", expected \"", kTokenFormat, "\"");
    ST_USER_CHECK(j.at("version") == kTokenFormatVersion || j.at("version") == kMaskedTokenFormatVersion ||
                      j.at("version") == kRowsTokenFormatVersion,
                  "'", path, "': format version ", j.at("version").dump(), " is not supported (this build reads ",
                  kTokenFormatVersion, ", ", kMaskedTokenFormatVersion, " and ", kRowsTokenFormatVersion, ")");
    m.rows = j.at("version") == kRowsTokenFormatVersion;
    // Version 2 always has a mask; version 3 has one when its keys are there.
    m.masked = j.at("version") == kMaskedTokenFormatVersion || (m.rows && j.contains("mask"));
    if (m.rows) {
      // Fixed names, as the masks': a received meta.json cannot point the reader elsewhere.
      ST_USER_CHECK(j.at("splits").at("train").at("rows") == "train.rows" &&
                        j.at("splits").at("val").at("rows") == "val.rows",
                    "'", path, "': splits.*.rows must be \"train.rows\" and \"val.rows\"");
      ST_USER_CHECK(j.at("rows").at("bytes_per_row") == kRowRecordBytes, "'", path, "': rows.bytes_per_row must be ",
                    kRowRecordBytes);
      m.train_rows = j.at("splits").at("train").at("row_count").get<std::int64_t>();
      m.val_rows = j.at("splits").at("val").at("row_count").get<std::int64_t>();
      m.row_kind = j.at("rows").at("kind").get<std::string>();
      ST_USER_CHECK(m.row_kind == "rows" || m.row_kind == "documents", "'", path, "': rows.kind is \"", m.row_kind,
                    "\", not \"rows\" or \"documents\"");
    }
    m.tokenizer = j.at("tokenizer").get<std::string>();
    m.vocab_size = j.at("vocab_size").get<std::int64_t>();
    m.dtype = j.at("dtype").get<std::string>();
    m.eot_id = j.at("eot_id").get<std::int32_t>();
    m.val_fraction = j.at("val_fraction").get<double>();
    m.train_tokens = j.at("splits").at("train").at("tokens").get<std::int64_t>();
    m.val_tokens = j.at("splits").at("val").at("tokens").get<std::int64_t>();
    if (m.masked) {
      // The mask files have fixed names: a received meta.json cannot point the reader elsewhere.
      ST_USER_CHECK(j.at("splits").at("train").at("mask") == "train.mask" &&
                        j.at("splits").at("val").at("mask") == "val.mask",
                    "'", path, "': splits.*.mask must be \"train.mask\" and \"val.mask\"");
      ST_USER_CHECK(j.at("mask").at("bytes_per_token") == 1, "'", path, "': mask.bytes_per_token must be 1");
      m.train_counted = j.at("splits").at("train").at("counted").get<std::int64_t>();
      m.val_counted = j.at("splits").at("val").at("counted").get<std::int64_t>();
      m.chat_format = j.at("mask").at("chat_format").get<std::string>();
    } else {
      ST_USER_CHECK(!j.at("splits").at("train").contains("mask") && !j.at("splits").at("val").contains("mask") &&
                        !j.contains("mask"),
                    "'", path, "': a loss mask needs format version ", kMaskedTokenFormatVersion, " or ",
                    kRowsTokenFormatVersion, ", this is version ", kTokenFormatVersion);
    }
    ST_USER_CHECK(m.rows || (!j.at("splits").at("train").contains("rows") && !j.contains("rows")), "'", path,
                  "': row boundaries need format version ", kRowsTokenFormatVersion, ", this is version ",
                  j.at("version").dump());
    if (j.contains("split_rule") && j.at("split_rule").is_string()) m.split_rule = j.at("split_rule").get<std::string>();
    for (auto& s : j.at("sources"))
    {
      TokenSourceInfo i{s.at("name"), s.at("bytes"), s.at("fnv1a64"), s.at("train_tokens"), s.at("val_tokens")};
      if (s.contains("format")) i.format = s.at("format").get<std::string>();
      if (s.contains("documents")) i.documents = s.at("documents").get<std::int64_t>();
      if (s.contains("skipped_lines")) i.skipped = s.at("skipped_lines").get<std::int64_t>();
      m.sources.push_back(i);
    }
  } catch (const nlohmann::json::exception& e) {
    throw UserError("'" + path + "': missing or mistyped key: " + e.what());
  }
  width_of(m.dtype, "'" + path + "'");
  ST_USER_CHECK(m.vocab_size > 0 && m.vocab_size <= (m.dtype == "uint16" ? 65536 : 2147483647LL), "'", path,
                "': vocab_size ", m.vocab_size, " does not fit dtype ", m.dtype);
  ST_USER_CHECK(m.train_tokens >= 0 && m.val_tokens >= 0, "'", path, "': negative token count (train ",
                m.train_tokens, ", val ", m.val_tokens, ")");
  ST_USER_CHECK(m.eot_id >= -1 && m.eot_id < m.vocab_size, "'", path, "': eot_id ", m.eot_id,
                " is not -1 (none) or an id below vocab_size ", m.vocab_size);
  ST_USER_CHECK(!m.rows || (m.train_rows >= 0 && m.train_rows <= m.train_tokens && m.val_rows >= 0 &&
                            m.val_rows <= m.val_tokens),
                "'", path, "': row counts (train ", m.train_rows, ", val ", m.val_rows, ") outside [0, tokens]");
  ST_USER_CHECK(!m.masked || (m.train_counted >= 0 && m.train_counted <= m.train_tokens && m.val_counted >= 0 &&
                              m.val_counted <= m.val_tokens),
                "'", path, "': counted tokens (train ", m.train_counted, ", val ", m.val_counted,
                ") outside [0, tokens]");
  return m;
}

TokenDataset::TokenDataset(const std::string& dir, const std::string& split) : meta_(read_token_meta(dir)) {
  ST_USER_CHECK(split == "train" || split == "val", "unknown split '", split, "' (expected train or val)");
  path_ = dir + "/" + split + ".bin";
  tokens_ = split == "train" ? meta_.train_tokens : meta_.val_tokens;
  int w = meta_.bytes_per_token();
  int fd = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // a FIFO must not block
  ST_USER_CHECK(fd >= 0, "cannot open '", path_, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw UserError("cannot stat '" + path_ + "': " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UserError("'" + path_ + "' is not a regular file");
  }
  // tokens x width from meta.json, overflow-checked: a wrapped product could match a short file.
  long long expected = 0;
  if (__builtin_mul_overflow(static_cast<long long>(tokens_), static_cast<long long>(w), &expected)) {
    ::close(fd);
    throw UserError(detail::concat(dir, "/meta.json: ", split, " has ", tokens_, " ", meta_.dtype,
                                   " tokens, more bytes than any file can hold; '", path_, "' has ", st.st_size,
                                   " bytes"));
  }
  if (st.st_size != expected) {
    ::close(fd);
    throw UserError(detail::concat("'", path_, "' has ", st.st_size, " bytes but ", dir, "/meta.json says ",
                                   tokens_, " ", meta_.dtype, " tokens (", expected,
                                   " bytes): truncated file or wrong dtype"));
  }
  if (expected > 0) {
    void* p = ::mmap(nullptr, static_cast<std::size_t>(expected), PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    ST_USER_CHECK(p != MAP_FAILED, "cannot mmap '", path_, "': ", std::strerror(err));
    data_ = static_cast<const unsigned char*>(p);
    mapped_ = static_cast<std::size_t>(expected);
  } else {
    ::close(fd);
  }
  if (meta_.masked) map_mask(dir, split);
  if (meta_.rows) map_rows(dir, split);
  // Spot-check ids: everything for small splits, an even spread for large ones.
  const std::int64_t kFull = 16LL << 20, kSamples = 1LL << 20;
  std::int64_t stride = tokens_ <= kFull ? 1 : tokens_ / kSamples;
  for (std::int64_t i = 0; i < tokens_; i += stride) {
    std::int64_t id = static_cast<std::uint32_t>(load_le(data_ + i * w, w));
    ST_USER_CHECK(id < meta_.vocab_size, "'", path_, "': token ", i, " (byte offset ", i * w, ") is ", id,
                  ", not below vocab_size ", meta_.vocab_size, " from meta.json: wrong dtype or corrupt file");
  }
}

void TokenDataset::map_mask(const std::string& dir, const std::string& split) {
  mask_path_ = dir + "/" + split + ".mask";
  const std::int64_t want_counted = split == "train" ? meta_.train_counted : meta_.val_counted;
  int fd = ::open(mask_path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ST_USER_CHECK(fd >= 0, "cannot open '", mask_path_, "' (", dir, "/meta.json says the dataset has a loss mask): ",
                std::strerror(errno));
  struct stat st {};
  const bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (!ok || st.st_size != tokens_) {
    ::close(fd);
    ST_USER_CHECK(ok, "'", mask_path_, "' is not a regular file");
    throw UserError(detail::concat("'", mask_path_, "' has ", st.st_size, " bytes but ", dir, "/meta.json says ", split,
                                   " has ", tokens_, " tokens (one mask byte per token): the mask does not match ",
                                   path_));
  }
  if (tokens_ > 0) {
    void* p = ::mmap(nullptr, static_cast<std::size_t>(tokens_), PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    ST_USER_CHECK(p != MAP_FAILED, "cannot mmap '", mask_path_, "': ", std::strerror(err));
    mask_ = static_cast<const unsigned char*>(p);
  } else {
    ::close(fd);
  }
  // Every byte is read once here (a mask is a quarter of the ids' size): bytes other than 0/1
  // or a count that differs from meta.json mean a corrupt or mismatched file.
  std::int64_t ones = 0;
  for (std::int64_t i = 0; i < tokens_; ++i) {
    const unsigned char b = mask_[i];
    if (b > 1) {
      throw UserError(detail::concat("'", mask_path_, "': byte ", i, " is ", static_cast<int>(b),
                                     ", not 0 or 1: corrupt mask file"));
    }
    ones += b;
  }
  ST_USER_CHECK(ones == want_counted, "'", mask_path_, "' marks ", ones, " token(s) as counted but ", dir,
                "/meta.json says ", want_counted, ": the mask does not match this dataset");
}

void TokenDataset::map_rows(const std::string& dir, const std::string& split) {
  rows_path_ = dir + "/" + split + ".rows";
  rows_ = split == "train" ? meta_.train_rows : meta_.val_rows;
  int fd = ::open(rows_path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ST_USER_CHECK(fd >= 0, "cannot open '", rows_path_, "' (", dir, "/meta.json says the dataset has row boundaries): ",
                std::strerror(errno));
  struct stat st {};
  const bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  const long long want = static_cast<long long>(rows_) * kRowRecordBytes;  // rows_ <= tokens: no overflow
  if (!ok || st.st_size != want) {
    ::close(fd);
    ST_USER_CHECK(ok, "'", rows_path_, "' is not a regular file");
    throw UserError(detail::concat("'", rows_path_, "' has ", st.st_size, " bytes but ", dir, "/meta.json says ", split,
                                   " has ", rows_, " rows (", kRowRecordBytes, " bytes each): the row file does not "
                                   "match this dataset"));
  }
  if (rows_ > 0) {
    void* p = ::mmap(nullptr, static_cast<std::size_t>(want), PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    ST_USER_CHECK(p != MAP_FAILED, "cannot mmap '", rows_path_, "': ", std::strerror(err));
    rows_data_ = static_cast<const unsigned char*>(p);
  } else {
    ::close(fd);
  }
  // Every record is checked once here: the packing reads any of them.
  ST_USER_CHECK(rows_ > 0 || tokens_ == 0, "'", rows_path_, "' has no rows but ", split, " has ", tokens_, " tokens");
  std::int64_t prev = -1;
  for (std::int64_t i = 0; i < rows_; ++i) {
    const RowRecord r = row(i);
    ST_USER_CHECK(i > 0 || r.start == 0, "'", rows_path_, "': the first row starts at token ", r.start, ", not 0");
    ST_USER_CHECK(r.start > prev && r.start < tokens_, "'", rows_path_, "': row ", i, " starts at token ", r.start,
                  " (the previous at ", prev, ", the split has ", tokens_,
                  " tokens): starts must increase strictly and lie inside the split");
    ST_USER_CHECK(r.source() >= 0 && r.source() < static_cast<std::int64_t>(meta_.sources.size()), "'", rows_path_,
                  "': row ", i, " names source ", r.source(), ", but meta.json lists ", meta_.sources.size());
    prev = r.start;
  }
}

RowRecord TokenDataset::row(std::int64_t i) const {
  ST_CHECK(i >= 0 && i < rows_, "row ", i, " outside [0, ", rows_, ") of ", rows_path_);
  const unsigned char* p = rows_data_ + i * kRowRecordBytes;
  std::uint64_t v[2] = {0, 0};
  for (int k = 0; k < 2; ++k)
    for (int b = 0; b < 8; ++b) v[k] |= static_cast<std::uint64_t>(p[8 * k + b]) << (8 * b);
  return {static_cast<std::int64_t>(v[0]), static_cast<std::int64_t>(v[1])};
}

std::int64_t TokenDataset::row_end(std::int64_t i) const { return i + 1 < rows_ ? row(i + 1).start : tokens_; }

std::string encode_rows(const std::vector<RowRecord>& rows) {
  std::string out(rows.size() * kRowRecordBytes, '\0');
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::uint64_t v[2] = {static_cast<std::uint64_t>(rows[i].start), static_cast<std::uint64_t>(rows[i].origin)};
    for (int k = 0; k < 2; ++k)
      for (int b = 0; b < 8; ++b) out[i * kRowRecordBytes + 8 * k + b] = static_cast<char>((v[k] >> (8 * b)) & 0xFF);
  }
  return out;
}

void write_rows(const std::string& path, const std::vector<RowRecord>& rows) {
  const std::string bytes = encode_rows(rows);
  write_file(path, bytes.data(), bytes.size());
}

TokenDataset::~TokenDataset() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), mapped_);
  if (mask_) ::munmap(const_cast<unsigned char*>(mask_), static_cast<std::size_t>(tokens_));
  if (rows_data_) ::munmap(const_cast<unsigned char*>(rows_data_), static_cast<std::size_t>(rows_) * kRowRecordBytes);
}

void TokenDataset::read_mask(std::int64_t begin, std::int64_t n, std::uint8_t* out) const {
  ST_CHECK(masked(), "read_mask on ", path_, ", which has no loss mask");
  ST_CHECK(begin >= 0 && n >= 0 && begin + n <= tokens_, "mask range [", begin, ", ", begin + n, ") outside [0, ",
           tokens_, ") of ", mask_path_);
  if (n > 0) std::memcpy(out, mask_ + begin, static_cast<std::size_t>(n));
}

std::int64_t TokenDataset::counted(std::int64_t begin, std::int64_t n) const {
  ST_CHECK(masked(), "counted() on ", path_, ", which has no loss mask");
  ST_CHECK(begin >= 0 && n >= 0 && begin + n <= tokens_, "mask range [", begin, ", ", begin + n, ") outside [0, ",
           tokens_, ") of ", mask_path_);
  std::int64_t c = 0;
  for (std::int64_t i = 0; i < n; ++i) c += mask_[begin + i];
  return c;
}

void write_mask(const std::string& path, const std::vector<std::uint8_t>& mask) {
  write_file(path, reinterpret_cast<const char*>(mask.data()), mask.size());
}

std::int32_t TokenDataset::at(std::int64_t i) const {
  ST_CHECK(i >= 0 && i < tokens_, "token index ", i, " outside [0, ", tokens_, ") of ", path_);
  return load_le(data_ + i * meta_.bytes_per_token(), meta_.bytes_per_token());
}

void TokenDataset::read(std::int64_t begin, std::int64_t n, std::int32_t* out) const {
  ST_CHECK(begin >= 0 && n >= 0 && begin + n <= tokens_, "token range [", begin, ", ", begin + n,
           ") outside [0, ", tokens_, ") of ", path_);
  int w = meta_.bytes_per_token();
  // Every id that reaches a batch is checked (the constructor spot-checks only a sample of
  // large splits): an id >= vocab_size would index past the embedding table.
  const std::uint32_t vocab = static_cast<std::uint32_t>(meta_.vocab_size);
  std::uint32_t bad = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t id = static_cast<std::uint32_t>(load_le(data_ + (begin + i) * w, w));
    bad |= id >= vocab ? 1u : 0u;
    out[i] = static_cast<std::int32_t>(id);
  }
  if (bad) {
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint32_t id = static_cast<std::uint32_t>(out[i]);
      ST_USER_CHECK(id < vocab, "'", path_, "': token ", begin + i, " (byte offset ", (begin + i) * w, ") is ", id,
                    ", not below vocab_size ", meta_.vocab_size,
                    " from meta.json: corrupt file (found while reading a batch)");
    }
  }
}

void write_ids(const std::string& path, const std::vector<std::int32_t>& ids, const std::string& dtype) {
  int w = width_of(dtype, "--dtype");
  std::uint64_t max = w == 2 ? 0xFFFF : 0xFFFFFFFFULL;
  for (std::size_t i = 0; i < ids.size(); ++i)
    ST_USER_CHECK(ids[i] >= 0 && static_cast<std::uint64_t>(ids[i]) <= max, "id ", ids[i], " at position ", i,
                  " does not fit ", dtype);
  std::string bytes = encode_ids(ids, w);
  write_file(path, bytes.data(), bytes.size());
}

std::vector<std::int32_t> read_ids(const std::string& path, const std::string& dtype) {
  int w = width_of(dtype, "--dtype");
  std::string bytes = read_file(path, kMaxSourceBytes, "token id file");
  ST_USER_CHECK(bytes.size() % w == 0, "'", path, "' has ", bytes.size(), " bytes, not a multiple of ", w,
                " (", dtype, "): truncated or wrong --dtype");
  std::vector<std::int32_t> ids(bytes.size() / w);
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = load_le(reinterpret_cast<const unsigned char*>(bytes.data()) + i * w, w);
  return ids;
}

}  // namespace shardtrain::data
