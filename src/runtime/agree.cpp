// run_agreed: an all-reduce of the failure code, then a broadcast of the first message.
#include "shardtrain/runtime/agree.h"

#include "shardtrain/runtime/blocking_region.h"

#include <string>
#include <vector>

#include "shardtrain/util/error.h"
#include "shardtrain/util/error_text.h"
#include "shardtrain/util/log.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::runtime {

void run_agreed(MPI_Comm comm, const std::function<void()>& fn, const char* name) {
  int rank = 0;
  ST_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  int code = kExitOk;
  std::string msg;
  try {
    fn();
  } catch (const UserError& e) {
    code = kExitUserInput;
    msg = e.what();
  } catch (const Error& e) {
    code = e.exit_code() == kExitOk ? kExitInternal : e.exit_code();
    msg = e.what();
  } catch (const std::exception& e) {
    code = kExitInternal;
    msg = error_text(e);  // no library stack trace (SHARDTRAIN_LOG=debug shows it)
    log::debug(e.what());
  }
  // Lowest failing rank speaks; its code decides the exception type. The agreement (not fn,
  // which names its own regions) is a blocking region: a peer that never arrives (a cut link)
  // ends the job through the watchdog when comm is watched.
  int mine = code != kExitOk ? rank : 1 << 30, first = 0;
  int hdr[2] = {code, static_cast<int>(msg.size())};
  std::vector<char> buf(msg.begin(), msg.end());
  {
    BlockingRegion region(comm, name);
    ST_MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
    if (first == 1 << 30) return;
    ST_MPI_CHECK(MPI_Bcast(hdr, 2, MPI_INT, first, comm));
    buf.resize(hdr[1]);
    ST_MPI_CHECK(MPI_Bcast(buf.data(), hdr[1], MPI_CHAR, first, comm));
  }
  std::string text(buf.begin(), buf.end());
  if (hdr[0] == kExitUserInput) {
    UserError e(text);
    e.set_agreed();
    throw e;
  }
  Error e(text, hdr[0]);
  e.set_agreed();
  throw e;
}

}  // namespace shardtrain::runtime
