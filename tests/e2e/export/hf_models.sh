#!/usr/bin/env bash
# Hugging Face model directories in and out (tests/python/hf_models.py writes tiny random ones:
# Llama 2, Llama 3.1 with llama3 rope scaling, Llama 3.2 tied, Mistral GQA, Qwen2 with q/k/v
# biases, an explicit head_dim with attention/MLP biases and linear rope scaling):
#  1. `ckpt import DIR` (no deck: the config.json gives the model) + `eval` equals the independent
#     PyTorch implementation of the transformers semantics within 1e-6 relative, per family;
#  2. 10 training steps from checkpoint.init_from = DIR at 1, 2 and 4 ranks equal the 1-rank
#     losses within 1e-5 (relative): Llama 3.1 (BF16 shards, each rank reading its slices), head_dim + biases;
#  3. `ckpt export --format hf` after an import gives the source's tensors byte for byte (F32 and
#     BF16, one file and shards + index), the Python reference loads the exported directory by
#     its config and index and gets the same loss, and export -> import gives the same eval loss
#     bit for bit;
#  4. bad config.json (missing, truncated, garbage, unknown architecture, unsupported rope type,
#     missing key) and a deck key contradicting the config: exit 2 naming file and key on every
#     rank, nothing written; a planted link as the export directory is refused.
# Usage: hf_models.sh SHARDTRAIN PYTHON SOURCE_DIR MPIRUN [MPIRUN_FLAGS...]
set -euo pipefail
bin=$1 py=$2 src=$3 mpirun=$4
shift 4
export OMP_NUM_THREADS=1
work=$(mktemp -d /tmp/shardtrain-e2e-hf.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
ref="$src/tests/python/hf_models.py"

families=$("$py" "$ref" write "$work/models")
# Byte tokens (ids < 256, below every family's vocabulary).
cat "$src"/docs/*.md > "$work/text.txt"
"$bin" data prepare --source "$work/text.txt" --tokenizer byte --out "$work/ds" --val-fraction 0.02 >/dev/null
cat > "$work/deck.toml" <<EOF
[run]
seed = 5
threads = 1
[model]
seq_len = 32
[fsdp]
param_dtype = "fp32"
[optimizer]
name = "adamw"
lr = 3e-3
weight_decay = 0.1
grad_clip = 1.0
[lr]
schedule = "cosine"
warmup_steps = 2
min_lr = 3e-4
[train]
max_steps = 10
global_batch = 8
micro_batch = 2
val_every = 0
[data]
dataset = "$work/ds"
tokenizer = "byte"
[log]
every = 1
peak_tflops = 1.0
[checkpoint]
resume = "never"
EOF
mpi=("$mpirun" "$@")
eval_loss() {  # eval_loss NP CKPT MODEL_DIR OUT.json -> prints the loss (17 digits)
  "${mpi[@]}" -np "$1" "$bin" eval "$work/deck.toml" --set model.from_hf="$3" --set checkpoint.resume="$2" \
    --set run.out_dir="$work/evalrun" --out "$4" >"$4.txt" || { cat "$4.txt"; fail "eval $2"; }
  sed -E 's/.* loss ([^,]+),.*/\1/' "$4.txt"
}

echo "== 1. import + eval against the independent implementation"
for f in $families; do
  "${mpi[@]}" -np 2 "$bin" ckpt import "$work/models/$f" "$work/$f.h5" >"$work/import_$f.log" 2>&1 ||
    { cat "$work/import_$f.log"; fail "ckpt import $f"; }
  got=$(eval_loss 2 "$work/$f.h5" "$work/models/$f" "$work/eval_$f.json")
  want=$("$py" "$ref" loss "$work/models/$f" "$work/ds" 32)
  echo -n "$f: "
  "$py" "$ref" check-loss "$got" "$want" || fail "$f: eval loss differs from the reference"
done
# deck check prints the resolved model, from the config.
"$bin" deck check "$work/deck.toml" --set model.from_hf="$work/models/headdim" >"$work/check.txt"
grep -q "^# resolved model (from $work/models/headdim/config.json)" "$work/check.txt" || fail "deck check: no resolved model"
grep -q "^# head_dim = 24$" "$work/check.txt" || fail "deck check: head_dim 24 not shown"
grep -q '^# hf_architecture = "LlamaForCausalLM"$' "$work/check.txt" || fail "deck check: architecture not shown"

