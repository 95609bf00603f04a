// prepare_corpus: each rank reads its byte ranges (data/corpus.h), tokenizes them on its threads
// in tasks of whole documents, and the ranks write the splits at offsets from a prefix sum over
// rank order, so the files are the same bits at any number of ranks and threads.
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "shardtrain/data/chat_format.h"
#include "shardtrain/data/checksum.h"
#include "shardtrain/data/corpus.h"
#include "shardtrain/data/packing.h"
#include "shardtrain/data/paths.h"
#include "shardtrain/data/token_dataset.h"
#include "shardtrain/data/tokenizer.h"
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/file_io.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::data {
namespace {

namespace fs = std::filesystem;
constexpr std::size_t kTaskBytes = std::size_t{1} << 20;  // JSONL tasks: about 1 MiB of whole lines

struct Fd {
  int fd = -1;
  explicit Fd(const std::string& path) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    ST_USER_CHECK(fd >= 0, "data prepare: cannot open '", path, "': ", std::strerror(errno));
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  std::string pread_all(const std::string& path, std::int64_t off, std::int64_t len) const {
    std::string out(static_cast<std::size_t>(len), '\0');
    std::int64_t got = 0;
    while (got < len) {
      const ssize_t n = ::pread(fd, out.data() + got, static_cast<std::size_t>(len - got), off + got);
      if (n < 0 && errno == EINTR) continue;
      ST_USER_CHECK(n >= 0, "data prepare: cannot read '", path, "': ", std::strerror(errno));
      if (n == 0) break;
      got += n;
    }
    out.resize(static_cast<std::size_t>(got));
    return out;
  }
  // Index of the first '\n' at or after `from`, or -1 at the end of the file.
  std::int64_t next_newline(const std::string& path, std::int64_t from) const {
    for (std::int64_t at = from;; at += 1 << 16) {
      const std::string b = pread_all(path, at, 1 << 16);
      if (b.empty()) return -1;
      if (const void* p = std::memchr(b.data(), '\n', b.size())) return at + (static_cast<const char*>(p) - b.data());
    }
  }
};

std::string gunzip_file(const std::string& path) {
  gzFile g = ::gzopen(path.c_str(), "rb");
  ST_USER_CHECK(g != nullptr, "data prepare: cannot open '", path, "': ", std::strerror(errno));
  std::string out;
  std::vector<char> buf(std::size_t{1} << 20);
  for (;;) {
    const int n = ::gzread(g, buf.data(), static_cast<unsigned>(buf.size()));
    if (n < 0) {
      int code = 0;
      const std::string msg = ::gzerror(g, &code);
      ::gzclose(g);
      throw UserError("data prepare: '" + path + "' is not a readable gzip file: " + msg);
    }
    if (n == 0) break;
    out.append(buf.data(), static_cast<std::size_t>(n));
    ST_USER_CHECK(out.size() <= kMaxSourceBytes, "data prepare: '", path, "' inflates to more than ",
                  kMaxSourceBytes >> 30, " GiB: split it, or give it uncompressed (then ranks share it)");
  }
  ST_USER_CHECK(::gzclose(g) == Z_OK, "data prepare: '", path, "': gzip stream ends badly (truncated?)");
  return out;
}

// A rank's bytes of one source: the text and, for JSONL, the file offset it starts at.
struct Loaded {
  int source = 0;
  std::string text;
  std::int64_t offset = 0;
};

Loaded load_range(const CorpusSource& s, const SourceRange& r) {
  Loaded l;
  l.source = r.source;
  if (s.in_memory) {
    l.text = s.text;
  } else if (s.gzip) {
    l.text = gunzip_file(s.name);
  } else if (!s.splittable()) {
    l.text = read_file(s.name, kMaxSourceBytes, "text source");
  } else {
    Fd f(s.name);
    std::int64_t b = 0;
    if (r.begin > 0) {
      const std::int64_t nl = f.next_newline(s.name, r.begin - 1);
      b = nl < 0 ? s.bytes : nl + 1;
    }
    if (b < r.end) {
      const std::int64_t nl = f.next_newline(s.name, r.end - 1);
      const std::int64_t e = nl < 0 ? s.bytes : nl + 1;
      l.text = f.pread_all(s.name, b, e - b);
    }
    l.offset = b;
  }
  // A file of 0 bytes is refused when the sources are listed; a gzip one can still hold nothing.
  if (!s.splittable())
    ST_USER_CHECK(!l.text.empty(), "source '", s.name, "' is empty", s.gzip ? " once decompressed" : " (0 bytes)",
                  ": nothing to tokenize");
  return l;
}

struct Task {
  int loaded = 0;  // index into the rank's Loaded
  std::size_t begin = 0, end = 0;
  std::int64_t line0 = 0;  // lines of the Loaded text before `begin`
};

// A row (an instruction row, or a document's part in one split) as a task saw it: its token
// count and its line in the task's Loaded text (1-based; 0 for a whole text document).
struct TaskRow {
  std::int64_t tokens = 0, line = 0;
};

struct TaskOut {
  std::vector<std::int32_t> train, val;
  std::vector<std::uint8_t> train_mask, val_mask;  // instruction data only
  std::vector<TaskRow> train_rows, val_rows;
  std::int64_t docs = 0, skipped = 0;
  std::string first_bad, error;
};

struct Counters {
  std::atomic<std::int64_t> bytes{0}, docs{0}, tasks{0};
  std::atomic<bool> stop{false};
};

class Worker {
 public:
  // `tok`: the rank's tokenizer; the worker's own shares its tables (read once per rank).
  Worker(const PrepareArgs& a, const std::vector<CorpusSource>& s, const std::vector<Loaded>& l, Counters& c,
         const Tokenizer& tok, const ChatTemplate* chat)
      : a_(a), s_(s), l_(l), c_(c), tok_(tok.for_thread()), eot_(tok_->eot_id()) {
    if (chat) chat_ = std::make_unique<ChatRenderer>(*chat, *tok_);
  }

  void run(const Task& t, TaskOut& o) {
    const Loaded& l = l_[t.loaded];
    const CorpusSource& src = s_[l.source];
    const std::string_view all(l.text);
    if (src.format == CorpusFormat::Text) {
      add_doc(all, 0, o);
      c_.bytes += static_cast<std::int64_t>(all.size());
      return;
    }
    std::int64_t line = t.line0;
    for (std::size_t p = t.begin; p < t.end && !c_.stop;) {
      const std::size_t nl = all.find('\n', p);
      const std::size_t e = nl == std::string_view::npos || nl > t.end ? t.end : nl;
      const std::string_view ln = all.substr(p, e - p);
      ++line;
      p = e + 1;
      c_.bytes += static_cast<std::int64_t>(ln.size() + 1);
      if (ln.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank lines are no documents
      std::string why;
      nlohmann::json j = nlohmann::json::parse(ln.begin(), ln.end(), nullptr, false);
      if (chat_) {
        if (j.is_discarded()) why = "not valid JSON";
        else why = add_row(j, ln, line, o);
        if (why.empty()) continue;
      } else if (j.is_discarded()) why = "not valid JSON";
      else if (!j.is_object()) why = "not a JSON object";
      else if (!j.contains(a_.text_field)) why = "no field \"" + a_.text_field + "\" (--text-field)";
      else if (!j[a_.text_field].is_string()) why = "field \"" + a_.text_field + "\" is not a string";
      if (!why.empty()) {
        const std::string where = src.name + ":" + std::to_string(line_number(l, line)) + ": " + why;
        if (!a_.skip_bad)
          throw UserError("data prepare: " + where + " (fix the line, or pass --skip-bad to skip and count such lines)");
        if (o.first_bad.empty()) o.first_bad = where;
        ++o.skipped;
        continue;
      }
      if (chat_) continue;
      const std::string& text = j[a_.text_field].get_ref<const std::string&>();
      if (!text.empty()) add_doc(text, line, o);
    }
  }

 private:
  // The file's line number of the rank's line `k` (1-based): the newlines before the rank's
  // first byte are counted only when a message needs them.
  std::int64_t line_number(const Loaded& l, std::int64_t k) const {
    if (l.offset == 0) return k;
    Fd f(s_[l.source].name);
    std::int64_t before = 0;
    for (std::int64_t at = 0; at < l.offset; at += 1 << 20) {
      const std::string b = f.pread_all(s_[l.source].name, at, std::min<std::int64_t>(1 << 20, l.offset - at));
      before += std::count(b.begin(), b.end(), '\n');
    }
    return before + k;
  }
  // An instruction row: rendered whole into train or val (val when the row's FNV-1a hash, as a
  // fraction of 2^64, is below val_fraction: the same at any rank and thread count, and equal
  // rows land in the same split). Returns "" or why the row is bad (nothing appended then).
  std::string add_row(const nlohmann::json& j, std::string_view line, std::int64_t line_no, TaskOut& o) {
    std::string why = parse_instruction_row(j, msgs_);
    if (!why.empty()) return why;
    ids_.clear();
    mask_.clear();
    why = chat_->render(msgs_, ids_, mask_);
    if (!why.empty()) return why;
    const double u = static_cast<double>(fnv1a64(line) >> 11) * 0x1p-53;
    const bool val = u < a_.val_fraction;
    (val ? o.val : o.train).insert((val ? o.val : o.train).end(), ids_.begin(), ids_.end());
    (val ? o.val_mask : o.train_mask).insert((val ? o.val_mask : o.train_mask).end(), mask_.begin(), mask_.end());
    if (!ids_.empty()) (val ? o.val_rows : o.train_rows).push_back({static_cast<std::int64_t>(ids_.size()), line_no});
    ++o.docs;
    ++c_.docs;
    return "";
  }
  void add_doc(std::string_view text, std::int64_t line_no, TaskOut& o) {
    ids_.clear();
    tok_->encode_append(text, ids_);
    const auto n = static_cast<std::int64_t>(ids_.size());
    const auto n_val = static_cast<std::int64_t>(std::floor(a_.val_fraction * static_cast<double>(n)));
    const auto train0 = static_cast<std::int64_t>(o.train.size()), val0 = static_cast<std::int64_t>(o.val.size());
    o.train.insert(o.train.end(), ids_.begin(), ids_.end() - n_val);
    o.val.insert(o.val.end(), ids_.end() - n_val, ids_.end());
    if (eot_ >= 0) {
      o.train.push_back(eot_);
      if (n_val > 0) o.val.push_back(eot_);
    }
    // Each part a row of its split (the document's boundaries, for packing and document masks).
    if (static_cast<std::int64_t>(o.train.size()) > train0)
      o.train_rows.push_back({static_cast<std::int64_t>(o.train.size()) - train0, line_no});
    if (static_cast<std::int64_t>(o.val.size()) > val0)
      o.val_rows.push_back({static_cast<std::int64_t>(o.val.size()) - val0, line_no});
    ++o.docs;
    ++c_.docs;
  }
  const PrepareArgs& a_;
  const std::vector<CorpusSource>& s_;
  const std::vector<Loaded>& l_;
  Counters& c_;
  std::unique_ptr<Tokenizer> tok_;
  std::int32_t eot_;
  std::vector<std::int32_t> ids_;
  std::unique_ptr<ChatRenderer> chat_;  // instruction data
  std::vector<ChatMessage> msgs_;
  std::vector<std::uint8_t> mask_;
};

// --chat-format auto: --tokenizer-config, else tokenizer_config.json beside the tokenizer (a
// model directory, or the directory of a tokenizer file).
std::string tokenizer_config_path(const PrepareArgs& a) {
  if (!a.tokenizer_config.empty()) return a.tokenizer_config;
  std::error_code ec;
  if (fs::is_directory(a.tokenizer, ec)) return (fs::path(a.tokenizer) / "tokenizer_config.json").string();
  if (a.tokenizer.find('/') != std::string::npos || fs::exists(a.tokenizer, ec))
    return (fs::path(a.tokenizer).parent_path() / "tokenizer_config.json").string();
  throw UserError("data prepare: --chat-format auto reads the chat template from the model's tokenizer_config.json; "
                  "the " + a.tokenizer + " tokenizer has none: give --tokenizer-config FILE or --chat-format NAME");
}

std::vector<Task> make_tasks(const std::vector<CorpusSource>& s, const std::vector<Loaded>& loaded) {
  std::vector<Task> tasks;
  for (int i = 0; i < static_cast<int>(loaded.size()); ++i) {
    const std::string& t = loaded[i].text;
    if (s[loaded[i].source].format == CorpusFormat::Text) {
      tasks.push_back({i, 0, t.size(), 0});
      continue;
    }
    std::int64_t lines = 0;
    for (std::size_t p = 0; p < t.size();) {
      std::size_t e = std::min(t.size(), p + kTaskBytes);
      if (e < t.size()) {
        const std::size_t nl = t.find('\n', e);
        e = nl == std::string::npos ? t.size() : nl + 1;
      }
      tasks.push_back({i, p, e, lines});
      lines += std::count(t.begin() + static_cast<std::ptrdiff_t>(p), t.begin() + static_cast<std::ptrdiff_t>(e), '\n');
      p = e;
    }
  }
  return tasks;
}

int default_threads(MPI_Comm world) {
  MPI_Comm local = MPI_COMM_NULL;
  ST_MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local));
  int n = 1;
  ST_MPI_CHECK(MPI_Comm_size(local, &n));
  ST_MPI_CHECK(MPI_Comm_free(&local));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, n));
}

