# Import from safetensors (the fine-tuning path): a model trained at 2 ranks and exported is
# (1) imported at 3 ranks into a step-0 checkpoint whose /model equals the source checkpoint's
# to the bit, and re-exported to a byte-identical safetensors file; (2) used as
# checkpoint.init_from of a fresh run at 3 ranks, which trains exactly like (3) a run resumed
# from the imported checkpoint (same losses to the bit). Bad input is refused on every rank.
source "$(dirname "$0")/lib.sh"
make_dataset
# Debian's python3 (python3-numpy from scripts/setup), not a python on PATH without numpy.
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
COMMON=(--set model.dropout=0 --set train.global_batch=12 --set train.micro_batch=4 --set checkpoint.resume=never)

note "P: 4 steps at 2 ranks (the 'pretrained' model), exported"
train_ok 2 "$T/P" --set model.dropout=0 --set train.global_batch=12 --set train.micro_batch=6 --set train.max_steps=4 \
  --set checkpoint.every_steps=4
SRC=$(ckpt_file "$T/P" 4)
"$ST" ckpt export "$SRC" "$T/p.safetensors" > "$T/export.log" 2>&1 || { cat "$T/export.log"; fail "export"; }

note "import at 3 ranks (each rank reads only its slices)"
"$MPIEXEC" "${MPIFLAGS[@]}" -np 3 "$ST" ckpt import "$T/p.safetensors" "$T/imported.h5" --deck "$DECK" \
  --set model.dropout=0 > "$T/import.log" 2>&1 || { cat "$T/import.log"; fail "import"; }
grep -q "imported $T/p.safetensors -> $T/imported.h5: gpt2, .* 3 ranks" "$T/import.log" || { cat "$T/import.log"; fail "import summary line"; }
"$ST" ckpt verify "$T/imported.h5" > /dev/null || fail "ckpt verify imported.h5"
h5diff -q "$SRC" "$T/imported.h5" /model /model || fail "imported /model differs from the source checkpoint's"
"$ST" ckpt inspect "$T/imported.h5" > "$T/inspect.txt" || fail "ckpt inspect imported.h5"
grep -q "written by 3 ranks" "$T/inspect.txt" || { head "$T/inspect.txt"; fail "inspect does not say 3 ranks wrote imported.h5"; }
"$ST" ckpt export "$T/imported.h5" "$T/again.safetensors" > /dev/null 2>&1 || fail "re-export"
# Same tensors, same bytes (the headers differ only in __metadata__.source, the file exported from).
"$PY" - "$T/p.safetensors" "$T/again.safetensors" <<'PY' || fail "export -> import -> export changed the tensors"
import json, struct, sys
def load(p):
    raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
sys.exit(0 if a == b else "tensors differ")
PY

note "BF16 and F16 files (as Hugging Face ships them) are widened into the fp32 shards"
# to_half.py IN OUT DTYPE: the same tensors in BF16 / F16 (round to nearest even).
cat > "$T/to_half.py" <<'PY'
import json, struct, sys
import numpy as np
src, out, dt = sys.argv[1:4]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n]); base = 8 + n
new, blobs, off = {}, [], 0
for k, v in hdr.items():
    if k == "__metadata__": new[k] = v; continue
    a = np.frombuffer(raw[base + v["data_offsets"][0]:base + v["data_offsets"][1]], dtype="<f4")
    if dt == "F16":
        b = a.astype("<f2").tobytes()
    else:
        u = a.view("<u4").astype(np.uint64)
        b = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")).tobytes()
    new[k] = {"dtype": dt, "shape": v["shape"], "data_offsets": [off, off + len(b)]}
    blobs.append(b); off += len(b)
h = json.dumps(new).encode(); h += b" " * (-len(h) % 8)
open(out, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
# check.py A.safetensors B.safetensors DTYPE: B (F32) == A (F32) rounded to DTYPE, element for element.
cat > "$T/check_half.py" <<'PY'
import json, struct, sys
import numpy as np
def load(p):
    raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n])
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], dtype="<f4")
            for k, v in h.items() if k != "__metadata__"}
