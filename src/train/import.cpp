// import_safetensors: deck -> sharded model on meta -> slices read from safetensors -> checkpoint at step 0.
#include "shardtrain/train/import.h"

#include <ATen/Parallel.h>

#include <cstdio>
#include <memory>

#include "resume_state.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/sharded_optimizer.h"
#include "shardtrain/fsdp/strategy_comms.h"
#include "shardtrain/optim/kokkos_scope.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/runtime/device_mesh.h"
#include "shardtrain/runtime/topology.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/timer.h"
#include "spec_json.h"

namespace shardtrain::train {

void import_safetensors(runtime::Runtime& rt, const deck::Deck& d, const std::string& in, const std::string& out) {
  MPI_Comm world = rt.world();
  optim::KokkosScope kokkos;
  Timer timer;
  runtime::Topology topo;
  std::unique_ptr<runtime::DeviceMesh> mesh;
  model::ModelSpec spec;
  fsdp::OptimizerConfig opt_cfg;
  runtime::run_agreed(world, [&] {
    // Checked before any work: the header is parsed on every rank (cheap), so a bad file is
    // reported before the model is built.
    for (const std::string& f : ckpt::safetensors_files(in)) ckpt::read_safetensors_header(f);
    topo = runtime::discover_topology(world, static_cast<int>(d.get_int("parallel.simulate_ranks_per_host")));
    mesh = std::make_unique<runtime::DeviceMesh>(world, topo, static_cast<int>(d.get_int("parallel.shard_group_size")));
    spec = model_spec_from_deck(d);
    opt_cfg = optimizer_config_from_deck(d);
  });
  at::set_num_threads(threads_per_rank(d, topo.local_size));
  const fsdp::Strategy strategy = fsdp::parse_strategy(d.get_string("parallel.strategy"));
  const comm::CommOptions copts = comm_options_from_deck(d);
  fsdp::StrategyComms comms;
  runtime::run_agreed(world, [&] {
    comms = fsdp::make_strategy_comms(strategy, *mesh, d.get_string("comm.backend"), topo.device, copts);
  });
  std::shared_ptr<model::Model> net = model::build_model(spec, at::kMeta);
  fsdp::EngineOptions eopts;
  runtime::run_agreed(world, [&] { eopts = engine_options_from_deck(d, *net); });
  // Every parameter is overwritten by the import; zeros are the cheapest placeholder.
  fsdp::Engine engine(*net, comms.engine(), eopts, [](const std::string&, at::Tensor& t) { t.zero_(); });
  fsdp::ShardedOptimizer optimizer(engine, opt_cfg);
  ckpt::load_safetensors(in, engine, world);

  const uint64_t seed = static_cast<uint64_t>(d.get_int("run.seed"));
  seed_default_generator(seed, rt.rank());  // what a fresh run starts with
  // The batch plan is not checked here: the import may run at another rank count than the
  // training; the deck's global batch is recorded only for the resume note.
  const ckpt::TrainState st = make_train_state(LoopPosition{}, d.get_int("train.global_batch"), seed, world);
  ckpt::CheckpointInfo info;
  info.deck_text = d.resolved_toml();
  info.model_spec_json = model_spec_json(spec);
  info.strategy = fsdp::to_string(strategy);
  info.shard_group_size = mesh->shard_size();
  info.replicate_size = mesh->replicate_size();
  const ckpt::IoStats io = ckpt::save_checkpoint(out, engine, optimizer, st, info, world);
  if (rt.rank() == 0) {
    std::printf("imported %s -> %s: %s, %lld parameters, %d ranks (%s, %d replicate x %d shard); wrote %.1f MB in %.2f s\n",
                in.c_str(), out.c_str(), spec.arch.c_str(), static_cast<long long>(model::parameter_count(spec)),
                rt.size(), fsdp::to_string(strategy), mesh->replicate_size(), mesh->shard_size(), io.bytes / 1e6,
                timer.seconds());
    std::fflush(stdout);
  }
}

}  // namespace shardtrain::train
