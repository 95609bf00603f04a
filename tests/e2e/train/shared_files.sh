#!/usr/bin/env bash
# Shared directories and files from others (issue #27, docs/security.md), end to end: a link
# planted at any name a command writes is refused with exit 2 and its target left untouched;
# a checkpoint with soft or external links, or a recorded model larger than its data, is
# refused by every reader before anything is read through it; a hostile run directory name
# runs no command in `report`; path keys and `latest` stay inside their base; a NUL in a deck
# string is refused. Singleton processes (no mpirun), the tiny deck, every command under
# `timeout`. The checkpoint edits need h5py ($H5PY_PYTHON, skipped without it).
# Usage: shared_files.sh SHARDTRAIN MPIEXEC [mpirun flags...]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PY=${H5PY_PYTHON:-/usr/bin/python3}
TMO=${HOSTILE_TIMEOUT:-90}
CASES=0
V=$T/victim
echo precious > "$V"

# expect_user_error TEXT CMD...: exit 2 within $TMO s with an "error: " line holding TEXT, and
# the planted link's target unchanged.
expect_user_error() {
  local want=$1; shift
  CASES=$((CASES + 1))
  set +e
  # Shell functions (run1, resume_on) put their own command under timeout.
  if declare -F "$1" > /dev/null; then "$@" > "$T/case.out" 2> "$T/case.err" < /dev/null
  else timeout -k 5 "$TMO" "$@" > "$T/case.out" 2> "$T/case.err" < /dev/null; fi
  local rc=$?
  set -e
  [ "$rc" != 124 ] && [ "$rc" != 137 ] || fail "hung (killed after $TMO s): $*"
  [ "$rc" = 2 ] || { tail -20 "$T/case.err"; fail "exit $rc, expected 2: $*"; }
  grep '^error: ' "$T/case.err" | grep -qF -- "$want" || { tail -20 "$T/case.err"; fail "stderr lacks '$want': $*"; }
  [ "$(cat "$V")" = precious ] || fail "the planted link's target was written: $*"
  note "exit 2: $(grep '^error: ' "$T/case.err" | head -1 | cut -c1-170)"
}
run1() {  # run1 OUT [--set ...]: the tiny deck on one singleton rank, a new run in OUT
  local out=$1; shift
  timeout -k 5 "$TMO" "$ST" train "$DECK" --set "data.dataset=$T/data" --set "run.out_dir=$out" --set checkpoint.resume=never \
    --set train.max_steps=2 --set lr.decay_steps=2 --set lr.warmup_steps=1 "$@"
}

make_dataset

# ---- 1. planted links, one per writer ----------------------------------------------------
mkdir -p "$T/L" && ln -s "$V" "$T/L/shardtrain.lock"
expect_user_error "shardtrain.lock exists and is a symbolic link" run1 "$T/L"
mkdir -p "$T/M" && ln -s "$V" "$T/M/metrics.jsonl"
expect_user_error "metrics.jsonl exists and is a symbolic link" run1 "$T/M"
mkdir -p "$T/S" && ln -s "$V" "$T/S/samples.jsonl"
expect_user_error "samples.jsonl exists and is a symbolic link" run1 "$T/S" --set train.sample_every=1
mkdir -p "$T/D" && ln -s "$V" "$T/D/deck.resolved.toml"
expect_user_error "deck.resolved.toml exists and is a symbolic link" run1 "$T/D"
mkdir -p "$T/C/checkpoints" && ln -s "$V" "$T/C/checkpoints/step_00000002.h5.tmp"
expect_user_error "step_00000002.h5.tmp exists and is a symbolic link" run1 "$T/C"
mkdir -p "$T/F/checkpoints" && ln -s "$V" "$T/F/checkpoints/step_00000002.h5"
expect_user_error "step_00000002.h5 exists and is a symbolic link" run1 "$T/F"
mkdir -p "$T/Lt/checkpoints" && ln -s "$V" "$T/Lt/checkpoints/latest.tmp"
expect_user_error "latest.tmp is not a regular file" run1 "$T/Lt"

