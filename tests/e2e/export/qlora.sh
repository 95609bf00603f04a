#!/usr/bin/env bash
# QLoRA (lora.base_dtype = "nf4") against the independent PyTorch implementation
# (tests/python/peft_reference.py --base-nf4 over hf_models.py's tiny random Hugging Face models,
# its NF4 from tests/python/nf4_reference.py with bitsandbytes' semantics):
#  1. a hub adapter on an NF4 base (blocks of 64, 32 and 128, with and without double
#     quantization): `eval` equals the reference's loss within 1e-6 (fp32 compute);
#  2. one full-batch AdamW step from it: the step's loss and the stepped adapter equal the
#     reference's, which differs from the bf16-base step (the NF4 base is what was trained on);
#  3. 1, 2 and 4 ranks and the sharded strategies give the same loss bits under train.reproducible;
#  4. loading at 2 ranks: each byte range of the weights is read once, by one rank (pread64
#     counted by strace), no rank reads the whole model (or 90% of it);
#  5. the frozen base's all-gather moves NF4 codes: the engine's byte counters of an NF4 run over
#     a bf16-base run of the same deck (the adapters' traffic is the same in both);
#  6. bad input: exit 2 naming the key, nothing written.
# Usage: qlora.sh SHARDTRAIN PYTHON SOURCE_DIR MPIRUN [MPIRUN_FLAGS...]
set -euo pipefail
bin=$1 py=$2 src=$3 mpirun=$4
shift 4
. "$(dirname "$0")/lib.sh" qlora "$@"

byte_data
reference_deck "$work/deck.toml" '[lora]' 'base_dtype = "nf4"'
m="$work/models/llama31"
"$py" "$peft" random-adapter "$m" "$work/ad" --r 4 --alpha 8 --targets all-linear --seed 3 >/dev/null

echo "== 1. eval of base + adapter in NF4 against the reference"
for c in "64 false" "64 true" "32 true" "128 false"; do
  set -- $c
  dq=(); [ "$2" = true ] && dq=(--nf4-double-quant)
  "${mpi[@]}" -np 2 "$bin" eval "$work/deck.toml" --set checkpoint.init_from="$m" --set lora.init_from="$work/ad" \
    --set lora.nf4_block="$1" --set lora.nf4_double_quant="$2" --set run.out_dir="$work/eval_$1_$2" \
    --out "$work/eval_$1_$2.json" >"$work/eval_$1_$2.txt" 2>&1 || { cat "$work/eval_$1_$2.txt"; fail "eval block $1 dq $2"; }
  want=$("$py" "$peft" loss "$m" "$work/ad" "$work/ds" 32 --base-nf4 "$1" "${dq[@]}")
  echo -n "block $1, double quant $2: "
  "$py" "$hf" check-loss "$(eval_loss "$work/eval_$1_$2.txt")" "$want" || fail "NF4 block $1 dq $2: eval differs from the reference"
done
full=$("$py" "$peft" loss "$m" "$work/ad" "$work/ds" 32)
if "$py" "$hf" check-loss "$(eval_loss "$work/eval_64_true.txt")" "$full" >/dev/null; then
  fail "the NF4 eval equals the full-precision base's loss: the comparison could not fail"
fi

echo "== 2. one optimizer step on the NF4 base against the reference"
"${mpi[@]}" -np 2 "$bin" train "$work/deck.toml" --set checkpoint.init_from="$m" --set lora.init_from="$work/ad" \
  --set lora.nf4_double_quant=true --set run.out_dir="$work/step" >"$work/step.log" 2>&1 || { tail -20 "$work/step.log"; fail "one step"; }
"$bin" ckpt export --format peft "$work/step/checkpoints/step_00000001.h5" "$work/stepped" >/dev/null
ref=$("$py" "$peft" step "$m" "$work/ad" "$work/ds" 32 --lr 2.5e-4 --weight-decay 0.1 --beta1 0.9 --beta2 0.95 \
  --eps 1e-4 --clip 1.0 --no-decay .bias,norm,ln_ --base-nf4 64 --nf4-double-quant "$work/ref")
echo -n "step loss: "
"$py" "$hf" check-loss "$(losses "$work/step/metrics.jsonl" | awk '{print $2}')" "$(echo "$ref" | sed -n 's/^loss_before //p')" ||
  fail "the step's loss differs from the reference"
