// The wire formats of DiLoCo's outer gradients (quantize.h, collectives.h wire_average): the
// int4 round trip within half a step of each block, its packed layout (hand-computed bytes),
// the int8 bytes of the ZeRO++ paths unchanged by the generalisation (against the original
// algorithm, kept here), the group average in each format against a reference every rank
// computes itself (quantized: every rank's dequantized vector summed in rank order, bit for
// bit, the same bits on every rank; fp32 with `tree`: the pairwise tree sum), and the bytes
// helper against what the engine's byte counters (CountingComm) count.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <memory>
#include <vector>

#include "collectives.h"
#include "counting_comm.h"
#include "shardtrain/comm/comm.h"
#include "shardtrain/fsdp/quantize.h"
#include "shardtrain/util/error.h"

using namespace shardtrain;
using fsdp::QuantBits;
using fsdp::WireFormat;

namespace {

int world_rank() { int r; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }

std::unique_ptr<comm::Comm> world_comm() {
  comm::CommOptions o;
  o.timeout_s = 120;
  return comm::make_mpi_comm(MPI_COMM_WORLD, "world", o);
}

// Random values with an outlier and an all-zero tail (blocks of very different steps).
at::Tensor values(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor x = at::normal(0.0, 1.0, {n}, gen).to(at::kFloat);
  if (n > 10) {
    x[3] = 250.0f;
    x.narrow(0, n - 5, 5).zero_();
  }
  return x;
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  at::Tensor ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.numel() * ac.element_size()) == 0;
}

// The same bytes, whatever the dtypes.
bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor ac = a.contiguous(), bc = b.contiguous();
  const int64_t na = ac.numel() * ac.element_size(), nb = bc.numel() * bc.element_size();
  return na == nb && std::memcmp(ac.data_ptr(), bc.data_ptr(), na) == 0;
}

std::vector<uint8_t> bytes_of(const at::Tensor& packed) {
  const auto* p = packed.data_ptr<uint8_t>();
  return std::vector<uint8_t>(p, p + packed.numel());
}

// ---- int4 ---------------------------------------------------------------------------

