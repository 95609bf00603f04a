// bench_gpu: one GPT-2-shaped training configuration, timed, as one JSON line: step time,
// tokens/s, achieved TFLOP/s, MFU, peak device memory (CUDA caching allocator), first/last loss.
//   mode plain    plain libtorch: the model on the device, fp32 parameters under bf16 autocast,
//                 torch::optim::AdamW, no FSDP (the baseline)
//   mode fsdp     shardtrain full_shard over all ranks (world 1: one GPU), bf16 compute, fp32
//                 masters, fused CUDA AdamW on the device
//   mode offload  as fsdp with fsdp.cpu_offload: masters, gradients, optimizer state in pinned host
//                 memory, AdamW on the host (Kokkos, --host-threads)
// scripts/gpu-check runs it on a GPU (table in perf/README.md); `--device cpu --model tiny`
// is a smoke test that runs anywhere (tests/e2e/bench_gpu.cmake).
//
//   mpirun -np 1 build-gpu/bin/bench_gpu --mode fsdp --model gpt2-1.5b --micro-batch 8 --seq 1024
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/DeviceGuard.h>

#include "shardtrain/fsdp/device.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/sharded_optimizer.h"
#include "shardtrain/fsdp/strategy_comms.h"
#include "shardtrain/model/model.h"
#include "shardtrain/optim/kokkos_scope.h"
#include "shardtrain/runtime/device_mesh.h"
#include "shardtrain/runtime/runtime.h"
#include "shardtrain/runtime/topology.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/timer.h"
#include "shardtrain/util/torch_compat.h"

using namespace shardtrain;

namespace {

struct Args {
  std::string mode = "fsdp", model = "gpt2-1.5b", device = "cuda", dtype = "bf16";
  int64_t micro_batch = 8, seq = 1024, steps = 10, warmup = 3;
  int host_threads = 8;
  double peak_tflops = 989.0;  // H200 SXM dense bf16
  bool recompute = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      ST_USER_CHECK(i + 1 < argc, "bench_gpu: ", k, " needs a value");
      return argv[++i];
    };
    if (k == "--mode") a.mode = val();
    else if (k == "--model") a.model = val();
    else if (k == "--device") a.device = val();
    else if (k == "--dtype") a.dtype = val();
    else if (k == "--micro-batch") a.micro_batch = std::stoll(val());
    else if (k == "--seq") a.seq = std::stoll(val());
    else if (k == "--steps") a.steps = std::stoll(val());
    else if (k == "--warmup") a.warmup = std::stoll(val());
    else if (k == "--host-threads") a.host_threads = std::stoi(val());
    else if (k == "--peak-tflops") a.peak_tflops = std::stod(val());
    else if (k == "--recompute") a.recompute = true;
    else throw UserError("bench_gpu: unknown argument '" + k + "'");
  }
  ST_USER_CHECK(a.mode == "plain" || a.mode == "fsdp" || a.mode == "offload", "bench_gpu: --mode plain|fsdp|offload");
  ST_USER_CHECK(a.steps >= 1 && a.warmup >= 0, "bench_gpu: --steps >= 1, --warmup >= 0");
  return a;
}