void append_le(std::string& out, const std::vector<std::int32_t>& ids, int width) {
  const std::size_t at = out.size();
  out.resize(at + ids.size() * static_cast<std::size_t>(width));
  char* p = out.data() + at;
  for (std::int32_t id : ids) {
    const auto u = static_cast<std::uint32_t>(id);
    for (int b = 0; b < width; ++b) *p++ = static_cast<char>((u >> (8 * b)) & 0xFF);
  }
}

// Collective: this rank's bytes at byte offset `offset` of `path` (created, truncated).
void write_at(const std::string& path, const std::string& bytes, std::int64_t offset, MPI_Comm world) {
  MPI_File fh = MPI_FILE_NULL;
  // EXCL: rank 0 creates the name with O_EXCL (no link followed); the caller cleared it.
  ST_MPI_CHECK(MPI_File_open(world, path.c_str(), MPI_MODE_CREATE | MPI_MODE_EXCL | MPI_MODE_WRONLY, MPI_INFO_NULL, &fh));
  constexpr std::size_t kChunk = std::size_t{1} << 30;
  for (std::size_t done = 0; done < bytes.size(); done += kChunk) {
    const int n = static_cast<int>(std::min(kChunk, bytes.size() - done));
    MPI_Status st;
    ST_MPI_CHECK(MPI_File_write_at(fh, static_cast<MPI_Offset>(offset + static_cast<std::int64_t>(done)),
                                   bytes.data() + done, n, MPI_BYTE, &st));
    int written = 0;
    ST_MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &written));
    if (written != n) throw IoError("data prepare: short write to '" + path + "'");
  }
  ST_MPI_CHECK(MPI_File_sync(fh));
  ST_MPI_CHECK(MPI_File_close(&fh));
}

