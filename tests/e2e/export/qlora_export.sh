#!/usr/bin/env bash
# QLoRA (lora.base_dtype = "nf4", double-quantized) out of the program, on hf_models.py's Qwen2
# (F32 base, fsdp.param_dtype fp32; some of the blocks' linear layers adapted, the others NF4 only):
#  a. the merged export (--format hf --dtype fp32) is the same bytes at 1, 2 and 3 ranks (3: row
#     ranges that start inside an NF4 block and inside the statistics' blocks of 256);
#  b. it equals, bit for bit, the reference merge (tests/python/peft_reference.py merge
#     --base-nf4 --nf4-double-quant --delta-fp64: every linear weight of the blocks through
#     nf4_reference.py's bitsandbytes round trip, then W + s B A in fp64 in shardtrain's order), and
#     PEFT's fp32 merge within 1e-6 of each tensor's largest value;
#  c. the merged directory's loss (hf_models.py) equals `eval` of the adapter checkpoint within 1e-6;
#  d. the export says the base was NF4 dequantized: on stdout and in its files' __metadata__;
#  e. `eval` of the adapter checkpoint is the same bits at 1 and 2 ranks, equals the reference's
#     loss of the NF4 base + the exported adapter within 1e-6 (and not the full-precision base's),
#     and the training run's validation loss at that step within 1e-6 (the validator's reduction
#     is not eval's: not the same bits);
#  g. `generate` on the adapter checkpoint gives the merged model's greedy tokens;
#  f. the checkpoint on another base of the same shape (eval, merged export) is exit 2 naming a tensor.
# Usage: qlora_export.sh SHARDTRAIN PYTHON SOURCE_DIR MPIRUN [MPIRUN_FLAGS...]
set -euo pipefail
bin=$1 py=$2 src=$3 mpirun=$4
shift 4
. "$(dirname "$0")/lib.sh" qlora-export "$@"

byte_data
cp -r "$work/models/qwen2" "$work/base"  # the run's base; changed at the end (f)
cat >"$work/deck.toml" <<EOF
[run]
seed = 5
threads = 1
[model]
seq_len = 32
[fsdp]
param_dtype = "fp32"
[optimizer]
name = "adamw"
lr = 1e-2
[lr]
schedule = "constant"
warmup_steps = 0
[train]
max_steps = 2
global_batch = 16
micro_batch = 8
val_every = 2
val_batches = 4
[lora]
rank = 4
alpha = 8.0
targets = ["q_proj", "v_proj", "up_proj", "down_proj"]
base_dtype = "nf4"
nf4_block = 64
nf4_double_quant = true
[data]
dataset = "$work/ds"
tokenizer = "byte"
[log]
every = 1
peak_tflops = 1.0
[checkpoint]
resume = "never"
every_steps = 2
init_from = "$work/base"
EOF

echo "== train (2 ranks), eval of its checkpoint = its validation loss (e)"
"${mpi[@]}" -np 2 "$bin" train "$work/deck.toml" --set run.out_dir="$work/run" >"$work/run.log" 2>&1 ||
  { tail -20 "$work/run.log"; fail "QLoRA training run"; }