run1 "$T/good" --set checkpoint.dir="$T/ck" > "$T/good.log" 2>&1 || { tail -20 "$T/good.log"; fail "the reference run"; }
CK=$T/ck/step_00000002.h5
ln -s "$V" "$T/exp.safetensors"
expect_user_error "exp.safetensors exists and is a symbolic link" "$ST" ckpt export "$CK" "$T/exp.safetensors"
ln -s "$V" "$T/exp2.safetensors.tmp"
expect_user_error "exp2.safetensors.tmp exists and is a symbolic link" "$ST" ckpt export "$CK" "$T/exp2.safetensors"
expect_user_error "/dev/null exists and is a character device" "$ST" ckpt export "$CK" /dev/null
[ -c /dev/null ] || fail "/dev/null is no longer a character device"
ln -s "$V" "$T/cons.h5"
expect_user_error "cons.h5 exists and is a symbolic link" "$ST" ckpt consolidate "$CK" "$T/cons.h5"
ln -s "$V" "$T/cons2.h5.tmp"
expect_user_error "cons2.h5.tmp exists and is a symbolic link" "$ST" ckpt consolidate "$CK" "$T/cons2.h5"
"$ST" ckpt export "$CK" "$T/model.safetensors" > /dev/null || fail "export to a free name"
ln -s "$V" "$T/imported.h5"
expect_user_error "imported.h5 exists and is a symbolic link" "$ST" ckpt import "$T/model.safetensors" "$T/imported.h5" --deck "$DECK"
mkdir -p "$T/P" && ln -s "$V" "$T/P/train.bin.tmp"
expect_user_error "train.bin.tmp exists and is a symbolic link" "$ST" data prepare --source "$T/text.txt" --tokenizer byte --out "$T/P"
mkdir -p "$T/P2" && ln -s "$V" "$T/P2/meta.json"
expect_user_error "meta.json exists and is a symbolic link" "$ST" data prepare --source "$T/text.txt" --tokenizer byte --out "$T/P2"
ln -s "$V" "$T/enc.bin"
expect_user_error "enc.bin exists and is a symbolic link" "$ST" data encode --tokenizer byte "$T/text.txt" "$T/enc.bin"

# ---- 3. a run directory name that is shell syntax ------------------------------------------
NAME="x\";touch pwned;\"'\$(touch pwned2)';touch pwned3;'"
mkdir -p "$T/$NAME" && cp "$T/good/metrics.jsonl" "$T/$NAME/"
(cd "$T" && timeout -k 5 "$TMO" "$ST" report "$T/$NAME" > "$T/report.log" 2>&1) || { cat "$T/report.log"; fail "report of the hostile name"; }
[ -z "$(find "$T" -type f -name 'pwned*')" ] || fail "a command in the directory name ran: $(find "$T" -type f -name 'pwned*')"
for p in loss throughput memory; do [ -s "$T/$NAME/plots/$p.png" ] || fail "no $p.png for the hostile name"; done
mkdir -p "$T/R" && cp "$T/good/metrics.jsonl" "$T/R/" && ln -s "$T/elsewhere" "$T/R/plots" && mkdir -p "$T/elsewhere"
expect_user_error "plots exists and is not a directory" "$ST" report "$T/R"
[ -z "$(ls "$T/elsewhere")" ] || fail "report wrote through a linked plots directory"
note "report: no command ran from the directory name, plots drawn"

# ---- 4. paths stay inside their base; 8. NUL in a deck string ------------------------------
expect_user_error "log.metrics_file" "$ST" deck check "$DECK" --set log.metrics_file=../x
expect_user_error "log.metrics_file" "$ST" deck check "$DECK" --set log.metrics_file=/tmp/x
expect_user_error "run.name" "$ST" deck check "$DECK" --set run.name=../../x
printf '[run]\nname = "a\\u0000b"\n' > "$T/nul.toml"
expect_user_error "run.name" "$ST" deck check "$T/nul.toml"
grep -q "NUL" "$T/case.err" || fail "the NUL message does not say NUL"
mkdir -p "$T/G1" "$T/G2" && cp "$CK" "$T/G1/away.h5"
echo "../G1/away.h5" > "$T/G2/latest"
expect_user_error "must name a checkpoint file" "$ST" generate "$T/G2" --prompt The --max-new-tokens 2
echo "$T/G1/away.h5" > "$T/G2/latest"
expect_user_error "must name a checkpoint file" "$ST" generate "$T/G2" --prompt The --max-new-tokens 2
ln -s "$T/G1/away.h5" "$T/G2/linked.h5" && echo linked.h5 > "$T/G2/latest"
expect_user_error "not a regular file" "$ST" generate "$T/G2" --prompt The --max-new-tokens 2
timeout -k 5 "$TMO" "$ST" generate "$T/ck" --prompt The --max-new-tokens 2 > /dev/null 2>&1 || fail "generate of a good directory"

