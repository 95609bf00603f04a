// MPI backend: a duplicated communicator, one worker thread running collectives in issue
// order, Work handles that forward errors, sequence numbers, flight recorder, watchdog.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>

#include "flight_recorder.h"
#include "half.h"
#include "internal.h"
#include "mpi_types.h"
#include "ring_reduce_scatter.h"
#include "serial_worker.h"
#include "tree_reduce.h"
#include "shardtrain/comm/comm.h"
#include "shardtrain/util/mpi_check.h"
#include "shardtrain/util/timer.h"
#include "watchdog.h"

namespace shardtrain::comm {
namespace {

using namespace detail;

// Completion state shared by the worker (which finishes it) and the caller (who waits).
// It keeps the tensors alive until the collective has run.
class MpiWork final : public Work {
 public:
  MpiWork(uint64_t seq, std::vector<at::Tensor> keep, std::weak_ptr<SerialWorker> worker)
      : Work(seq), keep_(std::move(keep)), worker_(std::move(worker)) {}

  void set_task(uint64_t id) { task_ = id; }

  void wait() override {
    if (!done_.load(std::memory_order_acquire)) {
      // Run it here if it is next in line: saves two thread wake-ups (see SerialWorker).
      if (auto w = worker_.lock()) w->run_if_next(task_);
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_.load(std::memory_order_acquire); });
    if (error_) std::rethrow_exception(error_);
  }
  bool is_completed() override { return done_.load(std::memory_order_acquire); }

