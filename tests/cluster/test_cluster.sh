# test_cluster.sh: sourced by the cluster tests. own_test_cluster PREFIX NET: a cluster of the
# test's own (name PREFIX<random>, the first free subnet 198.18.NET.0/24 upwards, so it meets
# neither a person's default cluster nor another test's) exported as SHARDTRAIN_CLUSTER /
# SHARDTRAIN_CLUSTER_NET; exits 77 (skipped, with the reason) where namespaces cannot be made.
own_test_cluster() {
  export SHARDTRAIN_CLUSTER=$1$((RANDOM % 10000))
  local net=$2 why rc
  while ip -o -4 addr show 2>/dev/null | grep -q " 198\.18\.$net\."; do net=$((net + 1)); done
  export SHARDTRAIN_CLUSTER_NET=$net
  set +e
  why=$("$CL/cluster.sh" check 2>&1)
  rc=$?
  set -e
  if [ $rc = 3 ]; then echo "SKIP: ${why#cluster: }"; exit 77; fi
  [ $rc = 0 ] || fail "cluster.sh check exited $rc: $why"
}

# remove_stale_test_clusters PREFIX: removes the clusters PREFIX* that a run of a test left when it
# was killed (SIGKILL: ctest's timeout); test clusters record the test's pid in their state folder.
remove_stale_test_clusters() {
  local owner name
  for owner in /run/shardtrain-cluster/"$1"*/owner; do
    [ -f "$owner" ] || continue
    kill -0 "$(cat "$owner")" 2>/dev/null && continue
    name=$(basename "$(dirname "$owner")")
    echo "removing the stale test cluster $name"
    SHARDTRAIN_CLUSTER=$name "$CL/cluster.sh" stop || true
  done
}
