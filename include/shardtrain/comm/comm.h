// Comm: one process group's collectives, each returning a Work handle (c10d style).
#pragma once
#include <ATen/core/Tensor.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace shardtrain::comm {

enum class ReduceOp { Sum, Avg, Max };
enum class Backend { Mpi, Nccl };
const char* to_string(ReduceOp op);
const char* to_string(Backend b);

// A handle on one issued collective. wait() blocks until the result is usable by the
// caller (CPU: the data is in place; CUDA: the caller's current stream is ordered after
// it) and rethrows any error the collective raised.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
  uint64_t seq() const { return seq_; }

 protected:
  explicit Work(uint64_t seq) : seq_(seq) {}
  uint64_t seq_;
};
using WorkPtr = std::shared_ptr<Work>;

struct CommOptions {
  double timeout_s = 600;  // a collective outstanding longer than this is fatal (watchdog)
  int flight_recorder_entries = 64;
};

// One entry of the flight recorder: the last N collectives issued in a group.
struct FlightRecord {
  uint64_t seq = 0;
  std::string op;
  int64_t numel = 0;
  std::string dtype;
  double issued_s = 0, started_s = 0, finished_s = 0;  // steady clock; 0 = not yet
};

// Contract shared by all backends:
// - Collectives are issued in the same order on every rank of the group and run in
//   issue order. Tensors must stay alive and untouched until wait() returns.
// - Counts are elements. all_gather: out.numel() == size() * in.numel();
//   reduce_scatter: in.numel() == size() * out.numel(). Both tensors contiguous.
//   out and in may alias in the usual in-place layouts (in is rank's slice of out for
//   all_gather; out is rank's slice of in for reduce_scatter).
// - dtypes: float32, float64, bfloat16, float16 (and int64 for all_reduce/broadcast);
//   half-precision reductions accumulate in fp32.
class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Backend backend() const = 0;
  const std::string& name() const { return name_; }

  virtual WorkPtr all_gather(const at::Tensor& out, const at::Tensor& in) = 0;
  virtual WorkPtr reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) = 0;
  virtual WorkPtr all_reduce(const at::Tensor& tensor, ReduceOp op) = 0;
  // All-reduces several tensors (each in place) as one group call: NCCL launches them inside
  // one ncclGroupStart/End, so many small tensors cost one launch. The default (MPI) issues
  // them one by one, in order. One Work for all (seq: the last one's; 0 when empty).
  virtual WorkPtr all_reduce_coalesced(const std::vector<at::Tensor>& tensors, ReduceOp op);
  // Sums in one fixed binary tree over the group's ranks (ranks 2i and 2i+1 first, then pairs
  // of pairs): the result's bits depend only on the inputs and the group size, never on timing,
  // the backend's ring order or an MPI library's algorithm (train.reproducible). The group size
  // must be a power of two; out must not overlap in. The default refuses (a backend without
  // them: a clear error, never a silent fallback to another order).
  virtual WorkPtr reduce_scatter_tree(const at::Tensor& out, const at::Tensor& in);
  virtual WorkPtr all_reduce_tree(const at::Tensor& tensor);
  virtual WorkPtr broadcast(const at::Tensor& tensor, int root) = 0;
  virtual WorkPtr barrier() = 0;

  // Last collectives of this group, oldest first.
  virtual std::vector<FlightRecord> flight_records() const = 0;

 protected:
  explicit Comm(std::string name) : name_(std::move(name)) {}
  std::string name_;
};

// MPI backend over a communicator it duplicates (CPU tensors). `name` labels the group in
// errors, e.g. "shard[0]". Collective over `comm`.
std::unique_ptr<Comm> make_mpi_comm(MPI_Comm comm, const std::string& name, const CommOptions& opts);

// NCCL backend (CUDA tensors); throws a clear Error when built without NCCL.
// Collective over `comm` (the unique id is broadcast through it).
std::unique_ptr<Comm> make_nccl_comm(MPI_Comm comm, const std::string& name, int device,
                                     const CommOptions& opts);
bool nccl_available();
std::string nccl_version_string();  // e.g. "2.28.3", or "" without NCCL

}  // namespace shardtrain::comm