  void finish(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = e;
      keep_.clear();
      done_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
  std::vector<at::Tensor> keep_;
  std::weak_ptr<SerialWorker> worker_;
  uint64_t task_ = 0;
};

template <typename T, typename A>
void upcast(const T* src, A* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = load_as<T, A>(src[i]);
}
template <typename T, typename A>
void downcast(const A* src, T* dst, int64_t n, A divisor) {
  if (divisor == A(1)) {
    for (int64_t i = 0; i < n; ++i) dst[i] = store_as<T, A>(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = store_as<T, A>(src[i] / divisor);
  }
}

class MpiComm final : public Comm, public Watched {
 public:
  MpiComm(MPI_Comm comm, const std::string& name, const CommOptions& opts)
      : Comm(name), opts_(opts), recorder_(opts.flight_recorder_entries) {
    ST_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
    ST_MPI_CHECK(MPI_Comm_dup(comm, &query_));
    ST_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    ST_MPI_CHECK(MPI_Comm_set_errhandler(query_, MPI_ERRORS_RETURN));
    ST_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    ST_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    worker_ = std::make_shared<SerialWorker>();
    watchdog_add(this, query_);
  }

  ~MpiComm() override {
    worker_->shutdown();  // drains the queue: outstanding collectives complete first
    worker_.reset();
    watchdog_remove(this);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      MPI_Comm_free(&query_);
      MPI_Comm_free(&comm_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::Mpi; }

  WorkPtr all_gather(const at::Tensor& out, const at::Tensor& in) override {
    validate_all_gather(name_, size_, out, in, {});
    const bool in_place = in.numel() > 0 && is_exact_slice(in, out, rank_ * in.numel());
    if (in.numel() > 0 && !in_place && is_overlapping(in, out))
      throw_comm_error(name_, "all_gather", "in place needs in to be this rank's slice of out");
    return issue("all_gather", out.numel(), out.scalar_type(), {out, in}, [=] {
      const int count = static_cast<int>(in.numel());
      if (count == 0) return;
      MPI_Datatype t = mpi_datatype(in.scalar_type());
      if (size_ == 1) {
        if (!in_place) std::memcpy(out.data_ptr(), in.data_ptr(), in.nbytes());
        return;
      }
      ST_MPI_CHECK(MPI_Allgather(in_place ? MPI_IN_PLACE : in.data_ptr(), count, t,
                                 out.data_ptr(), count, t, comm_));
    });
  }

  WorkPtr reduce_scatter(const at::Tensor& out, const at::Tensor& in, ReduceOp op) override {
    validate_reduce_scatter(name_, size_, out, in, op, {});
    return issue(op_label("reduce_scatter", op), in.numel(), in.scalar_type(), {out, in}, [=] {
      ring_reduce_scatter(comm_, rank_, size_, in.data_ptr(), out.data_ptr(), out.numel(),
                          in.scalar_type(), op, scratch_);
    });
  }

  WorkPtr reduce_scatter_tree(const at::Tensor& out, const at::Tensor& in) override {
    validate_reduce_scatter(name_, size_, out, in, ReduceOp::Sum, {});
    check_tree("reduce_scatter_tree");
    if (in.numel() > 0 && is_overlapping(in, out))
      throw_comm_error(name_, "reduce_scatter_tree", "out must not overlap in");
    return issue("reduce_scatter_tree(sum)", in.numel(), in.scalar_type(), {out, in}, [=] {
      tree_reduce_scatter(comm_, rank_, size_, in.data_ptr(), out.data_ptr(), out.numel(), in.scalar_type(), scratch_);
    });
  }

  WorkPtr all_reduce_tree(const at::Tensor& t) override {
    validate_all_reduce(name_, t, ReduceOp::Sum, {});
    check_tree("all_reduce_tree");
    if (t.scalar_type() == at::kLong) throw_comm_error(name_, "all_reduce_tree", "int64 sums are exact in any order: use all_reduce");
    return issue("all_reduce_tree(sum)", t.numel(), t.scalar_type(), {t}, [=] {
      tree_all_reduce(comm_, rank_, size_, t.data_ptr(), t.numel(), t.scalar_type(), scratch_);
    });
  }

  WorkPtr all_reduce(const at::Tensor& t, ReduceOp op) override {
    validate_all_reduce(name_, t, op, {});
    return issue(op_label("all_reduce", op), t.numel(), t.scalar_type(), {t}, [=] {
      const int64_t n = t.numel();
      if (n == 0) return;
      switch (t.scalar_type()) {
        case at::kFloat: return reduce_native<float>(t, op);
        case at::kDouble: return reduce_native<double>(t, op);
        case at::kLong: return reduce_native<int64_t>(t, op);
        case at::kBFloat16: return reduce_upcast<c10::BFloat16>(t, op);
        case at::kHalf: return reduce_upcast<c10::Half>(t, op);
        default: ST_CHECK(false, "unreachable dtype");
      }
    });
  }

  WorkPtr broadcast(const at::Tensor& t, int root) override {
    validate_broadcast(name_, size_, t, root, {});
    return issue(concat("broadcast(root ", root, ")"), t.numel(), t.scalar_type(), {t}, [=] {
      if (t.numel() == 0 || size_ == 1) return;
      ST_MPI_CHECK(MPI_Bcast(t.data_ptr(), static_cast<int>(t.numel()),
                             mpi_datatype(t.scalar_type()), root, comm_));
    });
  }

  WorkPtr barrier() override {
    return issue("barrier", 0, at::ScalarType::Undefined, {}, [=] {
      ST_MPI_CHECK(MPI_Barrier(comm_));
    });
  }

  std::vector<FlightRecord> flight_records() const override { return recorder_.snapshot(); }

  // Watched
  Progress progress() override {
    return {issued_.load(), entered_.load(), completed_.load()};
  }
  std::optional<Fatal> check(double now) override {
    if (opts_.timeout_s <= 0) return std::nullopt;
    std::lock_guard<std::mutex> lock(current_mu_);
    if (current_.seq == 0 || now - current_.since < opts_.timeout_s) return std::nullopt;
    Fatal f;
    f.seq = current_.seq;
    f.op = current_.op;
    f.numel = current_.numel;
    f.dtype = current_.dtype;
    f.running_s = now - current_.since;
    f.reason = concat("timed out (timeout_s = ", opts_.timeout_s, ")");
    return f;
  }
  std::string watched_name() const override { return name_; }
  std::vector<FlightRecord> watched_records() const override { return recorder_.snapshot(); }

 private:
  static bool is_overlapping(const at::Tensor& a, const at::Tensor& b) {
    auto pa = static_cast<const char*>(a.data_ptr()), pb = static_cast<const char*>(b.data_ptr());
    return pa < pb + b.nbytes() && pb < pa + a.nbytes();
  }

  void check_tree(const char* op) const {
    if (!is_power_of_two(size_))
      throw_comm_error(name_, op, concat("a fixed-tree sum needs a power-of-two group, this one has ", size_, " ranks"));
  }

  template <typename T>
  void reduce_native(const at::Tensor& t, ReduceOp op) {
    T* p = t.data_ptr<T>();
    const int64_t n = t.numel();
    if (size_ > 1)
      ST_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p, static_cast<int>(n), mpi_datatype(t.scalar_type()),
                                 mpi_op(op), comm_));
    if (op == ReduceOp::Avg)
      for (int64_t i = 0; i < n; ++i) p[i] /= static_cast<T>(size_);
  }

  // Half types: sum in an fp32 copy so that the reduction accumulates in fp32.
  template <typename T>
  void reduce_upcast(const at::Tensor& t, ReduceOp op) {
    T* p = static_cast<T*>(t.data_ptr());
    const int64_t n = t.numel();
    float* f = static_cast<float*>(scratch_.get(sizeof(float) * n));
    upcast<T, float>(p, f, n);
    if (size_ > 1)
      ST_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, f, static_cast<int>(n), MPI_FLOAT, mpi_op(op), comm_));
    downcast<T, float>(f, p, n, op == ReduceOp::Avg ? static_cast<float>(size_) : 1.0f);
  }

