// Bad checkpoint files end every rank with one UserError naming file and dataset; the
// offline tools (inspect, consolidate, safetensors export/import); files for the h5py check.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_ckpt_util.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/h5.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/optim/kokkos_scope.h"

using namespace shardtrain;
using namespace ckpt_test;
namespace fs = std::filesystem;

namespace {

// Rank 0 copies `good` to `bad` and edits it with plain (serial) HDF5.
void mutate(const std::string& good, const std::string& bad, const std::function<void(hid_t)>& edit) {
  if (rank_of(MPI_COMM_WORLD) == 0) {
    fs::copy_file(good, bad, fs::copy_options::overwrite_existing);
    hid_t f = H5Fopen(bad.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    edit(f);
    H5Fclose(f);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Replaces a dataset by one of another type/shape (with a digest, so only the type/shape is wrong).
void replace(hid_t f, const std::string& path, hid_t type, std::vector<hsize_t> dims) {
  H5Ldelete(f, path.c_str(), H5P_DEFAULT);
  hid_t sp = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  std::vector<hsize_t> chunk(dims.size(), 1);
  H5Pset_chunk(dcpl, static_cast<int>(dims.size()), chunk.data());
  hid_t d = H5Dcreate2(f, path.c_str(), type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ckpt::write_attr_uint64s(d, "digest", {0, 0});
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(sp);
}

// Loading `path` must fail on every rank with a UserError containing each of `parts`.
void expect_load_fails(const std::string& path, const std::vector<std::string>& parts, const Layout& L = {}) {
  SCOPED_TRACE(path + (parts.empty() ? std::string() : ": " + parts.back()));
  Trainee t(MPI_COMM_WORLD, L);
  fill(t, 1);
  try {
    ckpt::TrainState st;
    ckpt::load_checkpoint(path, *t.engine, *t.opt, st, MPI_COMM_WORLD);
    ADD_FAILURE() << path << " loaded";
  } catch (const UserError& e) {
    EXPECT_TRUE(e.agreed());
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
  // A validation failure leaves the shards as they were.
  if (parts.empty() || parts[0] != "checksum") {
    EXPECT_EQ(mismatches(t, 1), 0);
  }
}

struct Files : ::testing::Test {
  std::string dir, good;
  void SetUp() override {
    dir = test_dir("files");
    good = dir + "/good.h5";
    Trainee t(MPI_COMM_WORLD, Layout{"hybrid", fsdp::Strategy::HybridShard, 2});
    fill(t, 7);
    ckpt::CheckpointInfo info;
    info.strategy = "hybrid_shard";
    ckpt::save_checkpoint(good, *t.engine, *t.opt, {}, info, MPI_COMM_WORLD);
  }
};

}  // namespace

TEST_F(Files, HostileFilesAreUserErrors) {
  optim::KokkosScope kokkos;
  const std::string b = dir + "/bad.h5";
  mutate(good, b, [](hid_t f) { H5Ldelete(f, "model/h0.ln_1_weight", H5P_DEFAULT); });
  expect_load_fails(b, {b, "dataset /model/h0.ln_1_weight is missing"});
  EXPECT_THROW(ckpt::verify_checkpoint(b, MPI_COMM_WORLD), UserError) << "verify: optim without model";

  mutate(good, b, [](hid_t f) { replace(f, "model/ln_f_weight", H5T_IEEE_F64LE, {24}); });
  expect_load_fails(b, {b, "/model/ln_f_weight: element type is not float32"});

  mutate(good, b, [](hid_t f) { replace(f, "optim/exp_avg/ln_f_bias", H5T_IEEE_F32LE, {25}); });
  expect_load_fails(b, {"/optim/exp_avg/ln_f_bias: shape [25], the model has [24]"});

  mutate(good, b, [](hid_t f) { replace(f, "model/wpe_weight", H5T_IEEE_F32LE, {hsize_t{1} << 50, 24}); });
  expect_load_fails(b, {"/model/wpe_weight: absurd dimension"});
  EXPECT_THROW(ckpt::verify_checkpoint(b, MPI_COMM_WORLD), UserError);

  mutate(good, b, [](hid_t f) { replace(f, "model/extra.weight", H5T_IEEE_F32LE, {3}); });
  expect_load_fails(b, {"/model/extra.weight is not a parameter of this model"});

  mutate(good, b, [](hid_t f) { H5Adelete_by_name(f, "model/h2.attn_proj_bias", "digest", H5P_DEFAULT); });
  expect_load_fails(b, {"/model/h2.attn_proj_bias: digest attribute is missing"});

  mutate(good, b, [](hid_t f) { replace(f, "train/data_cursor", H5T_IEEE_F32LE, {3}); });
  expect_load_fails(b, {"/train/data_cursor: element type is not int64"});

  mutate(good, b, [](hid_t f) {
    H5Adelete(f, "version");
    ckpt::write_attr_int64(f, "version", 99);
  });
  expect_load_fails(b, {b, "format version 99"});
  EXPECT_THROW(ckpt::verify_checkpoint(b, MPI_COMM_WORLD), UserError);

  // Not HDF5 at all, and HDF5 that is not a checkpoint.
  if (rank_of(MPI_COMM_WORLD) == 0) {
    std::ofstream(dir + "/text.h5") << "definitely not HDF5\n";
    hid_t f = H5Fcreate((dir + "/plain.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(f);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  expect_load_fails(dir + "/text.h5", {"text.h5: cannot open as HDF5"});
  expect_load_fails(dir + "/plain.h5", {"plain.h5: attribute 'format' is missing"});
  expect_load_fails(dir + "/missing.h5", {"missing.h5: cannot open"});

  // A checkpoint of another model (d = 16 instead of 24).
  {
    Layout other;
    other.d = 16;
    Trainee t(MPI_COMM_WORLD, other);
    fill(t);
    ckpt::save_checkpoint(dir + "/other.h5", *t.engine, *t.opt, {}, {}, MPI_COMM_WORLD);
  }
  expect_load_fails(dir + "/other.h5", {"other.h5: dataset /model/", "a checkpoint of another model?"});
  ckpt::verify_checkpoint(dir + "/other.h5", MPI_COMM_WORLD);  // a fine file, just not ours
}

TEST_F(Files, CorruptDataIsFoundByLoadAndVerify) {
  optim::KokkosScope kokkos;
  const std::string b = dir + "/flipped.h5";
  haddr_t off = 0;
  mutate(good, b, [&](hid_t f) {
    hid_t d = H5Dopen2(f, "optim/exp_avg_sq/wte_weight", H5P_DEFAULT);
    off = H5Dget_offset(d);
    H5Dclose(d);
  });
  if (rank_of(MPI_COMM_WORLD) == 0) {
    std::fstream io(b, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(off + 7));
    io.put('\x5a');
  }
  MPI_Barrier(MPI_COMM_WORLD);
  try {
    ckpt::verify_checkpoint(b, MPI_COMM_WORLD);
    ADD_FAILURE() << "verify passed a corrupt file";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("/optim/exp_avg_sq/wte_weight: checksum mismatch"), std::string::npos)
        << e.what();
  }
  expect_load_fails(b, {"checksum", "/optim/exp_avg_sq/wte_weight: checksum mismatch"});
  ckpt::verify_checkpoint(good, MPI_COMM_WORLD);
}

TEST_F(Files, InspectConsolidateAndSafetensors) {
  optim::KokkosScope kokkos;
  const bool r0 = rank_of(MPI_COMM_WORLD) == 0;
  const std::string cons = dir + "/consolidated.h5", st = dir + "/model.safetensors";
  if (r0) {
    std::ostringstream os;
    ckpt::inspect_checkpoint(good, os);
    EXPECT_NE(os.str().find("written by " + std::to_string(size_of(MPI_COMM_WORLD)) + " ranks"), std::string::npos)
        << os.str();
    EXPECT_NE(os.str().find("/model/h0.attn_qkv_weight"), std::string::npos);
    EXPECT_NE(os.str().find("[72,24]"), std::string::npos);
    ckpt::consolidate_checkpoint(good, cons);
    ckpt::export_safetensors(good, st);
    auto entries = ckpt::read_safetensors_header(st);
    EXPECT_EQ(entries.size(), 4u + 3 * 11);
    for (auto& e : entries) EXPECT_EQ(e.dtype, "F32");
    fs::copy_file(st, dir + "/cut.safetensors");
    fs::resize_file(dir + "/cut.safetensors", fs::file_size(st) - 4);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  {
    Trainee t(MPI_COMM_WORLD, Layout{"shard_grad_op", fsdp::Strategy::ShardGradOp});
    ckpt::TrainState s;
    ckpt::load_checkpoint(cons, *t.engine, *t.opt, s, MPI_COMM_WORLD);
    EXPECT_EQ(mismatches(t, 7), 0);
  }
  {
    Layout L{"full_shard ignored", fsdp::Strategy::FullShard};
    L.ignored = {"wpe"};
    Trainee t(MPI_COMM_WORLD, L);
    ckpt::load_safetensors(st, *t.engine, MPI_COMM_WORLD);
    EXPECT_EQ(mismatches(t, 7, /*master_only=*/true), 0);
    EXPECT_THROW(ckpt::load_safetensors(dir + "/cut.safetensors", *t.engine, MPI_COMM_WORLD), UserError);
  }
}

// np=2 only: a checkpoint plus the values it must hold, for tests/python/check_ckpt_h5py.py.
TEST(CkptPython, WriteFilesForH5pyCheck) {
  if (size_of(MPI_COMM_WORLD) != 2) GTEST_SKIP() << "written by the np=2 run";
  optim::KokkosScope kokkos;
  const std::string dir = test_dir("python");
  Trainee t(MPI_COMM_WORLD, Layout{"hybrid_shard", fsdp::Strategy::HybridShard, 1});
  fill(t, 42);
  ckpt::TrainState s;
  s.step = 77;
  s.data_cursor = {1, 2, 3};
  s.rng_state = {9, 8, 7, 6};
  ckpt::save_checkpoint(dir + "/ckpt.h5", *t.engine, *t.opt, s, {}, MPI_COMM_WORLD);
  if (rank_of(MPI_COMM_WORLD) != 0) return;
  nlohmann::json want;
  for (fsdp::FlatParam* fp : t.engine->flat_params())
    for (const auto& slot : fp->slots()) {
      std::vector<std::string> names = {"model/" + slot.name, "optim/exp_avg/" + slot.name,
                                        "optim/exp_avg_sq/" + slot.name};
      for (size_t k = 0; k < 3; ++k) {
        std::vector<double> v;
        for (int64_t i = 0; i < slot.numel; ++i) v.push_back(value(slot.name, i, k, 42));
        want[names[k]] = {{"shape", slot.shape}, {"values", v}};
      }
    }
  std::ofstream(dir + "/expected.json") << want.dump();
}