"$py" "$peft" compare-adapters "$work/stepped" "$work/ref" || fail "the stepped adapter differs from the reference"
"$py" "$peft" step "$m" "$work/ad" "$work/ds" 32 --lr 2.5e-4 --weight-decay 0.1 --beta1 0.9 --beta2 0.95 \
  --eps 1e-4 --clip 1.0 --no-decay .bias,norm,ln_ "$work/ref_full" >/dev/null
if "$py" "$peft" compare-adapters "$work/stepped" "$work/ref_full" >/dev/null 2>&1; then
  fail "the NF4 step equals the full-precision base's step: the comparison could not fail"
fi
h5dump -a /base "$work/step/checkpoints/step_00000001.h5" | grep -q 'nf4 linear weights (block 64, double-quantized)' ||
  fail "the checkpoint's base identity does not say the base was NF4"

echo "== 3. ranks and strategies: the same bits"
run_repro() {  # run_repro NAME NP STRATEGY [--set ...]
  local name=$1 np=$2 st=$3
  shift 3
  "${mpi[@]}" -np "$np" "$bin" train "$work/deck.toml" --set checkpoint.init_from="$work/models/qwen2" \
    --set parallel.strategy="$st" --set run.out_dir="$work/r_$name" "$@" >"$work/r_$name.log" 2>&1 ||
    { tail -20 "$work/r_$name.log"; fail "run $name"; }
  losses "$work/r_$name/metrics.jsonl" >"$work/l_$name"
}
repro=(--set train.reproducible=true --set train.max_steps=4 --set train.global_batch=8 --set train.micro_batch=2
       --set parallel.simulate_ranks_per_host=2 --set lora.rank=4 --set lora.alpha=8.0 --set 'lora.targets=["all-linear"]'
       --set lora.nf4_double_quant=true --set lora.nf4_block=32)
run_repro np1 1 full_shard "${repro[@]}"
[ "$(wc -l <"$work/l_np1")" -eq 4 ] || fail "expected 4 losses"
for c in "2 full_shard" "4 full_shard" "4 shard_grad_op" "4 no_shard" "4 hybrid_shard"; do
  set -- $c
  run_repro "np$1_$2" "$1" "$2" "${repro[@]}"
  cmp -s "$work/l_np1" "$work/l_np$1_$2" || { paste "$work/l_np1" "$work/l_np$1_$2"; fail "$1 ranks $2: losses differ from 1 rank"; }
done
echo "1, 2, 4 ranks and four strategies: the same 4 losses, bit for bit"

echo "== 4. loading at 2 ranks reads each byte range once"
if strace -f -qq -e trace=none true 2>/dev/null; then
  "${mpi[@]}" -np 2 strace -f -qq -e trace=openat,pread64 -o "$work/trace" -ff "$bin" eval "$work/deck.toml" \
    --set checkpoint.init_from="$m" --set lora.init_from="$work/ad" --set lora.nf4_double_quant=true --set run.out_dir="$work/trace_run" \
    --out "$work/trace.json" >"$work/trace.log" 2>&1 || { cat "$work/trace.log"; fail "traced eval"; }
  "$py" - "$work" "$m" <<'PY' || fail "byte ranges"
