// runtime/singleton_session.h: which processes get a private Open MPI session directory, that a
// caller's own choice is kept, that dead singletons' directories are swept (and nothing else),
// and, last (MPI starts once per process), that a real MPI_Init puts its session tree there and
// the Runtime removes it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "shardtrain/runtime/runtime.h"
#include "shardtrain/runtime/singleton_session.h"

namespace fs = std::filesystem;
using namespace shardtrain::runtime;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string host() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

// Every test runs with TMPDIR set to a directory of its own and no session variables set.
class SingletonSession : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : {"OMPI_MCA_orte_tmpdir_base", "SHARDTRAIN_SINGLETON_TMPDIR"}) unsetenv(v);
    std::string t = (env("TMPDIR").empty() ? std::string("/tmp") : outer_) + "/singleton-session-test.XXXXXX";
    ASSERT_NE(mkdtemp(t.data()), nullptr);
    tmp_ = t;
    setenv("TMPDIR", tmp_.c_str(), 1);
  }
  void TearDown() override {
    remove_private_session_dir();
    for (const char* v : {"OMPI_MCA_orte_tmpdir_base", "SHARDTRAIN_SINGLETON_TMPDIR"}) unsetenv(v);
    if (outer_.empty()) unsetenv("TMPDIR");
    else setenv("TMPDIR", outer_.c_str(), 1);
    fs::remove_all(tmp_);
  }
  std::string outer_ = env("TMPDIR");
  std::string tmp_;
};

// A pid that is certainly not running: a child that has exited and been reaped.
pid_t dead_pid() {
  pid_t p = fork();
  if (p == 0) _exit(0);
  int st = 0;
  waitpid(p, &st, 0);
  return p;
}

void make_owned(const std::string& dir, const std::string& owner) {
  fs::create_directories(dir + "/ompi.x.0/jf.0/1/0");
  if (!owner.empty()) std::ofstream(dir + "/owner") << owner << '\n';
}

}  // namespace

TEST_F(SingletonSession, LaunchedProcessesAreLeftAlone) {
  for (const char* v : {"OMPI_MCA_orte_hnp_uri", "OMPI_MCA_orte_launch", "PMIX_RANK", "PMIX_NAMESPACE", "PMI_FD",
                        "PMI_RANK", "OMPI_COMM_WORLD_SIZE"}) {
    setenv(v, "1", 1);
    EXPECT_FALSE(launched_as_singleton()) << v;
    EXPECT_EQ(use_private_session_dir_if_singleton(), "") << v;
    EXPECT_EQ(env("OMPI_MCA_orte_tmpdir_base"), "") << v;
    unsetenv(v);
  }
  EXPECT_TRUE(launched_as_singleton());
  EXPECT_TRUE(fs::is_empty(tmp_));
}

TEST_F(SingletonSession, CallersChoiceIsKept) {
  for (const char* v : {"OMPI_MCA_orte_tmpdir_base", "OMPI_MCA_orte_top_session_dir", "OMPI_MCA_orte_jobfam_session_dir"}) {
    setenv(v, "/somewhere/chosen", 1);
    EXPECT_EQ(use_private_session_dir_if_singleton(), "") << v;
    EXPECT_EQ(env(v), "/somewhere/chosen") << v;
    unsetenv(v);
  }
  EXPECT_TRUE(fs::is_empty(tmp_));
}

TEST_F(SingletonSession, OneInheritedFromAParentIsReplacedAndRemoved) {
  const std::string parent = tmp_ + "/parents";
  setenv("OMPI_MCA_orte_tmpdir_base", parent.c_str(), 1);
  setenv("SHARDTRAIN_SINGLETON_TMPDIR", parent.c_str(), 1);
  const std::string dir = use_private_session_dir_if_singleton();
  ASSERT_NE(dir, "");
  EXPECT_EQ(fs::path(dir).parent_path(), fs::path(tmp_));
  EXPECT_EQ(fs::path(dir).filename().string().rfind("shardtrain-mpi." + std::to_string(getpid()) + ".", 0), 0u) << dir;
  EXPECT_EQ(env("OMPI_MCA_orte_tmpdir_base"), dir);
  EXPECT_EQ(env("SHARDTRAIN_SINGLETON_TMPDIR"), dir);
  std::ifstream owner(dir + "/owner");
  std::string h;
  long pid = 0;
  owner >> h >> pid;
  EXPECT_EQ(h, host());
  EXPECT_EQ(pid, getpid());
  fs::create_directories(dir + "/ompi.x.0/jf.0/1/0");  // what Open MPI leaves when killed
  remove_private_session_dir();
  EXPECT_FALSE(fs::exists(dir));
  remove_private_session_dir();  // idempotent
}

TEST_F(SingletonSession, SweepsOnlyDeadSingletonsOfThisHost) {
  const pid_t dead = dead_pid();
  const std::string p = tmp_ + "/shardtrain-mpi.";
  const std::string gone = p + std::to_string(dead) + ".aaaaaa";
  const std::string alive = p + std::to_string(getppid()) + ".bbbbbb";
  const std::string other_host = p + std::to_string(dead) + ".cccccc";
  const std::string no_owner = p + std::to_string(dead) + ".dddddd";
  const std::string not_ours = tmp_ + "/other-tool." + std::to_string(dead);
  make_owned(gone, host() + " " + std::to_string(dead));
  make_owned(alive, host() + " " + std::to_string(getppid()));
  make_owned(other_host, "another-host-name " + std::to_string(dead));
  make_owned(no_owner, "");
  make_owned(not_ours, host() + " " + std::to_string(dead));
  const std::string mine = use_private_session_dir_if_singleton();
  ASSERT_NE(mine, "");
  EXPECT_FALSE(fs::exists(gone));
  for (const auto& d : {alive, other_host, no_owner, not_ours}) EXPECT_TRUE(fs::exists(d + "/ompi.x.0/jf.0/1/0")) << d;
  EXPECT_TRUE(fs::exists(mine));
}

// Last: MPI_Init runs once per process. The session tree of a real singleton start is inside the
// private directory (none in TMPDIR itself), and the Runtime removes the directory at shut-down.
TEST_F(SingletonSession, MpiPutsItsSessionTreeThereAndRuntimeRemovesIt) {
  std::string dir;
  {
    Runtime rt(nullptr, nullptr);
    ASSERT_EQ(rt.size(), 1);
    dir = env("OMPI_MCA_orte_tmpdir_base");
    ASSERT_NE(dir, "");
    ASSERT_EQ(fs::path(dir).parent_path(), fs::path(tmp_));
    int session_entries = 0;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename() != "owner") ++session_entries;
    EXPECT_GE(session_entries, 1) << "Open MPI made no session directory in " << dir;
    for (const auto& e : fs::directory_iterator(tmp_))
      EXPECT_EQ(e.path().string(), dir) << "a session entry outside the private directory";
  }
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_TRUE(fs::is_empty(tmp_));
}
