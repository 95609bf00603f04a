// BlockingRegion: names a stretch of code that can block in collective MPI calls made outside
// comm::Comm (HDF5's own MPI-IO calls, run_agreed's agreements, a metadata broadcast), so that
// the watchdog ends the job (report, exit 3) when it lasts longer than comm.timeout_s.
#pragma once
#include <mpi.h>

#include <string>

namespace shardtrain::runtime {

// What watches the regions of one communicator. Implemented above this layer
// (comm::watch_regions, which reports through the collectives' watchdog); a communicator
// nobody watches makes a region cost one look-up.
class RegionWatcher {
 public:
  virtual ~RegionWatcher() = default;
  // Called by the thread that enters / leaves a region (regions nest; each has its own deadline).
  virtual void enter(const char* name) = 0;
  virtual void leave() = 0;
};

// Registers / unregisters the watcher of `comm` (not collective; the watcher must outlive
// the registration). One watcher per communicator handle.
void set_region_watcher(MPI_Comm comm, RegionWatcher* w);
void clear_region_watcher(MPI_Comm comm, RegionWatcher* w);

// RAII: every rank of `comm` enters the same regions in the same order (they surround
// collective calls). `name` is a short token ("save.create", "agree"): the watchdog's report
// prints it, and the test-only pause below matches it.
//
// Test only: SHARDTRAIN_TEST_PAUSE_IN="<name>:<world rank>" makes that rank, the first time it
// reaches region <name>, write its pid to SHARDTRAIN_TEST_PAUSE_MARKER and sleep (before
// entering the region) until the marker file is removed or 600 s pass, so a test can cut a
// link while the other ranks wait inside the region. Unset (always in production): one
// comparison per region.
class BlockingRegion {
 public:
  BlockingRegion(MPI_Comm comm, const char* name);
  ~BlockingRegion();
  BlockingRegion(const BlockingRegion&) = delete;
  BlockingRegion& operator=(const BlockingRegion&) = delete;

 private:
  RegionWatcher* watcher_ = nullptr;
};

}  // namespace shardtrain::runtime
