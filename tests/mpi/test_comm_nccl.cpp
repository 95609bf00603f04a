// NCCL backend, the parts that run without a GPU: version, availability, clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "comm_test_util.h"
#include "shardtrain/comm/comm.h"
#include "shardtrain/comm/compute_stream.h"
#include "shardtrain/runtime/topology.h"
#include "shardtrain/util/error.h"

using namespace shardtrain;
using namespace shardtrain::comm;

TEST(CommNccl, VersionAndAvailability) {
#ifdef SHARDTRAIN_HAVE_NCCL
  EXPECT_TRUE(nccl_available());
  std::string v = nccl_version_string();
  EXPECT_EQ(v.rfind("2.", 0), 0u) << v;
  EXPECT_GE(std::count(v.begin(), v.end(), '.'), 2) << v;
#else
  EXPECT_FALSE(nccl_available());
  EXPECT_EQ(nccl_version_string(), "");
#endif
}

TEST(CommNccl, NoDeviceIsAClearErrorOnEveryRank) {
  try {
    make_nccl_comm(MPI_COMM_WORLD, "world", -1, {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("comm 'world'"), std::string::npos) << m;
#ifdef SHARDTRAIN_HAVE_NCCL
    EXPECT_NE(m.find("needs a CUDA device"), std::string::npos) << m;
    EXPECT_TRUE(e.agreed());  // every rank failed together
#endif
  }
}

TEST(CommNccl, MissingGpuIsAClearError) {
  if (runtime::visible_cuda_devices() > 0) GTEST_SKIP() << "a GPU is present";
  try {
    make_nccl_comm(MPI_COMM_WORLD, "world", 0, {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("comm 'world'"), std::string::npos) << m;
  }
}

TEST(CommNccl, ComputeStreamIsPerThreadAndScoped) {
  EXPECT_EQ(compute_stream(), nullptr);
  int dummy = 0;
  {
    ComputeStreamGuard g(&dummy);
    EXPECT_EQ(compute_stream(), &dummy);
    std::thread([] { EXPECT_EQ(compute_stream(), nullptr); }).join();
  }
  EXPECT_EQ(compute_stream(), nullptr);
}
