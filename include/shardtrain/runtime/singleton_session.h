// A private Open MPI session directory for a process started without a launcher (a singleton).
#pragma once
#include <string>

namespace shardtrain::runtime {

// True when no launcher started this process as part of an MPI job: no mpirun/orted
// (OMPI_MCA_orte_launch, OMPI_MCA_orte_hnp_uri), no PMIx server (PMIX_NAMESPACE, PMIX_RANK),
// no Slurm PMI-1/2 (PMI_FD, PMI_RANK). Open MPI then starts the process as a singleton.
bool launched_as_singleton();

// Called before MPI_Init. Open MPI 4.1 names a singleton's session directory after its job
// (<tmp>/ompi.<host>.<uid>/jf.<family>/<job>/<rank>); every isolated singleton gets job family 0,
// so concurrent singletons share jf.0/1/0, and one that finishes removes the empty levels while
// another is creating them ("mkdir .../jf.0/1: No such file or directory"). For a singleton
// this creates <TMPDIR or /tmp>/shardtrain-mpi.<pid>.XXXXXX and points Open MPI's session tree
// at it (OMPI_MCA_orte_tmpdir_base), so no two processes share a level that is created or
// removed. Left alone: a launched process, or one whose caller set orte_tmpdir_base,
// orte_top_session_dir or orte_jobfam_session_dir. Directories of earlier singletons on this
// host that died without cleaning up (killed) are removed first. Returns the directory made,
// "" when none.
std::string use_private_session_dir_if_singleton();

// Removes the directory made above (after MPI_Finalize; also registered with atexit). After an
// MPI_Abort (which exits without atexit handlers) or a kill, the next singleton start on this
// host removes it. Idempotent; a no-op when none was made.
void remove_private_session_dir();

}  // namespace shardtrain::runtime
