#!/usr/bin/env bash
# Instruction rows trained whole and apart (data.packing, issue 45) against an independent
# reference that runs every row alone (tests/python/packing_reference.py: Hugging Face's
# semantics, each row its own batch of one, positions from 0, cut to model.seq_len tokens):
#  1. 42 JSONL rows of 5..32 byte tokens and two longer ones (45 and 77), a blank line among them,
#     through `data prepare --chat-format plain` (all in train): a version-3 dataset whose rows the
#     reference reads;
#  2. `eval` of a tiny random Llama 2 (tests/python/hf_models.py, imported with `ckpt import`),
#     packed and padded, at 1 and 2 ranks: the reference's loss within 1e-6 (relative), the same
#     counted targets, items = the first-fit-decreasing window count / the row count, 1 and 2 ranks
#     the same bits; the two overlong rows count on their first 32 tokens; and stream with
#     data.document_mask against the stream's windows with each row's piece computed alone;
#  3. one plain SGD step (no momentum, decay or clipping) on every row as one global batch
#     (padded at 1 rank in 2 micro-batches, packed at 2 ranks): the Llama's parameters, a PEFT
#     adapter on it (lora.init_from, the adapters only) and a GPT-2's parameters (random weights
#     written by the reference, checkpoint.init_from): the step's loss within 1e-6 and every
#     exported tensor within 1e-5 of max|want| and 1e-2 of the step's move; packed is the default
#     for a dataset with a mask and rows;
#  4. bad input: data.packing = "packed" on a version-2 dataset (no rows; "padded" on a version-1
#     one, deck check only), and data.overlong = "error" with an overlong row: `deck check` and
#     `train` both exit 2, naming data.packing / the row's rows.jsonl:LINE; training writes nothing.
# The models' weights are large (std 0.15-0.5, not a default init) so that attention depends on
# the context: a row that saw another row's tokens, or positions that did not restart, would move
# the loss far beyond 1e-6. Usage: packing.sh SHARDTRAIN PYTHON SOURCE_DIR MPIRUN [MPIRUN_FLAGS...]
set -euo pipefail
bin=$1 py=$2 src=$3 mpirun=$4
shift 4
. "$(dirname "$0")/lib.sh" packing "$@"
ref="$src/tests/python/packing_reference.py"
seq=32
lr=0.1
t0=$SECONDS
# One process without mpirun (an MPI singleton), or NP ranks under mpirun.
launch() {
  local np=$1
  shift
  if [ "$np" -eq 1 ]; then OMPI_MCA_ess_singleton_isolated=1 "$bin" "$@"; else "${mpi[@]}" -np "$np" "$bin" "$@"; fi
}

echo "== 1. rows -> a version-3 dataset; the models"
"$py" - "$work" "$src/tests/python" $seq <<'PY'
# Rows of every length 5..32 (bytes = byte tokens) and 12 more, the prompt 30-70% of each, a
# 45-byte row at line 8 and a 77-byte one at line 31 (line 3 is blank); the same rows as a
# version-2 (a mask, no row boundaries) and a version-1 dataset for the bad-input case; the models
# (one Python start): hf_models.py's Llama 2 directory, a PEFT adapter on it (random B), a GPT-2.
import json, random, sys
work, seq = sys.argv[1], int(sys.argv[3])
sys.path.insert(0, sys.argv[2])
import hf_models as hm
import packing_reference as pr
import peft_reference as peft
hm.write_family(f"{work}/models", "llama2", hm.FAMILIES["llama2"], seed=100)
peft.random_adapter(f"{work}/models/llama2", f"{work}/ad", 4, 8, False, "all-linear", None, 3)
hm.write_safetensors(f"{work}/gpt2.safetensors", pr.gpt2_params(256, 32, 2, seq, 3), "F32")
rng = random.Random(45)
letters = "abcdefghijklmnopqrstuvwxyz     "
text = lambda n: "".join(rng.choice(letters) for _ in range(n))
lengths = list(range(5, 33)) + [rng.randint(5, 32) for _ in range(12)]
rng.shuffle(lengths)
lengths.insert(6, 45)
lengths.insert(29, 77)
lines, rows = [], []
for n in lengths:
    p = max(1, min(n - 1, round(n * rng.uniform(0.3, 0.7))))
    r = {"prompt": text(p), "completion": text(n - p)}
    lines.append(json.dumps(r))
    rows.append({"ids": list((r["prompt"] + r["completion"]).encode()), "mask": [0] * p + [1] * (n - p)})
