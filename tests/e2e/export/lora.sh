#!/usr/bin/env bash
# LoRA with Hugging Face PEFT's semantics, against the independent PyTorch implementation
# (tests/python/peft_reference.py over hf_models.py's tiny random Hugging Face models):
#  1. a hub-style adapter (lora.init_from, B non-zero) on its base: `eval` equals the reference's
#     loss within 1e-6 (Llama 3.1 with a BF16 base; Qwen2 with q/k/v biases, rslora and the norms
#     as modules_to_save);
#  2. one full-batch AdamW step from it: the step's loss and the exported adapter equal the
#     reference's (1e-6 of each tensor's largest value), and the unstepped adapter does not;
#  3. 1, 2 and 4 ranks and every strategy give the same loss bits under train.reproducible; a
#     resume mid-run is exact; the checkpoint holds the adapters and the base's identity only;
#     ZeRO++ (qwZ, qgZ, hpZ) and DiLoCo (fragments, int8 wire) train adapters-only runs;
#  4. export --format peft -> lora.init_from -> export is byte-identical; the merged export
#     (--format hf) at 1 and 2 ranks is the same bytes, equals the reference merge and evaluates
#     to the adapter's loss within 1e-6; eval and generate on the base + --set lora.init_from;
#  5. train.freeze: the frozen tensors come out of training bit for bit, the others changed;
#  6. bad input: exit 2 on every rank naming the key, tensor or file, nothing written.
# Usage: lora.sh SHARDTRAIN PYTHON SOURCE_DIR MPIRUN [MPIRUN_FLAGS...]
set -euo pipefail
bin=$1 py=$2 src=$3 mpirun=$4
shift 4
. "$(dirname "$0")/lib.sh" lora "$@"

byte_data
reference_deck "$work/deck.toml"

echo "== 1-2. a hub adapter: eval and one optimizer step against the reference"
"$py" "$peft" random-adapter "$work/models/llama31" "$work/ad_llama31" --r 4 --alpha 8 --targets all-linear --seed 3 >/dev/null
"$py" "$peft" random-adapter "$work/models/qwen2" "$work/ad_qwen2" --r 8 --alpha 4 --rslora \
  --targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --modules-to-save norm --seed 4 >/dev/null
for f in llama31 qwen2; do
  base=(--set checkpoint.init_from="$work/models/$f" --set lora.init_from="$work/ad_$f")
  "${mpi[@]}" -np 2 "$bin" eval "$work/deck.toml" "${base[@]}" --set run.out_dir="$work/eval_$f" \
    --out "$work/eval_$f.json" >"$work/eval_$f.txt" 2>&1 || { cat "$work/eval_$f.txt"; fail "eval $f + adapter"; }
  want=$("$py" "$peft" loss "$work/models/$f" "$work/ad_$f" "$work/ds" 32)
  echo -n "$f eval: "
  "$py" "$hf" check-loss "$(eval_loss "$work/eval_$f.txt")" "$want" || fail "$f: eval of base + adapter differs from the reference"
  "${mpi[@]}" -np 2 "$bin" train "$work/deck.toml" "${base[@]}" --set run.out_dir="$work/step_$f" >"$work/step_$f.log" 2>&1 ||
    { tail -20 "$work/step_$f.log"; fail "one step of $f"; }
  "$bin" ckpt export --format peft "$work/step_$f/checkpoints/step_00000001.h5" "$work/stepped_$f" >/dev/null
  ref=$("$py" "$peft" step "$work/models/$f" "$work/ad_$f" "$work/ds" 32 --lr 2.5e-4 --weight-decay 0.1 --beta1 0.9 \
    --beta2 0.95 --eps 1e-4 --clip 1.0 --no-decay .bias,norm,ln_ "$work/ref_$f")
  echo -n "$f step loss: "
  "$py" "$hf" check-loss "$(losses "$work/step_$f/metrics.jsonl" | awk '{print $2}')" \
    "$(echo "$ref" | sed -n 's/^loss_before //p')" || fail "$f: the step's loss differs from the reference"
  "$py" "$peft" compare-adapters "$work/stepped_$f" "$work/ref_$f" || fail "$f: the stepped adapter differs from the reference"
  if "$py" "$peft" compare-adapters "$work/ad_$f" "$work/ref_$f" >/dev/null 2>&1; then
    fail "$f: the reference step did not move the adapter (the comparison could not fail)"
  fi
