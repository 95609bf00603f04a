// view_snapshot / staged_snapshot: the engine's flat shards and optimizer state as FlatViews.
#include "shardtrain/ckpt/snapshot.h"

#include <cstring>

#include "shardtrain/util/error.h"

namespace shardtrain::ckpt {

Snapshot view_snapshot(fsdp::Engine& engine, fsdp::ShardedOptimizer& opt) {
  Snapshot s;
  s.state_names = opt.state_names();
  // ShardedOptimizer names its state arrays; the names identify the algorithm.
  s.optimizer = (s.state_names.size() == 2 && s.state_names[0] == "exp_avg") ? "adamw" : "sgd";
  s.optimizer_steps = opt.steps_taken();
  std::vector<fsdp::FlatParam*> flats = engine.flat_params();
  for (size_t i = 0; i < flats.size(); ++i) {
    fsdp::FlatParam& fp = *flats[i];
    ST_CHECK(fp.master.defined() && fp.master.scalar_type() == at::kFloat && fp.master.is_contiguous() &&
                 fp.master.numel() == fp.shard_numel && fp.master.device().is_cpu(),
             "flat param ", i, ": master is not a contiguous fp32 CPU shard of ", fp.shard_numel);
    FlatView v;
    for (const auto& slot : fp.slots) v.slots.push_back({slot.name, slot.shape, slot.offset, slot.numel});
    v.numel = fp.numel;
    v.padded = fp.padded;
    v.shard_numel = fp.shard_numel;
    v.shard_rank = fp.shard_rank;
    v.shard_size = fp.shard_size;
    v.shard_begin = static_cast<int64_t>(fp.shard_rank) * fp.shard_numel;
    v.master = fp.master.data_ptr<float>();
    for (size_t k = 0; k < s.state_names.size(); ++k) v.states.push_back(opt.state(i, k));
    s.flats.push_back(std::move(v));
  }
  return s;
}

Snapshot staged_snapshot(fsdp::Engine& engine, fsdp::ShardedOptimizer& opt, std::vector<std::vector<float>>& pool) {
  Snapshot s = view_snapshot(engine, opt);
  size_t next = 0;
  for (FlatView& v : s.flats) {
    auto stage = [&](float*& p) {
      if (pool.size() <= next) pool.emplace_back();
      std::vector<float>& buf = pool[next++];
      buf.resize(static_cast<size_t>(v.shard_numel));
      if (v.shard_numel) std::memcpy(buf.data(), p, static_cast<size_t>(v.shard_numel) * sizeof(float));
      p = buf.data();
    };
    stage(v.master);
    for (float*& p : v.states) stage(p);
  }
  pool.resize(next);
  return s;
}

int64_t snapshot_file_bytes(const Snapshot& s) {
  int64_t n = 0;
  for (const FlatView& v : s.flats) n += v.numel;
  return n * 4 * static_cast<int64_t>(1 + s.state_names.size());
}

}  // namespace shardtrain::ckpt
