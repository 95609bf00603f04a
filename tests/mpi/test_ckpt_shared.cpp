// Files from others and shared directories (docs/security.md): checkpoints holding soft or
// external links are refused by every reader before anything is read through them; planted
// links at a checkpoint's temporary, its final name, the lock file and the tools' outputs are
// refused and their targets left untouched; overlapping safetensors tensors are refused.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <sstream>

#include "test_ckpt_util.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/h5.h"
#include "shardtrain/ckpt/manager.h"
#include "shardtrain/ckpt/run_dir.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/optim/kokkos_scope.h"

using namespace shardtrain;
using namespace ckpt_test;
namespace fs = std::filesystem;

namespace {

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// `fn` throws a UserError containing `part` (on this rank).
void expect_user_error(const std::function<void()>& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected '" << part << "'";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

struct Shared : ::testing::Test {
  std::string dir, good, victim;
  void SetUp() override {
    dir = test_dir("shared");
    good = dir + "/good.h5";
    victim = dir + "/victim";
    Trainee t(MPI_COMM_WORLD, Layout{});
    fill(t, 7);
    ckpt::save_checkpoint(good, *t.engine, *t.opt, {}, {}, MPI_COMM_WORLD);
    if (rank_of(MPI_COMM_WORLD) == 0) std::ofstream(victim) << "precious\n";
    MPI_Barrier(MPI_COMM_WORLD);
  }
  // Rank 0: a copy of good.h5 edited with serial HDF5, in a child process whose HDF5 is
  // re-initialised: this process has unregistered the external link class (ckpt's
  // quiet_hdf5), so it could not create one.
  std::string edited(const std::string& name, const std::function<void(hid_t)>& edit) {
    const std::string b = dir + "/" + name;
    if (rank_of(MPI_COMM_WORLD) == 0) {
      fs::copy_file(good, b, fs::copy_options::overwrite_existing);
      const pid_t pid = ::fork();
      if (pid == 0) {
        H5close();
        H5open();
        hid_t f = H5Fopen(b.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
        if (f >= 0) edit(f);
        ::_exit(f >= 0 && H5Fclose(f) >= 0 ? 0 : 1);
      }
      int status = -1;
      ::waitpid(pid, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "editing " << b;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return b;
  }
  // Every reader refuses `path` with `part` in the message: load (collective), verify
  // (collective), and on rank 0 inspect, export and consolidate (which write nothing).
  void every_reader_refuses(const std::string& path, const std::string& part) {
    SCOPED_TRACE(path);
    {
      Trainee t(MPI_COMM_WORLD, Layout{});
      fill(t, 1);
      ckpt::TrainState st;
      expect_user_error([&] { ckpt::load_checkpoint(path, *t.engine, *t.opt, st, MPI_COMM_WORLD); }, part);
      EXPECT_EQ(mismatches(t, 1), 0) << "nothing of the refused file reached the shards";
    }
    expect_user_error([&] { ckpt::verify_checkpoint(path, MPI_COMM_WORLD); }, part);
    if (rank_of(MPI_COMM_WORLD) == 0) {
      std::ostringstream os;
      expect_user_error([&] { ckpt::inspect_checkpoint(path, os); }, part);
      expect_user_error([&] { ckpt::export_safetensors(path, dir + "/out.safetensors"); }, part);
      expect_user_error([&] { ckpt::consolidate_checkpoint(path, dir + "/out.h5"); }, part);
      expect_user_error([&] { ckpt::read_checkpoint_meta(path); }, part);
      EXPECT_FALSE(fs::exists(dir + "/out.safetensors"));
      EXPECT_FALSE(fs::exists(dir + "/out.h5"));
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
};

}  // namespace

TEST_F(Shared, SoftAndExternalLinksInACheckpointAreRefusedByEveryReader) {
  optim::KokkosScope kokkos;
  // A parameter that is a soft link to another of the same shape: without the check, the
  // load would silently read ln_f_bias's values as ln_f_weight.
  const std::string soft = edited("soft.h5", [](hid_t f) {
    if (H5Ldelete(f, "model/ln_f_weight", H5P_DEFAULT) < 0 ||
        H5Lcreate_soft("/model/ln_f_bias", f, "model/ln_f_weight", H5P_DEFAULT, H5P_DEFAULT) < 0)
      ::_exit(2);
  });
  every_reader_refuses(soft, "/model/ln_f_weight is a soft link");

  // A parameter that is an external link into another checkpoint (same shapes, other values).
  const std::string other = dir + "/other.h5";
  {
    Trainee t(MPI_COMM_WORLD, Layout{});
    fill(t, 99);
    ckpt::save_checkpoint(other, *t.engine, *t.opt, {}, {}, MPI_COMM_WORLD);
  }
  const std::string ext = edited("external.h5", [&](hid_t f) {
    if (H5Ldelete(f, "model/wte_weight", H5P_DEFAULT) < 0 ||
        H5Lcreate_external(other.c_str(), "/model/wte_weight", f, "model/wte_weight", H5P_DEFAULT, H5P_DEFAULT) < 0)
      ::_exit(2);
  });
  every_reader_refuses(ext, "/model/wte_weight is an external link");

  // A link anywhere (here an extra group at the root) is refused too, before the data is read.
  const std::string extra = edited("extra_soft.h5", [](hid_t f) {
    if (H5Lcreate_soft("/model", f, "alias", H5P_DEFAULT, H5P_DEFAULT) < 0) ::_exit(2);
  });
  expect_user_error([&] { ckpt::verify_checkpoint(extra, MPI_COMM_WORLD); }, "/alias is a soft link");
  ckpt::verify_checkpoint(good, MPI_COMM_WORLD);  // the untouched file still verifies
}

TEST_F(Shared, PlantedLinksAtCheckpointNamesAreRefusedAndTheirTargetsKept) {
  optim::KokkosScope kokkos;
  const bool r0 = rank_of(MPI_COMM_WORLD) == 0;
  Trainee t(MPI_COMM_WORLD, Layout{});
  fill(t, 3);
  // The temporary of an atomic save.
  const std::string a = dir + "/a.h5";
  if (r0) fs::create_symlink(victim, a + ".tmp");
  MPI_Barrier(MPI_COMM_WORLD);
  expect_user_error([&] { ckpt::save_checkpoint(a, *t.engine, *t.opt, {}, {}, MPI_COMM_WORLD); },
                    "a.h5.tmp exists and is a symbolic link");
  // The final name.
  const std::string b = dir + "/b.h5";
  if (r0) fs::create_symlink(victim, b);
  MPI_Barrier(MPI_COMM_WORLD);
  expect_user_error([&] { ckpt::save_checkpoint(b, *t.engine, *t.opt, {}, {}, MPI_COMM_WORLD); },
                    "b.h5 exists and is a symbolic link");
  // The manager's step file temporary and `latest`.
  const std::string cdir = dir + "/ck";
  if (r0) {
    fs::create_directories(cdir);
    fs::create_symlink(victim, cdir + "/" + ckpt::CheckpointManager::file_name(5) + ".tmp");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  {
    ckpt::CheckpointManager m(cdir, 2, MPI_COMM_WORLD, /*async=*/false, {}, "run-1");
    expect_user_error([&] { m.save(5, *t.engine, *t.opt, {}, {}); }, ".h5.tmp exists and is a symbolic link");
  }
  if (r0) {
    EXPECT_EQ(text_of(victim), "precious\n");
    EXPECT_TRUE(fs::is_symlink(a + ".tmp"));
    EXPECT_TRUE(fs::is_symlink(b));
    // The lock file.
    const std::string ldir = dir + "/locked";
    fs::create_directories(ldir);
    fs::create_symlink(victim, ldir + "/shardtrain.lock");
    expect_user_error([&] { ckpt::DirLock::acquire(ldir, "run.out_dir"); }, "shardtrain.lock exists and is a symbolic link");
    // The tools' outputs: a link at the output, a link at its temporary, a device node.
    fs::create_symlink(victim, dir + "/exp.safetensors");
    expect_user_error([&] { ckpt::export_safetensors(good, dir + "/exp.safetensors"); }, "is a symbolic link");
    fs::create_symlink(victim, dir + "/exp2.safetensors.tmp");
    expect_user_error([&] { ckpt::export_safetensors(good, dir + "/exp2.safetensors"); }, "is a symbolic link");
    fs::create_symlink(victim, dir + "/cons.h5");
    expect_user_error([&] { ckpt::consolidate_checkpoint(good, dir + "/cons.h5"); }, "is a symbolic link");
    fs::create_symlink(victim, dir + "/cons2.h5.tmp");
    expect_user_error([&] { ckpt::consolidate_checkpoint(good, dir + "/cons2.h5"); }, "is a symbolic link");
    expect_user_error([&] { ckpt::export_safetensors(good, "/dev/null"); }, "is a character device");
    struct stat st {};
    ASSERT_EQ(::stat("/dev/null", &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode)) << "/dev/null was replaced";
    EXPECT_EQ(text_of(victim), "precious\n");
    // With the names free, the same outputs are written.
    ckpt::export_safetensors(good, dir + "/fine.safetensors");
    ckpt::consolidate_checkpoint(good, dir + "/fine.h5");
    EXPECT_FALSE(fs::exists(dir + "/fine.h5.tmp"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_F(Shared, OverlappingOrGappedSafetensorsTensorsAreRefused) {
  if (rank_of(MPI_COMM_WORLD) != 0) return;
  // Two F32 tensors of 2 elements in 16 bytes of data; offsets as given.
  auto write = [&](const std::string& name, int a0, int a1, int b0, int b1, int data_bytes) {
    std::string h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[" + std::to_string(a0) + "," +
                    std::to_string(a1) + "]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[" +
                    std::to_string(b0) + "," + std::to_string(b1) + "]}}";
    std::ofstream f(dir + "/" + name, std::ios::binary);
    uint64_t n = h.size();
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>(n >> (8 * i)));
    f << h << std::string(static_cast<size_t>(data_bytes), '\0');
    return dir + "/" + name;
  };
  EXPECT_EQ(ckpt::read_safetensors_header(write("ok.safetensors", 0, 8, 8, 16, 16)).size(), 2u);
  expect_user_error([&] { ckpt::read_safetensors_header(write("overlap.safetensors", 0, 8, 4, 12, 16)); },
                    "overlaps tensor 'a'");
  expect_user_error([&] { ckpt::read_safetensors_header(write("same.safetensors", 0, 8, 0, 8, 16)); }, "overlaps");
  expect_user_error([&] { ckpt::read_safetensors_header(write("gap.safetensors", 0, 8, 12, 20, 20)); },
                    "belong to no tensor");
  expect_user_error([&] { ckpt::read_safetensors_header(write("tail.safetensors", 0, 8, 8, 16, 24)); },
                    "at the end of the file belong to no tensor");
}
