# Divergence: a learning rate of 1e30 makes the loss non-finite from step 2. train.on_nonfinite
# = stop ends every rank with exit 4 at that step, without a checkpoint of that state (the last
# good one stays `latest`); skip_step skips updates and gives up after max_skipped_steps in a
# row; continue trains on, checkpoints nothing non-finite and still exits 4. A checkpoint
# holding NaN (valid checksums) fails `ckpt verify` and is skipped by resume; safetensors with
# NaN are refused by import.
source "$(dirname "$0")/lib.sh"
make_dataset
NP=2
BAD=(--set optimizer.lr=1e30 --set lr.warmup_steps=0 --set optimizer.grad_clip=0 --set checkpoint.every_steps=1
     --set train.max_steps=6)

note "stop (default): exit 4 at step 2, step 1 stays the newest checkpoint"
train $NP "$T/S" "${BAD[@]}"
[ "$RC" = 4 ] || { tail -20 "$T/S.log"; fail "on_nonfinite=stop exited $RC, expected 4"; }
grep -q "step 2: loss .* (not finite): the run diverged; stopping .*exit 4. Last good checkpoint: step 1" "$T/S.log" ||
  { grep -i "finite\|error" "$T/S.log"; fail "no divergence report at step 2"; }
[ "$(cat "$T/S/checkpoints/latest")" = step_00000001.h5 ] || fail "latest is not step 1"
[ "$(ls "$T/S/checkpoints" | grep -c '^step_')" = 1 ] || { ls "$T/S/checkpoints"; fail "a checkpoint of the diverged state was written"; }
grep -q '"step":2' "$T/S/metrics.jsonl" || fail "the diverged step is not in metrics.jsonl"
[ "$(grep -c 'exit 4' "$T/S.log")" -ge 1 ] || fail "exit code not named"

note "a checkpoint holding NaN with valid checksums: ckpt verify exit 2, resume skips it"
train_ok $NP "$T/H" --set checkpoint.every_steps=1 --set train.max_steps=2
/usr/bin/python3 - "$(ckpt_file "$T/H" 2)" "$(ckpt_file "$T/H" 5)" <<'EOF'
import shutil, sys
import h5py, numpy as np
src, dst = sys.argv[1:]
shutil.copy(src, dst)
with h5py.File(dst, "r+") as f:
    f.attrs["step"] = 5
    f["train"].attrs["step"] = 5
    f["train"].attrs["lr_step"] = 5
    f.attrs["save_seq"] = int(f.attrs["save_seq"]) + 1
    name = next(n for n in f["model"])
    d = f["model"][name]
    a = d[...]
    a.reshape(-1)[3] = np.nan
    d[...] = a
    w = np.ascontiguousarray(a).reshape(-1).view(np.uint32).astype(np.uint64)
    with np.errstate(over="ignore"):
        d.attrs["digest"] = np.array([w.sum(dtype=np.uint64), (w * np.arange(1, w.size + 1, dtype=np.uint64)).sum(dtype=np.uint64)], dtype=np.uint64)
EOF
set +e; "$ST" ckpt verify "$(ckpt_file "$T/H" 5)" > "$T/verify.log" 2>&1; RC=$?; set -e
[ "$RC" = 2 ] || { cat "$T/verify.log"; fail "ckpt verify of a NaN checkpoint exited $RC, expected 2"; }
grep -q "non-finite values (NaN or Inf)" "$T/verify.log" || { cat "$T/verify.log"; fail "verify does not report the NaN"; }
: > "$T/H.log"
train_ok $NP "$T/H" --set checkpoint.every_steps=1 --set train.max_steps=3
grep -q "checkpoint: skipping $(ckpt_file "$T/H" 5): .*non-finite" "$T/H.log" || { grep -i "skip\|resum" "$T/H.log"; fail "resume did not skip the NaN checkpoint"; }
[ -f "$(ckpt_file "$T/H" 5).bad" ] || fail "the NaN checkpoint was not set aside"
grep -q "# resumed from $(ckpt_file "$T/H" 2): step 2," "$T/H.log" || fail "did not resume from step 2"

note "skip_step: updates skipped, exit 4 after 3 non-finite steps in a row"
train $NP "$T/K" "${BAD[@]}" --set train.on_nonfinite=skip_step --set train.max_skipped_steps=3
[ "$RC" = 4 ] || { tail -20 "$T/K.log"; fail "skip_step exited $RC, expected 4"; }
[ "$(grep -c 'update skipped' "$T/K.log")" = 2 ] || { grep finite "$T/K.log"; fail "expected 2 skipped updates before giving up"; }
grep -q "step 4: .*3 non-finite steps in a row" "$T/K.log" || fail "no give-up report at step 4"
for s in 2 3; do [ -f "$(ckpt_file "$T/K" $s)" ] || fail "skip_step: checkpoint $s of the (finite, skipped) state missing"; done
[ ! -f "$(ckpt_file "$T/K" 4)" ] || fail "skip_step: a checkpoint was written at the step it gave up"

note "continue: trains to the end, never checkpoints non-finite state, exits 4"
train $NP "$T/C" "${BAD[@]}" --set train.on_nonfinite=continue
[ "$RC" = 4 ] || { tail -20 "$T/C.log"; fail "continue exited $RC, expected 4"; }
grep -q '"step":6' "$T/C/metrics.jsonl" || fail "continue did not train to step 6"
grep -q "not written: the weights or the optimizer state hold NaN/Inf" "$T/C.log" || fail "no report of refused checkpoints"
[ "$(cat "$T/C/checkpoints/latest")" = step_00000001.h5 ] || fail "continue: latest is not step 1"

note "safetensors with NaN: import refused"
"$ST" ckpt export "$(ckpt_file "$T/H" 3)" "$T/w.safetensors" > /dev/null
/usr/bin/python3 - "$T/w.safetensors" <<'EOF'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
name = sorted(k for k in h if k != "__metadata__")[0]
off = 8 + n + h[name]["data_offsets"][0]
b[off:off + 4] = struct.pack("<f", float("inf"))
open(p, "wb").write(b)
EOF
set +e
"$MPIEXEC" "${MPIFLAGS[@]}" -np $NP "$ST" ckpt import "$T/w.safetensors" "$T/imp.h5" --deck "$DECK" > "$T/imp.log" 2>&1
RC=$?
set -e
[ "$RC" = 2 ] || { cat "$T/imp.log"; fail "import of a NaN/Inf tensor exited $RC, expected 2"; }
grep -q "holds non-finite values" "$T/imp.log" || { cat "$T/imp.log"; fail "import does not name the non-finite tensor"; }
[ ! -e "$T/imp.h5" ] || fail "import left a file behind"
note "OK: divergence detected at its step; no non-finite state checkpointed, verified or imported"
