# Shared by the LoRA / QLoRA end-to-end scripts (lora.sh, qlora.sh, qlora_export.sh): sourced after
# `bin py src mpirun` are set and shifted off, with the MPI flags left in "$@" and NAME as the
# first argument: `. lib.sh NAME "$@"`. Gives $work (removed on exit), $hf, $peft, the mpi array
# and the helpers below; `byte_data` writes hf_models.py's tiny models to $work/models and a
# byte-token dataset of 64 training and 64 validation windows of 32 tokens to $work/ds.
name=$1
shift
export OMP_NUM_THREADS=1
work=$(mktemp -d "/tmp/shardtrain-e2e-$name.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
hf="$src/tests/python/hf_models.py"
peft="$src/tests/python/peft_reference.py"
mpi=("$mpirun" "$@")
# "STEP LOSS" per logged step of a metrics.jsonl; the loss of an `eval` log.
losses() { sed -n 's/.*"loss":\([^,}]*\).*"step":\([0-9]*\).*/\2 \1/p' "$1"; }
eval_loss() { grep '^eval ' "$1" | sed -E 's/.* loss ([^,]+),.*/\1/'; }
# expect_exit2 LOG PATTERN CMD...: exit 2 and PATTERN in the output.
expect_exit2() {
  local log=$1 pattern=$2
  shift 2
  set +e
  "$@" >"$log" 2>&1
  local rc=$?
  set -e
  [ $rc -eq 2 ] || { cat "$log"; fail "expected exit 2, got $rc: $*"; }
  grep -q -- "$pattern" "$log" || { cat "$log"; fail "no '$pattern' in the message of: $*"; }
}
byte_data() {
  "$py" "$hf" write "$work/models" >/dev/null
  head -c 4100 "$src/docs/fsdp.md" >"$work/text.txt"
  "$bin" data prepare --source "$work/text.txt" --tokenizer byte --out "$work/ds" --val-fraction 0.5 >/dev/null
}
# reference_deck FILE [TOML...]: the deck of the comparisons with peft_reference.py (fp32, one
# full-batch AdamW step of 64 windows), the extra TOML lines appended.
reference_deck() {
  local f=$1
  shift
  cat >"$f" <<DECK
[run]
seed = 5
threads = 1
[model]
seq_len = 32
[fsdp]
param_dtype = "fp32"
[optimizer]
name = "adamw"
lr = 2.5e-4
weight_decay = 0.1
grad_clip = 1.0
# Adam's first step is lr g / (|g| + eps): an element whose gradient is a few 1e-8 (the sums
# cancel) carries mostly fp32 rounding, which a small eps would turn into a visibly different step
# between two correct implementations that sum in different orders (1e-8: 3e-5 of the largest
# value, 1e-6: 4e-6, measured); 1e-4 keeps those below 1e-6.
eps = 1e-4
[lr]
schedule = "constant"
warmup_steps = 0
[train]
max_steps = 1
global_batch = 64
micro_batch = 16
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
  local line
  for line in "$@"; do echo "$line" >>"$f"; done
}