lines.insert(2, "")
open(f"{work}/rows.jsonl", "w").write("\n".join(lines) + "\n")
pr.write_dataset(f"{work}/ds_v2", {"train": rows, "val": []}, version=2)
pr.write_dataset(f"{work}/ds_v1", {"train": rows, "val": []}, version=1)
PY
# Every row in train: one global batch holds them all.
"$bin" data prepare --source "$work/rows.jsonl" --tokenizer byte --chat-format plain --val-fraction 0 \
  --out "$work/ds" >"$work/prepare.log" 2>&1 || { cat "$work/prepare.log"; fail "data prepare"; }
# The reference reads the row records (checking starts and counts) and places the rows itself.
read -r rows windows counted <<<"$("$py" "$ref" windows "$work/ds" train $seq | awk '{print $3, $5, $7}')"
[ "$rows" = 42 ] || fail "the dataset has $rows rows, expected the 42 JSONL rows"
[ $((windows % 2)) -eq 0 ] || fail "$windows packed windows: the 2-rank step needs an even number"
echo "$rows rows, $windows packed windows of $seq, $counted counted targets"
# The 1-rank step in micro-batches of rows / d rows, d the smallest divisor >= 2 of the rows.
d=2
while [ $((rows % d)) -ne 0 ]; do d=$((d + 1)); done
cat >"$work/deck.toml" <<DECK
[run]
seed = 5
threads = 1
[model]
seq_len = $seq
[fsdp]
param_dtype = "fp32"
[optimizer]
name = "sgd"
lr = $lr
momentum = 0.0
weight_decay = 0.0
grad_clip = 0.0
[lr]
schedule = "constant"
warmup_steps = 0
[train]
max_steps = 1
micro_batch = 8
val_every = 0
[data]
dataset = "$work/ds"
tokenizer = "byte"
[log]
every = 1
peak_tflops = 1.0
[checkpoint]
resume = "never"
DECK
llama=(--set checkpoint.init_from="$work/models/llama2")
gpt2=(--set model.arch=gpt2 --set model.vocab_size=256 --set model.d_model=32 --set model.n_layers=2
      --set model.n_heads=4 --set checkpoint.init_from="$work/gpt2.safetensors")
# The whole train split as one global batch: every row once (padded: d micro-batches on 1 rank;
# packed: one micro-batch per rank on 2).
padded1=(--set data.packing=padded --set train.global_batch=$rows --set train.micro_batch=$((rows / d)))
packed2=(--set data.packing=packed --set train.global_batch=$windows --set train.micro_batch=$((windows / 2)))

echo "== 2. eval: packed and padded, 1 and 2 ranks, against the reference"
OMPI_MCA_ess_singleton_isolated=1 "$bin" ckpt import "$work/models/llama2" "$work/llama.h5" --deck "$work/deck.toml" \
  >"$work/import.log" 2>&1 || { cat "$work/import.log"; fail "ckpt import"; }
for packing in packed padded; do
  for np in 1 2; do
    out="$work/eval_${packing}_$np"
    launch $np eval "$work/deck.toml" --set model.from_hf="$work/models/llama2" \
      --set checkpoint.resume="$work/llama.h5" --set data.packing=$packing --set run.out_dir="$work/evalrun" \
      --split train --out "$out.json" >"$out.txt" 2>&1 || { cat "$out.txt"; fail "eval $packing at $np ranks"; }
  done
done
# The stream with document masks: windows cut through rows, each row's piece computed alone.
launch 2 eval "$work/deck.toml" --set model.from_hf="$work/models/llama2" --set checkpoint.resume="$work/llama.h5" \
  --set data.packing=stream --set data.document_mask=true --set run.out_dir="$work/evalrun" --split train \
  --out "$work/eval_streamdoc_2.json" >"$work/eval_streamdoc_2.txt" 2>&1 ||
  { cat "$work/eval_streamdoc_2.txt"; fail "eval stream + document_mask"; }
"$py" "$ref" eval "$work/models/llama2" "$work/ds" train $seq --packed "$work/eval_packed_1.json" \
  --packed "$work/eval_packed_2.json" --padded "$work/eval_padded_1.json" --padded "$work/eval_padded_2.json" \
  --stream-doc "$work/eval_streamdoc_2.json" || fail "eval differs from the one-row-at-a-time reference"
"$py" - "$work" <<'PY' || fail "eval: 1 and 2 ranks differ"
import json, sys
for p in ("packed", "padded"):
    a, b = (json.load(open(f"{sys.argv[1]}/eval_{p}_{n}.json"))["loss"] for n in (1, 2))
    assert a == b, f"{p}: {a!r} at 1 rank, {b!r} at 2"
print("eval: 1 and 2 ranks the same bits, packed and padded")
PY

