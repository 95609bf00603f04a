// Helpers for checkpoint tests: an engine over any communicator, deterministic shard values.
#pragma once
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "shardtrain/comm/comm.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/sharded_optimizer.h"
#include "shardtrain/fsdp/strategy_comms.h"
#include "shardtrain/runtime/device_mesh.h"
#include "shardtrain/runtime/topology.h"
#include "shardtrain/util/error.h"
#include "tiny_transformer.h"

namespace ckpt_test {
using namespace shardtrain;

struct Layout {
  Layout(std::string n = "full_shard", fsdp::Strategy s = fsdp::Strategy::FullShard, int rph = 0)
      : name(std::move(n)), strategy(s), ranks_per_host(rph) {}
  std::string name;
  fsdp::Strategy strategy;
  int ranks_per_host;                     // hybrid: simulated hosts of this many ranks
  std::vector<std::string> ignored;
  at::ScalarType dtype = at::kFloat;      // bf16: two flats per unit (norms stay fp32)
  std::string optimizer = "adamw";
  int64_t d = 24;                         // another d = another model
  bool state_as_tensors = false;          // the optimizer's device implementation, on the host
};

// Model + groups + engine + optimizer over `comm` (any sub-communicator of the world).
struct Trainee {
  fsdp::ShardedGroups groups;  // by the path production takes (fsdp::open_groups)
  comm::Comm* world = nullptr;
  std::unique_ptr<tiny::Model> model;
  std::unique_ptr<fsdp::Engine> engine;
  std::unique_ptr<fsdp::ShardedOptimizer> opt;
  MPI_Comm comm;

  Trainee(MPI_Comm c, const Layout& L) : comm(c) {
    int size = 0;
    MPI_Comm_size(c, &size);
    fsdp::GroupOptions go;
    go.strategy = L.strategy;
    go.simulate_ranks_per_host =
        !fsdp::is_hybrid(L.strategy) ? 0 : L.ranks_per_host > 0 && size % L.ranks_per_host == 0 ? L.ranks_per_host : 1;
    go.backend = "mpi";
    go.comm.timeout_s = 120;
    groups = fsdp::open_groups(c, go);
    world = groups.comms.world.get();
    const fsdp::EngineComms ec = groups.comms.engine();
    tiny::Config cfg;
    cfg.d = L.d;
    model = std::make_unique<tiny::Model>(cfg, at::kMeta);
    fsdp::EngineOptions eo;
    eo.strategy = L.strategy;
    eo.wrap_types = {model->blocks[0]->name()};
    eo.ignored = L.ignored;
    eo.mp.param_dtype = L.dtype;
    eo.mp.keep_fp32 = {"ln_"};
    engine = std::make_unique<fsdp::Engine>(*model, ec, eo, tiny::init_param);
    fsdp::OptimizerConfig oc;
    oc.name = L.optimizer;
    oc.sgd.momentum = 0.9f;
    oc.state_as_tensors = L.state_as_tensors;
    opt = std::make_unique<fsdp::ShardedOptimizer>(*engine, oc);
  }
};

// The value element i of parameter `name` has in array k (0 master, 1.. optimizer states),
// whatever the layout: a layout-independent expectation for bit-exact comparisons.
inline float value(const std::string& name, int64_t i, size_t k, uint32_t salt = 0) {
  uint64_t h = 1469598103934665603ull ^ salt;
  for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  h ^= static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull + k * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return static_cast<float>(static_cast<int64_t>(h % 2000003) - 1000001) / 1000001.0f;
}

// Calls fn(k, slot, element index in the parameter, float& shard element) for every
// element this rank's shards hold, master (k=0) and each optimizer state.
template <typename F>
void for_each_element(Trainee& t, F&& fn) {
  auto flats = t.engine->flat_params();
  const size_t ns = t.opt->state_names().size();
  for (size_t f = 0; f < flats.size(); ++f) {
    fsdp::FlatParam& fp = *flats[f];
    const int64_t sb = static_cast<int64_t>(fp.shard_rank()) * fp.shard_numel();
    for (size_t k = 0; k <= ns; ++k) {
      float* base = k == 0 ? fp.write_master().data_ptr<float>() : t.opt->state(f, k - 1);
      for (const auto& s : fp.slots())
        for (int64_t e = std::max(sb, s.offset); e < std::min(sb + fp.shard_numel(), s.offset + s.numel); ++e)
          fn(k, s, e - s.offset, base[e - sb]);
    }
  }
}

inline void fill(Trainee& t, uint32_t salt = 0) {
  for_each_element(t, [&](size_t k, const fsdp::ParamSlot& s, int64_t i, float& x) { x = value(s.name, i, k, salt); });
  t.opt->set_steps_taken(17 + salt);
}

// Number of elements that differ (bitwise) from value(); also checks the padding is 0.
inline int64_t mismatches(Trainee& t, uint32_t salt = 0, bool master_only = false) {
  int64_t bad = 0;
  for_each_element(t, [&](size_t k, const fsdp::ParamSlot& s, int64_t i, float& x) {
    if (master_only && k > 0) return;
    float want = value(s.name, i, k, salt);
    if (std::memcmp(&want, &x, 4) != 0) ++bad;
  });
  for (fsdp::FlatParam* fp : t.engine->flat_params()) {
    const int64_t sb = static_cast<int64_t>(fp->shard_rank()) * fp->shard_numel();
    for (int64_t e = std::max(sb, fp->numel()); e < sb + fp->shard_numel(); ++e)
      if (fp->master().data_ptr<float>()[e - sb] != 0.0f) ++bad;
  }
  return bad;
}

inline int rank_of(MPI_Comm c) { int r; MPI_Comm_rank(c, &r); return r; }
inline int size_of(MPI_Comm c) { int n; MPI_Comm_size(c, &n); return n; }

// The first n world ranks (MPI_COMM_NULL on the others). Free with MPI_Comm_free.
inline MPI_Comm first_ranks(int n) {
  MPI_Comm c;
  MPI_Comm_split(MPI_COMM_WORLD, rank_of(MPI_COMM_WORLD) < n ? 0 : MPI_UNDEFINED, 0, &c);
  return c;
}

// An empty directory under the build tree for this world size (made by rank 0). Collective.
inline std::string test_dir(const std::string& what) {
  std::string d = std::string(CKPT_TEST_DIR) + "/" + what + "_np" + std::to_string(size_of(MPI_COMM_WORLD));
  if (rank_of(MPI_COMM_WORLD) == 0) {
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return d;
}

}  // namespace ckpt_test
