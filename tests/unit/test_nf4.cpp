// NF4 codes (fsdp/nf4.h) against tests/python/nf4_reference.py, an independent PyTorch
// implementation of bitsandbytes' quantize_4bit / dequantize_4bit ("nf4") and its double
// quantization: codes, absmax and dequantized values in fp32, bf16 and fp16, bit for bit, on
// random blocks, blocks of zeros, outliers, values on the midpoints, short last blocks and odd
// lengths. The cases are written by the reference (CTest fixture) to $SHARDTRAIN_NF4_CASES.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardtrain/fsdp/nf4.h"

namespace nf4 = shardtrain::fsdp::nf4;

namespace {

std::string cases_dir() {
  const char* d = std::getenv("SHARDTRAIN_NF4_CASES");
  return d ? d : "";
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// A file of the reference's as a tensor of `dtype` (raw little-endian values).
at::Tensor read_tensor(const std::string& path, at::ScalarType dtype) {
  std::vector<char> b = read_bytes(path);
  const int64_t n = static_cast<int64_t>(b.size()) / static_cast<int64_t>(c10::elementSize(dtype));
  at::Tensor t = at::empty({n}, at::TensorOptions().dtype(dtype));
  std::memcpy(t.data_ptr(), b.data(), b.size());
  return t;
}

// Equal bits (not values: -0.0 and 0.0 differ, NaN equals itself).
void expect_same_bits(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  const at::Tensor g = got.contiguous(), w = want.contiguous();
  const size_t bytes = static_cast<size_t>(g.numel()) * c10::elementSize(g.scalar_type());
  if (std::memcmp(g.data_ptr(), w.data_ptr(), bytes) == 0) return;
  int64_t first = -1, count = 0;
  const auto* gp = static_cast<const unsigned char*>(g.data_ptr());
  const auto* wp = static_cast<const unsigned char*>(w.data_ptr());
  const size_t es = c10::elementSize(g.scalar_type());
  for (int64_t i = 0; i < g.numel(); ++i)
    if (std::memcmp(gp + i * es, wp + i * es, es) != 0) {
      if (first < 0) first = i;
      ++count;
    }
  ADD_FAILURE() << what << ": " << count << " of " << g.numel() << " elements differ, the first at " << first
                << " (got " << g[first].item<double>() << ", want " << w[first].item<double>() << ")";
}

at::ScalarType dtype_of(const std::string& name) {
  if (name == "bf16") return at::kBFloat16;
  if (name == "fp16") return at::kHalf;
  return at::kFloat;
}

}  // namespace

TEST(Nf4, LevelsAreTheQloraPapersAndSorted) {
  EXPECT_EQ(nf4::kLevels.front(), -1.0f);
  EXPECT_EQ(nf4::kLevels[7], 0.0f);
  EXPECT_EQ(nf4::kLevels.back(), 1.0f);
  for (size_t i = 1; i < nf4::kLevels.size(); ++i) EXPECT_LT(nf4::kLevels[i - 1], nf4::kLevels[i]);
}

TEST(Nf4, PackingHighNibbleFirstAndAShortLastBlock) {
  // absmax 2 in the first block of 4, 0.5 in the short one: values on levels dequantize exactly.
  at::Tensor x = at::tensor({2.0f, -2.0f, 0.0f, 2.0f * nf4::kLevels[12], 0.5f}, at::kFloat);
  nf4::Codes c = nf4::quantize(x, 4);
  ASSERT_EQ(c.packed.numel(), 3);
  EXPECT_EQ(c.packed[0].item<int>(), 0xF0);  // 1.0 -> 15 (high), -1.0 -> 0 (low)
  EXPECT_EQ(c.packed[1].item<int>(), 0x7C);  // 0.0 -> 7, level 12
  EXPECT_EQ(c.packed[2].item<int>(), 0xF7);  // 1.0 of the short block, then the pad (7)
  EXPECT_TRUE(at::equal(c.absmax, at::tensor({2.0f, 0.5f}, at::kFloat)));
  EXPECT_TRUE(at::equal(nf4::dequantize(c, 5, 4, at::kFloat), x));
}

TEST(Nf4, DynamicMapIsSortedSignedAndSpansMinusOneToOne) {
  const at::Tensor& m = nf4::dynamic_map();
  ASSERT_EQ(m.numel(), 256);
  EXPECT_EQ(m[255].item<float>(), 1.0f);
  EXPECT_TRUE(at::all(m.narrow(0, 1, 255) > m.narrow(0, 0, 255)).item<bool>());
  EXPECT_LT(m[0].item<float>(), -0.99f);
}

TEST(Nf4, SameBitsAsTheReference) {
  const std::string dir = cases_dir();
  if (dir.empty()) GTEST_SKIP() << "SHARDTRAIN_NF4_CASES unset (no Python with torch: the reference did not run)";
  std::ifstream mf(dir + "/manifest.json");
  ASSERT_TRUE(mf.good()) << dir << "/manifest.json";
  const nlohmann::json manifest = nlohmann::json::parse(mf);
  expect_same_bits(nf4::dynamic_map(), read_tensor(dir + "/dynamic_map.f32", at::kFloat), "dynamic map");
  int checked = 0;
  for (const auto& c : manifest["cases"]) {
    const std::string name = c["name"], p = dir + "/" + name;
    const int64_t n = c["n"], block = c["block"];
    const at::ScalarType in = dtype_of(c["input_dtype"]);
    at::Tensor x = read_tensor(p + ".input", in == at::kFloat ? at::kInt : at::kShort).view(in);
    ASSERT_EQ(x.numel(), n) << name;
    nf4::Codes q = nf4::quantize(x, block);
    expect_same_bits(q.packed, read_tensor(p + ".codes", at::kByte), name + " codes");
    expect_same_bits(q.absmax, read_tensor(p + ".absmax", at::kFloat), name + " absmax");
    for (const char* dt : {"fp32", "bf16", "fp16"}) {
      const at::ScalarType t = dtype_of(dt);
      at::Tensor want = read_tensor(p + ".values_" + dt, t == at::kFloat ? at::kInt : at::kShort).view(t);
      expect_same_bits(nf4::dequantize(q, n, block, t), want, name + " values " + dt);
    }
    nf4::DoubleQuant dq = nf4::quantize_absmax(q.absmax);
    expect_same_bits(dq.codes, read_tensor(p + ".dq_codes", at::kByte), name + " double-quant codes");
    expect_same_bits(dq.absmax2, read_tensor(p + ".dq_absmax2", at::kFloat), name + " double-quant absmax");
    expect_same_bits(dq.offset.reshape(1), read_tensor(p + ".dq_offset", at::kFloat), name + " double-quant offset");
    expect_same_bits(nf4::dequantize_absmax(dq), read_tensor(p + ".dq_absmax", at::kFloat), name + " absmax back");
    ++checked;
  }
  for (const auto& s : manifest["stats"]) {
    const std::string name = s["name"], p = dir + "/" + name;
    nf4::DoubleQuant dq = nf4::quantize_absmax(read_tensor(p + ".absmax", at::kFloat));
    expect_same_bits(dq.codes, read_tensor(p + ".dq_codes", at::kByte), name + " codes");
    expect_same_bits(dq.absmax2, read_tensor(p + ".dq_absmax2", at::kFloat), name + " absmax2");
    expect_same_bits(dq.offset.reshape(1), read_tensor(p + ".dq_offset", at::kFloat), name + " offset");
    expect_same_bits(nf4::dequantize_absmax(dq), read_tensor(p + ".dq_absmax", at::kFloat), name + " back");
  }
  EXPECT_GE(checked, 9);
}
