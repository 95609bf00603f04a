// util: error messages carry rank and file:line; memory readings are sane.
#include <gtest/gtest.h>

#include <vector>

#include "shardtrain/util/error.h"
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
