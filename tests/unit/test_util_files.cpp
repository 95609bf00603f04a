// util/file_io.h and util/path_inside.h: the one way files are created never writes through a
// planted symbolic link, into a FIFO or device, or over a non-regular file; path keys stay
// inside their base.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "shardtrain/util/error.h"
#include "shardtrain/util/error_text.h"
#include "shardtrain/util/file_io.h"
#include "shardtrain/util/path_inside.h"

using namespace shardtrain;
namespace fs = std::filesystem;

namespace {
struct Dir : ::testing::Test {
  std::string d;
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "st-files-XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    d = templ;
    std::ofstream(d + "/victim") << "precious\n";
  }
  void TearDown() override { fs::remove_all(d); }
  std::string victim() const {
    std::ifstream in(d + "/victim");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  void plant(const std::string& name) { fs::create_symlink(d + "/victim", d + "/" + name); }
};

// `fn` throws a UserError (exit 2) whose message contains `part`.
template <typename F>
void expect_user_error(F&& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected '" << part << "'";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}
}  // namespace

TEST_F(Dir, AtomicWriteRefusesALinkAtTheOutputAndAtItsTemporary) {
  plant("out");
  expect_user_error([&] { io::write_file_atomic(d + "/out", "x"); }, "/out exists and is a symbolic link");
  EXPECT_EQ(victim(), "precious\n");
  EXPECT_TRUE(fs::is_symlink(d + "/out"));
  EXPECT_FALSE(fs::exists(fs::symlink_status(d + "/out.tmp")));

  plant("new.tmp");
  expect_user_error([&] { io::write_file_atomic(d + "/new", "x"); }, "/new.tmp exists and is a symbolic link");
  EXPECT_EQ(victim(), "precious\n");
  EXPECT_FALSE(fs::exists(d + "/new"));

  // A stale regular temporary (a crashed writer's) is replaced; the write succeeds.
  std::ofstream(d + "/ok.tmp") << "stale";
  io::write_file_atomic(d + "/ok", "fresh");
  std::ifstream in(d + "/ok");
  std::string s;
  std::getline(in, s);
  EXPECT_EQ(s, "fresh");
  EXPECT_FALSE(fs::exists(d + "/ok.tmp"));
}

TEST_F(Dir, OutputsThatAreNotRegularFilesAreRefused) {
  ASSERT_EQ(::mkfifo((d + "/fifo").c_str(), 0644), 0);
  expect_user_error([&] { io::write_file_atomic(d + "/fifo", "x"); }, "is a FIFO");
  fs::create_directory(d + "/dir");
  expect_user_error([&] { io::write_file_atomic(d + "/dir", "x"); }, "is a directory");
  // A device node: /dev/null as an output is refused (as root, a rename would replace it).
  expect_user_error([&] { io::check_output_path("/dev/null", "export"); }, "is a character device");
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

TEST_F(Dir, AnOutputInADirectoryThatIsNotThereIsBadInputForEveryWriter) {
  // The same kind of failure, the same exit code (2), whichever command writes: before the
  // work (check_output_path / check_output_writable) and at the create itself.
  expect_user_error([&] { io::check_output_path(d + "/no/such/out", "export output"); },
                    "export output " + d + "/no/such/out: its directory " + d + "/no/such does not exist");
  expect_user_error([&] { io::check_output_writable(d + "/no/out", "import output"); }, "its directory " + d + "/no does not exist");
  expect_user_error([&] { io::check_output_path(d + "/victim/out", "output"); }, "/victim/out: ");
  expect_user_error([&] { io::write_file_atomic(d + "/gone/out", "x"); }, "/gone/out: its directory");
  try {
    io::write_file_atomic(d + "/gone/out", "x");
  } catch (const IoError&) {
    ADD_FAILURE() << "a missing directory is not a storage failure (exit 5)";
  } catch (const UserError&) {
  }
  io::check_output_writable(d + "/fine", "output");  // absent, in a writable directory: fine
  EXPECT_FALSE(fs::exists(d + "/fine"));
  EXPECT_FALSE(fs::exists(d + "/no"));
}

TEST_F(Dir, OutputFileLeavesNothingBehindWithoutCommit) {
  {
    io::OutputFile f(d + "/part", "test output");
    f.write("half");
    EXPECT_TRUE(fs::exists(d + "/part.tmp"));
  }
  EXPECT_FALSE(fs::exists(d + "/part.tmp"));
  EXPECT_FALSE(fs::exists(d + "/part"));
}

TEST_F(Dir, AppendFileAndInPlaceOpensRefuseLinksAndFifos) {
  plant("metrics.jsonl");
  io::AppendFile a;
  expect_user_error([&] { a.open(d + "/metrics.jsonl", /*truncate=*/true); }, "is a symbolic link");
  expect_user_error([&] { a.open(d + "/metrics.jsonl", /*truncate=*/false); }, "is a symbolic link");
  EXPECT_EQ(victim(), "precious\n");
  ASSERT_EQ(::mkfifo((d + "/samples.jsonl").c_str(), 0644), 0);
  expect_user_error([&] { a.open(d + "/samples.jsonl", true); }, "is a FIFO");  // and it did not block
  a.open(d + "/real.jsonl", true);
  a.append("{\"step\":1}\n");
  a.close();
  EXPECT_EQ(fs::file_size(d + "/real.jsonl"), 11u);
  const int fd = io::open_in_place(d + "/real.jsonl", O_RDWR, "lock");
  ASSERT_GE(fd, 0);
  ::close(fd);
  EXPECT_EQ(io::open_in_place(d + "/no/such/dir", O_RDWR, "lock"), -1);
}

TEST(PathInside, RelativePathsStayInsideTheirBase) {
  EXPECT_EQ(path_escape_reason("metrics.jsonl"), "");
  EXPECT_EQ(path_escape_reason("logs/m.jsonl"), "");
  EXPECT_EQ(path_escape_reason("a/../b"), "");
  EXPECT_NE(path_escape_reason("../x"), "");
  EXPECT_NE(path_escape_reason("a/../../x"), "");
  EXPECT_NE(path_escape_reason("/etc/passwd"), "");
  EXPECT_NE(path_escape_reason(""), "");
  EXPECT_NE(path_escape_reason("."), "");
  EXPECT_NE(path_escape_reason("a/.."), "");
  EXPECT_NE(path_escape_reason(std::string("a\0b", 3)), "");
  EXPECT_NE(path_escape_reason("a\nb"), "");
  EXPECT_EQ(path_inside("runs", "x", "run.name", "runs/"), "runs/x");
  expect_user_error([] { path_inside("runs", "../../x", "run.name", "runs/"); }, "run.name = \"../../x\"");
  EXPECT_EQ(plain_name_reason("step_00000004.h5"), "");
  EXPECT_NE(plain_name_reason("../step_00000004.h5"), "");
  EXPECT_NE(plain_name_reason("/tmp/x.h5"), "");
  EXPECT_NE(plain_name_reason(".."), "");
}

TEST(ErrorText, ALibrarysStackTraceIsCutOff) {
  // libtorch's c10::Error::what(): the message, then where it was raised and the frames.
  const std::runtime_error torch_like(
      "[enforce fail at alloc_cpu.cpp:75] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate "
      "64000008000000 bytes.\nException raised from alloc_cpu at ../c10/core/impl/alloc_cpu.cpp:75 (most recent call "
      "first):\nframe #0: c10::Error::Error(...) + 0x8d (0x7f in /usr/lib/libc10.so)\nframe #1: ...");
  EXPECT_EQ(error_text(torch_like),
            "[enforce fail at alloc_cpu.cpp:75] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
            "allocate 64000008000000 bytes.");
  const std::runtime_error frames_only("Storage size calculation overflowed\nframe #0: at::empty(...)");
  EXPECT_EQ(error_text(frames_only), "Storage size calculation overflowed");
  const std::runtime_error plain("a plain message\nwith two lines");
  EXPECT_EQ(error_text(plain), "a plain message\nwith two lines");
}
