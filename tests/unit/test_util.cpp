// util: error messages carry rank and file:line; memory readings are sane.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <cstdlib>
#include <vector>

#include "shardtrain/util/error.h"
#include "shardtrain/util/host_memory.h"
#include "shardtrain/util/memory.h"

using namespace shardtrain;

TEST(Error, CheckNamesFileLineAndRank) {
  set_error_rank(3);
  try {
    ST_CHECK(1 + 1 == 3, "arithmetic is broken: ", 42);
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[rank 3]"), std::string::npos) << m;
    EXPECT_NE(m.find("test_util.cpp:"), std::string::npos) << m;
    EXPECT_NE(m.find("1 + 1 == 3"), std::string::npos) << m;
    EXPECT_NE(m.find("arithmetic is broken: 42"), std::string::npos) << m;
    EXPECT_EQ(e.exit_code(), kExitInternal);
  }
  set_error_rank(-1);
}

TEST(Error, UserCheckIsExitCodeTwoWithPlainMessage) {
  try {
    ST_USER_CHECK(false, "deck.toml:3: bad value ", 7);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "deck.toml:3: bad value 7");
    EXPECT_EQ(e.exit_code(), kExitUserInput);
  }
}

TEST(Memory, PeakCoversAnAllocationWeTouched) {
  ProcessMemory before = read_process_memory();
  ASSERT_GT(before.rss_bytes, 0);
  std::vector<char> big(64 << 20, 1);  // touched, so resident
  ProcessMemory after = read_process_memory();
  EXPECT_GE(after.hwm_bytes, before.rss_bytes + (48 << 20));
  EXPECT_GE(after.hwm_bytes, after.rss_bytes);
  EXPECT_EQ(big[12345], 1);
}

namespace {
// Minor page faults while touching every page of a fresh 64 MiB malloc block (then freed).
long faults_touching_a_64mib_block() {
  const size_t n = size_t{64} << 20;
  char* p = static_cast<char*>(std::malloc(n));
  if (p == nullptr) return -1;
  rusage a{}, b{};
  getrusage(RUSAGE_SELF, &a);
  for (size_t i = 0; i < n; i += 4096) reinterpret_cast<volatile char*>(p)[i] = 1;
  getrusage(RUSAGE_SELF, &b);
  std::free(p);
  return b.ru_minflt - a.ru_minflt;
}
}  // namespace

// One test, in this order: glibc's default first (the setting is process-wide and one-way).
TEST(HostMemory, FreedBlocksAreReusedWithoutFaultingAgain) {
  // Default: a block over the mmap threshold (at most 32 MiB) is a fresh mapping every time.
  faults_touching_a_64mib_block();
  const long before = faults_touching_a_64mib_block();
  ASSERT_GT(before, 0) << "a fresh 64 MiB block should fault its pages in";
  ASSERT_TRUE(keep_freed_host_memory());
  ASSERT_TRUE(keep_freed_host_memory()) << "idempotent";
  faults_touching_a_64mib_block();  // the heap grows once
  const long after = faults_touching_a_64mib_block();
  EXPECT_LT(after * 8, before) << "freed memory should be reused: " << after << " faults vs " << before;
}
