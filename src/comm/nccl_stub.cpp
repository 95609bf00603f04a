// NCCL entry points for builds without NCCL: clear errors instead of missing symbols.
#include "shardtrain/comm/comm.h"
#include "shardtrain/util/error.h"

namespace shardtrain::comm {

std::unique_ptr<Comm> make_nccl_comm(MPI_Comm, const std::string& name, int, const CommOptions&) {
  throw UserError("comm '" + name + "': the nccl backend was requested, but this shardtrain was "
                  "built without NCCL (configure with -DSHARDTRAIN_WITH_NCCL=ON and a CUDA "
                  "toolkit); use comm backend 'mpi'");
}
bool nccl_available() { return false; }
std::string nccl_version_string() { return ""; }

}  // namespace shardtrain::comm
