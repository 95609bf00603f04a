#!/usr/bin/env bash
# Hostile inputs, end to end: each must end with exit 2 and one "error: ..." line naming the
# culprit, quickly (every command runs under `timeout`, so a regression fails instead of
# hanging). Singleton processes (no mpirun) keep it fast; one tiny training run makes the
# checkpoint the checkpoint cases edit (with h5py: $H5PY_PYTHON, skipped without it).
# Usage: hostile_inputs.sh SHARDTRAIN MPIEXEC [mpirun flags...]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PY=${H5PY_PYTHON:-/usr/bin/python3}
TMO=${HOSTILE_TIMEOUT:-60}
CASES=0

# expect_user_error TEXT CMD...: exit 2 within $TMO s, stderr exactly one "error: " line with TEXT.
expect_user_error() {
  local want=$1; shift
  CASES=$((CASES + 1))
  set +e
  timeout -k 5 "$TMO" "$@" > "$T/case.out" 2> "$T/case.err" < /dev/null
  local rc=$?
  set -e
  [ "$rc" != 124 ] && [ "$rc" != 137 ] || fail "hung (killed after $TMO s): $*"
  [ "$rc" = 2 ] || { cat "$T/case.err"; fail "exit $rc, expected 2: $*"; }
  [ "$(wc -l < "$T/case.err")" = 1 ] && grep -q '^error: ' "$T/case.err" ||
    { cat "$T/case.err"; fail "stderr is not one 'error:' line: $*"; }
  grep -qF -- "$want" "$T/case.err" || { cat "$T/case.err"; fail "stderr lacks '$want': $*"; }
  note "exit 2: $(cut -c1-160 "$T/case.err")"
}
# train1 TEXT [--set ...]: `train` on one singleton rank with the tiny deck, expecting TEXT.
train1() {
  local want=$1; shift
  # A directory of its own per case: runs own their out_dir and checkpoint.dir.
  expect_user_error "$want" "$ST" train "$DECK" --set "run.out_dir=$T/run$CASES" --set checkpoint.resume=never "$@"
}

# ---- decks ------------------------------------------------------------------------------
mkfifo "$T/fifo.toml"
expect_user_error "fifo.toml: is a FIFO" "$ST" deck check "$T/fifo.toml"
expect_user_error "/dev/zero: is a character device" "$ST" deck check /dev/zero
awk 'BEGIN { s = "[a"; for (i = 0; i < 20000; ++i) s = s ".a"; print "[run]"; print s "]" }' > "$T/deep.toml"
expect_user_error "deep.toml:2:" "$ST" deck check "$T/deep.toml"
awk 'BEGIN { s = ""; for (i = 0; i < 20000; ++i) s = s "{a = "; print "x = " s }' > "$T/inline.toml"
expect_user_error "nesting" "$ST" deck check "$T/inline.toml"
head -c $((1024 * 1024 + 1)) /dev/zero | tr '\0' '#' > "$T/big.toml"
expect_user_error "at most 1 MiB" "$ST" deck check "$T/big.toml"
expect_user_error "run.threads=100000: must be <= 4096" "$ST" deck check "$DECK" --set run.threads=100000

# ---- data prepare / info -------------------------------------------------------------------
: > "$T/empty.txt"
printf 'hello world\n' > "$T/small.txt"
# A directory is a corpus (its *.txt, *.jsonl, ... files); one without such files, or a FIFO, is not.
mkdir -p "$T/nocorpus"
expect_user_error "holds no *.txt" "$ST" data prepare --tokenizer byte --source "$T/nocorpus" --out "$T/ds_dir"
mkfifo "$T/fifo.txt"
expect_user_error "is not a regular file" "$ST" data prepare --tokenizer byte --source "$T/fifo.txt" --out "$T/ds_dir"
rm -f "$T/fifo.txt"
expect_user_error "empty.txt' is empty" "$ST" data prepare --tokenizer byte --source "$T/empty.txt" --out "$T/ds_empty"
printf 'x' > "$T/one.txt"
expect_user_error "fewer than the 2" "$ST" data prepare --tokenizer byte --source "$T/one.txt" --out "$T/ds_one"
expect_user_error "--val-fraction must be in [0, 1)" "$ST" data prepare --tokenizer byte --source "$T/small.txt" \
  --out "$T/ds_neg" --val-fraction -1
[ ! -e "$T/ds_dir" ] && [ ! -e "$T/ds_empty" ] && [ ! -e "$T/ds_neg" ] || fail "a refused prepare wrote a dataset"
mkdir -p "$T/wrap"
: > "$T/wrap/train.bin"; : > "$T/wrap/val.bin"
cat > "$T/wrap/meta.json" <<'EOF'
{"format": "shardtrain-tokens", "version": 1, "tokenizer": "byte", "vocab_size": 256, "dtype": "uint32",
 "byte_order": "little", "eot_id": -1, "splits": {"train": {"file": "train.bin", "tokens": 4611686018427387904},
 "val": {"file": "val.bin", "tokens": 0}}, "val_fraction": 0.05, "sources": []}
EOF
expect_user_error "4611686018427387904" "$ST" data info "$T/wrap"
train1 "4611686018427387904" --set "data.dataset=$T/wrap"

