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
