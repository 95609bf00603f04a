// Checkpoints across world sizes and strategies (bit-exact), train state, commit, rotation,
// resume choice and asynchronous saves.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "test_ckpt_util.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/manager.h"
#include "shardtrain/optim/kokkos_scope.h"

using namespace shardtrain;
using namespace ckpt_test;

namespace {

std::vector<Layout> writer_layouts() {
  Layout fs;
  Layout hy{"hybrid_shard", fsdp::Strategy::HybridShard, 2};
  Layout ns{"no_shard", fsdp::Strategy::NoShard};
  Layout mixed{"shard_grad_op bf16 ignored", fsdp::Strategy::ShardGradOp};
  mixed.dtype = at::kBFloat16;
  mixed.ignored = {"wpe"};
  return {fs, hy, ns, mixed};
}
std::vector<Layout> reader_layouts() {
  Layout hz{"hybrid_shard_zero2", fsdp::Strategy::HybridShardZero2, 1};
  Layout fi{"full_shard ignored", fsdp::Strategy::FullShard};
  fi.ignored = {"wte"};
  Layout hb{"hybrid bf16", fsdp::Strategy::HybridShard, 2};
  hb.dtype = at::kBFloat16;
  return {Layout{}, hz, fi, hb};
}

ckpt::TrainState sample_state(int64_t step) {
  ckpt::TrainState s;
  s.step = step;
  s.tokens_seen = step * 4096;
  s.lr_step = step + 1;
  s.data_cursor = {step, -3, int64_t{1} << 40};
  for (int i = 0; i < 2500; ++i) s.rng_state.push_back(static_cast<uint8_t>(i * 7 + step));
  s.extra_json = R"({"loss_scale": 65536.0})";
  return s;
}

}  // namespace

