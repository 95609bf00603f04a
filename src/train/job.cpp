// open_sharded_job: the set-up every sharded command shares.
#include "shardtrain/train/job.h"

#include <ATen/Parallel.h>

#include "shardtrain/runtime/agree.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/host_memory.h"
#include "shardtrain/util/log.h"
#include "shardtrain/util/mpi_check.h"
#include "spec_json.h"

namespace shardtrain::train {

ShardedJob open_sharded_job(MPI_Comm world, const deck::Deck& d, const JobOptions& o) {
  ShardedJob j;
  fsdp::GroupOptions go;
  bool reuse_host_memory = true;
  fsdp::Strategy deck_strategy = fsdp::Strategy::FullShard;
  runtime::run_agreed(world, [&] {
    deck_strategy = strategy_from_deck(d);
    go.strategy = o.strategy ? *o.strategy : deck_strategy;
    go.simulate_ranks_per_host =
        o.ranks_per_host >= 0 ? o.ranks_per_host : static_cast<int>(d.get_int("parallel.simulate_ranks_per_host"));
    go.shard_group_size = static_cast<int>(d.get_int("parallel.shard_group_size"));
    go.device = o.host_only ? "cpu" : d.get_string("run.device");
    go.backend = d.get_string("comm.backend");
    go.comm = comm_options_from_deck(d);
    go.secondary_shards = d.get_bool("fsdp.secondary_shards");
    j.spec = o.spec ? *o.spec : model_spec_from_deck(d);
    check_thread_keys(d);
    reuse_host_memory = d.get_bool("run.reuse_host_memory");
  });
  int rank = 0;
  ST_MPI_CHECK(MPI_Comm_rank(world, &rank));
  if (reuse_host_memory && !keep_freed_host_memory() && rank == 0)
    log::warn("run.reuse_host_memory: this C library does not take glibc's malloc settings; host memory is "
              "returned on free as before");
  j.threads = threads_per_rank(d, runtime::real_host_ranks(world).size);
  at::set_num_threads(j.threads);
  fsdp::ShardedGroups g = fsdp::open_groups(world, go);
  j.strategy = go.strategy;
  j.topo = std::move(g.topo);
  j.mesh = std::move(g.mesh);
  j.device = g.device;
  j.comms = std::move(g.comms);
  runtime::run_agreed(world, [&] {
    j.net = model::build_model(j.spec, at::kMeta);  // an error here (the spec's) is one message, not an abort
    j.engine_options = engine_options_from_deck(d, *j.net, deck_strategy);
    j.engine_options.strategy = j.strategy;
    j.engine_options.device = j.device;
    j.engine_options.host_id = j.topo.host_id;
    // A probe of another strategy than the deck's (plan, maxbatch) keeps the options it runs.
    j.engine_options.compression = fsdp::supported_compression(j.strategy, j.engine_options.compression);
  });
  // bf16 products on a CPU: the faster correct path, the same on every rank (bf16_choice.h).
  if (j.engine_options.mp.param_dtype == at::kBFloat16 && j.device.is_cpu()) {
    std::string setting;
    runtime::run_agreed(world, [&] { setting = d.get_string("fsdp.bf16_gemm"); });
    j.bf16_gemm = choose_bf16_gemm(world, setting);
  } else {
    model::set_bf16_gemm(model::Bf16Gemm::Native);
  }
  return j;
}

ckpt::CheckpointInfo checkpoint_info(const ShardedJob& job, const deck::Deck& d) {
  ckpt::CheckpointInfo info;
  info.deck_text = d.resolved_toml();
  info.model_spec_json = model_spec_json(job.spec);
  info.strategy = fsdp::to_string(job.strategy);
  info.shard_group_size = job.mesh->shard_size();
  info.replicate_size = job.mesh->replicate_size();
  return info;
}

fsdp::InitFn seeded_init(const model::Model& m, uint64_t seed) {
  const model::Model* raw = &m;
  return [raw, seed](const std::string& name, at::Tensor& t) {
    model::init_parameter(t, raw->init_rule(name), model::param_seed(seed, name));
  };
}

}  // namespace shardtrain::train
