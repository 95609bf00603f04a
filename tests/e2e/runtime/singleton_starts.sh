#!/usr/bin/env bash
# Starts many singleton shardtrain processes (no mpirun) at once, in rounds, and counts the
# ones that fail: Open MPI 4.1 gives every isolated singleton the same session directory
# (<tmp>/ompi.<host>.<uid>/jf.0/1/0), so one that finishes (rmdir of the empty tree) races one
# that starts (mkdir of each level): "mkdir .../jf.0/1: No such file or directory".
# Usage: singleton_starts.sh <shardtrain> [concurrent=16] [rounds=3] [max_failures=0]
# Env: SINGLETON_ARGS (default: deck check tests/decks/good/minimal.toml), KEEP_ENV=1 to leave
# OMPI_MCA_ess_singleton_isolated as the caller set it (default: isolated, the tests' mode).
# Runs under a private TMPDIR (so other jobs' session directories are not touched) and checks
# that nothing is left in it afterwards. Exit 0 when failures <= max_failures and TMPDIR is clean.
set -uo pipefail
st=${1:?usage: singleton_starts.sh <shardtrain> [concurrent] [rounds] [max_failures]}
n=${2:-16} rounds=${3:-3} max_fail=${4:-0}
src=$(cd "$(dirname "$0")/../../.." && pwd)
read -r -a args <<< "${SINGLETON_ARGS:-deck check $src/tests/decks/good/minimal.toml}"
T=$(mktemp -d "${TMPDIR:-/tmp}/shardtrain-e2e-singletons.XXXXXX")
trap 'rm -rf "$T"' EXIT
mkdir "$T/tmp" "$T/log"
export TMPDIR=$T/tmp OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ "${KEEP_ENV:-0}" = 1 ] || export OMPI_MCA_ess_singleton_isolated=1
fail=0 total=0
for ((r = 0; r < rounds; ++r)); do
  pids=()
  for ((i = 0; i < n; ++i)); do
    "$st" "${args[@]}" > "$T/log/$r.$i.out" 2> "$T/log/$r.$i.err" &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    total=$((total + 1))
    if ! wait "${pids[$i]}"; then
      fail=$((fail + 1))
      [ "$fail" -le 3 ] && { echo "--- round $r process $i failed:"; head -5 "$T/log/$r.$i.err"; }
    fi
  done
done
left=$(find "$T/tmp" -mindepth 1 | head -5)
echo "singleton_starts: $fail of $total singleton starts failed ($n at a time, $rounds rounds)"
if [ -n "$left" ]; then
  echo "FAIL: left behind in TMPDIR:"; echo "$left"; exit 1
fi
[ "$fail" -le "$max_fail" ] || { echo "FAIL: more than $max_fail failed"; exit 1; }
echo "PASS"
