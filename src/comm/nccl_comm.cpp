// NCCL backend: a communicator made from the MPI group, dedicated streams for all-gather,
// reduce-scatter and the rest, ordered against the caller's compute stream with events;
// tensors stay referenced until the collective's done event completes. Many tensors go in one
// group call (all_reduce_coalesced). An NCCL error while issuing aborts the communicator
// (ncclCommAbort) and every later call on it fails with that first error.
#include <algorithm>
#include <atomic>
#include <deque>
#include <mutex>

#include "cuda_check.h"
#include "flight_recorder.h"
#include "internal.h"
#include "shardtrain/comm/comm.h"
#include "shardtrain/comm/compute_stream.h"
#include "shardtrain/runtime/agree.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/timer.h"
#include "watchdog.h"

namespace shardtrain::comm {
namespace {

using namespace detail;

// Makes `device` current for a scope (NCCL and stream calls act on the current device).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    ST_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device_) ST_CUDA_CHECK(cudaSetDevice(device_));
  }
  ~DeviceGuard() {
    if (prev_ != device_) cudaSetDevice(prev_);  // best effort in a destructor
  }

 private:
  int device_, prev_ = -1;
};

ncclDataType_t nccl_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kBFloat16: return ncclBfloat16;
    case at::kHalf: return ncclFloat16;
    case at::kLong: return ncclInt64;
    default: ST_CHECK(false, "no NCCL dtype for ", dtype_long_name(t));
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;  // NCCL >= 2.10 divides on the device
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

// One issued collective: its events and the tensors it uses.
struct InFlight {
  uint64_t seq = 0;
  std::string op, dtype;
  int64_t numel = 0;
  double issued_s = 0;
  cudaEvent_t done = nullptr;
  std::vector<at::Tensor> keep;
  bool host_sync = false;  // barrier: wait() blocks the host too
  ~InFlight() {
    if (done) cudaEventDestroy(done);  // legal before completion; freed when it completes
  }
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<InFlight> f, int device) : Work(f->seq), f_(std::move(f)), device_(device) {}
  void wait() override {
    DeviceGuard g(device_);
    ST_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(compute_stream()), f_->done, 0));
    if (f_->host_sync) ST_CUDA_CHECK(cudaEventSynchronize(f_->done));
  }
  bool is_completed() override {
    DeviceGuard g(device_);
    cudaError_t e = cudaEventQuery(f_->done);
    if (e == cudaErrorNotReady) return false;
    ST_CUDA_CHECK(e);
    return true;
  }

 private:
  std::shared_ptr<InFlight> f_;
  int device_;
};

class NcclComm final : public Comm, public Watched {
 public:
  enum Lane { kGather = 0, kScatter = 1, kOther = 2 };