echo "== 3. one SGD step over every row: Llama, LoRA on it, GPT-2 (1 rank padded, 2 ranks packed)"
step() {  # step NAME NP FORMAT [--set ...]: train one step, export it to $work/NAME.out
  local name=$1 np=$2 format=$3
  shift 3
  launch "$np" train "$work/deck.toml" --set run.out_dir="$work/$name" "$@" >"$work/$name.log" 2>&1 ||
    { tail -20 "$work/$name.log"; fail "the step $name"; }
  OMPI_MCA_ess_singleton_isolated=1 "$bin" ckpt export --format "$format" "$work/$name/checkpoints/step_00000001.h5" \
    "$work/$name.out" >"$work/$name.export.log" 2>&1 || { cat "$work/$name.export.log"; fail "export $name"; }
}
step llama_1 1 safetensors "${llama[@]}" "${padded1[@]}"
step llama_2 2 safetensors "${llama[@]}" "${packed2[@]}"
"$py" "$ref" step "$work/models/llama2" "$work/ds" $seq --lr $lr --compare "$work/llama_1.out" \
  --compare "$work/llama_2.out" --metrics "$work/llama_1/metrics.jsonl" --metrics "$work/llama_2/metrics.jsonl" ||
  fail "the Llama's step differs from the reference"
step lora_1 1 peft "${llama[@]}" --set lora.init_from="$work/ad" "${padded1[@]}"
# (data.packing not set: packed is the default for a dataset with a mask and rows)
step lora_2 2 peft "${llama[@]}" --set lora.init_from="$work/ad" "${packed2[@]:2}"
grep -q "train packed windows of $seq" "$work/lora_2.log" ||
  { grep "^# data" "$work/lora_2.log"; fail "the default is not packed"; }
"$py" "$ref" step "$work/models/llama2" "$work/ds" $seq --lr $lr --adapter "$work/ad" --compare "$work/lora_1.out" \
  --compare "$work/lora_2.out" --metrics "$work/lora_1/metrics.jsonl" --metrics "$work/lora_2/metrics.jsonl" ||
  fail "the LoRA step differs from the reference"
step gpt2_1 1 safetensors "${gpt2[@]}" "${padded1[@]}"
step gpt2_2 2 safetensors "${gpt2[@]}" "${packed2[@]}"
"$py" "$ref" step "$work/gpt2.safetensors" "$work/ds" $seq --arch gpt2 --n-heads 4 --lr $lr \
  --compare "$work/gpt2_1.out" --compare "$work/gpt2_2.out" --metrics "$work/gpt2_1/metrics.jsonl" \
  --metrics "$work/gpt2_2/metrics.jsonl" || fail "the GPT-2's step differs from the reference"

echo "== 4. bad input: deck check and train agree, exit 2, nothing written"
bad() {  # bad NAME NP PATTERN [--set ...]: deck check and train (NP ranks) exit 2 naming PATTERN
  local name=$1 np=$2 pattern=$3
  shift 3
  expect_exit2 "$work/bad_${name}_check.log" "$pattern" "$bin" deck check "$work/deck.toml" "$@"
  expect_exit2 "$work/bad_${name}_train.log" "$pattern" launch "$np" train "$work/deck.toml" \
    --set run.out_dir="$work/bad_$name" "$@"
  ! ls "$work/bad_$name"/checkpoints/*.h5* "$work/bad_$name"/metrics.jsonl >/dev/null 2>&1 ||
    fail "$name: a checkpoint or metrics written"
  echo "$name: exit 2 from deck check and train: $(grep -m1 -o "$pattern.*" "$work/bad_${name}_train.log" |
    cut -c1-100)"
}
bad v2 1 'data.packing' "${llama[@]}" --set data.dataset="$work/ds_v2" --set data.packing=packed
expect_exit2 "$work/bad_v1_check.log" 'data.packing' "$bin" deck check "$work/deck.toml" "${llama[@]}" \
  --set data.dataset="$work/ds_v1" --set data.packing=padded
bad overlong 2 'rows.jsonl:8' "${llama[@]}" --set data.overlong=error
echo "== 5. plan --measure on packed rows: scores bounded by the longest row (77 of 96), planned = measured within 10%"
"${mpi[@]}" -np 2 "$bin" plan "$work/deck.toml" "${gpt2[@]}" --set model.seq_len=96 --set train.global_batch=2 \
  --set train.micro_batch=1 --ranks-per-host 1 --strategy full_shard --measure --steps 2 --tolerance 0.10 \
  >"$work/plan.log" 2>&1 || { cat "$work/plan.log"; fail "plan --measure on packed rows"; }
grep -q "# windows: data.packing packed (each row its own causal attention: scores of at most 77 keys" "$work/plan.log" ||
  { grep "# windows" "$work/plan.log"; fail "the plan does not bound the scores by the longest row"; }
grep "^full_shard " "$work/plan.log"
echo "OK ($((SECONDS - t0)) s)"