model::ModelSpec spec_for(const Args& a) {
  model::ModelSpec s;
  if (a.model == "tiny") {  // a smoke-test shape
    s.vocab_size = 512;
    s.d_model = 64;
    s.n_layers = 2;
    s.n_heads = 4;
  } else {
    s = model::preset_spec(a.model);
  }
  s.seq_len = a.seq;
  return model::resolve_spec(s);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    runtime::Runtime rt(&argc, &argv);
    optim::KokkosScope kokkos;
    const Args a = parse(argc, argv);
    ST_USER_CHECK(a.device == "cpu" || a.device == "cuda", "bench_gpu: --device cuda|cpu");
    // Topology, device and communicators by the path train takes (run.device = --device).
    fsdp::GroupOptions go;
    go.strategy = fsdp::Strategy::FullShard;
    go.device = a.device;
    fsdp::ShardedGroups groups = fsdp::open_groups(MPI_COMM_WORLD, go);
    const c10::Device device = groups.device;
    c10::OptionalDeviceGuard guard(device.is_cuda() ? c10::optional<c10::Device>(device) : c10::nullopt);
    const at::ScalarType dtype = fsdp::parse_dtype(a.dtype);
    const model::ModelSpec spec = spec_for(a);
    const int64_t params = model::parameter_count(spec);

    // Token batches: B x (T+1) ids per rank, fixed seed (the loss must fall on a repeated batch).
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1234 + rt.rank());
    at::Tensor ids = at::randint(spec.vocab_size, {a.micro_batch, a.seq + 1}, gen, at::kLong).to(device);
    at::Tensor x = ids.narrow(1, 0, a.seq), y = ids.narrow(1, 1, a.seq);

    std::shared_ptr<model::Model> net;
    std::unique_ptr<fsdp::Engine> engine;
    std::unique_ptr<fsdp::ShardedOptimizer> fopt;
    std::unique_ptr<torch::optim::AdamW> topt;
    Timer setup;
    if (a.mode == "plain") {
      ST_USER_CHECK(rt.size() == 1, "bench_gpu: --mode plain runs on one rank");
      net = model::build_model(spec, at::kCPU);  // CPU init (the init rule's generator), then move
      net->to(device);
      topt = std::make_unique<torch::optim::AdamW>(
          net->parameters(), torch::optim::AdamWOptions(1e-4).betas({0.9, 0.95}).weight_decay(0.1));
    } else {
      net = model::build_model(spec, at::kMeta);
      fsdp::EngineOptions eo;
      eo.strategy = fsdp::Strategy::FullShard;
      eo.wrap_types = net->block_types();
      eo.mp.param_dtype = dtype;
      eo.mp.reduce_dtype = at::kFloat;
      eo.mp.keep_fp32 = net->norm_param_patterns();
      eo.activation_checkpointing = a.recompute;
      eo.device = device;
      eo.cpu_offload = a.mode == "offload";
      model::Model* raw = net.get();
      engine = std::make_unique<fsdp::Engine>(*net, groups.comms.engine(), eo, [raw](const std::string& n, at::Tensor& t) {
        model::init_parameter(t, raw->init_for(n), model::param_seed(0, n));
      });
      fsdp::OptimizerConfig oc;
      oc.adamw.beta2 = 0.95f;
      oc.adamw.weight_decay = 0.1f;
      oc.no_decay = net->no_decay_patterns();
      oc.host_threads = a.host_threads;
      fopt = std::make_unique<fsdp::ShardedOptimizer>(*engine, oc);
    }
    const double setup_s = setup.seconds();

    std::vector<double> times;
    double first_loss = 0, last_loss = 0;
    for (int64_t step = 0; step < a.warmup + a.steps; ++step) {
      if (step == a.warmup) {
        fsdp::synchronize_device(device);
        fsdp::reset_device_peak(device);
        if (engine) engine->reset_peaks();
      }
      fsdp::synchronize_device(device);
      Timer t;
      at::Tensor loss;
      if (topt) {
        topt->zero_grad();
        {
          std::unique_ptr<torch_compat::CudaAutocast> autocast;
          if (device.is_cuda() && dtype != at::kFloat) autocast = std::make_unique<torch_compat::CudaAutocast>(dtype);
          loss = net->loss(x, y);
        }
        loss.backward();
        torch::nn::utils::clip_grad_norm_(net->parameters(), 1.0);
        topt->step();
      } else {
        engine->zero_grad();
        engine->set_last_micro_batch(true);
        loss = net->loss(x, y);
        loss.backward();
        engine->clip_grad_norm(1.0);
        fopt->step(1e-4f);
      }
      const double l = loss.item<double>();  // synchronises the device with the host
      fsdp::synchronize_device(device);
      const double s = t.seconds();
      if (step == 0) first_loss = l;
      last_loss = l;
      if (step >= a.warmup) times.push_back(s);
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const double tokens = static_cast<double>(a.micro_batch * a.seq * rt.size());
    const double tflops = net->train_flops_per_token(a.seq) * tokens / median / 1e12;
    const fsdp::DeviceMemory mem = fsdp::device_memory(device);
    if (rt.rank() == 0) {
      std::printf("{\"mode\": \"%s\", \"model\": \"%s\", \"params\": %lld, \"device\": \"%s\", \"ranks\": %d, "
                  "\"dtype\": \"%s\", \"micro_batch\": %lld, \"seq\": %lld, \"steps\": %lld, \"setup_s\": %.2f, "
                  "\"step_ms_median\": %.2f, \"step_ms_min\": %.2f, \"tokens_per_s\": %.1f, \"tflops\": %.2f, "
                  "\"mfu\": %.4f, \"peak_mem_gib\": %.3f, \"loss_first\": %.5f, \"loss_last\": %.5f, \"torch\": \"%s\"}\n",
                  a.mode.c_str(), a.model.c_str(), static_cast<long long>(params), device.str().c_str(), rt.size(),
                  a.dtype.c_str(), static_cast<long long>(a.micro_batch), static_cast<long long>(a.seq),
                  static_cast<long long>(a.steps), setup_s, median * 1e3, times.front() * 1e3,
                  tokens / median, tflops / rt.size(), tflops / rt.size() / a.peak_tflops,
                  mem.peak_allocated >= 0 ? mem.peak_allocated / 1073741824.0 : -1.0, first_loss, last_loss,
                  torch_compat::version().c_str());
      std::fflush(stdout);
    }
    fopt.reset();
    engine.reset();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu: %s\n", e.what());
    return dynamic_cast<const UserError*>(&e) ? 2 : 1;
  }
}
