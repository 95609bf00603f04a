// FlightRecorder: a fixed-size ring of the last N collectives of one group, thread-safe.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "shardtrain/comm/comm.h"

namespace shardtrain::comm::detail {

class FlightRecorder {
 public:
  explicit FlightRecorder(int capacity);
  // Sequence numbers start at 1 and grow by one per collective of the group.
  void issued(uint64_t seq, std::string op, int64_t numel, std::string dtype, double t);
  void started(uint64_t seq, double t);
  void finished(uint64_t seq, double t);
  // The recorded collectives, oldest first.
  std::vector<FlightRecord> snapshot() const;

 private:
  FlightRecord* find(uint64_t seq);  // nullptr once the entry was overwritten
  mutable std::mutex mu_;
  std::vector<FlightRecord> ring_;
};

// One line per record with times relative to `now` (e.g. "-3.021 s"), each prefixed by
// `indent`; used by the watchdog's dump.
std::string format_flight_records(const std::vector<FlightRecord>& records, double now,
                                  const std::string& indent);

}  // namespace shardtrain::comm::detail
