// make_plan: layout agreement across ranks and each rank's pieces of every parameter.
#include "plan.h"

#include <hdf5.h>

#include <algorithm>
#include <functional>

#include "shardtrain/ckpt/format.h"
#include "shardtrain/ckpt/h5.h"
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::ckpt {

std::string model_path(const std::string& name) { return std::string(kModelGroup) + "/" + name; }
std::string optim_path(const std::string& state, const std::string& name) {
  return std::string(kOptimGroup) + "/" + state + "/" + name;
}

namespace {
uint64_t fnv(uint64_t h, const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
uint64_t layout_hash(const Snapshot& s) {
  uint64_t h = 1469598103934665603ull;
  auto i64 = [&](int64_t v) { h = fnv(h, &v, sizeof v); };
  auto str = [&](const std::string& v) { i64(static_cast<int64_t>(v.size())); h = fnv(h, v.data(), v.size()); };
  str(s.optimizer);
  for (auto& n : s.state_names) str(n);
  for (const FlatView& f : s.flats) {
    i64(f.numel); i64(f.padded); i64(f.shard_size);
    for (const SlotView& sl : f.slots) {
      str(sl.name); i64(sl.offset); i64(sl.numel);
      for (int64_t d : sl.shape) i64(d);
    }
  }
  return h;
}
Piece clip_to_slot(const SlotView& sl, int64_t begin, int64_t end, int64_t shard_begin) {
  int64_t a = std::max(begin, sl.offset), b = std::min(end, sl.offset + sl.numel);
  if (a >= b) return Piece{0, 0, 0};
  return Piece{a - sl.offset, b - sl.offset, a - shard_begin};
}
}  // namespace

std::vector<ParamPlan> make_plan(const Snapshot& snap, MPI_Comm world, bool split) {
  int rank = 0, size = 1;
  ST_MPI_CHECK(MPI_Comm_rank(world, &rank));
  ST_MPI_CHECK(MPI_Comm_size(world, &size));
  // A save's or a load's first exchanges.
  ST_CHECK(runtime::all_equal(world, layout_hash(snap), "plan"), "ranks disagree on the model's flat layout or optimizer; every rank must wrap the same model");

  const size_t nf = snap.flats.size();
  std::vector<int> mine(nf);
  for (size_t f = 0; f < nf; ++f) mine[f] = snap.flats[f].shard_rank;
  const std::vector<int> all = runtime::all_gather(world, mine, "plan");

  std::vector<ParamPlan> plan;
  for (size_t f = 0; f < nf; ++f) {
    const FlatView& v = snap.flats[f];
    // Replicas of this shard: ranks with the same shard position, in world-rank order.
    int R = 0, k = 0;
    for (int r = 0; r < size; ++r)
      if (all[static_cast<size_t>(r) * nf + f] == v.shard_rank) {
        if (r == rank) k = R;
        ++R;
      }
    const int64_t sb = v.shard_begin, se = sb + v.shard_numel, L = v.shard_numel;
    int64_t ob = sb, oe = se;
    if (split) {
      ob = sb + L * k / R;
      oe = sb + L * (k + 1) / R;
    } else if (k != 0) {
      oe = ob;
    }
    for (size_t s = 0; s < v.slots.size(); ++s) {
      ParamPlan p;
      p.flat = f;
      p.slot = s;
      p.name = v.slots[s].name;
      p.shape = v.slots[s].shape;
      p.own = clip_to_slot(v.slots[s], ob, oe, sb);
      p.shard = clip_to_slot(v.slots[s], sb, se, sb);
      plan.push_back(std::move(p));
    }
  }
  return plan;
}

void select_piece(hid_t space, const std::vector<int64_t>& shape, const Piece& p) {
  ST_H5_CHECK(H5Sselect_none(space));
  if (p.numel() == 0) return;
  if (shape.empty()) {
    ST_H5_CHECK(H5Sselect_all(space));
    return;
  }
  for (const Box& b : flat_range_boxes(shape, p.lo, p.hi)) {
    std::vector<hsize_t> start(b.start.begin(), b.start.end()), count(b.count.begin(), b.count.end());
    ST_H5_CHECK(H5Sselect_hyperslab(space, H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr));
  }
}

hid_t piece_mem_space(const Piece& p) {
  hsize_t n = static_cast<hsize_t>(std::max<int64_t>(p.numel(), 1));
  hid_t s = ST_H5_CHECK(H5Screate_simple(1, &n, nullptr));
  if (p.numel() == 0) ST_H5_CHECK(H5Sselect_none(s));
  return s;
}

}  // namespace shardtrain::ckpt
