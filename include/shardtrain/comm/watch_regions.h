// watch_regions: puts the blocking regions (runtime::BlockingRegion) of one MPI communicator
// under the collectives' watchdog.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>

namespace shardtrain::comm {

// While the returned object lives, a region on `comm` that lasts longer than `timeout_s`
// (comm.timeout_s; <= 0: never) is reported by the watchdog like an overdue collective: the
// group `name`, the region, which ranks have not arrived at it or do not answer, and their
// hosts; then the job ends with MPI_Abort(kExitCommTimeout = 3). Collective over `comm`
// (a duplicate for the watchdog's queries, the members' host names).
class RegionWatch {
 public:
  virtual ~RegionWatch() = default;
  // A new timeout for the regions entered from now on (not collective; every rank sets the
  // same). `train` watches the world from before its deck is read (the deck's own agreement,
  // under the schema's default comm.timeout_s), then sets the deck's.
  virtual void set_timeout(double timeout_s) = 0;
};
std::unique_ptr<RegionWatch> watch_regions(MPI_Comm comm, const std::string& name, double timeout_s);

// The same for `comm` with the timeout of `like`'s watch, or nullptr when `like` is not
// watched (the same answer on every rank, so collective over `comm` exactly when watched).
// For a duplicate of a watched communicator (the background checkpoint writer's).
std::unique_ptr<RegionWatch> watch_regions_like(MPI_Comm comm, const std::string& name, MPI_Comm like);

}  // namespace shardtrain::comm
