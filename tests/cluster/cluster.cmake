# shardtrain across real hosts on this machine: tests/cluster/cluster.sh makes a cluster of
# network + UTS namespaces on a bridge (each node its own hostname and address in
# 198.18.0.0/15), tests/cluster/mpirun-cluster launches across it. One script runs every check
# in one cluster start (info, the five strategies against one host, resume at 4 x 1 and 1 x 2,
# kill -9 on node 2, a stalled rank on node 2 and the watchdog's report, SIGUSR1), ~2 minutes on
# 2 cores. Skipped (exit 77, the reason printed) where namespaces cannot be made (not root, no
# CAP_NET_ADMIN); the cluster is removed on every exit.
if(TARGET shardtrain)
  add_test(NAME cluster_train
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/cluster_train.sh $<TARGET_FILE:shardtrain> ${MPIEXEC_EXECUTABLE}
            ${SHARDTRAIN_MPIRUN_FLAGS})
  # PROCESSORS 4: 4 ranks on the nodes (which share this machine's cores).
  set_tests_properties(cluster_train PROPERTIES LABELS "cluster" PROCESSORS 4 TIMEOUT 480
    SKIP_RETURN_CODE 77 RESOURCE_LOCK shardtrain_test_cluster
    ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_ess_singleton_isolated=1")
endif()

# A real two-node Slurm on a namespace cluster of its own (tests/cluster/cluster_slurm.sh:
# slurmctld on node 1, a slurmd per node, munged shared): multinode.sbatch with srun and with
# mpirun across the 2 nodes, a time-limited job requeued and bit-identical to the uninterrupted
# one, and a scaling study on 1 and 2 nodes through Slurm. ~1 minute on 2 busy cores. Its cluster
# name, subnet and daemons are its own (the daemons listen inside the nodes' namespaces), so it
# runs next to cluster_train and slurm_jobscripts. Skipped (exit 77, the reason printed) where
# namespaces or slurmd cannot run (not root, no CAP_NET_ADMIN).
if(TARGET shardtrain)
  find_program(SHARDTRAIN_H5DIFF h5diff)
  add_test(NAME cluster_slurm
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/cluster_slurm.sh $<TARGET_FILE:shardtrain> ${MPIEXEC_EXECUTABLE}
            ${SHARDTRAIN_MPIRUN_FLAGS})
  set_tests_properties(cluster_slurm PROPERTIES LABELS "cluster;slurm" PROCESSORS 4 TIMEOUT 480
    SKIP_RETURN_CODE 77 ENVIRONMENT "OMP_NUM_THREADS=1")
  if(NOT SHARDTRAIN_H5DIFF)
    set_tests_properties(cluster_slurm PROPERTIES DISABLED TRUE)  # compares checkpoints with h5diff
  endif()
endif()

# A network cut ends the job with exit 3 (issue 27): tests/cluster/cluster_netcut.sh cuts node 2's
# link of a 2-node cluster mid-step, mid-checkpoint (synchronous) and mid-checkpoint (asynchronous),
# each time under the shipped jobscripts/run-training.sh with mpirun, and checks exit 3, the
# watchdog's report (from node 1, naming node 2's ranks and host) and the time from the cut
# (comm.timeout_s + 60 s at most; a hang fails there); a fourth cut in a step's agreement (the report names step.agree). ~3.5 minutes on 2 busy cores. RESOURCE_LOCK: one
# test cluster at a time on this machine's cores. Skipped (exit 77) where namespaces cannot be made.
if(TARGET shardtrain)
  add_test(NAME cluster_netcut
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/cluster_netcut.sh $<TARGET_FILE:shardtrain> ${MPIEXEC_EXECUTABLE}
            ${SHARDTRAIN_MPIRUN_FLAGS})
  set_tests_properties(cluster_netcut PROPERTIES LABELS "cluster" PROCESSORS 4 TIMEOUT 420
    SKIP_RETURN_CODE 77 RESOURCE_LOCK shardtrain_test_cluster
    ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1")
endif()