// Stops early (the value is then unused) when `stop` is set.
std::uint64_t file_fnv(const CorpusSource& s, const std::atomic<bool>& stop) {
  if (s.in_memory) return fnv1a64(s.text);
  Fd f(s.name);
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (std::int64_t at = 0; !stop; at += 1 << 22) {
    const std::string b = f.pread_all(s.name, at, 1 << 22);
    if (b.empty()) break;
    h = fnv1a64(b, h);
  }
  return h;
}


std::string mb(double bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f", bytes / 1e6);
  return s;
}

// This rank's row records of one split (0 train, 1 val): each row's start from the rank's first
// token `first`, its origin's line on the file's count (`lines_before`: the lower ranks' newlines
// per source; this rank's earlier ranges add theirs).
std::vector<RowRecord> rank_rows(int split, std::int64_t first, const std::vector<Task>& tasks,
                                 const std::vector<TaskOut>& outs, const std::vector<Loaded>& loaded,
                                 const std::vector<std::int64_t>& lines_before) {
  std::vector<std::int64_t> line_base = lines_before, loaded_base(loaded.size(), 0);
  for (std::size_t i = 0; i < loaded.size(); ++i) {
    loaded_base[i] = line_base[loaded[i].source];
    line_base[loaded[i].source] += std::count(loaded[i].text.begin(), loaded[i].text.end(), '\n');
  }
  std::vector<RowRecord> recs;
  std::int64_t at = first;
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const int l = tasks[i].loaded;
    for (const TaskRow& r : split == 0 ? outs[i].train_rows : outs[i].val_rows) {
      recs.push_back({at, RowRecord::make_origin(loaded[l].source, r.line > 0 ? loaded_base[l] + r.line : 0)});
      at += r.tokens;
    }
  }
  return recs;
}

}  // namespace

