// bench_collectives [op] [min-bytes] [max-bytes] [dtype] [iters] [warmup]: runs
// comm::run_collectives_bench on MPI_COMM_WORLD (see `shardtrain bench collectives`).
#include <cstdlib>
#include <iostream>

#include "shardtrain/comm/bench.h"
#include "shardtrain/runtime/runtime.h"
#include "shardtrain/util/byte_size.h"
#include "shardtrain/util/error.h"

using namespace shardtrain;

int main(int argc, char** argv) {
  runtime::Runtime rt(&argc, &argv);
  try {
    comm::CollectivesBenchOptions o;
    if (argc > 1) o.op = argv[1];
    if (argc > 2) o.min_bytes = parse_byte_size(argv[2], "min-bytes");
    if (argc > 3) o.max_bytes = parse_byte_size(argv[3], "max-bytes");
    if (argc > 4) o.dtype = argv[4];
    if (argc > 5) o.iters = std::atoi(argv[5]);
    if (argc > 6) o.warmup = std::atoi(argv[6]);
    comm::run_collectives_bench(MPI_COMM_WORLD, o, std::cout);
  } catch (const Error& e) {
    std::cerr << e.what() << "\n";
    runtime::Runtime::abort(e.exit_code());
  }
  return 0;
}
