# Damaged checkpoints: the newest one truncated, then one with a flipped byte inside a
# parameter dataset. resume=auto must say why it skips it, resume from the previous one and
# finish with the same final state as the undamaged run; naming a damaged file explicitly
# (checkpoint.resume=PATH) must end the job with exit code 2 and the file's name.
source "$(dirname "$0")/lib.sh"
make_dataset
NP=2
EVERY=(--set checkpoint.every_steps=4)

note "A: 12 steps, checkpoints at 4, 8, 12"
train_ok $NP "$T/A" "${EVERY[@]}"
LAST=$(ckpt_file "$T/A" 12)
cp "$LAST" "$T/reference.h5"

# resumes_from_8 WHY: relaunch; the skip of step 12 must be reported with WHY, resume at 8.
resumes_from_8() {
  : > "$T/A.log"
  train_ok $NP "$T/A" "${EVERY[@]}"
  grep -q "checkpoint: skipping $LAST: .*$1" "$T/A.log" || { grep -i "skip\|resum" "$T/A.log"; fail "no report of skipping the damaged step 12 ($1)"; }
  grep -q "# resumed from $(ckpt_file "$T/A" 8): step 8," "$T/A.log" || fail "did not resume from step 8"
  same_params "$T/reference.h5" "$LAST"
}

note "truncated newest checkpoint"
truncate -s $(( $(stat -c %s "$LAST") / 2 )) "$LAST"
resumes_from_8 "truncated"

note "one flipped byte inside /model"
DSET=$(h5ls -r "$LAST/model" | awk '$2 == "Dataset" { print $1; exit }')
[ -n "$DSET" ] || fail "no dataset under /model in $LAST"
OFF=$(h5dump -p -H -d "/model$DSET" "$LAST" | sed -n 's/.*OFFSET \([0-9]*\).*/\1/p' | head -1)
[ -n "$OFF" ] || fail "no storage offset for /model$DSET"
OFF=$((OFF + 5))
BYTE=$(od -An -tu1 -j "$OFF" -N1 "$LAST" | tr -d ' ')
printf "$(printf '\\%03o' $(( BYTE ^ 0x10 )))" | dd of="$LAST" bs=1 seek="$OFF" conv=notrunc status=none
cmp -s "$LAST" "$T/reference.h5" && fail "the byte flip did not change the file"
cp "$LAST" "$T/flipped.h5"
resumes_from_8 "checksum mismatch"

note "checkpoint.resume naming the damaged file: exit 2"
train $NP "$T/X" --set "checkpoint.resume=$T/flipped.h5"
[ "$RC" = 2 ] || { tail -20 "$T/X.log"; fail "resume from a damaged file exited $RC, expected 2"; }
grep -q "flipped.h5" "$T/X.log" || fail "the error does not name the damaged file"
note "OK: damaged newest checkpoints skipped with a reason; the run recovered from step 8 bit-identically"
