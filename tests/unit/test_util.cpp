// util: error messages carry rank and file:line; memory readings are sane.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <cstdlib>
#include <vector>

#include "shardtrain/util/byte_size.h"
#include "shardtrain/util/error.h"
#include "shardtrain/util/host_memory.h"
#include "shardtrain/util/memory.h"

using namespace shardtrain;

// The one size parser (plan --device-memory, maxbatch --memory-limit, ckpt export
// --max-shard-size, bench collectives --min-bytes/--max-bytes).
TEST(ByteSize, ParsesSizes) {
  EXPECT_EQ(parse_byte_size("80GiB", "x"), int64_t(80) << 30);
  EXPECT_EQ(parse_byte_size("512MiB", "x"), int64_t(512) << 20);
  EXPECT_EQ(parse_byte_size("2GB", "x"), int64_t(2000000000));
  EXPECT_EQ(parse_byte_size("1.5e9", "x"), int64_t(1500000000));
  EXPECT_EQ(parse_byte_size("4096", "x"), 4096);
  EXPECT_THROW(parse_byte_size("lots", "--device-memory"), UserError);
  EXPECT_THROW(parse_byte_size("3 parsecs", "--device-memory"), UserError);
  EXPECT_THROW(parse_byte_size("-1GiB", "--device-memory"), UserError);
}

// What each spelling that a doc, test or script uses has always meant: KB, MB, GB decimal
// (ckpt export's "60KB", "5GB"), the bench's bare letters binary ("1K", "64M", "16M").
TEST(ByteSize, DecimalWithBBinaryWithoutOrWithIB) {
  EXPECT_EQ(parse_byte_size("60KB", "x"), 60000);
  EXPECT_EQ(parse_byte_size("5gb", "x"), int64_t(5000000000));
  EXPECT_EQ(parse_byte_size("1K", "x"), 1024);
  EXPECT_EQ(parse_byte_size("64M", "x"), int64_t(64) << 20);
  EXPECT_EQ(parse_byte_size("16m", "x"), int64_t(16) << 20);
  EXPECT_EQ(parse_byte_size("1G", "x"), int64_t(1) << 30);
  EXPECT_EQ(parse_byte_size("40 GiB", "x"), int64_t(40) << 30);
  EXPECT_EQ(parse_byte_size("1.5KiB", "x"), 1536);
  try {
    parse_byte_size("0", "--min-bytes");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--min-bytes: '0' must be a positive size"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_byte_size("0.5", "x"), UserError);  // less than a byte
  EXPECT_THROW(parse_byte_size("9e18", "x"), UserError);
  EXPECT_THROW(parse_byte_size("nan", "x"), UserError);
  EXPECT_THROW(parse_byte_size("1XB", "x"), UserError);
}

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
