#!/usr/bin/env bash
# Trains a tiny GPT-2 on 2 ranks, exports its final checkpoint to safetensors, and checks that
# an independent GPT-2 (tests/python/hf_reference.py semantics) gives the validation loss the
# run reported. Usage: export_loss.sh SHARDTRAIN PYTHON SOURCE_DIR MPIRUN [MPIRUN_FLAGS...]
set -euo pipefail
bin=$1 py=$2 src=$3 mpirun=$4
shift 4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat "$src"/docs/*.md "$src"/README.md > "$work/text.txt"
"$bin" data prepare --source "$work/text.txt" --tokenizer byte --out "$work/ds" --val-fraction 0.2 >/dev/null
"$mpirun" "$@" -np 2 "$bin" train "$src/inputs/quickstart.toml" \
  --set run.out_dir="$work/run" --set checkpoint.dir="$work/ck" --set data.dataset="$work/ds" \
  --set data.tokenizer=byte --set model.vocab_size=256 --set model.seq_len=32 --set model.d_model=32 \
  --set model.n_layers=2 --set model.n_heads=2 --set train.max_steps=8 --set train.micro_batch=4 \
  --set train.val_every=8 --set train.val_batches=1 --set lr.warmup_steps=2 --set log.peak_tflops=1 \
  --set checkpoint.resume=never >"$work/train.log"
ckpt=$(ls "$work"/ck/step_*.h5 | tail -n 1)
"$bin" ckpt export "$ckpt" "$work/model.safetensors" --format safetensors >/dev/null
"$py" "$src/tests/python/export_loss_check.py" "$work/model.safetensors" "$work/ds" "$work/run" 2 2 32 8
