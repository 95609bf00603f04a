# e2e_gpu_skip_rules (CPU): when the `gpu` tests may report "skipped" and when they must fail.
# On this machine (no GPU, CPU libtorch): train_gpu.sh and test_gpu_adamw skip (77) for the
# documented reasons; under SHARDTRAIN_GPU_REQUIRED=1 (what scripts/gpu-check sets on the GPU
# machine) the same is a failure (1); a shardtrain the loader cannot start is a failure, never a
# skip. Usage: bash skip_rules.sh SHARDTRAIN TEST_GPU_ADAMW|- MPIEXEC [mpirun flags...]
set -uo pipefail
ST=$1; ADAMW=$2; shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
if [ -e /dev/nvidia0 ] || [ -e /dev/nvidiactl ]; then echo "SKIP: this machine has a GPU"; exit 77; fi
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
bad=0
expect() {  # expect RC DESCRIPTION -- COMMAND...
  local want=$1 what=$2; shift 3
  "$@" > "$T/out" 2>&1; local rc=$?
  if [ "$rc" = "$want" ]; then echo "ok: $what: exit $rc ($(grep -m1 -E '^(SKIP|FAIL)' "$T/out"))"
  else echo "FAIL: $what: exit $rc, expected $want"; tail -5 "$T/out"; bad=1; fi
}
expect 77 "train_gpu.sh, CPU libtorch, no GPU" -- bash "$HERE/train_gpu.sh" "$ST" "$@"
expect 1 "train_gpu.sh under SHARDTRAIN_GPU_REQUIRED=1" -- env SHARDTRAIN_GPU_REQUIRED=1 bash "$HERE/train_gpu.sh" "$ST" "$@"
# A binary whose libraries the loader cannot find exits 127 before main: a failure, not a skip.
printf '#!/bin/sh\necho "shardtrain: error while loading shared libraries: libnccl.so.2: cannot open shared object file" >&2\nexit 127\n' > "$T/broken"
chmod +x "$T/broken"
expect 1 "train_gpu.sh with a shardtrain the loader cannot start" -- bash "$HERE/train_gpu.sh" "$T/broken" "$@"
if [ "$ADAMW" != - ]; then
  expect 77 "test_gpu_adamw, no GPU" -- "$ADAMW"
  expect 1 "test_gpu_adamw under SHARDTRAIN_GPU_REQUIRED=1" -- env SHARDTRAIN_GPU_REQUIRED=1 "$ADAMW"
fi
[ $bad = 0 ] && echo "skip rules: OK"
exit $bad