# ---- training: threads, sizes, ids ----------------------------------------------------------
train1 "more threads than this host can run" --set run.threads=4000 --set data.dataset=
train1 "optimizer.host_threads = 4000" --set optimizer.host_threads=4000 --set data.dataset=
train1 "cannot fit in memory" --set model.seq_len=1000000 --set data.dataset=
train1 "cannot fit in memory" --set train.micro_batch=1048576 --set train.global_batch=0 --set data.dataset=
# Ids >= vocab_size everywhere but where the open-time spot check looks (splits over 16 Mi
# tokens are sampled with stride 16): the first batch finds them.
mkdir -p "$T/oov"
"$PY" - "$T/oov" <<'EOF'
import sys
n = 16 * 2**20 + 2
b = bytearray(b"\x2c\x01" * n)          # 300 everywhere
b[0::32] = b"\x41" * len(range(0, 2 * n, 32))  # token 16k = 65
b[1::32] = b"\x00" * len(range(1, 2 * n, 32))
open(sys.argv[1] + "/train.bin", "wb").write(b)
open(sys.argv[1] + "/val.bin", "wb").write(b"")
open(sys.argv[1] + "/meta.json", "w").write(
    '{"format": "shardtrain-tokens", "version": 1, "tokenizer": "byte", "vocab_size": 256, "dtype": "uint16", '
    '"byte_order": "little", "eot_id": -1, "splits": {"train": {"file": "train.bin", "tokens": %d}, '
    '"val": {"file": "val.bin", "tokens": 0}}, "val_fraction": 0.05, "sources": []}' % n)
EOF
train1 "not below vocab_size 256 from meta.json: corrupt file (found while reading a batch)" --set "data.dataset=$T/oov"
rm -rf "$T/oov"

# ---- checkpoints: export / import paths, edited files ---------------------------------------
make_dataset
"$ST" train "$DECK" --set "data.dataset=$T/data" --set "run.out_dir=$T/good" --set train.max_steps=2 \
  --set lr.decay_steps=2 --set lr.warmup_steps=1 --set checkpoint.dir="$T/ck" > "$T/good.log" 2>&1 ||
  { tail -20 "$T/good.log"; fail "training the reference checkpoint"; }
CK=$(ls "$T"/ck/step_*.h5 | tail -n 1)
expect_user_error "refusing to overwrite" "$ST" ckpt export "$CK" "$CK"
ln -s "$CK" "$T/alias.h5"
expect_user_error "refusing to overwrite" "$ST" ckpt export "$CK" "$T/alias.h5"
"$ST" ckpt export "$CK" "$T/model.safetensors" > /dev/null
expect_user_error "refusing to overwrite" "$ST" ckpt import "$T/model.safetensors" "$T/model.safetensors" --deck "$DECK"
if "$PY" -c "import h5py, numpy" 2> /dev/null; then
  # A parameter deleted, one misshaped (valid digest), a chunked 2^40-element rng_state, and
  # garbage RNG bytes behind a valid digest.
  "$PY" - "$CK" "$T" <<'EOF'
import shutil, sys
import h5py, numpy as np
ck, t = sys.argv[1], sys.argv[2]
def digest(a):
    w = np.frombuffer(a.tobytes(), dtype={1: np.uint8, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]).astype(np.uint64)
    with np.errstate(over="ignore"):
        return np.array([w.sum(dtype=np.uint64), (w * np.arange(1, len(w) + 1, dtype=np.uint64)).sum(dtype=np.uint64)],
                        dtype=np.uint64)
def edit(name, fn):
    shutil.copy(ck, t + "/" + name)
    with h5py.File(t + "/" + name, "r+") as f:
        fn(f)
first = None
with h5py.File(ck, "r") as f:
    first = sorted(f["model"].keys())[0]
    open(t + "/first.txt", "w").write(first)
edit("missing.h5", lambda f: f.__delitem__("model/" + first))
def misshape(f):
    a = f["model/" + first][()].reshape(-1)[:1].copy()
    del f["model/" + first]
    d = f.create_dataset("model/" + first, data=a)
    d.attrs["digest"] = digest(a)
edit("misshaped.h5", misshape)
def chunked(f):
    del f["train/rng_state"]
    d = f.create_dataset("train/rng_state", shape=(2**40,), dtype=np.uint8, chunks=(2**20,))
    d.attrs["digest"] = np.array([0, 0], dtype=np.uint64)
edit("chunked.h5", chunked)
def garbage(f):
    n = f["train/rng_state"].shape[0]
    a = np.random.default_rng(5).integers(0, 256, n, dtype=np.uint8)
    f["train/rng_state"][...] = a
    f["train/rng_state"].attrs["digest"] = digest(a)
edit("garbage_rng.h5", garbage)
EOF
  FIRST=$(cat "$T/first.txt")
  expect_user_error "dataset /model/$FIRST is missing" "$ST" ckpt export "$T/missing.h5" "$T/missing.safetensors"
  expect_user_error "dataset /model/$FIRST: shape [1]" "$ST" ckpt export "$T/misshaped.h5" "$T/misshaped.safetensors"
  [ ! -e "$T/missing.safetensors" ] && [ ! -e "$T/misshaped.safetensors" ] || fail "a refused export wrote its output"
  expect_user_error "/train/rng_state: stored with a chunked layout" "$ST" ckpt verify "$T/chunked.h5"
  "$ST" ckpt verify "$T/garbage_rng.h5" > /dev/null || fail "the garbage RNG checkpoint has valid digests"
  train1 "/train/rng_state of rank 0" --set "data.dataset=$T/data" --set checkpoint.resume="$T/garbage_rng.h5" \
    --set train.max_steps=4 --set lr.decay_steps=4
else
  note "no h5py for $PY: checkpoint-editing cases skipped"
fi
note "$CASES hostile cases: exit 2 with one error line each"