import glob, json, os, re, struct, sys
work, model = sys.argv[1], sys.argv[2]
files = {}  # path -> (data start, tensor data bytes)
for st in glob.glob(model + "/*.safetensors"):
    with open(st, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    total = sum(e - b for v in header.values() if isinstance(v, dict) and "data_offsets" in v for b, e in [v["data_offsets"]])
    files[os.path.realpath(st)] = (8 + n, total)
per_proc = {}  # process -> {file: [(begin, end)]}
for path in glob.glob(work + "/trace.*"):
    fds, got = {}, {}
    for line in open(path):
        o = re.match(r'openat\(AT_FDCWD, "([^"]*)".*\) = (\d+)', line)
        if o:
            fds[int(o.group(2))] = os.path.realpath(o.group(1))
            continue
        p = re.match(r'pread64\((\d+), .*, (\d+), (\d+)\) = (\d+)', line)
        if p:
            f = fds.get(int(p.group(1)))
            if f in files and int(p.group(3)) >= files[f][0]:
                got.setdefault(f, []).append((int(p.group(3)), int(p.group(3)) + int(p.group(4))))
    if got:
        per_proc[path] = got
if len(per_proc) != 2:
    sys.exit(f"FAIL: {len(per_proc)} processes read the weights, expected 2")
all_total = sum(t for _, t in files.values())
for f, (start, total) in files.items():
    spans = sorted(r for got in per_proc.values() for r in got.get(f, []))
    for (b0, e0), (b1, e1) in zip(spans, spans[1:]):
        if b1 < e0:
            sys.exit(f"FAIL: {f}: bytes [{b1}, {min(e0, e1)}) read twice")
    read = sum(e - b for b, e in spans)
    if read != total:
        sys.exit(f"FAIL: {f}: {read} bytes of tensor data read, it holds {total}")
per = [sum(e - b for v in got.values() for b, e in v) for got in per_proc.values()]
# The split is uneven on this tiny model (its 4096-value matrices each start a block of 16384
# values of the NF4 layout), but no rank reads everything.
if max(per) >= 0.9 * all_total or min(per) == 0:
    sys.exit(f"FAIL: the ranks read {per} of {all_total} bytes")
print(f"2 ranks read {per} bytes of the {all_total} bytes of weights in {len(files)} files: each range once, none twice")
PY
else
  echo "strace cannot trace here: the byte-range count is skipped"
fi

echo "== 5. the base's all-gather moves NF4 codes"
bytes_of() { sed -n 's/.*"intra_node_bytes":\([0-9]*\).*/\1/p' "$1/metrics.jsonl" | tail -1; }
gather=(--set checkpoint.init_from="$m" --set lora.rank=4 --set 'lora.targets=["q_proj"]' --set train.max_steps=2
        --set train.global_batch=16 --set train.micro_batch=8 --set fsdp.param_dtype=bf16 --set fsdp.reduce_dtype=bf16)
run_bytes() {  # run_bytes NAME [--set ...]
  local name=$1
  shift
  "${mpi[@]}" -np 2 "$bin" train "$work/deck.toml" "${gather[@]}" --set run.out_dir="$work/b_$name" "$@" >"$work/b_$name.log" 2>&1 ||
    { tail -20 "$work/b_$name.log"; fail "run $name"; }
}
run_bytes bf16 --set lora.base_dtype=param_dtype
run_bytes nf4 --set lora.nf4_double_quant=true
"$py" - "$(bytes_of "$work/b_bf16")" "$(bytes_of "$work/b_nf4")" <<'PY' || fail "NF4 gather bytes"
import sys
bf16, nf4 = int(sys.argv[1]), int(sys.argv[2])
print(f"bytes one rank sent in two steps: bf16 base {bf16}, NF4 base {nf4} ({nf4 / bf16:.3f})")
if not nf4 < 0.8 * bf16:
    sys.exit("FAIL: the NF4 run does not send fewer bytes")
PY

echo "== 6. bad input: exit 2 naming the key"
bad() {  # bad NAME PATTERN ARGS...
  local name=$1 pattern=$2
  shift 2
  expect_exit2 "$work/bad_$name.log" "$pattern" "${mpi[@]}" -np 2 "$bin" train "$work/deck.toml" \
    --set checkpoint.init_from="$m" --set run.out_dir="$work/bad_$name" "$@"
  ! ls "$work/bad_$name"/checkpoints/*.h5* "$work/bad_$name"/metrics.jsonl >/dev/null 2>&1 || fail "$name: something written"
}
bad no_lora 'lora.base_dtype = "nf4" stores a LoRA base' --set 'train.freeze=["*layers*"]'
bad block 'lora.nf4_block = 48 is not a block size' --set lora.rank=4 --set lora.nf4_block=48
bad block_big 'lora.nf4_block' --set lora.rank=4 --set lora.nf4_block=8192
bad dq_alone 'lora.nf4_double_quant is for lora.base_dtype = "nf4"' --set lora.rank=4 --set lora.base_dtype=param_dtype \
  --set lora.nf4_double_quant=true
bad dtype 'lora.base_dtype' --set lora.rank=4 --set lora.base_dtype=int4
echo "OK"
