# Runs own their directories: rotation keeps this run's newest checkpoints that verify and
# never touches another run's; a damaged newer file is set aside, not kept in place of good ones;
# resume = never over another run's checkpoints is refused (exit 2, nothing changed) unless
# checkpoint.previous_run = move_aside; a restart continues the directory's own run; a second
# job on a directory in use gets exit 2 naming the holder, and a lock left by a killed job is
# taken over.
source "$(dirname "$0")/lib.sh"
make_dataset
NP=2
EVERY=(--set checkpoint.every_steps=2 --set checkpoint.keep_last=2 --set model.dropout=0)
run_id_of() { h5dump -a /run_id "$1" | sed -n 's/.*(0): "\(.*\)".*/\1/p'; }
listing() { (cd "$1" && find . -type f ! -name shardtrain.lock -printf '%p %s\n' | sort); }

note "A: 8 steps, keep_last 2 -> step 6 and 8 remain"
train_ok $NP "$T/A" "${EVERY[@]}" --set train.max_steps=8
C=$T/A/checkpoints
[ -f "$C/run.json" ] || fail "no run record"
RUN_A=$(sed -n 's/.*"run_id": "\(.*\)".*/\1/p' "$C/run.json")
[ -n "$RUN_A" ] || fail "run.json holds no run id"
[ "$(run_id_of "$C/step_00000008.h5")" = "$RUN_A" ] || fail "step 8 does not carry run id $RUN_A"
[ "$(ls "$C" | grep -c '^step_.*\.h5$')" = 2 ] || { ls "$C"; fail "keep_last 2 not honoured"; }

note "a damaged 'newer' file (step 99) and a checkpoint of another run (step 50): resume skips 99, ignores 50"
cp "$C/step_00000008.h5" "$C/step_00000099.h5"
truncate -s 4000 "$C/step_00000099.h5"
# Another run's file: same model, other run id (h5py rewrites the attribute; data untouched).
cp "$C/step_00000006.h5" "$C/step_00000050.h5"
/usr/bin/python3 - "$C/step_00000050.h5" <<'EOF'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    f.attrs["run_id"] = b"19990101T000000Z-00000000"
EOF
: > "$T/A.log"
train_ok $NP "$T/A" "${EVERY[@]}" --set train.max_steps=14
grep -q "checkpoint: skipping $C/step_00000099.h5: .*truncated" "$T/A.log" || { cat "$T/A.log"; fail "no report of the damaged file"; }
[ -f "$C/step_00000099.h5.bad" ] || fail "the damaged file was not set aside as .bad"
grep -q "# resumed from $C/step_00000008.h5: step 8," "$T/A.log" || fail "did not resume from step 8"
grep -q "checkpoint(s) of other runs in $C are ignored" "$T/A.log" || fail "the foreign checkpoint was not reported"
[ -f "$C/step_00000050.h5" ] || fail "rotation deleted another run's checkpoint"
for s in 12 14; do [ -f "$(ckpt_file "$T/A" $s)" ] || fail "step $s missing"; done
[ ! -f "$(ckpt_file "$T/A" 10)" ] || fail "step 10 should have been rotated out"
[ "$(cat "$C/latest")" = step_00000014.h5 ] || fail "latest is $(cat "$C/latest"), not step 14"
verify_once "$(ckpt_file "$T/A" 14)"

note "a newest checkpoint whose training state cannot be restored (valid checksums): set aside, previous one used"
cp "$C/step_00000014.h5" "$C/step_00000016.h5"
/usr/bin/python3 - "$C/step_00000016.h5" <<'EOF'
import json, sys
import h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    f.attrs["save_seq"] = int(f.attrs["save_seq"]) + 1
    for g in (f.attrs, f["train"].attrs):
        g["step"] = 16
    f["train"].attrs["lr_step"] = 16
    extra = json.loads(f["train"].attrs["extra"].decode())
    extra["rng_bytes_per_rank"] = 8  # 2 ranks x 8 bytes: a size no torch generator accepts
    f["train"].attrs["extra"] = np.bytes_(json.dumps(extra))
    del f["train/rng_state"]
    rng = np.arange(16, dtype=np.uint8)
    d = f.create_dataset("train/rng_state", data=rng)
    w = rng.astype(np.uint64)
    d.attrs["digest"] = np.array([w.sum(), (w * np.arange(1, 17, dtype=np.uint64)).sum()], dtype=np.uint64)
