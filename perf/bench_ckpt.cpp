// bench_ckpt: checkpoint save/load bandwidth vs raw parallel HDF5, replica split, async stall.
//   mpirun -np N bench_ckpt [--dir D] [--d 512] [--layers 8] [--vocab 8192] [--reps 3]
#include <hdf5.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/h5.h"
#include "shardtrain/ckpt/manager.h"
#include "shardtrain/comm/comm.h"
#include "shardtrain/fsdp/engine.h"
#include "shardtrain/fsdp/sharded_optimizer.h"
#include "shardtrain/optim/kokkos_scope.h"
#include "shardtrain/fsdp/strategy_comms.h"
#include "shardtrain/runtime/device_mesh.h"
#include "shardtrain/runtime/runtime.h"
#include "shardtrain/runtime/topology.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/timer.h"
#include "tiny_transformer.h"

using namespace shardtrain;

namespace {

int g_rank = 0, g_size = 1;

struct Setup {
  fsdp::ShardedGroups groups;
  std::unique_ptr<tiny::Model> model;
  std::unique_ptr<fsdp::Engine> engine;
  std::unique_ptr<fsdp::ShardedOptimizer> opt;
  Setup(const tiny::Config& c, fsdp::Strategy s, int ranks_per_host) {
    fsdp::GroupOptions go;
    go.strategy = s;
    go.simulate_ranks_per_host = fsdp::is_hybrid(s) ? ranks_per_host : 0;
    go.backend = "mpi";
    groups = fsdp::open_groups(MPI_COMM_WORLD, go);
    const fsdp::EngineComms ec = groups.comms.engine();
    model = std::make_unique<tiny::Model>(c, at::kMeta);
    fsdp::EngineOptions eo;
    eo.strategy = s;
    eo.wrap_types = {model->blocks[0]->name()};
    engine = std::make_unique<fsdp::Engine>(*model, ec, eo, [](const std::string& n, at::Tensor& t) { t.normal_(0, 0.02); });
    opt = std::make_unique<fsdp::ShardedOptimizer>(*engine, fsdp::OptimizerConfig{});
    for (size_t i = 0; i < engine->flat_params().size(); ++i)  // non-trivial state bytes
      for (size_t k = 0; k < 2; ++k) {
        float* p = opt->state(i, k);
        for (int64_t j = 0; j < engine->flat_params()[i]->shard_numel(); ++j) p[j] = 1e-3f * static_cast<float>(j % 977);
      }
  }
};

// Raw parallel HDF5: one 1-D float dataset of n elements, rank r writes/reads a contiguous
// slab, collective transfer, same file settings (flush before close) as the checkpoint.
double raw_io(const std::string& path, int64_t n, bool write, bool fletcher) {
  using ckpt::H5Id;
  const int64_t lo = n * g_rank / g_size, hi = n * (g_rank + 1) / g_size;
  std::vector<float> buf(static_cast<size_t>(std::max<int64_t>(hi - lo, 1)), 0.5f);
  MPI_Barrier(MPI_COMM_WORLD);
  Timer t;
  H5Id fapl(ST_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  ST_H5_CHECK(H5Pset_fapl_mpio(fapl, MPI_COMM_WORLD, MPI_INFO_NULL));
  H5Id file(write ? ST_H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl))
                  : ST_H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl)),
            H5Fclose);
  hsize_t dims = static_cast<hsize_t>(n), start = static_cast<hsize_t>(lo), count = static_cast<hsize_t>(hi - lo);
  H5Id fs(ST_H5_CHECK(H5Screate_simple(1, &dims, nullptr)), H5Sclose);
  H5Id dcpl(ST_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  if (fletcher) {
    hsize_t chunk = std::min<hsize_t>(dims, hsize_t{1} << 20);
    ST_H5_CHECK(H5Pset_chunk(dcpl, 1, &chunk));
    ST_H5_CHECK(H5Pset_fletcher32(dcpl));
  } else {
    ST_H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
  }
  H5Id d(write ? ST_H5_CHECK(H5Dcreate2(file, "data", H5T_IEEE_F32LE, fs, H5P_DEFAULT, dcpl, H5P_DEFAULT))
               : ST_H5_CHECK(H5Dopen2(file, "data", H5P_DEFAULT)),
         H5Dclose);
  ST_H5_CHECK(H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, nullptr, &count, nullptr));
  H5Id ms(ST_H5_CHECK(H5Screate_simple(1, &count, nullptr)), H5Sclose);
  H5Id dxpl(ST_H5_CHECK(H5Pcreate(H5P_DATASET_XFER)), H5Pclose);
  ST_H5_CHECK(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
  if (write)
    ST_H5_CHECK(H5Dwrite(d, H5T_NATIVE_FLOAT, ms, fs, dxpl, buf.data()));
  else
    ST_H5_CHECK(H5Dread(d, H5T_NATIVE_FLOAT, ms, fs, dxpl, buf.data()));
  d.close();
  if (write) ST_H5_CHECK(H5Fflush(file, H5F_SCOPE_GLOBAL));
  file.close();
  MPI_Barrier(MPI_COMM_WORLD);
  return t.seconds();
}