  // Assigns the sequence number, records the collective and queues it on the worker.
  WorkPtr issue(std::string op, int64_t numel, at::ScalarType dtype, std::vector<at::Tensor> keep,
                std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(issue_mu_);  // seq order == queue order
    const uint64_t seq = issued_.load() + 1;
    std::string dname = dtype == at::ScalarType::Undefined ? "-" : dtype_long_name(dtype);
    recorder_.issued(seq, op, numel, dname, now_seconds());
    auto work = std::make_shared<MpiWork>(seq, std::move(keep), worker_);
    const uint64_t task = worker_->post([this, seq, work, fn = std::move(fn), op, numel, dname] {
      const double t0 = now_seconds();
      {
        std::lock_guard<std::mutex> l(current_mu_);
        current_ = {seq, op, numel, dname, t0};
      }
      entered_.store(seq);
      recorder_.started(seq, t0);
      std::exception_ptr err;
      try {
        fn();
      } catch (...) {
        err = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> l(current_mu_);
        current_.seq = 0;
      }
      completed_.store(seq);
      recorder_.finished(seq, now_seconds());
      work->finish(err);
    });
    work->set_task(task);
    issued_.store(seq);
    return work;
  }

  struct Current {
    uint64_t seq = 0;
    std::string op;
    int64_t numel = 0;
    std::string dtype;
    double since = 0;
  };

  CommOptions opts_;
  MPI_Comm comm_ = MPI_COMM_NULL;   // collectives (worker thread only)
  MPI_Comm query_ = MPI_COMM_NULL;  // watchdog messages (watchdog thread only)
  int rank_ = 0, size_ = 1;
  FlightRecorder recorder_;
  std::mutex issue_mu_;
  std::atomic<uint64_t> issued_{0}, entered_{0}, completed_{0};
  std::mutex current_mu_;
  Current current_;
  Scratch scratch_;  // worker thread only
  std::shared_ptr<SerialWorker> worker_;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(MPI_Comm comm, const std::string& name, const CommOptions& opts) {
  return std::make_unique<MpiComm>(comm, name, opts);
}

}  // namespace shardtrain::comm
