// open_sharded_job / select_device: the set-up every sharded command shares.
#include "shardtrain/train/job.h"

#include <ATen/Parallel.h>

#include "shardtrain/fsdp/device.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/train/setup.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/log.h"
#include "shardtrain/util/mpi_check.h"
#include "spec_json.h"

namespace shardtrain::train {

namespace {

// This rank's place among the ranks of its real host (not parallel.simulate_ranks_per_host's:
// simulated hosts still share the real one's cores and GPUs).
struct HostRanks {
  int rank = 0, size = 1;
};
HostRanks real_host_ranks(MPI_Comm world) {
  MPI_Comm local = MPI_COMM_NULL;
  ST_MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local));
  HostRanks h;
  ST_MPI_CHECK(MPI_Comm_rank(local, &h.rank));
  ST_MPI_CHECK(MPI_Comm_size(local, &h.size));
  ST_MPI_CHECK(MPI_Comm_free(&local));
  return h;
}

}  // namespace

c10::Device select_device(const deck::Deck& d, MPI_Comm world) {
  const std::string want = d.get_string("run.device");
  ST_USER_CHECK(want == "auto" || want == "cpu" || want == "cuda", "run.device = '", want,
                "': expected auto, cpu or cuda");
  // Two ranks on one GPU would put one device twice into an NCCL communicator.
  const HostRanks host = real_host_ranks(world);
  const int local_rank = host.rank, local_size = host.size;
  const int gpus = want == "cpu" ? 0 : fsdp::cuda_device_count();
  const int usable = gpus > 0 && local_size <= gpus ? 1 : 0;
  int all_usable = 0;
  ST_MPI_CHECK(MPI_Allreduce(&usable, &all_usable, 1, MPI_INT, MPI_MIN, world));
  runtime::run_agreed(world, [&] {
    if (want != "cuda" || usable) return;
    if (!fsdp::torch_built_with_cuda())
      throw UserError("run.device = cuda, but this build's libtorch has no CUDA (build against a CUDA libtorch: "
                      "docs/gpu.md), or use run.device = auto | cpu");
    if (gpus == 0) throw UserError("run.device = cuda, but torch sees no CUDA device on this rank's host");
    throw UserError(log::fmt("run.device = cuda, but this host runs ", local_size, " ranks on ", gpus,
                             " GPUs: NCCL needs a GPU per rank (launch at most ", gpus, " ranks per host)"));
  });
  if (want == "cpu" || !all_usable) return c10::Device(c10::kCPU);
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank % gpus));
}

ShardedJob open_sharded_job(MPI_Comm world, const deck::Deck& d, const JobOptions& o) {
  ShardedJob j;
  const int rph = o.ranks_per_host >= 0 ? o.ranks_per_host : static_cast<int>(d.get_int("parallel.simulate_ranks_per_host"));
  runtime::run_agreed(world, [&] {
    j.topo = runtime::discover_topology(world, rph);
    j.strategy = o.strategy ? *o.strategy : fsdp::parse_strategy(d.get_string("parallel.strategy"));
    j.mesh = std::make_unique<runtime::DeviceMesh>(world, j.topo, static_cast<int>(d.get_int("parallel.shard_group_size")));
    j.spec = o.spec ? *o.spec : model_spec_from_deck(d);
    check_thread_keys(d);
  });
  j.threads = threads_per_rank(d, real_host_ranks(world).size);
  at::set_num_threads(j.threads);
  if (!o.host_only) j.device = select_device(d, world);
  const comm::CommOptions copts = comm_options_from_deck(d);
  runtime::run_agreed(world, [&] {
    const std::string backend = d.get_string("comm.backend");
    // The MPI backend reduces host memory; NCCL reduces device memory.
    ST_USER_CHECK(!(j.device.is_cuda() && backend == "mpi"), "comm.backend = mpi reduces host memory, but "
                  "run.device places this run on ", j.device.str(), ": use comm.backend = auto or nccl");
    j.comms = fsdp::make_strategy_comms(j.strategy, *j.mesh, backend, j.device.is_cuda() ? j.device.index() : -1, copts);
  });
  j.net = model::build_model(j.spec, at::kMeta);
  runtime::run_agreed(world, [&] {
    j.engine_options = engine_options_from_deck(d, *j.net);
    j.engine_options.strategy = j.strategy;
    j.engine_options.device = j.device;
  });
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
    model::init_parameter(t, raw->init_for(name), model::param_seed(seed, name));
  };
}

}  // namespace shardtrain::train