# ---- 6. a resume on other data ---------------------------------------------------------------
resume_on() {  # resume_on NAME DATASET [--set ...]: continues the reference run's checkpoint on DATASET
  local name=$1 data=$2; shift 2
  rm -rf "$T/$name.ck" && cp -r "$T/ck" "$T/$name.ck"
  timeout -k 5 "$TMO" "$ST" train "$DECK" --set "data.dataset=$data" --set "run.out_dir=$T/$name" --set "checkpoint.dir=$T/$name.ck" \
    --set train.max_steps=3 --set lr.decay_steps=2 --set lr.warmup_steps=1 "$@"
}
cp -r "$T/data" "$T/same_size"
tr 'a-y' 'b-z' < "$T/data/train.bin" > "$T/same_size/train.bin"
cmp -s "$T/data/train.bin" "$T/same_size/train.bin" && fail "the replaced train.bin is not different"
expect_user_error "train.bin: content differs (same size)" resume_on same_size "$T/same_size"
awk '{ print toupper($0) }' "$T/text.txt" > "$T/other.txt"
"$ST" data prepare --source "$T/other.txt" --tokenizer byte --out "$T/other" > /dev/null 2>&1 || fail "data prepare other"
expect_user_error "was trained on other data" resume_on other "$T/other"
grep -q "meta.json" "$T/case.err" || fail "the message does not name what changed"
[ ! -e "$T/other.ck/step_00000003.h5" ] || fail "a refused resume trained"
ls "$T"/other.ck/*.bad > /dev/null 2>&1 && fail "the checkpoint of other data was set aside as bad"
resume_on allowed "$T/other" --set checkpoint.allow_data_change=true > "$T/allowed.log" 2>&1 ||
  { tail -20 "$T/allowed.log"; fail "the allowed resume on other data"; }
grep -q "warning: .*on other data" "$T/allowed.log" || fail "no warning for the allowed data change"
grep -q '"event":"data_changed"' "$T/allowed/metrics.jsonl" || fail "no data_changed record in the metrics"
resume_on same "$T/data" > "$T/same.log" 2>&1 || { tail -20 "$T/same.log"; fail "the resume on the same data"; }
grep -q "other data" "$T/same.log" && fail "the same data was reported as changed"
note "resume on other data: exit 2 naming the change; allowed with a warning and a metrics record"

# ---- 2. checkpoints that point elsewhere, and a recorded model larger than its data --------
if "$PY" -c "import h5py, numpy" 2> /dev/null; then
  "$PY" - "$CK" "$T" <<'PYEOF'
import re, shutil, sys
import h5py
ck, t = sys.argv[1], sys.argv[2]
def edit(name, fn):
    shutil.copy(ck, t + "/" + name)
    with h5py.File(t + "/" + name, "r+") as f:
        fn(f)
with h5py.File(ck, "r") as f:
    names = sorted(f["model"].keys())
first = names[0]
open(t + "/first.txt", "w").write(first)
shutil.copy(ck, t + "/other.h5")
def external(f):
    del f["model/" + first]
    f["model/" + first] = h5py.ExternalLink(t + "/other.h5", "/model/" + first)
edit("external.h5", external)
def soft(f):
    same = [n for n in names if n != first and f["model/" + n].shape == f["model/" + first].shape]
    target = same[0] if same else names[1]
    del f["model/" + first]
    f["model/" + first] = h5py.SoftLink("/model/" + target)
edit("soft.h5", soft)
def huge(f):
    deck = f.attrs["deck"]
    deck = deck.decode() if isinstance(deck, bytes) else deck
    deck = re.sub(r"(?m)^d_model = .*$", "d_model = 8192", deck)
    deck = re.sub(r"(?m)^n_layers = .*$", "n_layers = 512", deck)
    f.attrs["deck"] = deck
edit("huge.h5", huge)
PYEOF
  FIRST=$(cat "$T/first.txt")
  for kind in external soft; do
    want="/model/$FIRST is a"
    expect_user_error "$want" "$ST" ckpt verify "$T/$kind.h5"
    expect_user_error "$want" "$ST" ckpt inspect "$T/$kind.h5"
    expect_user_error "$want" "$ST" ckpt export "$T/$kind.h5" "$T/$kind.safetensors"
    expect_user_error "$want" "$ST" ckpt consolidate "$T/$kind.h5" "$T/$kind.cons.h5"
    expect_user_error "$want" "$ST" generate "$T/$kind.h5" --prompt The --max-new-tokens 2
    expect_user_error "$want" run1 "$T/resume_$kind" --set checkpoint.resume="$T/$kind.h5" --set train.max_steps=3
    [ ! -e "$T/$kind.safetensors" ] && [ ! -e "$T/$kind.cons.h5" ] || fail "a refused $kind checkpoint was exported"
  done
  expect_user_error "shape" "$ST" generate "$T/huge.h5" --prompt The --max-new-tokens 2
else
  note "no h5py for $PY: checkpoint-editing cases skipped"
fi
note "$CASES cases: exit 2 naming the culprit, every planted link's target untouched"
