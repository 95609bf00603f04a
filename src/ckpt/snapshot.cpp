// view_snapshot / staged_snapshot: the engine's flat shards and optimizer state as FlatViews.
#include "shardtrain/ckpt/snapshot.h"

#include <algorithm>
#include <cstring>

#include "shardtrain/util/error.h"

namespace shardtrain::ckpt {

namespace {

// Whether the checkpoint holds flat fp (all but the frozen ones of an adapter run).
bool in_checkpoint(const fsdp::Engine& engine, const fsdp::FlatParam& fp) {
  return !fp.frozen() || engine.options().checkpoint_frozen;
}

// The layout of every flat shard a checkpoint holds, without data pointers.
Snapshot layout_snapshot(fsdp::Engine& engine, fsdp::ShardedOptimizer& opt) {
  Snapshot s;
  s.state_names = opt.state_names();
  // ShardedOptimizer names its state arrays; the names identify the algorithm.
  s.optimizer = (s.state_names.size() == 2 && s.state_names[0] == "exp_avg") ? "adamw" : "sgd";
  // The engine's own per-flat state after the optimizer's: error-feedback residuals
  // (fsdp.quantize_grads), always staged in the engine's host copies (engine_states()).
  for (const std::string& n : engine.residual_names()) s.state_names.push_back(n);
  // DiLoCo's after those: the outer momentum and every replica's own master and optimizer state
  // (the model a checkpoint holds is the outer copy; engine.h).
  const std::vector<std::string> diloco = engine.diloco_state_names(opt.state_names());
  if (!diloco.empty()) s.optional_from = s.state_names.size();
  for (const std::string& n : diloco) s.state_names.push_back(n);
  s.optimizer_steps = opt.steps_taken();
  std::vector<fsdp::FlatParam*> flats = engine.flat_params();
  for (size_t i = 0; i < flats.size(); ++i) {
    fsdp::FlatParam& fp = *flats[i];
    if (!in_checkpoint(engine, fp)) continue;
    ST_CHECK(fp.master().defined() && (fp.frozen() || fp.master().scalar_type() == at::kFloat) &&
                 fp.master().is_contiguous() && fp.master().numel() == fp.shard_numel(),
             "flat param ", i, ": master is not a contiguous fp32 shard of ", fp.shard_numel());
    FlatView v = flat_view(fp, i);
    if (!v.frozen) v.states.assign(s.state_names.size(), nullptr);
    s.flats.push_back(std::move(v));
  }
  return s;
}

// Points the engine's states (after the optimizer's) at the engine's host copies; gather: fill
// them (a save) or only size them (a load).
void engine_states(Snapshot& s, fsdp::Engine& engine, fsdp::ShardedOptimizer& opt, size_t optimizer_states,
                   bool gather) {
  if (s.state_names.size() == optimizer_states) return;
  const size_t residuals_end = std::min(s.optional_from, s.state_names.size());
  if (residuals_end > optimizer_states) {
    auto& staged = engine.residual_staging(gather);
    for (FlatView& v : s.flats)
      for (size_t k = optimizer_states; k < residuals_end && !v.frozen; ++k)
        v.states[k] = staged.at(v.flat).at(k - optimizer_states).data_ptr<float>();
  }
  if (s.optional_from >= s.state_names.size()) return;
  // DiLoCo: staging [0] is the outer copy (the model a checkpoint holds), [1 + j] state j.
  auto& d = engine.diloco_staging([&opt](size_t f, size_t k) { return opt.state_tensor(f, k); }, optimizer_states,
                                  gather);
  const size_t R = (s.state_names.size() - s.optional_from - 1) / (1 + optimizer_states);
  for (FlatView& v : s.flats) {
    if (v.frozen) continue;  // not trained: no DiLoCo state; the model is the frozen shard itself
    for (size_t k = s.optional_from; k < s.state_names.size(); ++k)
      v.states[k] = d.at(v.flat).at(1 + k - s.optional_from).data_ptr<float>();
    if (!gather) continue;  // a load reads the model and base states into the live ones
    // A save: the model is the outer copy, the base optimizer states replica 0's (the same data on
    // every replica, so any replica may write any part).
    v.master = d.at(v.flat).at(0).data_ptr<float>();
    for (size_t k = 0; k < optimizer_states; ++k) v.states[k] = d.at(v.flat).at(2 + R * (1 + k)).data_ptr<float>();
  }
}

at::Tensor host_floats(float* p, int64_t n) { return at::from_blob(p, {n}, at::TensorOptions().dtype(at::kFloat)); }

}  // namespace

FlatView flat_view(const fsdp::FlatParam& fp, size_t index) {
  FlatView v;
  v.flat = index;
  v.frozen = fp.frozen();
  for (const auto& slot : fp.slots()) v.slots.push_back({slot.name, slot.shape, slot.offset, slot.numel});
  v.numel = fp.numel();
  v.padded = fp.padded();
  v.shard_numel = fp.shard_numel();
  v.shard_rank = fp.shard_rank();
  v.shard_size = fp.shard_size();
  v.shard_begin = static_cast<int64_t>(fp.shard_rank()) * fp.shard_numel();
  return v;
}

bool snapshot_in_host_memory(fsdp::Engine& engine, fsdp::ShardedOptimizer& opt) {
  std::vector<fsdp::FlatParam*> flats = engine.flat_params();
  const size_t ns = opt.state_names().size();
  for (size_t i = 0; i < flats.size(); ++i) {
    if (!in_checkpoint(engine, *flats[i])) continue;
    const at::Tensor& m = flats[i]->master();
    if (!m.device().is_cpu() || m.scalar_type() != at::kFloat) return false;
    if (flats[i]->frozen()) continue;
    for (size_t k = 0; k < ns; ++k)
      if (!opt.state_tensor(i, k).device().is_cpu()) return false;
  }
  return true;
}

Snapshot view_snapshot(fsdp::Engine& engine, fsdp::ShardedOptimizer& opt, SnapshotAccess access) {
  ST_CHECK(snapshot_in_host_memory(engine, opt), "view_snapshot: shards in device memory (use staged_snapshot)");
  Snapshot s = layout_snapshot(engine, opt);
  std::vector<fsdp::FlatParam*> flats = engine.flat_params();
  for (FlatView& v : s.flats) {
    fsdp::FlatParam& fp = *flats[v.flat];
    v.master = (access == SnapshotAccess::Write ? fp.write_master() : fp.master()).data_ptr<float>();
    for (size_t k = 0; k < opt.state_names().size() && !v.frozen; ++k) v.states[k] = opt.state(v.flat, k);
  }
  engine_states(s, engine, opt, opt.state_names().size(), access == SnapshotAccess::Read);
  return s;
}

Snapshot staged_snapshot(fsdp::Engine& engine, fsdp::ShardedOptimizer& opt, std::vector<std::vector<float>>& pool,
                         bool copy) {
  Snapshot s = layout_snapshot(engine, opt);
  std::vector<fsdp::FlatParam*> flats = engine.flat_params();
  size_t next = 0;
  for (FlatView& v : s.flats) {
    const size_t i = v.flat;
    // Tensor copies: from host memory a memcpy, from a device a device->host copy (synchronous).
    auto stage = [&](float*& p, const at::Tensor& from) {
      if (pool.size() <= next) pool.emplace_back();
      std::vector<float>& buf = pool[next++];
      buf.resize(static_cast<size_t>(v.shard_numel));
      p = buf.data();
      if (copy && v.shard_numel) host_floats(p, v.shard_numel).copy_(from);
    };
    stage(v.master, flats[i]->master());  // a frozen bf16 shard widens to fp32 here
    for (size_t k = 0; k < opt.state_names().size() && !v.frozen; ++k) stage(v.states[k], opt.state_tensor(i, k));
  }
  pool.resize(next);
  engine_states(s, engine, opt, opt.state_names().size(), copy);
  return s;
}

void restore_staged(const Snapshot& s, fsdp::Engine& engine, fsdp::ShardedOptimizer& opt) {
  std::vector<fsdp::FlatParam*> flats = engine.flat_params();
  for (const FlatView& v : s.flats) {
    ST_CHECK(v.flat < flats.size(), "restore_staged: staged flat ", v.flat, " of ", flats.size());
    if (v.shard_numel == 0) continue;
    flats[v.flat]->write_master().copy_(host_floats(v.master, v.shard_numel));  // rounds into a frozen bf16 shard
    for (size_t k = 0; k < opt.state_names().size() && !v.frozen; ++k)
      opt.state_tensor(v.flat, k).copy_(host_floats(v.states[k], v.shard_numel));
  }
}

int64_t snapshot_file_bytes(const Snapshot& s) {
  int64_t n = 0;
  for (const FlatView& v : s.flats) n += v.numel * static_cast<int64_t>(1 + v.states.size());
  return n * 4;
}

}  // namespace shardtrain::ckpt