std::string prepare_corpus(const PrepareArgs& a0, MPI_Comm world,
                           const std::function<void(const std::function<void()>&)>& agreed) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  int rank = 0, size = 1;
  ST_MPI_CHECK(MPI_Comm_rank(world, &rank));
  ST_MPI_CHECK(MPI_Comm_size(world, &size));
  PrepareArgs a = a0;
  if (!a.val_fraction_given) a.val_fraction = 0.05;
  std::vector<CorpusSource> sources;
  std::unique_ptr<Tokenizer> tokenizer;  // the rank's; its threads share its tables
  ChatTemplate chat;                     // instruction data (a.chat_format given)
  const bool instruct = !a.chat_format.empty();
  agreed([&] {
    ST_USER_CHECK(!a.out_dir.empty(), "data prepare: give --out DIR");
    ST_USER_CHECK(a.val_fraction >= 0 && a.val_fraction < 1, "data prepare: --val-fraction must be in [0, 1) (a "
                  "fraction of each document held out for validation), got ", a.val_fraction);
    ST_USER_CHECK(a.threads >= 0 && a.threads <= 4096, "data prepare: --threads must be in [0, 4096], got ", a.threads);
    ST_USER_CHECK(!a.text_field.empty(), "data prepare: --text-field must not be empty");
    tokenizer = make_tokenizer(a.tokenizer, a.data_dir, a.tokenizer_options);
    sources = expand_corpus_sources(a.sources, a.data_dir);
    if (!a.chat_format.empty()) {
      chat = a.chat_format == "auto" ? chat_template_from_config(tokenizer_config_path(a), a.chat_date)
                                     : chat_template_named(a.chat_format);
      ChatRenderer check(chat, *tokenizer);  // the format's special tokens exist: exit 2 before any work
      for (const auto& s : sources)
        ST_USER_CHECK(!s.in_memory && s.format == CorpusFormat::Jsonl, "data prepare: --chat-format ", a.chat_format,
                      " reads instruction rows from JSONL files; source '", s.name, "' is ",
                      s.in_memory ? "a built-in text" : "a plain text file");
    } else {
      ST_USER_CHECK(a.chat_date.empty() && a.tokenizer_config.empty(),
                    "data prepare: --chat-date and --tokenizer-config go with --chat-format");
    }
    std::error_code ec;
    for (const auto& s : sources)
      for (const char* f : {"train.bin", "val.bin", "meta.json", "train.mask", "val.mask"}) {
        const std::string out = a.out_dir + "/" + f;
        if (!s.in_memory && fs::exists(out, ec) && fs::equivalent(out, s.name, ec) && !ec)
          throw UserError("data prepare: the output '" + out + "' is the input '" + s.name +
                          "'; refusing to overwrite it: write to another path");
      }
  });
  if (a.threads == 0) a.threads = default_threads(world);

  // ---- the checksums of this rank's sources (meta.json), on a thread of their own -----
  // One rank reads each whole source a second time; overlapped with the tokenizers, it costs
  // the rank no wall time where a core is free, and shares the cores where none is.
  Counters c;
  const std::size_t ns = sources.size();
  std::vector<std::uint64_t> hash(ns, 0), all_hash(ns, 0);
  std::exception_ptr hash_error;
  std::thread hasher([&] {
    try {
      for (std::size_t i = static_cast<std::size_t>(rank); i < ns && !c.stop; i += static_cast<std::size_t>(size))
        hash[i] = file_fnv(sources[i], c.stop);
    } catch (...) {
      hash_error = std::current_exception();
    }
  });
  struct Join {
    std::thread& t;
    Counters& c;
    ~Join() {
      if (!t.joinable()) return;
      c.stop = true;  // only when leaving by an exception: the hash is not needed then
      t.join();
    }
  } join_hasher{hasher, c};

  // ---- this rank's documents, tokenized on its threads ------------------------------
  std::vector<Loaded> loaded;
  std::vector<Task> tasks;
  std::vector<TaskOut> outs;
  std::int64_t my_bytes = 0;
  auto tokenize_share = [&] {
    for (const SourceRange& r : rank_ranges(sources, rank, size)) {
      loaded.push_back(load_range(sources[r.source], r));
      my_bytes += static_cast<std::int64_t>(loaded.back().text.size());
    }
    tasks = make_tasks(sources, loaded);
    outs.resize(tasks.size());
    std::atomic<std::size_t> next{0};
    std::vector<std::string> start_errors(static_cast<std::size_t>(a.threads));
    auto work = [&](int id) {
      try {
        Worker w(a, sources, loaded, c, *tokenizer, instruct ? &chat : nullptr);
        for (std::size_t i; !c.stop && (i = next++) < tasks.size();) {
          try {
            w.run(tasks[i], outs[i]);
          } catch (const std::exception& e) {
            outs[i].error = e.what();
            c.stop = true;
          }
          ++c.tasks;
        }
      } catch (const std::exception& e) {
        start_errors[id] = e.what();
        c.stop = true;
      }
    };
    std::vector<std::thread> pool;
    const int n_threads = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(a.threads), std::max<std::size_t>(tasks.size(), 1)));
    for (int i = 0; i < n_threads; ++i) pool.emplace_back(work, i);
    // Rank 0 reports on long inputs: its own share, which is about 1/size of the whole.
    auto last = clock::now();
    while (rank == 0 && a.progress_every_s > 0 && c.tasks < static_cast<std::int64_t>(tasks.size()) && !c.stop) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const auto now = clock::now();
      if (std::chrono::duration<double>(now - last).count() < a.progress_every_s) continue;
      last = now;
      const double s = std::chrono::duration<double>(now - t0).count(), done = static_cast<double>(c.bytes);
      const double rate = done / std::max(s, 1e-9);
      std::printf("# prepare: %lld documents, %s of %s MB (rank 0's share, 1 of %d ranks x %d threads), %.2f MB/s, ETA %.0f s\n",
                  static_cast<long long>(c.docs.load()), mb(done).c_str(), mb(static_cast<double>(my_bytes)).c_str(),
                  size, n_threads, rate / 1e6, rate > 0 ? (static_cast<double>(my_bytes) - done) / rate : 0.0);
      std::fflush(stdout);
    }
    for (auto& t : pool) t.join();
    for (const auto& e : start_errors)
      if (!e.empty()) throw UserError(e);
    for (const auto& o : outs)
      if (!o.error.empty()) throw UserError(o.error);
  };
  agreed([&] {
    // Every rank reaches the quiet wait, failed or not, so none waits there alone.
    std::exception_ptr failed;
    try {
      tokenize_share();
    } catch (...) {
      failed = std::current_exception();
      c.stop = true;
    }
    hasher.join();
    // A rank done with its share leaves its core to the ranks and the checksum thread still working.
    runtime::quiet_barrier(world, "prepare.tokenized");
    if (failed) std::rethrow_exception(failed);
  });

  // ---- counts, offsets, per-source statistics and checksums ---------------------------
  std::vector<std::int64_t> stats(4 * ns, 0);  // train, val, docs, skipped
  std::vector<std::int64_t> mine = {0, 0}, counted = {0, 0};
  std::string first_bad;
  for (const auto& o : outs) {
    counted[0] += std::count(o.train_mask.begin(), o.train_mask.end(), std::uint8_t{1});
    counted[1] += std::count(o.val_mask.begin(), o.val_mask.end(), std::uint8_t{1});
  }
  std::vector<std::int64_t> all_counted = counted;
  runtime::sum(world, all_counted, "prepare.counts");
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const int src = loaded[tasks[i].loaded].source;
    stats[4 * src] += static_cast<std::int64_t>(outs[i].train.size());
    stats[4 * src + 1] += static_cast<std::int64_t>(outs[i].val.size());
    stats[4 * src + 2] += outs[i].docs;
    stats[4 * src + 3] += outs[i].skipped;
    mine[0] += static_cast<std::int64_t>(outs[i].train.size());
    mine[1] += static_cast<std::int64_t>(outs[i].val.size());
    if (first_bad.empty()) first_bad = outs[i].first_bad;
  }
  // Rows: this rank's row counts, and its JSONL sources' newlines (a rank's lines follow the lower
  // ranks' in each file: the ranges split files at line starts, in rank order).
  std::vector<std::int64_t> my_rows = {0, 0}, newlines(ns, 0);
  for (const auto& o : outs) {
    my_rows[0] += static_cast<std::int64_t>(o.train_rows.size());
    my_rows[1] += static_cast<std::int64_t>(o.val_rows.size());
  }
  for (const Loaded& l : loaded) newlines[l.source] += std::count(l.text.begin(), l.text.end(), '\n');
  const std::vector<std::int64_t> rows_before = runtime::exclusive_sum(world, my_rows, "prepare.offsets");
  const std::vector<std::int64_t> lines_before = runtime::exclusive_sum(world, newlines, "prepare.offsets");
  std::vector<std::int64_t> all_rows = my_rows;
  runtime::sum(world, all_rows, "prepare.counts");
  std::vector<std::int64_t> all_stats = stats, total = mine;
  runtime::sum(world, all_stats, "prepare.counts");
  const std::vector<std::int64_t> before = runtime::exclusive_sum(world, mine, "prepare.offsets");
  runtime::sum(world, total, "prepare.counts");
  agreed([&] {
    if (hash_error) std::rethrow_exception(hash_error);
  });
  all_hash = hash;
  runtime::bit_or(world, all_hash, "prepare.checksums");
  const int first_bad_rank = runtime::min(world, first_bad.empty() ? size : rank, "prepare.first_bad");
  if (first_bad_rank < size) runtime::broadcast(world, first_bad, first_bad_rank, "prepare.first_bad");

  TokenDatasetMeta meta;
  meta.tokenizer = tokenizer->name();
  meta.vocab_size = tokenizer->vocab_size();
  meta.dtype = dtype_for_vocab(meta.vocab_size);
  meta.eot_id = tokenizer->eot_id();
  meta.val_fraction = a.val_fraction;
  meta.train_tokens = total[0];
  meta.val_tokens = total[1];
  meta.rows = true;
  meta.row_kind = instruct ? "rows" : "documents";
  meta.train_rows = all_rows[0];
  meta.val_rows = all_rows[1];
  if (instruct) {
    meta.masked = true;
    meta.train_counted = all_counted[0];
    meta.val_counted = all_counted[1];
    meta.chat_format = chat.name;
    meta.split_rule = "per instruction row (a JSONL line): the whole row goes to val when fnv1a64(line bytes) / 2^64 "
                      "< val_fraction, else to train; rows rendered in the chat format and concatenated in order";
  }
  std::int64_t docs = 0, skipped = 0, in_bytes = 0;
  for (std::size_t i = 0; i < ns; ++i) {
    TokenSourceInfo s;
    s.name = sources[i].name;
    s.bytes = sources[i].bytes;
    s.fnv1a64 = hex64(all_hash[i]);
    s.train_tokens = all_stats[4 * i];
    s.val_tokens = all_stats[4 * i + 1];
    if (!sources[i].in_memory) {
      s.format = std::string(sources[i].format == CorpusFormat::Jsonl ? "jsonl" : "text") + (sources[i].gzip ? ".gz" : "");
      s.documents = all_stats[4 * i + 2];
      if (sources[i].format == CorpusFormat::Jsonl) s.skipped = all_stats[4 * i + 3];
    }
    docs += all_stats[4 * i + 2];
    skipped += all_stats[4 * i + 3];
    in_bytes += sources[i].bytes;
    meta.sources.push_back(s);
  }

  // ---- the splits: .tmp files at each rank's offset, renamed, meta.json last -----------
  const std::string train_tmp = a.out_dir + "/train.bin.tmp", val_tmp = a.out_dir + "/val.bin.tmp";
  agreed([&] {
    ST_USER_CHECK(meta.train_tokens >= kMinTrainTokens, "the sources give ", meta.train_tokens,
                  " training token(s) (", meta.tokenizer, " tokenizer, --val-fraction ", a.val_fraction,
                  "), fewer than the ", kMinTrainTokens, " of the shortest training sequence; nothing written to '",
                  a.out_dir, "'");
    ST_USER_CHECK(!instruct || meta.train_counted > 0, "data prepare: the training rows have no completion token to "
                  "train on (", meta.train_tokens, " tokens, none counted); nothing written to '", a.out_dir, "'");
    if (rank != 0) return;
    make_dirs(a.out_dir);
    std::error_code ec;
    for (const char* f : {"/train.bin", "/val.bin", "/meta.json", "/train.mask", "/val.mask", "/train.rows", "/val.rows"})
      io::check_output_path(a.out_dir + f, "data prepare output");
    for (const std::string& t : {train_tmp, val_tmp, a.out_dir + "/train.mask.tmp", a.out_dir + "/val.mask.tmp",
                                 a.out_dir + "/train.rows.tmp", a.out_dir + "/val.rows.tmp"})
      io::clear_temp_name(t, "data prepare output");
    fs::remove(a.out_dir + "/meta.json", ec);  // an older dataset here is no longer complete
    ST_USER_CHECK(!fs::exists(a.out_dir + "/meta.json", ec), "data prepare: cannot replace '", a.out_dir, "/meta.json'");
    if (!instruct)  // a mask left by an older instruction dataset here would no longer match
      for (const char* f : {"/train.mask", "/val.mask"}) fs::remove(a.out_dir + f, ec);
  });
  const int w = meta.bytes_per_token();
  std::string bytes;
  for (int split = 0; split < 2; ++split) {
    bytes.clear();
    for (const auto& o : outs) append_le(bytes, split == 0 ? o.train : o.val, w);
    write_at(split == 0 ? train_tmp : val_tmp, bytes, before[split] * w, world);
  }
  // The masks: one byte per token at the same token offsets.
  std::vector<std::pair<std::string, std::string>> renames = {{train_tmp, a.out_dir + "/train.bin"},
                                                              {val_tmp, a.out_dir + "/val.bin"}};
  if (instruct)
    for (int split = 0; split < 2; ++split) {
      bytes.clear();
      for (const auto& o : outs) {
        const auto& m = split == 0 ? o.train_mask : o.val_mask;
        bytes.append(reinterpret_cast<const char*>(m.data()), m.size());
      }
      const std::string fin = a.out_dir + (split == 0 ? "/train.mask" : "/val.mask");
      write_at(fin + ".tmp", bytes, before[split], world);
      renames.emplace_back(fin + ".tmp", fin);
    }
  for (int split = 0; split < 2; ++split) {
    const std::string fin = a.out_dir + (split == 0 ? "/train.rows" : "/val.rows");
    const std::vector<RowRecord> recs = rank_rows(split, before[split], tasks, outs, loaded, lines_before);
    write_at(fin + ".tmp", encode_rows(recs), rows_before[split] * kRowRecordBytes, world);
    renames.emplace_back(fin + ".tmp", fin);
  }
  std::string summary;
  agreed([&] {
    if (rank != 0) return;
    for (const auto& [tmp, fin] : renames) io::commit_temp(tmp, fin, "data prepare output");
    write_token_meta(a.out_dir, meta);
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    std::ostringstream os;
    os << ns << " source(s), " << docs << " document(s), " << in_bytes << " bytes -> " << meta.train_tokens
       << " train + " << meta.val_tokens << " val " << meta.tokenizer << " tokens (" << meta.dtype << ", vocab "
       << meta.vocab_size << ") in " << a.out_dir << "; " << size << " rank(s) x " << a.threads << " thread(s), "
       << (static_cast<double>(in_bytes) / 1e6) / s << " MB/s";
    if (instruct)
      os << "\ninstruction rows (" << meta.chat_format << "): " << meta.train_counted << " train + " << meta.val_counted
         << " val tokens counted in the loss (train.mask, val.mask)";
    if (skipped > 0) os << "\nskipped " << skipped << " malformed line(s) (--skip-bad); the first: " << first_bad;
    os << "\n" << packing_report(a.out_dir, kReportSeqLens);
    summary = os.str();
  });
  return summary;
}

}  // namespace shardtrain::data