EOF
"$ST" ckpt verify "$C/step_00000016.h5" > /dev/null || fail "the crafted file should verify (checksums are valid)"
: > "$T/A.log"
train_ok $NP "$T/A" "${EVERY[@]}" --set train.max_steps=14
grep -Eq "checkpoint: skipping $C/step_00000016.h5: .*(training state \(/train\) cannot be restored|is not a generator state)" "$T/A.log" ||
  { grep -i "skip\|resum\|error" "$T/A.log"; fail "no report of the unrestorable training state"; }
grep -q "# resumed from $C/step_00000014.h5: step 14," "$T/A.log" || fail "did not fall back to step 14"
[ -f "$C/step_00000016.h5.bad" ] || fail "the unrestorable file was not set aside"

note "resume = never over run A's directory: exit 2, nothing touched"
listing "$T/A" > "$T/before"
train $NP "$T/A" "${EVERY[@]}" --set train.max_steps=4 --set checkpoint.resume=never
[ "$RC" = 2 ] || { tail -5 "$T/A.log"; fail "resume=never over another run exited $RC, expected 2"; }
grep -q "previous_run=move_aside" "$T/A.log" || fail "the error does not say how to start a new run there"
grep -q "of run $RUN_A" "$T/A.log" || fail "the error does not name run $RUN_A"
listing "$T/A" > "$T/after"
diff "$T/before" "$T/after" || fail "the refused run changed the directory"

note "resume = never + previous_run = move_aside: A's files move aside, run B starts; a restart continues B"
train_ok $NP "$T/A" "${EVERY[@]}" --set train.max_steps=4 --set checkpoint.resume=never \
  --set checkpoint.previous_run=move_aside
RUN_B=$(sed -n 's/.*"run_id": "\(.*\)".*/\1/p' "$C/run.json")
[ -n "$RUN_B" ] && [ "$RUN_B" != "$RUN_A" ] || fail "no new run id after move_aside ($RUN_B)"
# The whole run moves to out_dir/previous-runs/<id>/, its checkpoints under checkpoints/ there.
[ -f "$T/A/previous-runs/$RUN_A/checkpoints/step_00000014.h5" ] || { find "$T/A"; fail "A's step 14 not in previous-runs/$RUN_A/checkpoints"; }
[ -f "$T/A/previous-runs/$RUN_A/checkpoints/run.json" ] || fail "A's run record did not move with its checkpoints"
[ -f "$T/A/previous-runs/19990101T000000Z-00000000/checkpoints/step_00000050.h5" ] || fail "the foreign file was not moved to its own run's folder"
[ -f "$T/A/previous-runs/$RUN_A/metrics.jsonl" ] || fail "A's metrics were not moved aside"
[ "$(ls "$C" | grep -c '^step_.*\.h5$')" = 2 ] || { ls "$C"; fail "B should hold steps 2 and 4 only"; }
: > "$T/A.log"
train_ok $NP "$T/A" "${EVERY[@]}" --set train.max_steps=6
grep -q "# resumed from $C/step_00000004.h5: step 4," "$T/A.log" || fail "the restart did not continue run B at step 4"
[ "$(run_id_of "$C/step_00000006.h5")" = "$RUN_B" ] || fail "step 6 is not run B's"

