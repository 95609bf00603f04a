// Watchdog e2e driver: the last rank skips one all_reduce, so the others' collective can
// never complete; the watchdog must report it and end the job with exit code 3.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "shardtrain/comm/comm.h"
#include "shardtrain/runtime/runtime.h"

using namespace shardtrain;

int main(int argc, char** argv) {
  runtime::Runtime rt(&argc, &argv);
  comm::CommOptions o;
  o.timeout_s = argc > 1 ? std::atof(argv[1]) : 3.0;
  auto world = comm::make_mpi_comm(MPI_COMM_WORLD, "world", o);
  at::Tensor t = at::ones({4}, at::kFloat);
  world->all_reduce(t, comm::ReduceOp::Sum)->wait();  // seq 1
  world->barrier()->wait();                            // seq 2
  if (rt.rank() == rt.size() - 1) {
    // Skips seq 3: stays alive (its watchdog answers queries) until the job is aborted.
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return 0;
  }
  world->all_reduce(t, comm::ReduceOp::Sum)->wait();  // seq 3: never completes
  return 0;
}