done

echo "== 3. ranks, strategies, resume: the same bits"
run_repro() {  # run_repro NAME NP STRATEGY [--set ...]
  local name=$1 np=$2 st=$3
  shift 3
  "${mpi[@]}" -np "$np" "$bin" train "$work/deck.toml" --set checkpoint.init_from="$work/models/qwen2" \
    --set parallel.strategy="$st" --set run.out_dir="$work/r_$name" "$@" >"$work/r_$name.log" 2>&1 ||
    { tail -20 "$work/r_$name.log"; fail "run $name"; }
  losses "$work/r_$name/metrics.jsonl" >"$work/l_$name"
}
repro=(--set train.reproducible=true --set train.max_steps=6 --set train.global_batch=8 --set train.micro_batch=2
       --set parallel.simulate_ranks_per_host=2 --set checkpoint.every_steps=3 --set lora.rank=4 --set lora.alpha=8.0
       --set 'lora.targets=["all-linear"]' --set 'lora.train_also=["model.norm.weight"]' --set lora.dropout=0.1)
run_repro np1 1 full_shard "${repro[@]}"
[ "$(wc -l <"$work/l_np1")" -eq 6 ] || fail "expected 6 losses"
for c in "2 full_shard" "4 full_shard" "4 shard_grad_op" "4 no_shard" "4 hybrid_shard" "4 hybrid_shard_zero2"; do
  set -- $c
  run_repro "np$1_$2" "$1" "$2" "${repro[@]}"
  cmp -s "$work/l_np1" "$work/l_np$1_$2" || { paste "$work/l_np1" "$work/l_np$1_$2"; fail "$1 ranks $2: losses differ from 1 rank"; }
done
echo "1, 2, 4 ranks and five strategies: the same 6 losses, bit for bit (lora.dropout 0.1)"
h5ls "$work/r_np1/checkpoints/step_00000006.h5/model" >"$work/ls.txt"
grep -q 'lora_A.weight' "$work/ls.txt" || fail "no adapters in the checkpoint"
grep -q '^model.norm.weight ' "$work/ls.txt" || fail "lora.train_also's model.norm.weight not in the checkpoint"
if grep -v 'lora_[AB].weight' "$work/ls.txt" | grep -vq '^model.norm.weight '; then
  cat "$work/ls.txt"; fail "the adapter checkpoint holds base tensors"
fi
h5dump -a /base "$work/r_np1/checkpoints/step_00000006.h5" | grep -q 'model.layers.1.mlp.up_proj.weight' ||
  fail "the checkpoint does not identify its base"
# Resume at step 3 at another world size and strategy: the last three losses, bit for bit.
rm "$work/r_np1/checkpoints/step_00000006.h5"
cp -r "$work/r_np1" "$work/r_resume"
echo "step_00000003.h5" >"$work/r_resume/checkpoints/latest"
"${mpi[@]}" -np 2 "$bin" train "$work/deck.toml" --set checkpoint.init_from="$work/models/qwen2" \
  --set parallel.strategy=hybrid_shard --set run.out_dir="$work/r_resume" --set checkpoint.resume=auto "${repro[@]}" \
  >"$work/r_resume.log" 2>&1 || { tail -20 "$work/r_resume.log"; fail "resume"; }
grep -q "resumed from" "$work/r_resume.log" || fail "did not resume"
tail -3 "$work/l_np1" >"$work/want3"
losses "$work/r_resume/metrics.jsonl" | tail -3 >"$work/got3"
cmp -s "$work/want3" "$work/got3" || { paste "$work/want3" "$work/got3"; fail "resume at step 3 is not exact"; }
echo "resume at step 3 (2 ranks, hybrid_shard): steps 4-6 bit for bit"
# ZeRO++ (int8 weight gathers and replica averages, hpZ) and DiLoCo (2 replicas of 2, 2
# fragments, an int8 outer wire) on an adapter run: they carry the trainable flats only (a frozen
# flat has no gradient, residual, outer copy or momentum), train, and checkpoint the adapters alone.
other=(--set train.max_steps=6 --set train.global_batch=8 --set train.micro_batch=2 --set parallel.simulate_ranks_per_host=2
       --set lora.rank=4 --set 'lora.targets=["all-linear"]' --set checkpoint.every_steps=6)