template <typename F>
double best_of(int reps, F&& f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) best = std::min(best, f());
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  runtime::Runtime rt(&argc, &argv);
  g_rank = rt.rank();
  g_size = rt.size();
  optim::KokkosScope kokkos;
  std::string dir = "/tmp/shardtrain_bench_ckpt";
  tiny::Config c;
  c.d = 512;
  c.layers = 8;
  c.vocab = 8192;
  c.seq = 64;
  c.heads = 8;
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--dir") dir = argv[i + 1];
    else if (a == "--d") c.d = std::stoll(argv[i + 1]);
    else if (a == "--layers") c.layers = std::stoll(argv[i + 1]);
    else if (a == "--vocab") c.vocab = std::stoll(argv[i + 1]);
    else if (a == "--reps") reps = std::stoi(argv[i + 1]);
  }
  if (g_rank == 0) std::filesystem::create_directories(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string ck = dir + "/bench.h5", raw = dir + "/raw.h5";

  Setup full(c, fsdp::Strategy::FullShard, 0);
  ckpt::TrainState st;
  const int64_t bytes = ckpt::snapshot_file_bytes(ckpt::view_snapshot(*full.engine, *full.opt));
  const double gb = static_cast<double>(bytes) / 1e9;

  // Interleaved (save, collective save, raw write) x reps, best of each: the machine's load
  // drifts, and back-to-back blocks of one kind would compare different moments.
  ckpt::SaveOptions coll;
  coll.collective_data = true;
  double t_save = 1e30, t_save_coll = 1e30, t_raw_w = 1e30;
  for (int i = 0; i < reps; ++i) {
    t_save = std::min(t_save, ckpt::save_checkpoint(ck, *full.engine, *full.opt, st, {}, MPI_COMM_WORLD).seconds);
    t_save_coll = std::min(t_save_coll, ckpt::save_checkpoint(ck, *full.engine, *full.opt, st, {}, MPI_COMM_WORLD, coll).seconds);
    t_raw_w = std::min(t_raw_w, raw_io(raw, bytes / 4, true, false));
  }
  double t_load = best_of(reps, [&] { return ckpt::load_checkpoint(ck, *full.engine, *full.opt, st, MPI_COMM_WORLD).seconds; });
  double t_raw_r = best_of(reps, [&] { return raw_io(raw, bytes / 4, false, false); });
  double t_verify = best_of(1, [&] { Timer t; ckpt::verify_checkpoint(ck, MPI_COMM_WORLD); return t.seconds(); });
  double t_fl = best_of(1, [&] { return raw_io(raw, bytes / 4, true, true); });

  if (g_rank == 0) {
    std::printf("bench_ckpt: %d ranks, %.3f GB per checkpoint (%lld params, adamw), dir %s, best of %d\n", g_size, gb,
                static_cast<long long>(bytes / 12), dir.c_str(), reps);
    std::printf("  %-44s %8s %8s\n", "", "s", "GB/s");
    std::printf("  %-44s %8.3f %8.2f\n", "save (full_shard, independent data writes)", t_save, gb / t_save);
    std::printf("  %-44s %8.3f %8.2f\n", "save (full_shard, collective data writes)", t_save_coll, gb / t_save_coll);
    std::printf("  %-44s %8.3f %8.2f   save/raw %.2f\n", "raw collective write, 1-D, same bytes", t_raw_w, gb / t_raw_w,
                t_raw_w / t_save);
    std::printf("  %-44s %8.3f %8.2f\n", "raw write, chunked 1M + Fletcher32", t_fl, gb / t_fl);
    std::printf("  %-44s %8.3f %8.2f\n", "load (full_shard)", t_load, gb / t_load);
    std::printf("  %-44s %8.3f %8.2f   load/raw %.2f\n", "raw collective read, 1-D, same bytes", t_raw_r, gb / t_raw_r,
                t_raw_r / t_load);
    std::printf("  %-44s %8.3f %8.2f\n", "verify (all digests)", t_verify, gb / t_verify);
  }

  // Replicated shards (hybrid, 1 rank per simulated host: every rank holds everything).
  if (g_size > 1) {
    Setup hy(c, fsdp::Strategy::HybridShard, 1);
    for (bool split : {true, false}) {
      ckpt::SaveOptions so;
      so.split_replicas = split;
      double t = best_of(reps, [&] { return ckpt::save_checkpoint(ck, *hy.engine, *hy.opt, st, {}, MPI_COMM_WORLD, so).seconds; });
      if (g_rank == 0)
        std::printf("  %-44s %8.3f %8.2f\n", split ? "save hybrid R=N, replicas split the work" : "save hybrid R=N, replica 0 writes all",
                    t, gb / t);
    }
  }

  // Training stall: real steps (forward, backward, AdamW) with a save every `every` steps,
  // without saves, with synchronous and with asynchronous saves; the stall per save is the
  // extra wall time divided by the number of saves (the background writer competes with the
  // training for the same cores, which this includes).
  const int steps = std::max(4, 2 * reps + 2), every = 2;
  at::Tensor tokens = at::randint(c.vocab, {8, c.seq}, at::TensorOptions().dtype(at::kLong));
  at::Tensor targets = at::roll(tokens, {-1}, {1});
  auto train = [&](int mode) {  // 0 no saves, 1 sync, 2 async
    const std::string mdir = dir + "/stall" + std::to_string(mode);
    std::unique_ptr<ckpt::CheckpointManager> mgr;
    if (mode) mgr = std::make_unique<ckpt::CheckpointManager>(mdir, 2, MPI_COMM_WORLD, mode == 2);
    double max_save_call = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    Timer t;
    for (int i = 1; i <= steps; ++i) {
      full.engine->set_last_micro_batch(true);
      full.engine->zero_grad();
      full.model->loss(tokens, targets).backward();
      full.opt->step(1e-4);
      if (mgr && i % every == 0) {
        mgr->save(i, *full.engine, *full.opt, st, {});
        max_save_call = std::max(max_save_call, mgr->last_stall_seconds());
      }
    }
    if (mgr) mgr->wait();
    MPI_Barrier(MPI_COMM_WORLD);
    return std::make_pair(t.seconds(), max_save_call);
  };
  train(0);  // warm-up
  const double base = train(0).first;
  const auto sync = train(1), async = train(2);
  const int saves = steps / every;
  if (g_rank == 0) {
    std::printf("  %-44s %8.3f          (%d steps, no saves)\n", "training time", base, steps);
    std::printf("  %-44s %8.3f          save() blocked %.3f s\n", "step stall per save, sync",
                (sync.first - base) / saves, sync.second);
    std::printf("  %-44s %8.3f          save() blocked %.3f s (host staging copy)\n", "step stall per save, async",
                (async.first - base) / saves, async.second);
  }
  if (g_rank == 0) std::filesystem::remove_all(dir);
  return 0;
}
