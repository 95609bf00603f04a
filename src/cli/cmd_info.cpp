// `shardtrain info`: versions, topology and the device mesh as a rank table.
#include <mpi.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "command.h"
#include "shardtrain/ckpt/versions.h"
#include "shardtrain/comm/comm.h"
#include "shardtrain/fsdp/device.h"
#include "shardtrain/fsdp/strategy_comms.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/runtime/blas_kernel.h"
#include "shardtrain/runtime/device_mesh.h"
#include "shardtrain/runtime/exchange.h"
#include "shardtrain/runtime/topology.h"
#include "shardtrain/train/job.h"
#include "shardtrain/util/cpu_isa.h"

namespace shardtrain::cli {
namespace {

std::string join(const std::vector<int>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  return os.str();
}

int run_info(runtime::Runtime& rt, const DeckArgs& args) {
  deck::Deck d = load_deck_agreed(args, rt.world());
  runtime::Topology topo;
  std::unique_ptr<runtime::DeviceMesh> mesh;
  runtime::run_agreed(rt.world(), [&] {
    topo = runtime::discover_topology(rt.world(), static_cast<int>(d.get_int("parallel.simulate_ranks_per_host")));
  });
  runtime::run_agreed(rt.world(), [&] {
    mesh = std::make_unique<runtime::DeviceMesh>(rt.world(), topo,
                                                 static_cast<int>(d.get_int("parallel.shard_group_size")));
  });

  // One fixed-width row per rank, gathered to rank 0 in rank order.
  constexpr int kRow = 256;
  char row[kRow];
  // Where `train` with this deck computes (run.device), not only which GPUs the host has.
  const c10::Device dev = fsdp::select_device(d.get_string("run.device"), rt.world());
  std::string device = dev.str();
  std::snprintf(row, kRow, "%5d  %-24s %10d  %-8s %-13s %-12s %-16s %-12s", topo.world_rank,
                topo.host_names[topo.host_id].c_str(), topo.local_rank, device.c_str(),
                mesh->shard_group_name().c_str(), join(mesh->shard_members()).c_str(),
                mesh->replicate_group_name().c_str(), join(mesh->replicate_members()).c_str());
  const std::vector<std::string> rows = runtime::gather_to(rt.world(), 0, std::string(row, kRow), "info.rows");
  if (rt.rank() != 0) return 0;

  // The same line as --version and every checkpoint's library_versions, then what it means here.
  std::printf("%s\n", ckpt::software_versions().c_str());
  std::printf("  libtorch %s, NCCL %s\n", fsdp::torch_built_with_cuda() ? "with CUDA" : "CPU only",
              comm::nccl_version_string().empty() ? "not built" : "built");
  const CpuIsa& isa = cpu_isa();
  std::printf("  CPU %s (family %d model %d, %s, %.2f GHz); theoretical peak per core %.0f GFLOP/s fp32, %.0f bf16\n",
              isa.model_name.c_str(), isa.family, isa.model, isa.isa_name().c_str(), isa.clock_ghz,
              theoretical_peak_tflops(isa, "fp32", 1) * 1e3, theoretical_peak_tflops(isa, "bf16", 1) * 1e3);
  std::printf("  %s\n", runtime::blas_kernel().line().substr(2).c_str());
  std::printf("  world %d ranks on %d host%s%s; GPUs per host %d (torch sees %d); run.device = %s\n", rt.size(),
              topo.num_hosts, topo.num_hosts == 1 ? "" : "s", topo.simulated ? " (simulated)" : "",
              topo.gpus_per_host, fsdp::cuda_device_count(), d.get_string("run.device").c_str());
  std::printf("  mesh: %d replicate x %d shard; shard groups %s hosts; strategy %s\n\n",
              mesh->replicate_size(), mesh->shard_size(),
              mesh->shard_group_within_host() ? "inside" : "span", d.get_string("parallel.strategy").c_str());
  std::printf("%5s  %-24s %10s  %-8s %-13s %-12s %-16s %-12s\n", "rank", "host", "local_rank", "device",
              "shard_group", "members", "replicate_group", "members");
  for (int r = 0; r < rt.size(); ++r) std::printf("%s\n", rows[static_cast<size_t>(r)].c_str());
  return 0;
}

void add_info(CLI::App& app, CommandFn& selected) {
  auto* sub = app.add_subcommand("info", "Print versions, the rank topology and the device mesh");
  auto args = std::make_shared<DeckArgs>();
  add_deck_args(sub, *args, false);
  sub->callback([&selected, args] { selected = [args](runtime::Runtime& rt) { return run_info(rt, *args); }; });
}

}  // namespace
ST_REGISTER_COMMAND_NEEDS(info, "info", add_info, [] {
  CommandNeeds n = computing();
  n.prints_kernel = true;  // in its rank table
  return n;
}());
}  // namespace shardtrain::cli
