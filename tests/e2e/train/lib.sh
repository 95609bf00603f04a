# Shared helpers of the checkpoint/resume e2e tests (sourced). Usage of every test script:
#   bash <test>.sh SHARDTRAIN MPIEXEC [mpirun flags...]
# Each test works in its own temporary directory, removed on exit (kept when KEEP_TMP=1).
set -euo pipefail
ST=$1; MPIEXEC=$2; shift 2; MPIFLAGS=("$@")
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DECK=$HERE/tiny.toml
export OMP_NUM_THREADS=1
T=$(mktemp -d "${TMPDIR:-/tmp}/shardtrain-e2e-XXXXXX")
BG_PID=
cleanup() {
  # Only the mpirun this test started in the background (if still alive), by its pid.
  if [ -n "$BG_PID" ] && kill -0 "$BG_PID" 2>/dev/null; then kill -9 "$BG_PID" 2>/dev/null || true; fi
  if [ "${KEEP_TMP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
note() { echo "== $*"; }

# A byte-token dataset from deterministic text (~40 KB: several epochs never needed).
make_dataset() {
  awk 'BEGIN { srand(11); split("the of and to a in that it was her she not be his as had with for he you", w, " ");
               for (l = 0; l < 800; ++l) { s = ""; for (i = 0; i < 9; ++i) s = s w[int(rand() * 20) + 1] " ";
               print toupper(substr(s, 1, 1)) substr(s, 2) "." } }' > "$T/text.txt"
  "$ST" data prepare --source "$T/text.txt" --tokenizer byte --out "$T/data" > "$T/prepare.log" 2>&1 ||
    { cat "$T/prepare.log"; fail "data prepare"; }
}

# train NP OUT_DIR [--set k=v ...]: runs to completion or failure; sets RC, output in OUT_DIR.log.
train() {
  local np=$1 out=$2; shift 2
  set +e
  "$MPIEXEC" "${MPIFLAGS[@]}" -np "$np" "$ST" train "$DECK" --set "data.dataset=$T/data" --set "run.out_dir=$out" \
    "$@" >> "$out.log" 2>&1
  RC=$?
  set -e
}
# train_ok: the same, and it must exit 0.
train_ok() {
  train "$@"
  [ "$RC" = 0 ] || { tail -40 "$2.log"; fail "training in $2 exited $RC (expected 0)"; }
}

# train_bg NP OUT_DIR [--set ...]: starts in the background; BG_PID = mpirun's pid.
train_bg() {
  local np=$1 out=$2; shift 2
  "$MPIEXEC" "${MPIFLAGS[@]}" -np "$np" "$ST" train "$DECK" --set "data.dataset=$T/data" --set "run.out_dir=$out" \
    "$@" >> "$out.log" 2>&1 &
  BG_PID=$!
}
# wait_bg: waits for the background mpirun; RC = its exit code.
wait_bg() {
  set +e
  wait "$BG_PID"
  RC=$?
  set -e
  BG_PID=
}
# wait_file PATH SECONDS: until PATH exists and is not empty (fails the test after SECONDS).
wait_file() {
  local i
  for ((i = 0; i < $2 * 10; ++i)); do
    [ -s "$1" ] && return 0
    if [ -n "$BG_PID" ] && ! kill -0 "$BG_PID" 2>/dev/null; then fail "the run ended before $1 appeared"; fi
    sleep 0.1
  done
  fail "$1 did not appear within $2 s"
}

# step_table METRICS: "step loss grad_norm lr" per training record, the numbers exactly as
# written (nlohmann writes doubles with round-trip precision, keys sorted).
step_table() {
  sed -n 's/.*"grad_norm":\([^,}]*\).*"loss":\([^,}]*\).*"lr":\([^,}]*\).*"step":\([0-9]*\).*/\4 \2 \1 \3/p' "$1"
}

# verify_once FILE: `ckpt verify` (completeness, every checksum), once per file content: the
# reference a test compares several runs against is verified the first time only. A file
# rewritten in place (new inode, size or mtime) is verified again.
declare -A VERIFIED=()
verify_once() {
  local key
  key=$(stat -c '%n %i %s %y' "$1") || fail "no checkpoint $1"
  [ -n "${VERIFIED[$key]:-}" ] && return 0
  "$ST" ckpt verify "$1" > /dev/null || fail "ckpt verify $1"
  VERIFIED[$key]=1
}

# same_params A.h5 B.h5: model, optimizer state and the data cursor / RNG states identical to the bit.
same_params() {
  verify_once "$1"
  verify_once "$2"
  local g
  for g in /model /optim /train/data_cursor /train/rng_state; do
    h5diff -q "$1" "$2" "$g" "$g" || { h5diff -r "$1" "$2" "$g" "$g" | head -20; fail "$g differs: $1 vs $2"; }
  done
}

ckpt_file() { printf '%s/checkpoints/step_%08d.h5' "$1" "$2"; }
