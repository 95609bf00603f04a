// Comm::reduce_scatter_tree / all_reduce_tree, the default: a backend without fixed-tree sums
// refuses with a clear error (the MPI backend has them: tree_reduce.h).
#include "internal.h"
#include "shardtrain/comm/comm.h"

namespace shardtrain::comm {

WorkPtr Comm::reduce_scatter_tree(const at::Tensor&, const at::Tensor&) {
  detail::throw_comm_error(name_, "reduce_scatter_tree",
                           std::string("the ") + to_string(backend()) + " backend has no fixed-tree sums");
}

WorkPtr Comm::all_reduce_tree(const at::Tensor&) {
  detail::throw_comm_error(name_, "all_reduce_tree",
                           std::string("the ") + to_string(backend()) + " backend has no fixed-tree sums");
}

}  // namespace shardtrain::comm
