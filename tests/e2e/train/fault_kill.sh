# kill -9 of one rank, (1) in the middle of a step and (2) in the middle of a collective
# checkpoint write (step_N.h5.tmp half written, not committed); each time the job is
# relaunched with resume=auto and must end with the same final checkpoint, bit for bit, as an
# uninterrupted run at the same world size.
source "$(dirname "$0")/lib.sh"
make_dataset
NP=2
EVERY=(--set checkpoint.every_steps=3)

note "A: 12 steps uninterrupted (checkpoints at 3, 6, 9, 12)"
train_ok $NP "$T/A" "${EVERY[@]}"
step_table "$T/A/metrics.jsonl" > "$T/A.steps"

# killed NAME POINT STEP: rank 1 pauses at POINT of STEP, the test kills it with SIGKILL.
killed() {
  export SHARDTRAIN_TEST_PAUSE=$2:$3:1 SHARDTRAIN_TEST_PAUSE_MARKER=$T/$1.paused
  train_bg $NP "$T/$1" "${EVERY[@]}"
  wait_file "$T/$1.paused" 60
  unset SHARDTRAIN_TEST_PAUSE SHARDTRAIN_TEST_PAUSE_MARKER
}

note "K1: kill -9 rank 1 in the middle of step 8"
killed K1 mid_step 8
kill -9 "$(cat "$T/K1.paused")"
wait_bg
[ "$RC" != 0 ] || fail "K1: mpirun exited 0 after a rank was killed"
[ "$(cat "$T/K1/checkpoints/latest")" = step_00000006.h5 ] || fail "K1: latest is not step 6 after the kill"
train_ok $NP "$T/K1" "${EVERY[@]}"
grep -q "# resumed from $(ckpt_file "$T/K1" 6): step 6," "$T/K1.log" || fail "K1 did not resume from step 6"
step_table "$T/K1/metrics.jsonl" > "$T/K1.steps"
diff "$T/A.steps" "$T/K1.steps" || fail "K1's metrics differ from A's (step 7 logged twice?)"
same_params "$(ckpt_file "$T/A" 12)" "$(ckpt_file "$T/K1" 12)"

note "K2: kill -9 rank 1 inside the collective write of step 9's checkpoint"
# write_stall.cpp (LD_PRELOAD on the ranks) stalls rank 1 in its 3rd H5Dwrite into
# step_00000009.h5.tmp: some datasets are written, rank 0 waits inside the same collective.
[ -f "${SHARDTRAIN_WRITE_STALL_LIB:-}" ] || fail "set SHARDTRAIN_WRITE_STALL_LIB to the built write_stall shim (CTest does)"
BASE_FLAGS=("${MPIFLAGS[@]}")
MPIFLAGS+=(-x "LD_PRELOAD=$SHARDTRAIN_WRITE_STALL_LIB")  # the ranks only, not mpirun
export SHARDTRAIN_TEST_STALL_FILE=step_00000009.h5.tmp SHARDTRAIN_TEST_STALL_RANK=1 SHARDTRAIN_TEST_STALL_MARKER=$T/K2.stalled
train_bg $NP "$T/K2" "${EVERY[@]}"
wait_file "$T/K2.stalled" 60
unset SHARDTRAIN_TEST_STALL_FILE SHARDTRAIN_TEST_STALL_RANK SHARDTRAIN_TEST_STALL_MARKER
MPIFLAGS=("${BASE_FLAGS[@]}")
[ -s "$T/K2/checkpoints/step_00000009.h5.tmp" ] || fail "K2: no partial step_00000009.h5.tmp while rank 1 is stalled"
kill -9 "$(cat "$T/K2.stalled")"
wait_bg
[ "$RC" != 0 ] || fail "K2: mpirun exited 0 after a rank was killed"
[ -f "$T/K2/checkpoints/step_00000009.h5.tmp" ] || fail "K2: the partial step_00000009.h5.tmp is gone"
[ ! -f "$(ckpt_file "$T/K2" 9)" ] || fail "K2: step 9 was committed although a rank died during the write"
[ "$(cat "$T/K2/checkpoints/latest")" = step_00000006.h5 ] || fail "K2: latest is not step 6 after the kill"
train_ok $NP "$T/K2" "${EVERY[@]}"
grep -q "# resumed from $(ckpt_file "$T/K2" 6): step 6," "$T/K2.log" || fail "K2 did not resume from step 6"
ls "$T/K2/checkpoints" | grep -q '\.tmp$' && fail "K2: a .tmp file is left after the relaunch: $(ls "$T/K2/checkpoints")"
step_table "$T/K2/metrics.jsonl" > "$T/K2.steps"
diff "$T/A.steps" "$T/K2.steps" || fail "K2's metrics differ from A's"
same_params "$(ckpt_file "$T/A" 12)" "$(ckpt_file "$T/K2" 12)"
note "OK: both kills recovered from step 6 to the uninterrupted run's final state"