run_repro zpp 4 hybrid_shard "${other[@]}" --set fsdp.quantize_weights=true --set fsdp.quantize_grads=true \
  --set fsdp.quant_block=64 --set fsdp.quant_guard_every=2
run_repro zpp_hpz 4 full_shard "${other[@]}" --set fsdp.secondary_shards=true --set fsdp.quantize_weights=true
run_repro diloco 4 hybrid_shard "${other[@]}" --set parallel.replica_sync=diloco --set diloco.inner_steps=2 \
  --set diloco.fragments=2 --set diloco.outer_dtype=int8 --set fsdp.quant_block=64
for name in zpp zpp_hpz diloco; do
  [ "$(wc -l <"$work/l_$name")" -eq 6 ] || fail "$name: expected 6 losses"
  awk '{ if ($2 != $2 + 0 || $2 > 10 || $2 < 0.1) exit 1 }' "$work/l_$name" || { cat "$work/l_$name"; fail "$name: a loss is not finite"; }
  h5ls "$work/r_$name/checkpoints/step_00000006.h5/model" >"$work/ls_$name.txt"
  if grep -v 'lora_[AB].weight' "$work/ls_$name.txt" | grep -q .; then
    cat "$work/ls_$name.txt"; fail "$name: the adapter checkpoint holds base tensors"
  fi
done
grep -q "outer" "$work/r_diloco.log" || fail "diloco: no outer step reported"
echo "ZeRO++ (qwZ, qgZ, hpZ) and DiLoCo (2 fragments, int8 wire) on adapters: trained, adapters-only checkpoints"

echo "== 4. export: PEFT round trip and the merged model"
# ckpt import of a LoRA deck: an adapter checkpoint at step 0 on the given base.
"${mpi[@]}" -np 2 "$bin" ckpt import "$work/models/qwen2" "$work/rt.h5" --deck "$work/deck.toml" \
  --set lora.init_from="$work/stepped_qwen2" >"$work/rt.log" 2>&1 || { tail -20 "$work/rt.log"; fail "import an adapter"; }
"$bin" ckpt export --format peft "$work/rt.h5" "$work/rt_peft" >/dev/null
for file in adapter_config.json adapter_model.safetensors; do
  cmp "$work/stepped_qwen2/$file" "$work/rt_peft/$file" || fail "export -> lora.init_from -> export: $file differs"
done
echo "export --format peft -> ckpt import --set lora.init_from -> export: byte-identical"
ck="$work/step_qwen2/checkpoints/step_00000001.h5"
"$bin" ckpt export --format hf --dtype fp32 "$ck" "$work/merged1" >"$work/merged1.log" || { cat "$work/merged1.log"; fail "merged export"; }
"${mpi[@]}" -np 2 "$bin" ckpt export --format hf --dtype fp32 "$ck" "$work/merged2" >"$work/merged2.log" 2>&1 ||
  { cat "$work/merged2.log"; fail "merged export at 2 ranks"; }
"$py" "$hf" same-tensors "$work/merged1" "$work/merged2" || fail "the merged export differs between 1 and 2 ranks"
"$py" "$peft" merge "$work/models/qwen2" "$work/stepped_qwen2" "$work/ref_merged" >/dev/null
"$py" - "$hf" "$work/ref_merged" "$work/merged2" <<'PY' || fail "the merged export differs from the reference merge"
# Ours rounds W + s B A once from fp64; the reference computes B @ A in fp32: 1e-6 of each tensor.
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("hf", sys.argv[1]); hf = importlib.util.module_from_spec(spec); spec.loader.exec_module(hf)
_, want = hf.read_model_dir(sys.argv[2])
_, got = hf.read_model_dir(sys.argv[3])
assert sorted(want) == sorted(got), "tensor names differ"
worst, changed = 0.0, 0
for n in want:
    w, g = hf.to_tensor(*want[n]), hf.to_tensor(*got[n])
    assert w.shape == g.shape, n
    worst = max(worst, float((w - g).abs().max() / w.abs().max()))