echo "== 2. 10 steps from init_from = DIR at 1, 2 and 4 ranks"
losses() { sed -n 's/.*"loss":\([^,}]*\).*"step":\([0-9]*\).*/\2 \1/p' "$1"; }
for f in llama31 headdim; do
  for n in 1 2 4; do
    "${mpi[@]}" -np $n "$bin" train "$work/deck.toml" --set checkpoint.init_from="$work/models/$f" \
      --set run.out_dir="$work/train_${f}_$n" >"$work/train_${f}_$n.log" 2>&1 ||
      { tail -20 "$work/train_${f}_$n.log"; fail "training $f at $n ranks"; }
    losses "$work/train_${f}_$n/metrics.jsonl" >"$work/loss_${f}_$n"
  done
  [ "$(wc -l <"$work/loss_${f}_1")" -eq 10 ] || fail "$f: expected 10 training losses"
  for n in 2 4; do
    "$py" - "$work/loss_${f}_1" "$work/loss_${f}_$n" <<'PY' || fail "$f: $n-rank losses differ from 1 rank"
import sys
a = [float(l.split()[1]) for l in open(sys.argv[1])]
b = [float(l.split()[1]) for l in open(sys.argv[2])]
assert len(a) == len(b) == 10, (len(a), len(b))
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"  {sys.argv[2].rsplit('_', 1)[1]} ranks: worst relative difference {worst:.3g} over 10 steps")
sys.exit(0 if worst <= 1e-5 else 1)
PY
  done
  echo "$f: first $(head -1 "$work/loss_${f}_1"), last $(tail -1 "$work/loss_${f}_1")"
done

echo "== 3. export --format hf"
for f in llama2 llama31 qwen2 llama32; do
  shard=()
  [ "$f" = llama31 ] && shard=(--max-shard-size 60KB)
  "$bin" ckpt export --format hf "$work/$f.h5" "$work/out_$f" "${shard[@]}" >"$work/export_$f.log" 2>&1 ||
    { cat "$work/export_$f.log"; fail "export $f"; }
  "$py" "$ref" same-tensors "$work/models/$f" "$work/out_$f" || fail "$f: exported tensors differ from the source"
  for t in tokenizer_config.json special_tokens_map.json; do
    cmp -s "$work/models/$f/$t" "$work/out_$f/$t" || fail "$f: $t not copied"
  done
  [ -s "$work/out_$f/generation_config.json" ] || fail "$f: no generation_config.json"
  want=$("$py" "$ref" loss "$work/out_$f" "$work/ds" 32)
  echo -n "$f exported, reference on it: "
  "$py" "$ref" check-loss "$(cat "$work/eval_$f.json.txt" | sed -E 's/.* loss ([^,]+),.*/\1/')" "$want" || fail "$f: export loss"
  # export -> import -> eval: the same loss to the bit.
  "${mpi[@]}" -np 2 "$bin" ckpt import "$work/out_$f" "$work/again_$f.h5" >/dev/null 2>&1 || fail "re-import $f"
  a=$(sed -E 's/.* loss ([^,]+),.*/\1/' "$work/eval_$f.json.txt")
  b=$(eval_loss 2 "$work/again_$f.h5" "$work/out_$f" "$work/e2_$f.json")
  [ "$a" = "$b" ] || fail "$f: eval loss after export -> import $b, before $a"
done
# 60 KB shards: several files (each at most 60 KB of tensor data unless one tensor is larger) and an index.
[ -s "$work/out_llama31/model.safetensors.index.json" ] && [ "$(ls "$work"/out_llama31/model-000*-of-000*.safetensors | wc -l)" -ge 3 ] ||
  { ls "$work/out_llama31"; fail "llama31: expected shards and an index"; }
[ ! -e "$work/out_llama31/model.safetensors" ] || fail "llama31: both shards and model.safetensors"
[ -s "$work/out_llama2/model.safetensors" ] && [ ! -e "$work/out_llama2/model.safetensors.index.json" ] || fail "llama2: expected one file"
grep -q '"total_size": 279168' "$work/out_llama31/model.safetensors.index.json" || fail "llama31: index total_size is not 2 bytes x 139584 parameters"
grep -q '"torch_dtype": "bfloat16"' "$work/out_llama31/config.json" || fail "llama31: BF16 source exported as $(grep torch_dtype "$work/out_llama31/config.json")"
# A trained model exported as bf16 from an fp32 run.
"$bin" ckpt export --format hf "$(ls "$work"/train_headdim_2/checkpoints/step_*.h5 | tail -1)" "$work/out_trained" --dtype bf16 \
  --tokenizer-from "$work/models/headdim" >/dev/null || fail "export of a trained checkpoint"
grep -q '"BF16"' "$work/out_trained/model.safetensors" || fail "--dtype bf16 did not write BF16"
"$py" "$ref" loss "$work/out_trained" "$work/ds" 32 >/dev/null || fail "the reference cannot load the trained export"

