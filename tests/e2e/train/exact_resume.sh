# Exact resume at 2 ranks: an uninterrupted run (A) against a run split by train.max_steps (B,
# asynchronous checkpoints), a run stopped by a real SIGUSR1 through mpirun (C) and one that
# checkpoints by wall clock (D). Every step's loss, grad norm and LR
# in B's and C's metrics.jsonl must equal A's to the last digit, and the final checkpoints'
# parameters, optimizer state, data cursor and RNG states must be identical.
source "$(dirname "$0")/lib.sh"
make_dataset
NP=2

note "A: 12 steps uninterrupted"
train_ok $NP "$T/A"
step_table "$T/A/metrics.jsonl" > "$T/A.steps"
[ "$(wc -l < "$T/A.steps")" = 12 ] || fail "A logged $(wc -l < "$T/A.steps") steps, expected 12"

note "B: 5 steps, then resume=auto to 12 (background checkpoint writes)"
train_ok $NP "$T/B" --set train.max_steps=5 --set checkpoint.async=true
[ -f "$(ckpt_file "$T/B" 5)" ] || fail "B: no final checkpoint at step 5"
train_ok $NP "$T/B" --set checkpoint.async=true
grep -q "# resumed from $(ckpt_file "$T/B" 5): step 5," "$T/B.log" || fail "B did not report resuming from step 5"
step_table "$T/B/metrics.jsonl" > "$T/B.steps"
diff "$T/A.steps" "$T/B.steps" || fail "B's steps differ from A's"
same_params "$(ckpt_file "$T/A" 12)" "$(ckpt_file "$T/B" 12)"

note "C: SIGUSR1 to mpirun during step 7, exit 42, resume to 12"
# Rank 1 pauses in the middle of step 7 (after backward) until the signal arrives, so the
# signal lands at a known step however fast the machine is.
export SHARDTRAIN_TEST_PAUSE=mid_step:7:1 SHARDTRAIN_TEST_PAUSE_MARKER=$T/C.paused
train_bg $NP "$T/C"
wait_file "$T/C.paused" 60
kill -USR1 "$BG_PID"
wait_bg
unset SHARDTRAIN_TEST_PAUSE SHARDTRAIN_TEST_PAUSE_MARKER
[ "$RC" = 42 ] || { tail -30 "$T/C.log"; fail "C exited $RC after SIGUSR1, expected 42"; }
grep -q "checkpoint: step 7 .*signal SIGUSR1" "$T/C.log" || fail "C: no checkpoint for the signal at step 7"
[ -f "$(ckpt_file "$T/C" 7)" ] || fail "C: step_00000007.h5 missing"
[ "$(cat "$T/C/checkpoints/latest")" = step_00000007.h5 ] || fail "C: latest does not name step 7"
train_ok $NP "$T/C"
grep -q "# resumed from $(ckpt_file "$T/C" 7): step 7," "$T/C.log" || fail "C did not report resuming from step 7"
step_table "$T/C/metrics.jsonl" > "$T/C.steps"
diff "$T/A.steps" "$T/C.steps" || fail "C's steps differ from A's"
same_params "$(ckpt_file "$T/A" 12)" "$(ckpt_file "$T/C" 12)"

note "D: checkpoints by wall clock (every 12 ms) agree across ranks and change nothing"
train_ok $NP "$T/D" --set checkpoint.every_minutes=0.0002 --set checkpoint.keep_last=20
grep -q "checkpoint: step [0-9]* .*(every_minutes" "$T/D.log" || fail "D: no checkpoint by checkpoint.every_minutes"
step_table "$T/D/metrics.jsonl" > "$T/D.steps"
diff "$T/A.steps" "$T/D.steps" || fail "D's steps differ from A's"
same_params "$(ckpt_file "$T/A" 12)" "$(ckpt_file "$T/D" 12)"

note "OK: 12 steps bit-identical after a max_steps split (at 5) and a SIGUSR1 stop (at 7, exit 42)"
