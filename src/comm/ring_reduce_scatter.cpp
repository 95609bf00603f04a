// Ring reduce-scatter: n-1 steps to the right neighbour, each step's segments in flight at once.
#include "ring_reduce_scatter.h"

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "half.h"
#include "internal.h"
#include "shardtrain/util/mpi_check.h"

namespace shardtrain::comm::detail {

void* Scratch::get(size_t bytes) {
  if (bytes > size_) {
    mem_.reset(new char[bytes]);
    size_ = bytes;
  }
  return mem_.get();
}

MPI_Request* Scratch::requests(size_t n) {
  if (requests_.size() < n) requests_.resize(n, MPI_REQUEST_NULL);
  return requests_.data();
}

size_t ring_segment_bytes() {
  static const size_t bytes = [] {
    const char* env = std::getenv("SHARDTRAIN_RING_SEGMENT_KB");
    long kb = env ? std::atol(env) : 256;
    return static_cast<size_t>(std::max(4L, kb)) * 1024;
  }();
  return bytes;
}

namespace {

constexpr int kRingTag = 4711;

template <typename A>
inline A combine(A a, A b, bool max) { return max ? std::max(a, b) : a + b; }

template <typename T>
void ring(MPI_Comm comm, int r, int n, const T* in, T* out, int64_t c, ReduceOp op,
          Scratch& scratch) {
  using A = typename Accum<T>::type;
  constexpr bool kSame = std::is_same<T, A>::value;
  const MPI_Datatype wire = std::is_same<A, double>::value ? MPI_DOUBLE : MPI_FLOAT;
  const bool max = op == ReduceOp::Max;
  const bool avg = op == ReduceOp::Avg;
  const A denom = static_cast<A>(n);
  auto finish = [&](A v) { return store_as<T, A>(avg ? v / denom : v); };

  if (n == 1) {
    for (int64_t i = 0; i < c; ++i) out[i] = finish(load_as<T, A>(in[i]));
    return;
  }
  const int left = (r - 1 + n) % n, right = (r + 1) % n;
  // buf[0], buf[1]: alternate receive buffers (partial sums); buf[1] also holds the
  // converted first send when T is a half type.
  const bool two = n > 2 || !kSame;
  A* base = static_cast<A*>(scratch.get(sizeof(A) * static_cast<size_t>(c) * (two ? 2 : 1)));
  A* buf[2] = {base, two ? base + c : base};
  const int64_t seg = std::max<int64_t>(1, ring_segment_bytes() / sizeof(A));

  // Every segment of a step is in flight at once (receives and sends posted together, the data
  // to send is complete: the previous step has finished), and each arriving segment is reduced
  // while the later ones still travel. Lock-step Sendrecv per segment left the link idle between
  // segments: on a 250 Mbit/s link it ran at 0.75 of the all-gather's busbw (perf/README.md).
  // The arithmetic is the same, segment by segment, so the results are the same bits.
  const int64_t nseg = (c + seg - 1) / seg;
  MPI_Request* recvs = scratch.requests(2 * static_cast<size_t>(nseg));
  MPI_Request* sends = recvs + nseg;
  for (int s = 0; s < n - 1; ++s) {
    const int send_idx = ((r - s - 1) % n + n) % n;
    const int recv_idx = ((r - s - 2) % n + n) % n;
    const bool last = s == n - 2;
    A* recv = buf[s % 2];
    const T* mine = in + static_cast<int64_t>(recv_idx) * c;  // recv_idx == r when last
    for (int64_t k = 0, off = 0; off < c; ++k, off += seg) {
      const int len = static_cast<int>(std::min(seg, c - off));
      ST_MPI_CHECK(MPI_Irecv(recv + off, len, wire, left, kRingTag, comm, &recvs[k]));
    }
    for (int64_t k = 0, off = 0; off < c; ++k, off += seg) {
      const int len = static_cast<int>(std::min(seg, c - off));
      const A* send;
      if (s > 0) {
        send = buf[(s - 1) % 2] + off;
      } else if constexpr (kSame) {
        send = reinterpret_cast<const A*>(in + static_cast<int64_t>(send_idx) * c + off);
      } else {
        const T* src = in + static_cast<int64_t>(send_idx) * c + off;
        A* dst = buf[1] + off;
        for (int i = 0; i < len; ++i) dst[i] = load_as<T, A>(src[i]);
        send = dst;
      }
      ST_MPI_CHECK(MPI_Isend(send, len, wire, right, kRingTag, comm, &sends[k]));
    }
    // Two ranks, in place into the other rank's slice: the output overwrites what the sends
    // still read, so they finish first (MPI may read a send buffer until the send completes).
    if (last && s == 0 && kSame) {
      const T* sent = in + static_cast<int64_t>(send_idx) * c;
      if (out < sent + c && sent < out + c)
        ST_MPI_CHECK(MPI_Waitall(static_cast<int>(nseg), sends, MPI_STATUSES_IGNORE));
    }
    for (int64_t k = 0, off = 0; off < c; ++k, off += seg) {
      const int len = static_cast<int>(std::min(seg, c - off));
      ST_MPI_CHECK(MPI_Wait(&recvs[k], MPI_STATUS_IGNORE));
      A* rv = recv + off;
      const T* mv = mine + off;
      if (!last) {
        for (int i = 0; i < len; ++i) rv[i] = combine(rv[i], load_as<T, A>(mv[i]), max);
      } else {
        T* o = out + off;  // may alias mv: element i is read before it is written
        for (int i = 0; i < len; ++i) o[i] = finish(combine(rv[i], load_as<T, A>(mv[i]), max));
      }
    }
    // The next step receives into the buffer these sends read from.
    ST_MPI_CHECK(MPI_Waitall(static_cast<int>(nseg), sends, MPI_STATUSES_IGNORE));
  }
}

}  // namespace

void ring_reduce_scatter(MPI_Comm comm, int rank, int size, const void* in, void* out,
                         int64_t count, at::ScalarType dtype, ReduceOp op, Scratch& scratch) {
  switch (dtype) {
    case at::kFloat:
      return ring(comm, rank, size, static_cast<const float*>(in), static_cast<float*>(out), count, op, scratch);
    case at::kDouble:
      return ring(comm, rank, size, static_cast<const double*>(in), static_cast<double*>(out), count, op, scratch);
    case at::kBFloat16:
      return ring(comm, rank, size, static_cast<const c10::BFloat16*>(in), static_cast<c10::BFloat16*>(out), count, op, scratch);
    case at::kHalf:
      return ring(comm, rank, size, static_cast<const c10::Half*>(in), static_cast<c10::Half*>(out), count, op, scratch);
    default:
      ST_CHECK(false, "ring_reduce_scatter: unsupported dtype ", dtype_long_name(dtype));
  }
}

}  // namespace shardtrain::comm::detail
