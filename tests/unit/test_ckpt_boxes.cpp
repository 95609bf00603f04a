// flat_range_boxes exhaustively on small shapes; Digest's combining and sensitivity.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "shardtrain/ckpt/digest.h"
#include "shardtrain/ckpt/flat_boxes.h"

using namespace shardtrain::ckpt;

namespace {
// Row-major flat index of every element of a box, in row-major order of the box.
std::vector<int64_t> box_elements(const std::vector<int64_t>& shape, const Box& b) {
  std::vector<int64_t> out;
  const size_t nd = shape.size();
  if (nd == 0) return {0};
  std::vector<int64_t> idx(nd, 0);
  const int64_t n = b.numel();
  for (int64_t e = 0; e < n; ++e) {
    int64_t flat = 0;
    for (size_t d = 0; d < nd; ++d) flat = flat * shape[d] + b.start[d] + idx[d];
    out.push_back(flat);
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < b.count[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}
}  // namespace

TEST(CkptBoxes, EveryRangeOfSmallShapes) {
  const std::vector<std::vector<int64_t>> shapes = {
      {1}, {7}, {3, 4}, {1, 5}, {5, 1}, {2, 3, 4}, {3, 1, 2}, {2, 2, 2, 3}, {1, 1, 1}, {4, 3, 2, 1, 2}};
  int64_t ranges = 0;
  for (const auto& shape : shapes) {
    const int64_t n = shape_numel(shape);
    for (int64_t a = 0; a <= n; ++a)
      for (int64_t b = a; b <= n; ++b) {
        std::vector<Box> boxes = flat_range_boxes(shape, a, b);
        ASSERT_LE(boxes.size(), 2 * shape.size() - 1) << "[" << a << "," << b << ")";
        std::vector<int64_t> got;
        for (const Box& bx : boxes) {
          ASSERT_EQ(bx.start.size(), shape.size());
          for (size_t d = 0; d < shape.size(); ++d) {
            ASSERT_GE(bx.start[d], 0);
            ASSERT_GE(bx.count[d], 1);
            ASSERT_LE(bx.start[d] + bx.count[d], shape[d]);
          }
          auto e = box_elements(shape, bx);
          got.insert(got.end(), e.begin(), e.end());
        }
        // Boxes in order, elements in order: exactly a, a+1, ..., b-1.
        ASSERT_EQ(static_cast<int64_t>(got.size()), b - a) << "[" << a << "," << b << ")";
        for (int64_t i = 0; i < b - a; ++i) ASSERT_EQ(got[i], a + i) << "[" << a << "," << b << ") element " << i;
        ++ranges;
      }
  }
  EXPECT_GT(ranges, 1000);
}

TEST(CkptBoxes, WorstCaseUsesAllBoxesAndScalarsWork) {
  // [1, 35) of [3,3,4]: rest of row 0 (2 boxes), row 1 whole, start of row 2 (2 boxes).
  EXPECT_EQ(flat_range_boxes({3, 3, 4}, 1, 35).size(), 5u);
  EXPECT_EQ(flat_range_boxes({2, 3, 4}, 1, 23).size(), 4u);
  EXPECT_EQ(flat_range_boxes({}, 0, 1).size(), 1u);
  EXPECT_TRUE(flat_range_boxes({3, 0}, 0, 0).empty());
  EXPECT_ANY_THROW(flat_range_boxes({3, 4}, 5, 13));
}

TEST(CkptDigest, PiecesCombineAndChangesAreSeen) {
  std::mt19937 gen(7);
  std::vector<float> v(1001);
  for (auto& x : v) x = std::uniform_real_distribution<float>(-1, 1)(gen);
  Digest whole;
  whole.add(v.data(), 1001, 4, 0);
  for (int64_t cut : {0, 1, 3, 500, 1000, 1001}) {
    Digest a, b;
    a.add(v.data(), cut, 4, 0);
    b.add(v.data() + cut, 1001 - cut, 4, cut);
    Digest sum{a.sum + b.sum, a.weighted + b.weighted};
    EXPECT_EQ(sum, whole) << "cut " << cut;
  }
  // One flipped bit anywhere changes the digest; a swap of two words changes `weighted`.
  for (int byte : {0, 1, 2, 3, 401, 4003}) {
    std::vector<float> w = v;
    reinterpret_cast<unsigned char*>(w.data())[byte] ^= 0x10;
    Digest d;
    d.add(w.data(), 1001, 4, 0);
    EXPECT_NE(d, whole) << "byte " << byte;
  }
  std::vector<float> s = v;
  std::swap(s[10], s[20]);
  Digest d;
  d.add(s.data(), 1001, 4, 0);
  EXPECT_EQ(d.sum, whole.sum);
  EXPECT_NE(d.weighted, whole.weighted);
  // The documented formula, for 8-byte and 1-byte words.
  std::vector<int64_t> q = {5, -1, 1LL << 40};
  Digest di;
  di.add(q.data(), 3, 8, 0);
  uint64_t s1 = 5 + static_cast<uint64_t>(-1) + (1ULL << 40), s2 = 1 * 5 + 2 * static_cast<uint64_t>(-1) + 3 * (1ULL << 40);
  EXPECT_EQ(di.sum, s1);
  EXPECT_EQ(di.weighted, s2);
  std::vector<uint8_t> u = {1, 2, 255};
  Digest du;
  du.add(u.data(), 3, 1, 10);
  EXPECT_EQ(du.sum, 258u);
  EXPECT_EQ(du.weighted, 11u * 1 + 12u * 2 + 13u * 255);
}
