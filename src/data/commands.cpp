// The data subcommands' logic; src/cli/cmd_data.cpp only parses flags and calls these.
#include "shardtrain/data/commands.h"

#include <chrono>
#include <filesystem>
#include <sstream>

#include "shardtrain/data/austen.h"
#include "shardtrain/data/mnist.h"
#include "shardtrain/data/packing.h"
#include "shardtrain/data/paths.h"
#include "shardtrain/data/token_dataset.h"
#include "shardtrain/data/tokenizer.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/file_io.h"

namespace shardtrain::data {
namespace {
// UserError when writing `out` would replace the input `in` (same file by any path).
// `makes_dir`: the command creates out's directory itself (data prepare's --out), so only a
// directory that is already there is checked.
void refuse_overwrite(const std::string& what, const std::string& out, const std::string& in, bool makes_dir = false) {
  std::error_code ec;
  if (std::filesystem::exists(out, ec) && std::filesystem::exists(in, ec) && std::filesystem::equivalent(out, in, ec) &&
      !ec)
    throw UserError(what + ": the output '" + out + "' is the input '" + in +
                    "'; refusing to overwrite it: write to another path");
  std::error_code dir_ec;
  if (makes_dir && !std::filesystem::is_directory(io::parent_dir(out), dir_ec)) return;
  io::check_output_writable(out, what + " output");  // a planted link or device, no directory: refused up front
}
}  // namespace

std::string cmd_extract_austen(const std::string& data_dir, const std::string& out_dir) {
  std::string out = out_dir.empty() ? data_dir + "/austen" : out_dir;
  auto docs = extract_austen(austen_rdx_path(data_dir), out);
  std::ostringstream os;
  std::size_t total = 0;
  for (auto& d : docs) total += d.text.size();
  os << "wrote " << docs.size() << " novels (" << total << " bytes) to " << out;
  return os.str();
}

std::string cmd_prepare(const PrepareArgs& a) {
  ST_USER_CHECK(!a.sources.empty(), "data prepare: give --source austen|mnist|FILE...");
  ST_USER_CHECK(!a.out_dir.empty(), "data prepare: give --out DIR");
  ST_USER_CHECK(!a.val_fraction_given || (a.val_fraction >= 0 && a.val_fraction < 1),
                "data prepare: --val-fraction must be in [0, 1) (a fraction of each source held out for "
                "validation), got ", a.val_fraction);
  const bool mnist = a.sources.size() == 1 && a.sources[0] == "mnist";
  ST_USER_CHECK(!mnist || a.chat_format.empty(), "data prepare: --chat-format reads instruction rows from JSONL "
                "files; mnist is an image dataset");
  const double val_fraction = a.val_fraction_given ? a.val_fraction : mnist ? 0.2 : 0.05;
  std::ostringstream os;
  if (mnist) {
    auto digits = read_mnist_digits(mnist_digits_dir(a.data_dir));
    auto m = prepare_mnist_dataset(digits, a.out_dir, val_fraction);
    os << "mnist: " << m.train_count << " train / " << m.val_count << " val images of " << m.channels << "x"
       << m.height << "x" << m.width << " uint8 in " << a.out_dir;
    return os.str();
  }
  std::vector<TextDocument> docs;
  for (const auto& s : a.sources) {
    ST_USER_CHECK(s != "mnist", "data prepare: mnist cannot be mixed with text sources");
    if (s == "austen") {
      auto d = read_austen(austen_rdx_path(a.data_dir));
      docs.insert(docs.end(), d.begin(), d.end());
    } else {
      docs.push_back({std::filesystem::path(s).filename().string(), read_file(s, kMaxSourceBytes, "text source")});
    }
  }
  for (const auto& s : a.sources)
    for (const char* f : {"train.bin", "val.bin", "meta.json"})
      refuse_overwrite("data prepare", a.out_dir + "/" + f, s, /*makes_dir=*/true);
  auto tok = make_tokenizer(a.tokenizer, a.data_dir, a.tokenizer_options);
  std::size_t bytes = 0;
  for (auto& d : docs) bytes += d.text.size();
  auto t0 = std::chrono::steady_clock::now();
  auto m = prepare_token_dataset(docs, *tok, a.out_dir, val_fraction);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  os << docs.size() << " source(s), " << bytes << " bytes -> " << m.train_tokens << " train + " << m.val_tokens
     << " val " << m.tokenizer << " tokens (" << m.dtype << ", vocab " << m.vocab_size << ") in " << a.out_dir
     << "; " << (bytes / 1e6) / s << " MB/s\n"
     << packing_report(a.out_dir, kReportSeqLens);
  return os.str();
}

std::string cmd_encode(const std::string& data_dir, const std::string& tokenizer, const std::string& in,
                       const std::string& out, std::string dtype, const TokenizerOptions& options) {
  auto tok = make_tokenizer(tokenizer, data_dir, options);
  if (dtype.empty()) dtype = dtype_for_vocab(tok->vocab_size());
  refuse_overwrite("data encode", out, in);
  std::string text = read_file(in, kMaxSourceBytes, "text input");
  auto ids = tok->encode(text);
  write_ids(out, ids, dtype);
  std::ostringstream os;
  os << in << ": " << text.size() << " bytes -> " << ids.size() << " " << tokenizer << " tokens (" << dtype
     << ") in " << out;
  return os.str();
}

std::string cmd_decode(const std::string& data_dir, const std::string& tokenizer, const std::string& in,
                       const std::string& out, std::string dtype) {
  auto tok = make_tokenizer(tokenizer, data_dir);
  if (dtype.empty()) dtype = dtype_for_vocab(tok->vocab_size());
  refuse_overwrite("data decode", out, in);
  auto ids = read_ids(in, dtype);
  std::string text;
  try {
    text = tok->decode(ids);
  } catch (const UserError& e) {
    throw UserError("'" + in + "': " + e.what());
  }
  write_file(out, text.data(), text.size());
  std::ostringstream os;
  os << in << ": " << ids.size() << " tokens -> " << text.size() << " bytes in " << out;
  return os.str();
}

std::string cmd_info(const std::string& dir) {
  std::error_code ec;
  ST_USER_CHECK(std::filesystem::exists(dir + "/meta.json", ec), "'", dir,
                "/meta.json' not found: is '", dir, "' a dataset written by 'shardtrain data prepare'?");
  std::string meta = read_file(dir + "/meta.json", kMaxMetaBytes, "dataset meta.json");
  std::ostringstream os;
  if (meta.find(kImageFormat) != std::string::npos) {
    ImageDataset train(dir, "train"), val(dir, "val");
    os << dir << ": image dataset, " << train.size() << " train / " << val.size() << " val, "
       << train.meta().channels << "x" << train.meta().height << "x" << train.meta().width << ", "
       << train.meta().num_classes << " classes";
    return os.str();
  }
  TokenDataset train(dir, "train"), val(dir, "val");
  const auto& m = train.meta();
  os << dir << ": token dataset, tokenizer " << m.tokenizer << " (vocab " << m.vocab_size << ", " << m.dtype
     << "), " << train.size() << " train / " << val.size() << " val tokens, " << m.sources.size() << " source(s):";
  if (m.masked)  // instruction data: validated above (sizes, bytes, counts)
    os << "\n  loss mask (" << m.chat_format << "): " << m.train_counted << " train / " << m.val_counted
       << " val tokens counted";
  for (auto& s : m.sources) os << "\n  " << s.name << ": " << s.bytes << " bytes, fnv1a64 " << s.fnv1a64 << ", "
                               << s.train_tokens << " + " << s.val_tokens << " tokens";
  const std::string rows = packing_report(dir, kReportSeqLens);
  if (rows.empty()) os << "\n  no row boundaries (format version " << (m.masked ? 2 : 1)
                       << "): data.packing = \"stream\" only; prepare it again for packed / padded rows";
  else os << "\n" << rows;
  return os.str();
}

}  // namespace shardtrain::data
