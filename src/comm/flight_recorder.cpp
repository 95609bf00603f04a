// FlightRecorder: ring buffer indexed by sequence number; formatting for watchdog dumps.
#include "flight_recorder.h"

#include <algorithm>
#include <cstdio>

namespace shardtrain::comm::detail {

FlightRecorder::FlightRecorder(int capacity) : ring_(std::max(0, capacity)) {}

FlightRecord* FlightRecorder::find(uint64_t seq) {
  if (ring_.empty()) return nullptr;
  FlightRecord& r = ring_[seq % ring_.size()];
  return r.seq == seq ? &r : nullptr;
}

void FlightRecorder::issued(uint64_t seq, std::string op, int64_t numel, std::string dtype,
                            double t) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ring_.empty()) return;
  FlightRecord& r = ring_[seq % ring_.size()];
  r = FlightRecord{};
  r.seq = seq;
  r.op = std::move(op);
  r.numel = numel;
  r.dtype = std::move(dtype);
  r.issued_s = t;
}

void FlightRecorder::started(uint64_t seq, double t) {
  std::lock_guard<std::mutex> lock(mu_);
  if (FlightRecord* r = find(seq)) r->started_s = t;
}

void FlightRecorder::finished(uint64_t seq, double t) {
  std::lock_guard<std::mutex> lock(mu_);
  if (FlightRecord* r = find(seq)) r->finished_s = t;
}

std::vector<FlightRecord> FlightRecorder::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<FlightRecord> out;
  for (const FlightRecord& r : ring_)
    if (r.seq != 0) out.push_back(r);
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.seq < b.seq; });
  return out;
}

std::string format_flight_records(const std::vector<FlightRecord>& records, double now,
                                  const std::string& indent) {
  std::string s;
  char line[512];
  auto rel = [&](double t, char* buf, size_t n) {
    if (t == 0) std::snprintf(buf, n, "%9s", "-");
    else std::snprintf(buf, n, "%+8.3fs", t - now);
  };
  for (const FlightRecord& r : records) {
    char a[32], b[32], c[32];
    rel(r.issued_s, a, sizeof a);
    rel(r.started_s, b, sizeof b);
    rel(r.finished_s, c, sizeof c);
    const char* state = r.finished_s ? "done" : r.started_s ? "RUNNING" : "queued";
    std::snprintf(line, sizeof line, "%sseq %-6llu %-22s numel %-10lld %-8s issued %s started %s "
                  "finished %s  %s\n", indent.c_str(), static_cast<unsigned long long>(r.seq),
                  r.op.c_str(), static_cast<long long>(r.numel), r.dtype.c_str(), a, b, c, state);
    s += line;
  }
  return s;
}

}  // namespace shardtrain::comm::detail
