#!/usr/bin/env bash
# Peak resident memory per rank of `ckpt export --format hf` merging a LoRA adapter into a base of
# >= 1 GB (issue 37: "each rank reads and merges only its slices, layer by layer"): a random
# Llama-shaped Hugging Face directory (fp32, 318 M parameters, 1.27 GB), one LoRA step on it
# (r 16, all-linear), then the merged export at 1 and 2 ranks. Prints the model's size, its
# largest tensor, and each export's peak per rank (the export's own VmHWM report) as ratios.
# Usage: perf/lora/merge_memory.sh [SHARDTRAIN]   (default build/bin/shardtrain)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-build/bin/shardtrain}
py=/usr/bin/python3
work=$(mktemp -d /tmp/shardtrain-merge-mem.XXXXXX)
trap 'rm -rf "$work"' EXIT
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
export OMP_NUM_THREADS=1

"$py" - "$work/base" <<'PY'
import json, pathlib, sys, torch
sys.path.insert(0, "tests/python")
import hf_models as hf
d = pathlib.Path(sys.argv[1]); d.mkdir()
cfg = dict(hf.BASE, architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=1024, intermediate_size=2816,
           num_hidden_layers=20, num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
           max_position_embeddings=256, tie_word_embeddings=False, torch_dtype="float32")
(d / "config.json").write_text(json.dumps(cfg, indent=2))
t = hf.family_tensors({"cfg": cfg, "arch": "LlamaForCausalLM"}, torch.Generator().manual_seed(1))
t = {k: v * 0.1 for k, v in t.items()}
hf.write_safetensors(d / "model.safetensors", t, "F32")
n = sum(v.numel() for v in t.values()); big = max(v.numel() for v in t.values())
print(f"base: {n / 1e6:.1f} M parameters, {4 * n / 2**30:.2f} GiB fp32; largest tensor {4 * big / 2**20:.0f} MiB")
PY
head -c 300000 docs/fsdp.md > "$work/text.txt"
"$bin" data prepare --source "$work/text.txt" --tokenizer byte --out "$work/ds" --val-fraction 0.1 >/dev/null
cat >"$work/deck.toml" <<DECK
[run]
threads = 1
[model]
seq_len = 32
[train]
max_steps = 1
micro_batch = 1
val_every = 0
[data]
dataset = "$work/ds"
tokenizer = "byte"
[lora]
rank = 16
alpha = 32.0
targets = ["all-linear"]
[checkpoint]
resume = "never"
init_from = "$work/base"
DECK
"${mpi[@]}" -np 2 "$bin" train "$work/deck.toml" --set run.out_dir="$work/run" >"$work/train.log" 2>&1 || { tail "$work/train.log"; exit 1; }
ck="$work/run/checkpoints/step_00000001.h5"
for np in 1 2; do
  "${mpi[@]}" -np $np "$bin" ckpt export --format hf --dtype fp32 "$ck" "$work/merged$np" >"$work/export$np.log" 2>&1 ||
    { cat "$work/export$np.log"; exit 1; }
  peak=$(sed -n 's/.*peak resident memory per rank \([0-9.]*\) MiB.*/\1/p' "$work/export$np.log")
  echo "merged export at $np rank(s): peak resident memory per rank $peak MiB"
done
du -sb "$work/base/model.safetensors" | awk '{printf "base file: %.0f MiB\n", $1 / 2^20}'