note "two jobs on one directory: the second exits 2 naming the first; a killed job's lock is taken over"
export SHARDTRAIN_TEST_PAUSE=mid_step:8:0 SHARDTRAIN_TEST_PAUSE_MARKER=$T/L.paused
train_bg $NP "$T/L" "${EVERY[@]}" --set train.max_steps=10
wait_file "$T/L.paused" 60
unset SHARDTRAIN_TEST_PAUSE SHARDTRAIN_TEST_PAUSE_MARKER
HOLDER=$(cat "$T/L.paused")
train $NP "$T/L" "${EVERY[@]}" --set train.max_steps=10 > /dev/null
[ "$RC" = 2 ] || fail "a second job on a directory in use exited $RC, expected 2"
grep -q "is in use by another job: host $(hostname) pid $HOLDER" "$T/L.log" || { tail -3 "$T/L.log"; fail "the error does not name the holder (pid $HOLDER)"; }
kill -9 "$HOLDER"
wait_bg
[ "$RC" != 0 ] || fail "the killed job exited 0"
: > "$T/L.log"
train_ok $NP "$T/L" "${EVERY[@]}" --set train.max_steps=10
grep -q "taking over $T/L/shardtrain.lock, left by host $(hostname) pid $HOLDER" "$T/L.log" || { head -20 "$T/L.log"; fail "no warning about the stale lock"; }
grep -q "# resumed from $(ckpt_file "$T/L" 6): step 6," "$T/L.log" || fail "did not resume after the kill"
[ ! -s "$T/L/shardtrain.lock" ] || fail "the lock file still names a holder after the job ended"
note "two jobs started at once on one fresh directory: exactly one trains, the other exits 2"
# Both would pause in step 1 (the winner does: it holds the lock meanwhile, whatever the load);
# the loser must exit 2 at start-up; then SIGUSR1 ends the winner's pause: checkpoint, exit 42.
export SHARDTRAIN_TEST_PAUSE=mid_step:1:0 SHARDTRAIN_TEST_PAUSE_MARKER=$T/R.paused
set +e
"$MPIEXEC" "${MPIFLAGS[@]}" -np 1 "$ST" train "$DECK" --set "data.dataset=$T/data" --set "run.out_dir=$T/R" \
  > "$T/R1.log" 2>&1 &
P1=$!
"$MPIEXEC" "${MPIFLAGS[@]}" -np 1 "$ST" train "$DECK" --set "data.dataset=$T/data" --set "run.out_dir=$T/R" \
  > "$T/R2.log" 2>&1 &
P2=$!
set -e
unset SHARDTRAIN_TEST_PAUSE SHARDTRAIN_TEST_PAUSE_MARKER
for ((i = 0; i < 600; ++i)); do
  [ -s "$T/R.paused" ] && { ! kill -0 $P1 2>/dev/null || ! kill -0 $P2 2>/dev/null; } && break
  sleep 0.1
done
[ -s "$T/R.paused" ] || { kill -9 $P1 $P2 2>/dev/null; fail "neither racing job reached step 1"; }
if kill -0 $P1 2>/dev/null; then WIN=$P1 LOSE=$P2; else WIN=$P2 LOSE=$P1; fi
kill -0 $LOSE 2>/dev/null && { kill -9 $P1 $P2 2>/dev/null; fail "both racing jobs are running: the lock did not stop one"; }
set +e; wait $LOSE; RL=$?; set -e
kill -USR1 $WIN
set +e; wait $WIN; RW=$?; set -e
[ "$RL" = 2 ] || { tail -n 3 "$T/R1.log" "$T/R2.log"; fail "the losing job exited $RL, expected 2"; }
[ "$RW" = 42 ] || { tail -n 3 "$T/R1.log" "$T/R2.log"; fail "the winning job exited $RW after SIGUSR1, expected 42"; }
grep -q "is in use by another job" "$T/R1.log" "$T/R2.log" || fail "the losing job does not say the directory is in use"
[ "$(step_table "$T/R/metrics.jsonl" | awk '{print $1}' | tr '\n' ' ')" = "1 " ] || fail "metrics.jsonl is not one run's step 1"
verify_once "$(ckpt_file "$T/R" 1)"
note "OK: rotation by validity and ownership, new runs never mix, locks hold"