echo "== 4. bad input: exit 2 naming file and key, nothing written"
expect2() {  # expect2 WHAT PATTERN CMD...
  local what=$1 pat=$2; shift 2
  set +e; "$@" >"$work/bad.out" 2>"$work/bad.err"; local rc=$?; set -e
  [ $rc -eq 2 ] || { cat "$work/bad.out" "$work/bad.err"; fail "$what: exit $rc, expected 2"; }
  grep -q -- "$pat" "$work/bad.err" || { cat "$work/bad.err"; fail "$what: the error does not say '$pat'"; }
}
bad() {  # bad NAME: a copy of llama2 whose config.json the caller changes
  rm -rf "$work/bad/$1"; mkdir -p "$work/bad"; cp -r "$work/models/llama2" "$work/bad/$1"; echo "$work/bad/$1"
}
d=$(bad missing); rm "$d/config.json"
expect2 "from_hf without config.json" "$d/config.json" "${mpi[@]}" -np 2 "$bin" ckpt import "$d" "$work/bad.h5" --deck "$work/deck.toml" --set model.from_hf="$d"
expect2 "import without config.json or deck" "has no config.json" "${mpi[@]}" -np 2 "$bin" ckpt import "$d" "$work/bad.h5"
d=$(bad truncated); head -c 200 "$work/models/llama2/config.json" > "$d/config.json"
expect2 "truncated config.json" "$d/config.json: not valid JSON" "${mpi[@]}" -np 2 "$bin" ckpt import "$d" "$work/bad.h5"
d=$(bad garbage); head -c 3000 /dev/urandom > "$d/config.json"
expect2 "garbage config.json" "$d/config.json" "${mpi[@]}" -np 2 "$bin" ckpt import "$d" "$work/bad.h5"
d=$(bad arch); sed -i 's/LlamaForCausalLM/GemmaForCausalLM/' "$d/config.json"
expect2 "unknown architecture" "$d/config.json: architectures = \"GemmaForCausalLM\" is not supported" "${mpi[@]}" -np 2 "$bin" ckpt import "$d" "$work/bad.h5"
d=$(bad rope); "$py" - "$d/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}; json.dump(c, open(sys.argv[1], "w"))
PY
expect2 "unsupported rope type" "$d/config.json: rope_scaling.rope_type = \"yarn\" is not supported" "${mpi[@]}" -np 2 "$bin" ckpt import "$d" "$work/bad.h5"
d=$(bad key); "$py" - "$d/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); del c["hidden_size"]; json.dump(c, open(sys.argv[1], "w"))
PY
expect2 "missing key" "$d/config.json: hidden_size is missing" "${mpi[@]}" -np 2 "$bin" ckpt import "$d" "$work/bad.h5"
expect2 "missing key (train)" "$d/config.json: hidden_size is missing" "${mpi[@]}" -np 2 "$bin" train "$work/deck.toml" \
  --set checkpoint.init_from="$d" --set run.out_dir="$work/badrun"
expect2 "deck contradicts config" "model.d_model = 96, which contradicts hidden_size = 64 in $work/models/llama2/config.json" \
  "${mpi[@]}" -np 2 "$bin" ckpt import "$work/models/llama2" "$work/bad.h5" --deck "$work/deck.toml" --set model.d_model=96
expect2 "seq_len above the sliding window" "exceeds the model's sliding_window 48" \
  "$bin" deck check "$work/deck.toml" --set model.from_hf="$work/models/mistral" --set model.seq_len=64
[ ! -e "$work/bad.h5" ] && [ ! -e "$work/badrun/checkpoints" ] || fail "a refused import or run left files behind"
ls "$work" | grep -q '\.tmp' && fail "temporary files left behind: $(ls "$work" | grep '\.tmp')"
# The export directory: a planted link, a non-empty directory, a non-llama model: refused, nothing written.
mkdir "$work/victim"; ln -s "$work/victim" "$work/link_out"
expect2 "export into a link" "is not a directory (a file or a link)" "$bin" ckpt export --format hf "$work/llama2.h5" "$work/link_out"
[ -z "$(ls -A "$work/victim")" ] || fail "the export wrote through a planted link"
expect2 "export into a non-empty directory" "is not empty" "$bin" ckpt export --format hf "$work/llama2.h5" "$work/out_llama2"
ln -s /etc/hostname "$work/bad/key/tokenizer.json"
expect2 "a linked tokenizer file" "tokenizer.json: cannot open" "$bin" ckpt export --format hf "$work/llama2.h5" "$work/out_link" \
  --tokenizer-from "$work/bad/key"
[ ! -e "$work/out_link" ] || fail "a failed export left its directory"
ls -a "$work" | grep -q '^\.out_link\.tmp' && fail "a failed export left its temporary directory"
echo "hf models: OK"