print(f"merged export vs the reference merge: worst relative difference {worst:.2g}")
sys.exit(0 if worst <= 1e-6 else 1)
PY
# eval with the deck it was trained with (its base and [lora] keys), at the adapter checkpoint.
"${mpi[@]}" -np 2 "$bin" eval "$work/deck.toml" --set checkpoint.init_from="$work/models/qwen2" \
  --set lora.init_from="$work/ad_qwen2" --set checkpoint.resume="$ck" --set run.out_dir="$work/ev_ad" \
  --out "$work/ev_ad.json" >"$work/ev_ad.txt" 2>&1 || { cat "$work/ev_ad.txt"; fail "eval of the adapter checkpoint"; }
want=$("$py" "$hf" loss "$work/merged2" "$work/ds" 32)
echo -n "merged export vs the adapter checkpoint's eval: "
"$py" "$hf" check-loss "$(eval_loss "$work/ev_ad.txt")" "$want" || fail "the merged model's loss differs from the adapter's"
"$bin" generate "$ck" --prompt "The " --max-new-tokens 8 --temperature 0 --tokenizer byte >"$work/gen_ad.txt" 2>"$work/gen_ad.err" ||
  { cat "$work/gen_ad.err"; fail "generate on the adapter checkpoint"; }
"${mpi[@]}" -np 2 "$bin" ckpt import "$work/models/qwen2" "$work/qwen2.h5" >/dev/null 2>&1 || fail "import the base"
"$bin" generate "$work/qwen2.h5" --set lora.init_from="$work/stepped_qwen2" --prompt "The " --max-new-tokens 8 \
  --temperature 0 --tokenizer byte >"$work/gen_base.txt" 2>"$work/gen_base.err" || { cat "$work/gen_base.err"; fail "generate on base + adapter"; }
cmp -s "$work/gen_ad.txt" "$work/gen_base.txt" || fail "generate: the adapter checkpoint and base + lora.init_from disagree"
echo "generate: adapter checkpoint = base checkpoint + --set lora.init_from (greedy, 8 tokens)"

echo "== 5. train.freeze: frozen tensors bit for bit"
"${mpi[@]}" -np 2 "$bin" train "$work/deck.toml" --set checkpoint.init_from="$work/models/qwen2" --set train.max_steps=3 \
  --set 'train.freeze=["model.embed_tokens.*", "model.layers.0.*"]' --set run.out_dir="$work/fz" >"$work/fz.log" 2>&1 ||
  { tail -20 "$work/fz.log"; fail "train.freeze run"; }
"$bin" ckpt export "$work/fz/checkpoints/step_00000003.h5" "$work/fz.safetensors" >/dev/null
"$py" - "$hf" "$work/models/qwen2" "$work/fz.safetensors" <<'PY' || fail "train.freeze: frozen tensors changed or trained ones did not"
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("hf", sys.argv[1]); hf = importlib.util.module_from_spec(spec); spec.loader.exec_module(hf)
_, src = hf.read_model_dir(sys.argv[2])
out = hf.read_safetensors_raw(sys.argv[3])
frozen = [n for n in out if n.startswith("model.embed_tokens.") or n.startswith("model.layers.0.")]
trained = [n for n in out if n not in frozen]
assert frozen and trained
for n in frozen:
    assert torch.equal(hf.to_tensor(*out[n]), hf.to_tensor(*src[n])), n
for n in trained:
    assert not torch.equal(hf.to_tensor(*out[n]), hf.to_tensor(*src[n])), n + " did not train"
print(f"train.freeze: {len(frozen)} frozen tensors bit for bit, {len(trained)} trained ones changed")
PY