  NcclComm(MPI_Comm comm, const std::string& name, int device, const CommOptions& opts)
      : Comm(name), opts_(opts), device_(device), recorder_(opts.flight_recorder_entries) {
    ST_MPI_CHECK(MPI_Comm_dup(comm, &query_));
    ST_MPI_CHECK(MPI_Comm_set_errhandler(query_, MPI_ERRORS_RETURN));
    ST_MPI_CHECK(MPI_Comm_rank(query_, &rank_));
    ST_MPI_CHECK(MPI_Comm_size(query_, &size_));
    DeviceGuard g(device_);
    ncclUniqueId id{};
    runtime::run_agreed(query_, [&] {
      if (rank_ == 0) ST_NCCL_CHECK(ncclGetUniqueId(&id));
    });
    ST_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, query_));
    ST_NCCL_CHECK(ncclCommInitRank(&nccl_, size_, id, rank_));
    for (auto& s : streams_) ST_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    ST_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)));
    watchdog_add(this, query_);
  }

  ~NcclComm() override {
    {
      DeviceGuard g(device_);
      // Finish outstanding work while the watchdog still watches (a stuck one aborts).
      for (auto& s : streams_) cudaStreamSynchronize(s);
    }
    watchdog_remove(this);
    DeviceGuard g(device_);
    {
      std::lock_guard<std::mutex> lock(inflight_mu_);
      inflight_.clear();
    }
    if (!aborted_) {  // ncclCommAbort already released an aborted one
      ncclCommFinalize(nccl_);
      ncclCommDestroy(nccl_);
    }
    for (auto& s : streams_) cudaStreamDestroy(s);
    cudaFree(barrier_buf_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&query_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::Nccl; }

  WorkPtr all_gather(const at::Tensor& out, const at::Tensor& in) override {
    validate_all_gather(name_, size_, out, in, {true, device_});
    return issue("all_gather", out.numel(), out.scalar_type(), {out, in}, kGather, false,
                 [&](cudaStream_t s) {
                   // In place when in.data_ptr() == out + rank * count (NCCL's rule too).
                   ST_NCCL_CHECK(ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(),
                                               nccl_dtype(in.scalar_type()), nccl_, s));
                 });
  }

  WorkPtr reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) override {
    validate_reduce_scatter(name_, size_, out, in, op, {true, device_});
    return issue(op_label("reduce_scatter", op), in.numel(), in.scalar_type(), {out, in},
                 kScatter, false, [&](cudaStream_t s) {
                   ST_NCCL_CHECK(ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(),
                                                   nccl_dtype(in.scalar_type()), nccl_op(op), nccl_, s));
                 });
  }

  WorkPtr all_reduce_coalesced(const std::vector<at::Tensor>& ts, ReduceOp op) override {
    int64_t numel = 0;
    at::ScalarType dtype = ts.empty() ? at::ScalarType::Undefined : ts.front().scalar_type();
    for (const auto& t : ts) {
      validate_all_reduce(name_, t, op, {true, device_});
      numel += t.numel();
      if (t.scalar_type() != dtype) dtype = at::ScalarType::Undefined;  // "-" in records
    }
    return issue(op_label("all_reduce_coalesced", op), numel, dtype, ts, kOther, false,
                 [&](cudaStream_t s) {
                   // Inside issue()'s ncclGroupStart/End: one launch for all of them.
                   for (const auto& t : ts)
                     ST_NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(),
                                                 nccl_dtype(t.scalar_type()), nccl_op(op), nccl_, s));
                 });
  }

  WorkPtr all_reduce(const at::Tensor& t, ReduceOp op) override {
    validate_all_reduce(name_, t, op, {true, device_});
    return issue(op_label("all_reduce", op), t.numel(), t.scalar_type(), {t}, kOther, false,
                 [&](cudaStream_t s) {
                   ST_NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(),
                                               nccl_dtype(t.scalar_type()), nccl_op(op), nccl_, s));
                 });
  }

  WorkPtr broadcast(const at::Tensor& t, int root) override {
    validate_broadcast(name_, size_, t, root, {true, device_});
    return issue(concat("broadcast(root ", root, ")"), t.numel(), t.scalar_type(), {t}, kOther,
                 false, [&](cudaStream_t s) {
                   ST_NCCL_CHECK(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(),
                                               nccl_dtype(t.scalar_type()), root, nccl_, s));
                 });
  }

  // NCCL has no barrier: a one-element all-reduce, and wait() also blocks the host.
  WorkPtr barrier() override {
    return issue("barrier", 0, at::ScalarType::Undefined, {}, kOther, true, [&](cudaStream_t s) {
      ST_NCCL_CHECK(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, nccl_, s));
    });
  }

  std::vector<FlightRecord> flight_records() const override { return recorder_.snapshot(); }

  // Watched: for NCCL "entered" means issued to the stream; the GPU's start is not visible.
  Progress progress() override {
    uint64_t i = issued_.load();
    return {i, i, completed_.load()};
  }

  std::optional<Fatal> check(double now) override {
    {
      std::lock_guard<std::mutex> l(abort_mu_);
      if (aborted_) return std::nullopt;  // the communicator is gone; its caller got the error
    }
    DeviceGuard g(device_);
    ncclResult_t async = ncclSuccess;
    ST_NCCL_CHECK(ncclCommGetAsyncError(nccl_, &async));
    std::lock_guard<std::mutex> lock(inflight_mu_);
    reap_locked(now);
    if (async != ncclSuccess && async != ncclInProgress) {
      Fatal f = fatal_for_front(now);
      f.reason = concat("failed (NCCL async error: ", ncclGetErrorString(async), ")");
      return f;
    }
    if (opts_.timeout_s > 0 && !inflight_.empty() &&
        now - inflight_.front()->issued_s > opts_.timeout_s) {
      Fatal f = fatal_for_front(now);
      f.reason = concat("timed out (timeout_s = ", opts_.timeout_s, ")");
      return f;
    }
    return std::nullopt;
  }
  std::string watched_name() const override { return name_; }
  std::vector<FlightRecord> watched_records() const override { return recorder_.snapshot(); }
  void abort_backend() override { abort("the watchdog ended the job"); }

 private:
  Fatal fatal_for_front(double now) const {
    Fatal f;
    if (inflight_.empty()) return f;
    const InFlight& x = *inflight_.front();
    f.seq = x.seq;
    f.op = x.op;
    f.numel = x.numel;
    f.dtype = x.dtype;
    f.running_s = now - x.issued_s;
    return f;
  }

  // After a failed NCCL call the communicator's state is unknown (peers may be inside the
  // collective): abort it so that nothing waits on it forever, and refuse further use.
  void abort(const std::string& why) {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (aborted_) return;
    aborted_ = true;
    abort_reason_ = why;
    ncclCommAbort(nccl_);
  }

  // Drops collectives whose done event completed (releasing their tensors), in order.
  void reap_locked(double now) {
    while (!inflight_.empty()) {
      InFlight& x = *inflight_.front();
      cudaError_t e = cudaEventQuery(x.done);
      if (e == cudaErrorNotReady) return;
      ST_CUDA_CHECK(e);
      completed_.store(x.seq);
      recorder_.finished(x.seq, now);
      x.keep.clear();
      inflight_.pop_front();
    }
  }

  template <typename Fn>
  WorkPtr issue(std::string op, int64_t numel, at::ScalarType dtype, std::vector<at::Tensor> keep,
                Lane lane, bool host_sync, Fn&& launch) {
    DeviceGuard g(device_);
    std::lock_guard<std::mutex> lock(issue_mu_);
    {
      std::lock_guard<std::mutex> l(abort_mu_);
      if (aborted_) throw_comm_error(name_, op, "the NCCL communicator was aborted after an earlier error: " + abort_reason_);
    }
    const uint64_t seq = issued_.load() + 1;
    auto f = std::make_shared<InFlight>();
    f->seq = seq;
    f->op = op;
    f->numel = numel;
    f->dtype = dtype == at::ScalarType::Undefined ? "-" : dtype_long_name(dtype);
    f->issued_s = now_seconds();
    f->keep = std::move(keep);
    f->host_sync = host_sync;
    cudaEvent_t ready = nullptr;
    ST_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    ST_CUDA_CHECK(cudaEventCreateWithFlags(&f->done, cudaEventDisableTiming));
    cudaStream_t s = streams_[lane];
    // The collective reads what the compute stream has produced so far.
    ST_CUDA_CHECK(cudaEventRecord(ready, static_cast<cudaStream_t>(compute_stream())));
    ST_CUDA_CHECK(cudaStreamWaitEvent(s, ready, 0));
    ST_CUDA_CHECK(cudaEventDestroy(ready));
    try {
      ST_NCCL_CHECK(ncclGroupStart());
      try {
        launch(s);
      } catch (...) {
        ncclGroupEnd();  // close the group before aborting
        throw;
      }
      ST_NCCL_CHECK(ncclGroupEnd());
    } catch (const std::exception& e) {
      abort(concat("seq ", seq, " ", op, ": ", e.what()));
      throw;
    }
    ST_CUDA_CHECK(cudaEventRecord(f->done, s));
    recorder_.issued(seq, f->op, numel, f->dtype, f->issued_s);
    recorder_.started(seq, f->issued_s);
    issued_.store(seq);
    {
      std::lock_guard<std::mutex> l(inflight_mu_);
      reap_locked(now_seconds());
      inflight_.push_back(f);
    }
    return std::make_shared<NcclWork>(f, device_);
  }

  CommOptions opts_;
  int device_;
  MPI_Comm query_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  ncclComm_t nccl_ = nullptr;
  cudaStream_t streams_[3] = {nullptr, nullptr, nullptr};
  void* barrier_buf_ = nullptr;
  FlightRecorder recorder_;
  std::mutex issue_mu_;
  std::atomic<uint64_t> issued_{0}, completed_{0};
  std::mutex inflight_mu_;
  std::deque<std::shared_ptr<InFlight>> inflight_;
  std::mutex abort_mu_;
  bool aborted_ = false;
  std::string abort_reason_;
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(MPI_Comm comm, const std::string& name, int device,
                                     const CommOptions& opts) {
  // Checked on every rank together, so a rank without a GPU fails all ranks with one
  // message instead of leaving the others in ncclCommInitRank.
  runtime::run_agreed(comm, [&] {
    ST_USER_CHECK(device >= 0, "comm '", name, "': the nccl backend needs a CUDA device bound "
                  "to every rank, but rank ", error_rank(), " has none (device = -1); use comm "
                  "backend 'mpi' for CPU runs");
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    ST_USER_CHECK(e == cudaSuccess && device < n, "comm '", name, "': CUDA device ", device,
                  " is not usable on rank ", error_rank(), ": ",
                  e != cudaSuccess ? std::string(cudaGetErrorString(e))
                                   : concat(n, " device(s) visible"));
  });
  return std::make_unique<NcclComm>(comm, name, device, opts);
}

bool nccl_available() { return true; }

std::string nccl_version_string() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  // Since NCCL 2.9 the code is major*10000 + minor*100 + patch.
  return concat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

}  // namespace shardtrain::comm