a, b, dt = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
for k in a:
    x = a[k]
    if dt == "F16":
        r = x.astype("<f2").astype("<f4")
    else:
        u = x.view("<u4").astype(np.uint64)
        r = ((((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype("<u4")).view("<f4")
    if not np.array_equal(r, b[k]): sys.exit(f"{k}: imported values are not the {dt} rounding of the source")
print("ok", len(a), "tensors")
PY
for dt in BF16 F16; do
  "$PY" "$T/to_half.py" "$T/p.safetensors" "$T/p.$dt.safetensors" $dt || fail "making a $dt file"
  "$MPIEXEC" "${MPIFLAGS[@]}" -np 2 "$ST" ckpt import "$T/p.$dt.safetensors" "$T/imp.$dt.h5" --deck "$DECK" \
    > "$T/import.$dt.log" 2>&1 || { cat "$T/import.$dt.log"; fail "import of the $dt file"; }
  "$ST" ckpt export "$T/imp.$dt.h5" "$T/imp.$dt.safetensors" > /dev/null 2>&1 || fail "export of the $dt import"
  "$PY" "$T/check_half.py" "$T/p.safetensors" "$T/imp.$dt.safetensors" $dt || fail "$dt import values"
done

note "a sharded Hugging Face checkpoint (index.json + 2 files), by index and by directory"
cat > "$T/split.py" <<'PY'
import json, os, struct, sys
src, outdir = sys.argv[1:3]
raw = open(src, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; hdr = json.loads(raw[8:8 + n])
names = sorted(k for k in hdr if k != "__metadata__")
os.makedirs(outdir, exist_ok=True)
wmap = {}
for part, chunk in enumerate([names[0::2], names[1::2]]):
    fname = f"model-{part + 1:05d}-of-00002.safetensors"
    new, blobs, off = {}, [], 0
    for k in chunk:
        v = hdr[k]; b = raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
        new[k] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [off, off + len(b)]}
        blobs.append(b); off += len(b); wmap[k] = fname
    h = json.dumps(new).encode(); h += b" " * (-len(h) % 8)
    open(os.path.join(outdir, fname), "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
json.dump({"metadata": {}, "weight_map": wmap}, open(os.path.join(outdir, "model.safetensors.index.json"), "w"))
PY
"$PY" "$T/split.py" "$T/p.safetensors" "$T/hf" || fail "splitting the safetensors file"
for src in "$T/hf/model.safetensors.index.json" "$T/hf"; do
  rm -f "$T/imp.hf.h5"
  "$MPIEXEC" "${MPIFLAGS[@]}" -np 2 "$ST" ckpt import "$src" "$T/imp.hf.h5" --deck "$DECK" > "$T/import.hf.log" 2>&1 ||
    { cat "$T/import.hf.log"; fail "import of $src"; }
  h5diff -q "$SRC" "$T/imp.hf.h5" /model /model || fail "import of $src: /model differs from the source"
done

note "fine-tune from the safetensors file vs resume from the imported checkpoint (3 ranks)"
train_ok 3 "$T/F" "${COMMON[@]}" --set train.max_steps=4 --set "checkpoint.init_from=$T/p.safetensors"
grep -q "# initial weights from $T/p.safetensors" "$T/F.log" || fail "F did not report its initial weights"
train_ok 3 "$T/G" "${COMMON[@]}" --set train.max_steps=4 --set "checkpoint.resume=$T/imported.h5"
step_table "$T/F/metrics.jsonl" > "$T/F.steps"
step_table "$T/G/metrics.jsonl" > "$T/G.steps"
[ "$(wc -l < "$T/F.steps")" = 4 ] || fail "F logged $(wc -l < "$T/F.steps") steps, expected 4"
cmp "$T/F.steps" "$T/G.steps" || { paste "$T/F.steps" "$T/G.steps"; fail "init_from and resume-from-import train differently"; }
# And it really started from P's weights: on the same first batch its loss differs from a
# freshly initialised model's. P's own first step is that fresh model on that batch (same seed,
# initialisation and global batch of 12, dropout off; neither the initialisation nor the
# sampler depends on the rank count: P's step-1 loss equals a fresh 3-rank run's to the digit).
awk 'NR == FNR { if (FNR == 1) z = $2; next } FNR == 1 { d = $2 - z; if (d < 0) d = -d; if (d < 1e-3) { print "fine-tune first loss " $2 " vs fresh " z; exit 1 } }' \
  <(step_table "$T/P/metrics.jsonl") "$T/F.steps" || fail "F's first loss equals a fresh model's: the weights were not loaded"

note "bad input: missing tensor source, wrong model, init_from not a file"
# A deck whose model is bigger than the file: the shape mismatch is named, every rank exits 2.
set +e
"$MPIEXEC" "${MPIFLAGS[@]}" -np 2 "$ST" ckpt import "$T/p.safetensors" "$T/bad.h5" --deck "$DECK" \
  --set model.d_model=48 > "$T/bad1.log" 2>&1; rc1=$?
"$MPIEXEC" "${MPIFLAGS[@]}" -np 2 "$ST" ckpt import "$T/nope.safetensors" "$T/bad.h5" --deck "$DECK" > "$T/bad2.log" 2>&1; rc2=$?
set -e
[ "$rc1" = 2 ] || { cat "$T/bad1.log"; fail "import into a wider model exited $rc1, expected 2"; }
grep -q "shape" "$T/bad1.log" || { cat "$T/bad1.log"; fail "import into a wider model: no shape in the message"; }
[ "$rc2" = 2 ] || { cat "$T/bad2.log"; fail "import of a missing file exited $rc2, expected 2"; }
grep -q "nope.safetensors" "$T/bad2.log" || { cat "$T/bad2.log"; fail "missing file not named"; }
[ ! -e "$T/bad.h5" ] && [ ! -e "$T/bad.h5.tmp" ] || fail "a failed import left a file behind"
train 3 "$T/B" "${COMMON[@]}" --set train.max_steps=1 --set "checkpoint.init_from=$T/missing.safetensors"
[ "$RC" = 2 ] || { tail "$T/B.log"; fail "init_from a missing file exited $RC, expected 2"; }
grep -q "safetensors .*missing.safetensors: no such file or directory" "$T/B.log" || { tail "$T/B.log"; fail "init_from: missing file not named"; }
note "OK: import is exact, init_from == resume from the import, bad input refused"
