#!/usr/bin/env bash
# `shardtrain eval` and `shardtrain generate` on a tiny byte-level GPT-2 trained on 2 ranks:
# eval's loss is the same to the last bit at 1, 2 and 4 ranks; greedy generation is identical
# at 1 and 2 ranks; both equal what an independent GPT-2 (tests/python/hf_reference.py) computes
# on the exported weights over the same windows; bad input is one error line and exit 2. The
# training run also checks train.sample_every and a 4-step smoke run of a 10-step-warmup deck.
# Usage: eval_generate.sh SHARDTRAIN PYTHON SOURCE_DIR MPIRUN [MPIRUN_FLAGS...]
set -euo pipefail
bin=$1 py=$2 src=$3 mpirun=$4
shift 4
work=$(mktemp -d /tmp/shardtrain-e2e-evalgen.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cat "$src"/docs/*.md "$src"/README.md > "$work/text.txt"
"$bin" data prepare --source "$work/text.txt" --tokenizer byte --out "$work/ds" --val-fraction 0.2 >/dev/null
deck=("$src/inputs/quickstart.toml" --set run.out_dir="$work/run" --set checkpoint.dir="$work/ck"
      --set data.dataset="$work/ds" --set data.tokenizer=byte --set model.vocab_size=256 --set model.seq_len=32
      --set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set train.micro_batch=4)
"$mpirun" "$@" -np 2 "$bin" train "${deck[@]}" --set train.max_steps=40 --set train.val_every=0 \
  --set lr.warmup_steps=4 --set log.peak_tflops=1 --set checkpoint.resume=never \
  --set train.sample_every=20 --set train.sample_prompt=The --set train.sample_tokens=12 >"$work/train.log"
# Samples during training: in the log and in samples.jsonl, at steps 20 and 40.
[ "$(grep -c '^sample ' "$work/train.log")" -eq 2 ] || fail "expected 2 sample lines in the training log"
"$py" - "$work/run/samples.jsonl" <<'PY' || fail "samples.jsonl"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert [x["step"] for x in r] == [20, 40], r
assert all(x["prompt"] == "The" and len(x["text"].encode()) == 12 for x in r), r
PY
# A smoke run shorter than the deck's warmup (quickstart: 10 steps) trains, with one note.
"$mpirun" "$@" -np 2 "$bin" train "${deck[@]}" --set run.out_dir="$work/smoke" --set checkpoint.dir="$work/smoke/ck" \
  --set train.max_steps=4 --set log.peak_tflops=1 >"$work/smoke.log" 2>&1 || { cat "$work/smoke.log"; fail "the 4-step smoke run failed"; }
grep -q "note: lr.warmup_steps = 10 is not below train.max_steps = 4" "$work/smoke.log" || fail "no warmup note in the smoke run"

# eval: the same bits at 1, 2 and 4 ranks (the printed loss has 17 significant digits).
for n in 1 2 4; do
  "$mpirun" "$@" -np $n "$bin" eval "${deck[@]}" --out "$work/eval$n.json" >"$work/eval$n.txt"
  sed -E 's/.* loss ([^,]+),.*/\1/' "$work/eval$n.txt" >"$work/loss$n"
done
cat "$work/eval1.txt"
cmp "$work/loss1" "$work/loss2" || fail "eval loss differs between 1 and 2 ranks: $(cat "$work"/loss1) vs $(cat "$work"/loss2)"
cmp "$work/loss1" "$work/loss4" || fail "eval loss differs between 1 and 4 ranks: $(cat "$work"/loss1) vs $(cat "$work"/loss4)"
grep -q '"perplexity"' "$work/eval2.json" || fail "eval.json has no perplexity"

# generate: greedy is identical at 1 and 2 ranks (a checkpoint directory resolves through `latest`).
prompt="The checkpoint"
for n in 1 2; do
  "$mpirun" "$@" -np $n "$bin" generate "$work/ck" --prompt "$prompt" --temperature 0 --max-new-tokens 48 \
    >"$work/gen$n.txt" 2>"$work/gen$n.err"
done
cmp "$work/gen1.txt" "$work/gen2.txt" || fail "greedy generation differs between 1 and 2 ranks"
# Sampling with a seed repeats; another seed differs.
"$bin" generate "$work/ck" --prompt "$prompt" --seed 7 --top-k 40 --top-p 0.95 >"$work/s7a.txt" 2>/dev/null
"$bin" generate "$work/ck" --prompt "$prompt" --seed 7 --top-k 40 --top-p 0.95 >"$work/s7b.txt" 2>/dev/null
"$bin" generate "$work/ck" --prompt "$prompt" --seed 8 --top-k 40 --top-p 0.95 >"$work/s8.txt" 2>/dev/null
cmp "$work/s7a.txt" "$work/s7b.txt" || fail "the same --seed sampled different text"
! cmp -s "$work/s7a.txt" "$work/s8.txt" || fail "--seed 7 and --seed 8 sampled the same text"

# The independent implementation: the loss over the same windows and the same greedy text.
"$bin" ckpt export "$(ls "$work"/ck/step_*.h5 | tail -n 1)" "$work/model.safetensors" >/dev/null
"$py" "$src/tests/python/eval_generate_check.py" "$work/model.safetensors" "$work/ds" "$work/eval1.json" 2 2 32 \
  "$prompt" 48 "$work/gen1.txt"

# Bad input: exit 2 and one error line, on every rank count.
expect2() {
  local what=$1; shift
  set +e; "$@" >"$work/bad.out" 2>"$work/bad.err"; local rc=$?; set -e
  [ $rc -eq 2 ] || { cat "$work/bad.out" "$work/bad.err"; fail "$what: exit $rc, expected 2"; }
  # One message (CLI11 adds a "Run with --help" line; mpirun its own notice, not an error: line).
  [ "$(grep -c '^error' "$work/bad.err")" -eq 1 ] || [ "$(grep -c . "$work/bad.err")" -le 2 ] ||
    { cat "$work/bad.err"; fail "$what: not exactly one error message"; }
}
expect2 "missing checkpoint" "$mpirun" "$@" -np 2 "$bin" generate "$work/nope.h5" --prompt x
grep -q "nope.h5" "$work/bad.err" || fail "missing checkpoint: the error does not name the path"
expect2 "negative temperature" "$bin" generate "$work/ck" --prompt x --temperature -1
grep -q -- "--temperature" "$work/bad.err" || fail "the error does not name --temperature"
expect2 "top-p 0" "$bin" generate "$work/ck" --prompt x --top-p 0
expect2 "not a checkpoint" "$bin" generate "$work/text.txt" --prompt x
head -c 20000 "$(ls "$work"/ck/step_*.h5 | tail -n 1)" >"$work/truncated.h5"
expect2 "truncated checkpoint" "$mpirun" "$@" -np 2 "$bin" generate "$work/truncated.h5" --prompt x
grep -q "truncated.h5" "$work/bad.err" || fail "truncated checkpoint: the error does not name the file"
expect2 "unknown flag" "$bin" generate "$work/ck" --prompt x --temprature 1
expect2 "eval without a checkpoint" "$mpirun" "$@" -np 2 "$bin" eval "${deck[@]}" --set checkpoint.dir="$work/none"
expect2 "eval on a text file" "$bin" eval "${deck[@]}" --set checkpoint.resume="$work/text.txt"
echo "eval/generate: OK"