echo "== 6. bad input: exit 2, named, nothing written"
t=(--set checkpoint.init_from="$work/models/qwen2" --set lora.rank=4)
bad() {  # bad NAME PATTERN ARGS... : train exits 2 on both ranks naming PATTERN, no run directory
  local name=$1 pattern=$2
  shift 2
  expect_exit2 "$work/bad_$name.log" "$pattern" "${mpi[@]}" -np 2 "$bin" train "$work/deck.toml" --set run.out_dir="$work/bad_$name" "$@"
  ! ls "$work/bad_$name"/checkpoints/*.h5* "$work/bad_$name"/metrics.jsonl >/dev/null 2>&1 || fail "$name: a checkpoint or metrics written"
}
# What trains: deck check refuses it as train does (the same rules, applied to the model on meta).
checked() {  # checked NAME PATTERN ARGS... : deck check exits 2 naming PATTERN, then bad (train)
  local name=$1 pattern=$2
  shift 2
  expect_exit2 "$work/bad_${name}_check.log" "$pattern" "$bin" deck check "$work/deck.toml" "$@"
  bad "$name" "$pattern" "$@"
}
checked target 'lora.targets: "qproj" matches no linear layer.*q_proj, k_proj' "${t[@]}" --set 'lora.targets=["qproj"]'
checked rank 'lora.rank = 64 is above min(in, out) = 32' "${t[@]}" --set lora.rank=64
checked freeze 'train.freeze: "model.layerz.\*" matches no parameter' --set checkpoint.init_from="$work/models/qwen2" \
  --set 'train.freeze=["model.layerz.*"]'
checked freeze_all 'nothing would train' --set 'train.freeze=["*"]'
checked train_also 'lora.train_also .*lora.rank = 0' --set 'lora.train_also=["norm"]'
checked also_none 'lora.train_also: "nrm" matches no parameter' "${t[@]}" --set 'lora.train_also=["nrm"]'
# An adapter that does not fit: another rank in the deck, a shape, a tensor for a layer not adapted.
bad adapter_rank 'lora.rank = 4 contradicts r = 8' --set checkpoint.init_from="$work/models/qwen2" \
  --set lora.init_from="$work/ad_qwen2" --set lora.rank=4
"$py" "$peft" random-adapter "$work/models/llama2" "$work/ad_llama2" --r 8 --alpha 4 --targets q_proj,v_proj --seed 1 >/dev/null
bad adapter_shape "PEFT adapter .*has shape" --set checkpoint.init_from="$work/models/qwen2" --set lora.init_from="$work/ad_llama2"
bad adapter_extra "PEFT adapter .*fits no parameter" --set checkpoint.init_from="$work/models/llama2" \
  --set lora.init_from="$work/ad_llama2" --set 'lora.targets=["q_proj"]'
mkdir "$work/ad_dora" && cp "$work/ad_llama2"/* "$work/ad_dora/"
sed -i 's/"use_dora": false/"use_dora": true/' "$work/ad_dora/adapter_config.json"
bad adapter_dora "use_dora is true: DoRA" --set checkpoint.init_from="$work/models/llama2" --set lora.init_from="$work/ad_dora"
# Another base: a resume and a merged export on a changed base are refused, naming a tensor.
cp -r "$work/models/qwen2" "$work/other"
"${mpi[@]}" -np 2 "$bin" train "$work/deck.toml" --set checkpoint.init_from="$work/other" --set lora.rank=4 \
  --set run.out_dir="$work/ob" --set checkpoint.every_steps=1 >"$work/ob.log" 2>&1 || { tail "$work/ob.log"; fail "run on the copied base"; }
"$py" - "$hf" "$work/other" <<'PY'
import importlib.util, sys, pathlib
spec = importlib.util.spec_from_file_location("hf", sys.argv[1]); hf = importlib.util.module_from_spec(spec); spec.loader.exec_module(hf)
for f in pathlib.Path(sys.argv[2]).glob("*.safetensors"):
    raw = hf.read_safetensors_raw(f)
    if "model.layers.1.mlp.up_proj.weight" not in raw:
        continue
    t = {n: hf.to_tensor(*v) for n, v in raw.items()}
    t["model.layers.1.mlp.up_proj.weight"] = t["model.layers.1.mlp.up_proj.weight"] * 1.5
    hf.write_safetensors(f, t, next(iter(raw.values()))[0])
PY
expect_exit2 "$work/bad_base.log" "model.layers.1.mlp.up_proj.weight' holds other values" "${mpi[@]}" -np 2 "$bin" train \
  "$work/deck.toml" --set checkpoint.init_from="$work/other" --set lora.rank=4 --set run.out_dir="$work/ob" \
  --set checkpoint.resume=auto --set train.max_steps=2
expect_exit2 "$work/bad_export.log" "into another base" "${mpi[@]}" -np 2 "$bin" ckpt export --format hf \
  "$work/ob/checkpoints/step_00000001.h5" "$work/merged_bad"
[ ! -e "$work/merged_bad" ] || fail "the refused merged export left a directory"
expect_exit2 "$work/bad_peft.log" "holds a whole model, not a LoRA adapter" "$bin" ckpt export --format peft "$work/qwen2.h5" "$work/peft_bad"
[ ! -e "$work/peft_bad" ] || fail "the refused PEFT export left a directory"
echo "bad input: every case exit 2, named, nothing written"
echo "OK"
