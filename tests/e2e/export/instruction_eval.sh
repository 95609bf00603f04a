#!/usr/bin/env bash
# Instruction data against an independent implementation: a tiny byte-level GPT-2 trained on
# 2 ranks on a masked dataset (--chat-format plain), exported to safetensors; `eval` on both
# splits (2 ranks) equals what the independent GPT-2 of tests/python/hf_reference.py computes
# averaged over the counted targets only (tests/python/masked_loss_check.py).
# Usage: instruction_eval.sh SHARDTRAIN PYTHON SOURCE_DIR MPIRUN [MPIRUN_FLAGS...]
set -euo pipefail
bin=$1 py=$2 src=$3 mpirun=$4
shift 4
work=$(mktemp -d /tmp/shardtrain-e2e-instreval.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
awk 'BEGIN { srand(9); split("the of and to a in that it was her she not be his as had with for he you", w, " ");
  for (l = 0; l < 300; ++l) { p = ""; c = "";
    for (i = 0; i < 3 + int(rand() * 6); ++i) p = p w[int(rand() * 20) + 1] " ";
    for (i = 0; i < 2 + int(rand() * 6); ++i) c = c " " w[int(rand() * 20) + 1];
    printf "{\"prompt\": \"Q: %s?\\nA:\", \"completion\": \"%s.\"}\n", p, c } }' > "$work/rows.jsonl"
"$bin" data prepare --source "$work/rows.jsonl" --tokenizer byte --chat-format plain --out "$work/ds" \
  --val-fraction 0.2 >/dev/null
deck=("$src/inputs/quickstart.toml" --set run.out_dir="$work/run" --set checkpoint.dir="$work/ck"
      --set data.dataset="$work/ds" --set data.tokenizer=byte --set data.val_fraction=0.2 --set model.vocab_size=256
      --set model.seq_len=32 --set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set train.micro_batch=4
      --set data.packing=stream)  # masked_loss_check.py computes the stream's windows
"$mpirun" "$@" -np 2 "$bin" train "${deck[@]}" --set train.max_steps=12 --set train.val_every=0 \
  --set lr.warmup_steps=2 --set log.peak_tflops=1 --set checkpoint.resume=never >"$work/train.log" 2>&1 ||
  { tail -20 "$work/train.log"; fail "training"; }
"$bin" ckpt export "$(ls "$work"/ck/step_*.h5 | tail -n 1)" "$work/model.safetensors" >/dev/null
for split in train val; do
  "$mpirun" "$@" -np 2 "$bin" eval "${deck[@]}" --split $split --out "$work/eval-$split.json" >"$work/eval-$split.txt" 2>&1 ||
    { cat "$work/eval-$split.txt"; fail "eval $split"; }
  "$py" "$src/tests/python/masked_loss_check.py" "$work/model.safetensors" "$work/ds" $split "$work/eval-$split.json" 2 2 32
done