ck="$work/run/checkpoints/step_00000002.h5"
[ -f "$ck" ] || fail "no checkpoint at step 2"
val=$("$py" -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r.get("step") == 2 and "val_loss" in r: print(repr(float(r["val_loss"])))' "$work/run/metrics.jsonl" | tail -1)
[ -n "$val" ] || fail "no validation loss at step 2 in metrics.jsonl"
for np in 1 2; do
  "${mpi[@]}" -np $np "$bin" eval "$work/deck.toml" --set checkpoint.resume="$ck" --set run.out_dir="$work/ev$np" \
    >"$work/ev$np.txt" 2>&1 || { cat "$work/ev$np.txt"; fail "eval of the QLoRA checkpoint at $np ranks"; }
done
got=$(eval_loss "$work/ev1.txt")
[ "$got" = "$(eval_loss "$work/ev2.txt")" ] || fail "eval of the QLoRA checkpoint: $got at 1 rank, $(eval_loss "$work/ev2.txt") at 2"
# The run's validator sums per-micro-batch mean losses over the ranks, eval per-window sums in
# window order (docs/reproducibility.md): the same model gives the same loss to ~1e-7, not the same bits.
echo -n "eval of the checkpoint ($got, 1 and 2 ranks the same bits) vs the run's validation loss ($val): "
"$py" "$hf" check-loss "$got" "$val" || fail "eval of the QLoRA checkpoint differs from the run's validation loss"
# The model eval builds from the checkpoint is the reference's NF4 base + the adapter (within 1e-6:
# the two sum x W + s (x A) B in other orders), and not the full-precision base + the adapter.
"$bin" ckpt export --format peft "$ck" "$work/peft" >/dev/null
ref=$("$py" "$peft" loss "$work/base" "$work/peft" "$work/ds" 32 --base-nf4 64 --nf4-double-quant)
echo -n "eval of the checkpoint vs the reference's NF4 base + adapter: "
"$py" "$hf" check-loss "$got" "$ref" || fail "eval of the QLoRA checkpoint differs from the reference's NF4 model"
full=$("$py" "$peft" loss "$work/base" "$work/peft" "$work/ds" 32)
if "$py" "$hf" check-loss "$got" "$full" >/dev/null; then
  fail "eval of the QLoRA checkpoint equals the full-precision base + adapter's loss ($full): the check could not fail"
fi

echo "== merged export at 1, 2, 3 ranks (a, d)"
for np in 1 2 3; do
  "${mpi[@]}" -np $np "$bin" ckpt export --format hf --dtype fp32 "$ck" "$work/merged$np" >"$work/merged$np.log" 2>&1 ||
    { cat "$work/merged$np.log"; fail "merged export at $np ranks"; }
  grep -q '^# merged into the NF4 base dequantized (block 64, double-quantized): the merged model is not the full-precision base + adapter$' \
    "$work/merged$np.log" || { cat "$work/merged$np.log"; fail "the export at $np ranks does not say the base was NF4"; }
done
for np in 2 3; do
  for f in "$work"/merged1/*.safetensors; do
    cmp "$f" "$work/merged$np/$(basename "$f")" || fail "the merged export at $np ranks differs from 1 rank: $(basename "$f")"
  done
done
"$py" - "$work/merged1" <<'PY' || fail "the merged files' __metadata__ does not say the base was NF4"
import json, pathlib, struct, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.safetensors")):
    raw = f.read_bytes()
    meta = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])["__metadata__"]
    assert meta.get("lora_merge", "").startswith("merged into the NF4 base dequantized (block 64, double-quantized)"), (f, meta)
PY
echo "merged export: the same bytes at 1, 2 and 3 ranks; the NF4 notice on stdout and in __metadata__"

echo "== against the reference merge (b) and the adapter's loss (c)"
"$py" "$peft" merge "$work/base" "$work/peft" "$work/ref_exact" --base-nf4 64 --nf4-double-quant --delta-fp64 >/dev/null
"$py" "$hf" same-tensors "$work/ref_exact" "$work/merged1" || fail "the merged export differs from the reference NF4 merge"
"$py" "$peft" merge "$work/base" "$work/peft" "$work/ref_peft" --base-nf4 64 --nf4-double-quant >/dev/null
"$py" - "$hf" "$work/ref_peft" "$work/merged1" "$work/models/qwen2" <<'PY' || fail "the merged export vs PEFT's fp32 merge"
# PEFT's merge computes B @ A in fp32 and adds it (two roundings): 1e-6 of each tensor's largest value.
# And the NF4 round trip changed every linear weight of the blocks (not a merge of the plain base).
import importlib.util, re, sys, torch
spec = importlib.util.spec_from_file_location("hf", sys.argv[1]); hf = importlib.util.module_from_spec(spec); spec.loader.exec_module(hf)
_, want = hf.read_model_dir(sys.argv[2])
_, got = hf.read_model_dir(sys.argv[3])
_, plain = hf.read_model_dir(sys.argv[4])
worst, rounded = 0.0, 0
for n in want:
    w, g, p = hf.to_tensor(*want[n]), hf.to_tensor(*got[n]), hf.to_tensor(*plain[n])
    worst = max(worst, float((w - g).abs().max() / w.abs().max()))
    if re.match(r"model\.layers\.\d+\..*_proj\.weight$", n):
        assert not torch.equal(g, p), n + " is not the NF4 round trip of the base"
        rounded += 1
print(f"vs PEFT's fp32 merge: worst relative difference {worst:.2g}; {rounded} linear weights through NF4")
sys.exit(0 if worst <= 1e-6 and rounded == 14 else 1)
PY
want=$("$py" "$hf" loss "$work/merged1" "$work/ds" 32)
echo -n "the merged model's loss vs eval of the QLoRA checkpoint: "
"$py" "$hf" check-loss "$(eval_loss "$work/ev2.txt")" "$want" || fail "the merged model's loss differs from the adapter's"

# generate on the QLoRA checkpoint (its recorded spec: the NF4 base) = on the merged model, greedy.
"$bin" generate "$ck" --prompt "The " --max-new-tokens 8 --temperature 0 --tokenizer byte >"$work/gen_q.txt" 2>"$work/gen_q.err" ||
  { cat "$work/gen_q.err"; fail "generate on the QLoRA checkpoint"; }
"$bin" ckpt import "$work/merged1" "$work/merged.h5" >/dev/null 2>&1 || fail "import the merged model"
"$bin" generate "$work/merged.h5" --prompt "The " --max-new-tokens 8 --temperature 0 --tokenizer byte >"$work/gen_m.txt" \
  2>"$work/gen_m.err" || { cat "$work/gen_m.err"; fail "generate on the merged model"; }
cmp -s "$work/gen_q.txt" "$work/gen_m.txt" || { cat "$work/gen_q.txt" "$work/gen_m.txt"; fail "generate: the QLoRA checkpoint and its merged model disagree"; }
echo "generate: the QLoRA checkpoint = its merged model (greedy, 8 tokens)"

echo "== another base of the same shape (f)"
cp -r "$work/models/qwen2" "$work/other"
"$py" - "$hf" "$work/other" <<'PY'
import importlib.util, sys, pathlib
spec = importlib.util.spec_from_file_location("hf", sys.argv[1]); hf = importlib.util.module_from_spec(spec); spec.loader.exec_module(hf)
for f in pathlib.Path(sys.argv[2]).glob("*.safetensors"):
    raw = hf.read_safetensors_raw(f)
    if "model.layers.1.mlp.gate_proj.weight" in raw:
        t = {n: hf.to_tensor(*v) for n, v in raw.items()}
        t["model.layers.1.mlp.gate_proj.weight"] = t["model.layers.1.mlp.gate_proj.weight"] * 1.5
        hf.write_safetensors(f, t, next(iter(raw.values()))[0])
PY
expect_exit2 "$work/bad_eval.log" "model.layers.1.mlp.gate_proj.weight' holds other values" "${mpi[@]}" -np 2 "$bin" eval \
  "$work/deck.toml" --set checkpoint.resume="$ck" --set checkpoint.init_from="$work/other" --set run.out_dir="$work/bad_eval"
# The merged export reads the base its checkpoint's deck names: that directory, changed the same way.
cp "$work/other"/*.safetensors "$work/base/"
expect_exit2 "$work/bad_export.log" "model.layers.1.mlp.gate_proj.weight' holds other values" "${mpi[@]}" -np 2 "$bin" \
  ckpt export --format hf "$ck" "$work/merged_bad"
[ ! -e "$work/merged_bad" ] || fail "the refused merged export left a directory"
echo "another base: eval and the merged export exit 2 naming the tensor"
echo "OK"