TEST(Int4, RoundTripWithinHalfAStepOfEachBlock) {
  int checked = 0;
  for (int64_t block : {1, 7, 32, 64, 255}) {
    for (int64_t n : {1, 2, 7, 33, 1001, 4099}) {
      SCOPED_TRACE("n " + std::to_string(n) + " block " + std::to_string(block));
      at::Tensor x = values(n, 11 + n * 7 + block);
      const int64_t nb = (n + block - 1) / block;
      at::Tensor packed = at::empty({fsdp::quantized_bytes(n, block, QuantBits::Int4)}, at::kByte);
      ASSERT_EQ(packed.numel() % 4, 0);
      ASSERT_EQ(packed.numel(), ((n + 1) / 2 + 3) / 4 * 4 + 4 * nb);
      packed.fill_(0xAB);  // the pad must be written, not left
      fsdp::quantize_into(x, packed, block, QuantBits::Int4);
      const int64_t m = (n + 1) / 2, cb = (m + 3) / 4 * 4;
      EXPECT_TRUE(at::equal(packed.narrow(0, m, cb - m), at::zeros({cb - m}, at::kByte)));
      // Every nibble in [1, 15] (excess-8 of [-7, 7]); an odd n's last high nibble is 8.
      at::Tensor b = packed.narrow(0, 0, m).to(at::kInt);
      at::Tensor lo = b.remainder(16), hi = b.div(16, "floor");
      EXPECT_TRUE(((lo >= 1) & (lo <= 15) & (hi >= 1) & (hi <= 15)).all().item<bool>());
      if (n % 2) { EXPECT_EQ(hi[m - 1].item<int>(), 8); }
      at::Tensor y = fsdp::dequantize(packed, n, block, QuantBits::Int4);
      at::Tensor scales = fsdp::packed_scales(packed, n, block, QuantBits::Int4);
      ASSERT_EQ(scales.numel(), nb);
      for (int64_t k = 0; k < nb; ++k) {
        const int64_t lo_i = k * block, len = std::min(block, n - lo_i);
        const float amax = x.narrow(0, lo_i, len).abs().max().item<float>();
        const float s = scales[k].item<float>();
        EXPECT_FLOAT_EQ(s, amax / 7.0f) << "block " << k;
        const float err = (x.narrow(0, lo_i, len) - y.narrow(0, lo_i, len)).abs().max().item<float>();
        // Half a step, plus the fp32 rounding of code * scale.
        EXPECT_LE(err, s / 2 * (1 + 1e-5f) + 1e-30f) << "block " << k;
        // The block's largest value is exact up to rounding: its code is +-7.
        if (amax > 0) { EXPECT_NEAR(y.narrow(0, lo_i, len).abs().max().item<float>(), amax, amax * 1e-6f); }
        ++checked;
      }
      if (n > 10) { EXPECT_TRUE(at::equal(y.narrow(0, n - 5, 5), at::zeros({5}))); }
      // Into a bf16 buffer: the fp32 dequantization, cast once.
      at::Tensor h = at::empty({n}, at::kBFloat16);
      fsdp::dequantize_into(packed, n, block, h, QuantBits::Int4);
      EXPECT_TRUE(at::equal(h, y.to(at::kBFloat16)));
      // It did quantize (int4 is coarse: a random block loses something).
      if (n > 10) { EXPECT_GT((x - y).abs().max().item<float>(), 0.0f); }
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(Int4, HandComputedBytesAndAllZeroBlocks) {
  // Block 4, n 5 (odd: half a byte of padding, then a pad byte to 4): block 0 has s = 7/7 = 1,
  // codes 1, -3, 0, 7; block 1 s = 2/7, code 7. Excess-8 nibbles 9, 5, 8, 15 | 15, pad 8.
  at::Tensor x = at::tensor({1.0f, -3.0f, 0.4f, 7.0f, 2.0f});
  at::Tensor p = at::empty({fsdp::quantized_bytes(5, 4, QuantBits::Int4)}, at::kByte);
  ASSERT_EQ(p.numel(), 4 + 2 * 4);
  fsdp::quantize_into(x, p, 4, QuantBits::Int4);
  const float s1 = 2.0f / 7.0f, one = 1.0f;
  std::vector<uint8_t> want = {9 + 16 * 5, 8 + 16 * 15, 15 + 16 * 8, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  std::memcpy(&want[4], &one, 4);
  std::memcpy(&want[8], &s1, 4);
  EXPECT_EQ(bytes_of(p), want);
  at::Tensor y = fsdp::dequantize(p, 5, 4, QuantBits::Int4);
  EXPECT_TRUE(at::equal(y, at::tensor({1.0f, -3.0f, 0.0f, 7.0f, 7 * s1})));

  // All-zero blocks: codes 0 (nibble 8), scale 0, values 0; beside a non-zero block.
  at::Tensor z = at::zeros({100});
  z.narrow(0, 40, 10).fill_(-0.5f);
  p = at::empty({fsdp::quantized_bytes(100, 32, QuantBits::Int4)}, at::kByte);
  fsdp::quantize_into(z, p, 32, QuantBits::Int4);
  EXPECT_TRUE(at::equal(fsdp::dequantize(p, 100, 32, QuantBits::Int4), z));
  EXPECT_TRUE(at::equal(fsdp::packed_scales(p, 100, 32, QuantBits::Int4),
                        at::tensor({0.0f, 0.5f / 7, 0.0f, 0.0f})));
  EXPECT_TRUE(at::equal(p.narrow(0, 0, 16), at::full({16}, 8 + 16 * 8, at::kByte)));
  // A NaN makes its block NaN after the round trip (never a silently finite value).
  at::Tensor w = at::ones({64});
  w[40] = std::nanf("");
  p = at::empty({fsdp::quantized_bytes(64, 32, QuantBits::Int4)}, at::kByte);
  fsdp::quantize_into(w, p, 32, QuantBits::Int4);
  at::Tensor v = fsdp::dequantize(p, 64, 32, QuantBits::Int4);
  EXPECT_TRUE(at::equal(v.narrow(0, 0, 32), w.narrow(0, 0, 32)));
  EXPECT_TRUE(at::isnan(v.narrow(0, 32, 32)).all().item<bool>());
}

// ---- int8 unchanged -----------------------------------------------------------------

// The int8 quantizer as it was before int4 joined it (commit e1fec25), kept verbatim in
// substance: the codes and scales the ZeRO++ paths put on the wire.
void original_int8(const at::Tensor& x, int64_t block, at::Tensor& codes, at::Tensor& scales) {
  const int64_t n = x.numel(), nb = (n + block - 1) / block;
  at::Tensor v = x.reshape({n}).to(at::kFloat);
  if (nb * block != n) v = at::constant_pad_nd(v, {0, nb * block - n}, 0);
  v = v.view({nb, block});
  at::Tensor amax = v.abs().amax({1}, /*keepdim=*/true);
  scales = (amax / 127.0f).view({nb});
  at::Tensor inv = at::where(amax > 0, 127.0f / amax, at::zeros_like(amax));
  codes = (v * inv).round_().clamp_(-127, 127).to(at::kChar).view({nb * block}).narrow(0, 0, n).contiguous();
}

TEST(Int8, BytesUnchangedByTheGeneralisation) {
  for (int64_t block : {1, 8, 64, 256}) {
    for (int64_t n : {1, 7, 1000, 4099}) {
      SCOPED_TRACE("n " + std::to_string(n) + " block " + std::to_string(block));
      for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
        at::Tensor x = values(n, 5 + n + block).to(dt);
        at::Tensor codes, scales;
        original_int8(x, block, codes, scales);
        const int64_t P = fsdp::quantized_bytes(n, block);
        ASSERT_EQ(P, (n + 3) / 4 * 4 + 4 * ((n + block - 1) / block));
        ASSERT_EQ(fsdp::quantized_bytes(n, block, QuantBits::Int8), P);
        at::Tensor by_default = at::empty({P}, at::kByte), by_name = at::empty({P}, at::kByte);
        fsdp::quantize_into(x, by_default, block);
        fsdp::quantize_into(x, by_name, block, QuantBits::Int8);
        for (const at::Tensor& p : {by_default, by_name}) {
          EXPECT_TRUE(same_bytes(p.narrow(0, 0, n), codes));
          EXPECT_TRUE(same_bits(fsdp::packed_scales(p, n, block), scales));
          EXPECT_TRUE(same_bits(fsdp::dequantize(p, n, block), fsdp::dequantize(p, n, block, QuantBits::Int8)));
        }
      }
    }
  }
  // Hand-computed: block 4, s = 4/127, codes round(x * 127 / 4) = 32, -95, 16, 127.
  at::Tensor p = at::empty({8}, at::kByte);
  fsdp::quantize_into(at::tensor({1.0f, -3.0f, 0.5f, 4.0f}), p, 4);
  const float s = 4.0f / 127.0f;
  std::vector<uint8_t> want = {32, 256 - 95, 16, 127, 0, 0, 0, 0};
  std::memcpy(&want[4], &s, 4);
  EXPECT_EQ(bytes_of(p), want);
}

// ---- wire formats -------------------------------------------------------------------

TEST(WireFormat, NamesFollowTheDeckChoicesAndBytesFollowTheRingModel) {
  EXPECT_EQ(fsdp::parse_wire_format("fp32"), WireFormat::Fp32);
  EXPECT_EQ(fsdp::parse_wire_format("bf16"), WireFormat::Bf16);
  EXPECT_EQ(fsdp::parse_wire_format("int8"), WireFormat::Int8);
  EXPECT_EQ(fsdp::parse_wire_format("int4"), WireFormat::Int4);
  for (WireFormat f : {WireFormat::Fp32, WireFormat::Bf16, WireFormat::Int8, WireFormat::Int4})
    EXPECT_EQ(fsdp::parse_wire_format(fsdp::wire_format_name(f)), f);
  try {
    fsdp::parse_wire_format("int2");
    ADD_FAILURE() << "int2 accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("'int2' (fp32, bf16, int8, int4)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fsdp::quant_bits(WireFormat::Bf16), Error);
  // 4 ranks, 1000 values, blocks of 64 (16 scales): hand-computed ring bytes.
  EXPECT_EQ(fsdp::wire_average_bytes_sent(1000, WireFormat::Fp32, 64, 4), 2.0 * 3 / 4 * 4000);
  EXPECT_EQ(fsdp::wire_average_bytes_sent(1000, WireFormat::Bf16, 64, 4), 2.0 * 3 / 4 * 2000);
  EXPECT_EQ(fsdp::wire_average_bytes_sent(1000, WireFormat::Int8, 64, 4), 3.0 * (1000 + 64));
  EXPECT_EQ(fsdp::wire_average_bytes_sent(1000, WireFormat::Int4, 64, 4), 3.0 * (500 + 64));
  EXPECT_EQ(fsdp::wire_average_bytes_sent(1000, WireFormat::Int4, 64, 4, true), 3.0 * (500 + 64) + 6000);
  EXPECT_EQ(fsdp::wire_average_bytes_sent(1000, WireFormat::Fp32, 64, 4, true), 6000);  // no second one
  EXPECT_EQ(fsdp::wire_average_bytes_sent(1000, WireFormat::Int4, 64, 1), 0);
}

// Every rank's input: seeded by the rank, so each rank can compute the others' too.
at::Tensor rank_input(int r, int64_t n) { return values(n, 1000 + 31 * r + n).mul_(0.01f * (r + 1)); }

// The result's bits on every rank equal rank 0's.
void expect_same_on_every_rank(const at::Tensor& t) {
  at::Tensor root = t.clone();
  MPI_Bcast(root.data_ptr(), static_cast<int>(root.numel() * root.element_size()), MPI_BYTE, 0, MPI_COMM_WORLD);
  EXPECT_TRUE(same_bits(t, root)) << "rank " << world_rank() << " differs from rank 0";
}

TEST(WireAverage, QuantizedIsTheRankOrderSumOfTheDequantizedVectors) {
  auto group = world_comm();
  const int R = group->size();
  for (WireFormat f : {WireFormat::Int8, WireFormat::Int4}) {
    const QuantBits bits = fsdp::quant_bits(f);
    for (int64_t block : {7, 64}) {
      for (int64_t n : {1, 33, 4099}) {
        SCOPED_TRACE(std::string(fsdp::wire_format_name(f)) + " n " + std::to_string(n) + " block " +
                     std::to_string(block));
        at::Tensor x = rank_input(group->rank(), n), before = x.clone();
        fsdp::WireAverage a = fsdp::wire_average(*group, x, f, block, /*exact=*/true);
        x.fill_(-1);  // read at the call only
        a.wait();
        const at::Tensor avg = a.average();
        ASSERT_EQ(avg.numel(), n);
        // The reference: every rank's vector packed here, dequantized, summed in rank order.
        at::Tensor sum = at::zeros({n});
        at::Tensor exact = at::zeros({n}, at::kDouble), bound = at::zeros({n});
        for (int r = 0; r < R; ++r) {
          at::Tensor xr = rank_input(r, n);
          at::Tensor p = at::empty({fsdp::quantized_bytes(n, block, bits)}, at::kByte);
          fsdp::quantize_into(xr, p, block, bits);
          sum.add_(fsdp::dequantize(p, n, block, bits));
          exact.add_(xr.to(at::kDouble));
          at::Tensor s = fsdp::packed_scales(p, n, block, bits);
          bound.add_(s.repeat_interleave(block).narrow(0, 0, n) / 2);
        }
        EXPECT_TRUE(same_bits(avg, sum.div_(static_cast<double>(R))));
        expect_same_on_every_rank(avg);
        // Within the mean of the ranks' half steps of the exact average.
        at::Tensor err = (avg.to(at::kDouble) - exact / R).abs();
        at::Tensor allowed = (bound / R).to(at::kDouble) * (1 + 1e-5) + exact.abs() / R * 1e-6 + 1e-12;
        EXPECT_TRUE((err <= allowed).all().item<bool>());
        // The guard's exact average: the plain fp32 all-reduce of the inputs.
        at::Tensor plain = before.clone();
        group->all_reduce(plain, comm::ReduceOp::Avg)->wait();
        EXPECT_TRUE(same_bits(a.exact_average(), plain));
        EXPECT_TRUE(same_bits(before, rank_input(group->rank(), n)));
      }
    }
  }
}

// A replicate-like group inside the world (at 4 ranks: {0, 2} and {1, 3}): the rank order is
// the group's, and the two groups' averages differ.
TEST(WireAverage, SubgroupSumsInItsOwnRankOrder) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  if (W != 4) GTEST_SKIP() << "two groups of 2 in 4 ranks";
  MPI_Comm pair;
  ASSERT_EQ(MPI_Comm_split(MPI_COMM_WORLD, world_rank() % 2, world_rank(), &pair), MPI_SUCCESS);
  {
    comm::CommOptions o;
    o.timeout_s = 120;
    auto group = comm::make_mpi_comm(pair, "pair", o);
    ASSERT_EQ(group->size(), 2);
    const int64_t n = 3001, block = 32;
    const std::vector<int> members = {world_rank() % 2, world_rank() % 2 + 2};  // group rank order
    fsdp::WireAverage a = fsdp::wire_average(*group, rank_input(world_rank(), n), WireFormat::Int4, block);
    a.wait();
    at::Tensor sum = at::zeros({n});
    for (int w : members) {
      at::Tensor p = at::empty({fsdp::quantized_bytes(n, block, QuantBits::Int4)}, at::kByte);
      fsdp::quantize_into(rank_input(w, n), p, block, QuantBits::Int4);
      sum.add_(fsdp::dequantize(p, n, block, QuantBits::Int4));
    }
    EXPECT_TRUE(same_bits(a.average(), sum.div_(2.0)));
  }
  MPI_Comm_free(&pair);
}

// The pairwise tree of Comm::all_reduce_tree ((0+1)+(2+3)), computed here.
at::Tensor tree_sum(int lo, int hi, int64_t n) {
  if (hi - lo == 1) return rank_input(lo, n);
  const int mid = (lo + hi) / 2;
  return tree_sum(lo, mid, n) + tree_sum(mid, hi, n);
}

TEST(WireAverage, Fp32AndBf16) {
  auto group = world_comm();
  const int R = group->size();
  for (int64_t n : {1, 1001, 70001}) {
    SCOPED_TRACE("n " + std::to_string(n));
    at::Tensor x = rank_input(group->rank(), n);
    // fp32: the plain all-reduce average, and no second collective for the guard.
    fsdp::WireAverage a = fsdp::wire_average(*group, x, WireFormat::Fp32, 64, /*exact=*/true);
    EXPECT_EQ(a.exact_work, nullptr);
    a.wait();
    at::Tensor plain = x.clone();
    group->all_reduce(plain, comm::ReduceOp::Avg)->wait();
    EXPECT_TRUE(same_bits(a.average(), plain));
    EXPECT_TRUE(same_bits(a.exact_average(), plain));
    expect_same_on_every_rank(a.average());
    // fp32 with `tree`: the pairwise tree sum every rank computes here, divided by R.
    fsdp::WireAverage t = fsdp::wire_average(*group, x, WireFormat::Fp32, 64, false, /*tree=*/true);
    t.wait();
    const at::Tensor want = tree_sum(0, R, n).div_(static_cast<double>(R));
    EXPECT_TRUE(same_bits(t.average(), want));
    // bf16: the inputs rounded to bf16, averaged; within bf16's rounding of the fp32 average.
    fsdp::WireAverage b = fsdp::wire_average(*group, x, WireFormat::Bf16, 64, /*exact=*/true);
    b.wait();
    const at::Tensor bavg = b.average();
    EXPECT_EQ(bavg.scalar_type(), at::kFloat);
    EXPECT_TRUE(same_bits(b.exact_average(), plain));
    expect_same_on_every_rank(bavg);
    auto [e2, r2] = fsdp::squared_error_and_reference(bavg, plain);
    const double rel = fsdp::relative_error(e2, r2);
    EXPECT_LT(rel, 1e-2);
    EXPECT_GT(rel, 0);  // it did round
    // bf16 with `tree`: the tree sum of the bf16 inputs (summed in fp32 per the comm contract,
    // rounded to bf16), divided by R in fp32.
    fsdp::WireAverage bt = fsdp::wire_average(*group, x, WireFormat::Bf16, 64, false, /*tree=*/true);
    bt.wait();
    at::Tensor bsum = bt.wire.to(at::kFloat);
    EXPECT_TRUE(same_bits(bt.average(), bsum.div(static_cast<double>(R))));
    EXPECT_LT((bt.average() - want).abs().max().item<float>(), 1e-2 * want.abs().max().item<float>() + 1e-6f);
  }
  // Small integers: every format's rounding and order vanish; all four give the exact mean.
  const int64_t n = 999;
  at::Tensor ints = ((at::arange(n, at::kLong) * 3 + group->rank() * 7) % 11 - 5).to(at::kFloat).mul_(R);
  at::Tensor want = at::zeros({n});
  for (int r = 0; r < R; ++r) want.add_(((at::arange(n, at::kLong) * 3 + r * 7) % 11 - 5).to(at::kFloat));
  for (WireFormat f : {WireFormat::Fp32, WireFormat::Bf16})
    for (bool tree : {false, true}) {
      fsdp::WireAverage a = fsdp::wire_average(*group, ints, f, 64, false, tree);
      a.wait();
      EXPECT_TRUE(same_bits(a.average(), want)) << fsdp::wire_format_name(f) << " tree " << tree;
    }
}

TEST(WireAverage, BytesHelperMatchesTheEngineCounters) {
  auto inner = world_comm();
  fsdp::ByteCounters counters;
  // Each rank its own host: at more than one rank every byte crosses a "node".
  fsdp::CountingComm group(*inner, world_rank(), c10::Device(at::kCPU), counters);
  const int R = group.size();
  for (WireFormat f : {WireFormat::Fp32, WireFormat::Bf16, WireFormat::Int8, WireFormat::Int4}) {
    for (int64_t n : {1, 1001, 4099}) {
      for (bool exact : {false, true}) {
        for (bool tree : {false, true}) {
          SCOPED_TRACE(std::string(fsdp::wire_format_name(f)) + " n " + std::to_string(n) +
                       (exact ? " exact" : "") + (tree ? " tree" : ""));
          const int64_t before = counters.intra + counters.inter;
          fsdp::WireAverage a = fsdp::wire_average(group, rank_input(group.rank(), n), f, 64, exact, tree);
          a.wait();
          const int64_t sent = counters.intra + counters.inter - before;
          EXPECT_EQ(static_cast<double>(sent), fsdp::wire_average_bytes_sent(n, f, 64, R, exact));
          if (R > 1) { EXPECT_GT(sent, 0); }
        }
      }
    }
  }
  if (R > 1) { EXPECT_TRUE(group.successor_remote()); }
  // int4 moves fewer bytes than int8, int8 fewer than bf16, bf16 fewer than fp32 (ring bytes
  // at 4 ranks: int4's all-gather sends (R-1)/R * R = 3 packed vectors of ~n/2 bytes, fp32's
  // all-reduce 1.5 x 4n).
  const int64_t n = 1 << 20;
  EXPECT_LT(fsdp::wire_average_bytes_sent(n, WireFormat::Int4, 64, 4),
            0.6 * fsdp::wire_average_bytes_sent(n, WireFormat::Int8, 64, 4));
  EXPECT_LT(fsdp::wire_average_bytes_sent(n, WireFormat::Int4, 64, 4),
            0.3 * fsdp::wire_average_bytes_sent(n, WireFormat::Fp32, 64, 4));
}

}  // namespace