// Write with w ranks and every writer layout, read with r ranks and every reader layout:
// masters and optimizer state come back bit for bit. At world size D this checks the pairs
// with max(w, r) == D (the reader layout depends only on the writer layout and r); the pairs
// with both below D are the ones the smaller world sizes check, so ckpt_np1..np4 together
// cover every w, r <= 4, each pair once.
TEST(CkptReshard, EveryWriterSizeAndLayoutToEveryReader) {
  optim::KokkosScope kokkos;
  const int D = size_of(MPI_COMM_WORLD);
  const std::string dir = test_dir("reshard");
  std::vector<Layout> writers = writer_layouts(), readers = reader_layouts();
  int loads = 0;
  for (int w = 1; w <= D; ++w) {
    for (size_t li = 0; li < writers.size(); ++li) {
      const std::string path = dir + "/w" + std::to_string(w) + "_" + std::to_string(li) + ".h5";
      MPI_Comm wc = first_ranks(w);
      if (wc != MPI_COMM_NULL) {
        Trainee t(wc, writers[li]);
        fill(t, static_cast<uint32_t>(w * 10 + li));
        ckpt::CheckpointInfo info;
        info.strategy = writers[li].name;
        ckpt::SaveOptions so;
        so.split_replicas = li % 2 == 0;  // both ways of sharing replicated data
        ckpt::save_checkpoint(path, *t.engine, *t.opt, sample_state(w), info, wc, so);
        EXPECT_EQ(mismatches(t, w * 10 + li), 0) << "saving must not change the shards";
        MPI_Comm_free(&wc);
      }
      MPI_Barrier(MPI_COMM_WORLD);
      for (int r = 1; r <= D; ++r) {
        if (std::max(w, r) != D) continue;  // checked at world size max(w, r)
        const Layout& L = readers[(li + r) % readers.size()];
        MPI_Comm rc = first_ranks(r);
        if (rc != MPI_COMM_NULL) {
          Trainee t(rc, L);
          ckpt::TrainState st;
          ckpt::load_checkpoint(path, *t.engine, *t.opt, st, rc);
          EXPECT_EQ(mismatches(t, w * 10 + li), 0)
              << writers[li].name << " x" << w << " -> " << L.name << " x" << r;
          EXPECT_EQ(t.opt->steps_taken(), 17 + w * 10 + static_cast<int64_t>(li));
          EXPECT_EQ(st.step, w);
          MPI_Comm_free(&rc);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        ++loads;
      }
    }
  }
  EXPECT_EQ(loads, (2 * D - 1) * 4);
}

// The loaded engine computes what the saved one computed (parameters re-gathered).
TEST(CkptReshard, LoadedEngineGivesTheSameLoss) {
  optim::KokkosScope kokkos;
  const std::string dir = test_dir("loss");
  const std::string path = dir + "/a.h5";
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  at::Tensor batch = at::randint(61, {2, 9}, gen, at::kLong);
  double before = 0, after = 0;
  {
    Trainee t(MPI_COMM_WORLD, Layout{});
    fill(t, 3);
    t.engine->set_last_micro_batch(true);
    at::NoGradGuard ng;
    before = t.model->loss(batch.narrow(1, 0, 8), batch.narrow(1, 1, 8)).item<double>();
    ckpt::save_checkpoint(path, *t.engine, *t.opt, sample_state(1), {}, MPI_COMM_WORLD);
  }
  {
    Layout L{"hybrid", fsdp::Strategy::HybridShard, 2};
    Trainee t(MPI_COMM_WORLD, L);
    ckpt::TrainState st;
    ckpt::load_checkpoint(path, *t.engine, *t.opt, st, MPI_COMM_WORLD);
    t.engine->set_last_micro_batch(true);
    at::NoGradGuard ng;
    after = t.model->loss(batch.narrow(1, 0, 8), batch.narrow(1, 1, 8)).item<double>();
  }
  EXPECT_NEAR(after, before, 1e-6 * std::abs(before));
  EXPECT_GT(before, 0);
}

TEST(CkptTrainState, RoundTripIncludingLargeDeckText) {
  optim::KokkosScope kokkos;
  const std::string dir = test_dir("state");
  Trainee t(MPI_COMM_WORLD, Layout{});
  fill(t);
  ckpt::CheckpointInfo info;
  info.deck_text = std::string(100000, 'x') + "\n[run]\nname = \"big\"\n";  // over the 64 KiB compact limit
  info.model_spec_json = R"({"arch":"tiny","d_model":24})";
  info.strategy = "full_shard";
  info.shard_group_size = size_of(MPI_COMM_WORLD);
  ckpt::TrainState want = sample_state(123);
  ckpt::save_checkpoint(dir + "/s.h5", *t.engine, *t.opt, want, info, MPI_COMM_WORLD);
  ckpt::TrainState got;
  ckpt::load_checkpoint(dir + "/s.h5", *t.engine, *t.opt, got, MPI_COMM_WORLD);
  EXPECT_EQ(got.step, 123);
  EXPECT_EQ(got.tokens_seen, want.tokens_seen);
  EXPECT_EQ(got.lr_step, want.lr_step);
  EXPECT_EQ(got.data_cursor, want.data_cursor);
  EXPECT_EQ(got.rng_state, want.rng_state);
  EXPECT_EQ(got.extra_json, want.extra_json);
  if (rank_of(MPI_COMM_WORLD) == 0) {
    ckpt::CheckpointMeta m = ckpt::read_checkpoint_meta(dir + "/s.h5");
    EXPECT_EQ(m.world_size, size_of(MPI_COMM_WORLD));
    EXPECT_EQ(m.deck_text, info.deck_text);
    EXPECT_EQ(m.model_spec_json, info.model_spec_json);
    EXPECT_EQ(m.strategy, "full_shard");
    EXPECT_EQ(m.optimizer, "adamw");
    EXPECT_EQ(m.step, 123);
    EXPECT_FALSE(std::filesystem::exists(dir + "/s.h5.tmp"));
  }
}

TEST(CkptTrainState, SgdMomentumAndOptimizerMismatch) {
  optim::KokkosScope kokkos;
  const std::string dir = test_dir("sgd");
  Layout sgd;
  sgd.optimizer = "sgd";
  {
    Trainee t(MPI_COMM_WORLD, sgd);
    ASSERT_EQ(t.opt->state_names(), std::vector<std::string>{"momentum"});
    fill(t, 9);
    ckpt::save_checkpoint(dir + "/sgd.h5", *t.engine, *t.opt, sample_state(2), {}, MPI_COMM_WORLD);
  }
  Trainee t(MPI_COMM_WORLD, sgd);
  ckpt::TrainState st;
  ckpt::load_checkpoint(dir + "/sgd.h5", *t.engine, *t.opt, st, MPI_COMM_WORLD);
  EXPECT_EQ(mismatches(t, 9), 0);
  Trainee a(MPI_COMM_WORLD, Layout{});
  try {
    ckpt::load_checkpoint(dir + "/sgd.h5", *a.engine, *a.opt, st, MPI_COMM_WORLD);
    ADD_FAILURE() << "loading an sgd checkpoint into adamw must fail";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer 'sgd'"), std::string::npos) << e.what();
    EXPECT_TRUE(e.agreed());
  }
}

std::string read_text(const std::string& p) {
  std::ifstream in(p);
  std::string s;
  std::getline(in, s);
  return s;
}

// Rotation keeps keep_last; latest names the newest complete file; .tmp files are ignored;
// a corrupt or truncated newest file makes find_resume fall back to the previous one.
TEST(CkptManager, RotationLatestAndResumeFallback) {
  optim::KokkosScope kokkos;
  namespace fs = std::filesystem;
  const std::string dir = test_dir("manager") + "/ckpts";
  const bool r0 = rank_of(MPI_COMM_WORLD) == 0;
  Trainee t(MPI_COMM_WORLD, Layout{"hybrid", fsdp::Strategy::HybridShard, 2});
  ckpt::CheckpointManager mgr(dir, 3, MPI_COMM_WORLD);
  EXPECT_EQ(mgr.find_resume("auto"), std::nullopt);
  EXPECT_EQ(mgr.find_resume("never"), std::nullopt);
  for (int step : {10, 20, 30, 40}) {
    fill(t, step);
    std::string p = mgr.save(step, *t.engine, *t.opt, sample_state(step), {});
    EXPECT_EQ(p, dir + "/" + ckpt::CheckpointManager::file_name(step));
    if (r0) {
      EXPECT_EQ(read_text(dir + "/latest"), ckpt::CheckpointManager::file_name(step));
      EXPECT_TRUE(fs::exists(p));
      EXPECT_FALSE(fs::exists(p + ".tmp"));
    }
  }
  if (r0) {
    EXPECT_FALSE(fs::exists(dir + "/step_00000010.h5"));
    for (int s : {20, 30, 40}) EXPECT_TRUE(fs::exists(dir + "/" + ckpt::CheckpointManager::file_name(s)));
    // An interrupted later save: a partial .tmp (copy cut in half) must be ignored.
    fs::copy_file(dir + "/step_00000040.h5", dir + "/step_00000050.h5.tmp");
    fs::resize_file(dir + "/step_00000050.h5.tmp", fs::file_size(dir + "/step_00000050.h5.tmp") / 2);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(mgr.find_resume("auto"), dir + "/step_00000040.h5");

  // Flip one byte inside the data of a parameter of step 40.
  if (r0) {
    hid_t f = H5Fopen((dir + "/step_00000040.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "model/h1.mlp_fc_weight", H5P_DEFAULT);
    haddr_t off = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
    ASSERT_NE(off, HADDR_UNDEF);
    std::fstream io(dir + "/step_00000040.h5", std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(off + 101));
    char c;
    io.get(c);
    io.seekp(static_cast<std::streamoff>(off + 101));
    io.put(static_cast<char>(c ^ 0x40));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  try {
    ckpt::TrainState st;
    ckpt::load_checkpoint(dir + "/step_00000040.h5", *t.engine, *t.opt, st, MPI_COMM_WORLD);
    ADD_FAILURE() << "a flipped byte must be detected";
  } catch (const UserError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("step_00000040.h5"), std::string::npos) << m;
    EXPECT_NE(m.find("/model/h1.mlp_fc_weight: checksum mismatch"), std::string::npos) << m;
  }
  EXPECT_EQ(mgr.find_resume("auto"), dir + "/step_00000030.h5");
  EXPECT_THROW(mgr.find_resume(dir + "/step_00000040.h5"), UserError);

  // Truncate step 30: falls back to 20, which loads bit for bit.
  if (r0) fs::resize_file(dir + "/step_00000030.h5", fs::file_size(dir + "/step_00000030.h5") * 2 / 3);
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_THROW(
      {
        ckpt::TrainState st;
        ckpt::load_checkpoint(dir + "/step_00000030.h5", *t.engine, *t.opt, st, MPI_COMM_WORLD);
      },
      UserError);
  auto resume = mgr.find_resume("auto");
  ASSERT_EQ(resume, dir + "/step_00000020.h5");
  Trainee u(MPI_COMM_WORLD, Layout{});
  ckpt::TrainState st;
  ckpt::load_checkpoint(*resume, *u.engine, *u.opt, st, MPI_COMM_WORLD);
  EXPECT_EQ(mismatches(u, 20), 0);
  EXPECT_EQ(st.step, 20);
  EXPECT_THROW(mgr.find_resume(dir + "/nope.h5"), UserError);
}

// Async: the save sees the shards as they were at save(), although training changes them.
TEST(CkptManager, AsyncSaveUsesStagedCopies) {
  optim::KokkosScope kokkos;
  const std::string dir = test_dir("async");
  Trainee t(MPI_COMM_WORLD, Layout{});
  ckpt::CheckpointManager mgr(dir, 2, MPI_COMM_WORLD, /*async=*/true);
  for (int step : {1, 2, 3}) {
    fill(t, 100 + step);
    mgr.save(step, *t.engine, *t.opt, sample_state(step), {});
    fill(t, 999);  // "training" goes on while the file is written
    // Collectives on the training communicators while the writer uses its own.
    at::Tensor x = at::ones({1000});
    t.world->all_reduce(x, comm::ReduceOp::Sum)->wait();
  }
  mgr.wait();
  Trainee u(MPI_COMM_WORLD, Layout{"no_shard", fsdp::Strategy::NoShard});
  auto resume = mgr.find_resume("auto");
  ASSERT_EQ(resume, dir + "/step_00000003.h5");
  ckpt::TrainState st;
  ckpt::load_checkpoint(*resume, *u.engine, *u.opt, st, MPI_COMM_WORLD);
  EXPECT_EQ(mismatches(u, 103), 0);
  if (rank_of(MPI_COMM_WORLD) == 0) {
    EXPECT_FALSE(std::filesystem::exists(dir + "/step_00000001.h5"));
  }
}
