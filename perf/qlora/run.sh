#!/usr/bin/env bash
# run.sh: QLoRA (lora.base_dtype = "nf4") against bf16 LoRA of one model on this CPU, the frozen
# base's all-gather bytes in NF4 and bf16, and the peak memory of loading a >= 1 GB model directory
# (perf/README.md, "QLoRA").
#   perf/qlora/run.sh [build-dir]          (default: build/; needs bin/shardtrain)
# Env: ROUNDS=3 (alternations), STEPS=6 (steps per probe; timed: the median of those after the
# first), DECK=perf/qlora/llama-616m.toml (bf16, recomputation, 48 layers, a 4096-token
# vocabulary, LoRA r 16 on q_proj and v_proj: a run whose memory is mostly its frozen base, QLoRA's
# case; perf/lora/llama-167m.toml is the LoRA benchmark's deck, whose embedding, head and working
# memory dominate instead), PARTS="step bytes load".
#   step:  `plan --measure --strategy full_shard` at 2 ranks, QLoRA (--set lora.base_dtype=nf4,
#          double quantization) and bf16 LoRA (the deck) alternately, ROUNDS times each: planned
#          and measured peak per rank (counting allocator) and the step time; the medians and the
#          QLoRA / LoRA ratios (goals: step <= 1.3, memory <= 0.45, planned = measured within 10%).
#   bytes: two training steps of each at 2 ranks with the engine's byte counters, and the same
#          with LoRA on q_proj only so that the adapters' traffic cancels out: the frozen base's
#          all-gather bytes NF4 / bf16 (goal <= 0.27).
#   load:  a random Llama-shaped Hugging Face directory (fp32, 318 M parameters, 1.27 GB), one
#          LoRA training step of 2 x 32 tokens from it at 1 and 2 ranks, with and without NF4: each rank's peak
#          resident memory (/usr/bin/time's maximum RSS) against its shard (goal: peak <= shard +
#          one layer + 1 GiB).
# Prints the CPU model and the load (uptime) before and after. Raw outputs go to $OUT.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
build="${1:-$root/build}"
st="$build/bin/shardtrain"
[ -x "$st" ] || { echo "no $st: cmake --build $build -j2 --target shardtrain" >&2; exit 1; }
ROUNDS="${ROUNDS:-3}"
STEPS="${STEPS:-6}"
DECK="${DECK:-$here/llama-616m.toml}"
PARTS="${PARTS:-step bytes load}"
OUT="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/qlora-perf-XXXXXX")}"
mkdir -p "$OUT"
mpi=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nf4=(--set lora.base_dtype=nf4 --set lora.nf4_double_quant=true)
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(hostname): $cpu, $(nproc --all) cores, $(awk '/MemTotal/{printf "%.0f GB", $2/1048576}' /proc/meminfo); raw output in $OUT"
echo "# load before: $(uptime | sed 's/.*load average/load average/')"

# Byte tokens of the project's docs: the data of the bytes and load parts.
head -c 100000 "$root/docs/fsdp.md" > "$OUT/text.txt"
[ -d "$OUT/ds" ] || "$st" data prepare --source "$OUT/text.txt" --tokenizer byte --out "$OUT/ds" --val-fraction 0.5 >/dev/null

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
kv() { awk -v k="$2" '/^PLAN_VS_MEASURED/ { for (i = 2; i <= NF; ++i) { split($i, a, "="); if (a[1] == k) print a[2] } }' "$1"; }

if [[ " $PARTS " == *" step "* ]]; then
  echo
  echo "## QLoRA vs bf16 LoRA: $(basename "$DECK"), full_shard, 2 ranks, $STEPS steps per probe, $ROUNDS alternations"
  echo
  echo "| round | config | planned peak / rank | measured peak / rank | error | step (s) |"
  echo "|---:|---|---:|---:|---:|---:|"
  for r in $(seq 1 "$ROUNDS"); do
    for cfg in qlora lora; do
      log="$OUT/step-$cfg-$r.txt"
      extra=()
      [ "$cfg" = qlora ] && extra=("${nf4[@]}")
      "${mpi[@]}" -np 2 "$st" plan "$DECK" --strategy full_shard --measure --steps "$STEPS" "${extra[@]}" \
        > "$log" 2>&1 < /dev/null || { tail -20 "$log"; echo "plan --measure failed ($cfg)" >&2; exit 1; }
      line=$(awk '/^# measured/ { m = 1; next } m && $1 == "full_shard" { print; exit }' "$log")
      planned=$(kv "$log" planned)
      measured=$(kv "$log" measured)
      step=$(echo "$line" | awk '{ print $(NF - 1) }')
      echo "$planned $measured $step" > "$OUT/step-$cfg-$r.val"
      awk -v r="$r" -v c="$cfg" -v p="$planned" -v m="$measured" -v s="$step" \
        'BEGIN { printf "| %s | %s | %.1f MiB | %.1f MiB | %+.1f%% | %.3f |\n", r, c, p / 1048576, m / 1048576, 100 * (p - m) / m, s }'
    done
  done
  q_step=$(cat "$OUT"/step-qlora-*.val | awk '{ print $3 }' | median)
  l_step=$(cat "$OUT"/step-lora-*.val | awk '{ print $3 }' | median)
  q_peak=$(cat "$OUT"/step-qlora-*.val | awk '{ print $2 }' | median)
  l_peak=$(cat "$OUT"/step-lora-*.val | awk '{ print $2 }' | median)
  ratios=$(for r in $(seq 1 "$ROUNDS"); do paste "$OUT/step-qlora-$r.val" "$OUT/step-lora-$r.val" | awk '{ print $3 / $6 }'; done | median)
  worst=$(cat "$OUT"/step-*.val | awk '{ e = ($1 - $2) / $2; if (e < 0) e = -e; if (e > w) w = e } END { printf "%.1f%%", 100 * w }')
  echo
  awk -v qs="$q_step" -v ls="$l_step" -v qp="$q_peak" -v lp="$l_peak" -v rr="$ratios" -v w="$worst" 'BEGIN {
    printf "median step: QLoRA %.3f s, LoRA %.3f s: ratio %.2f (median of the per-round ratios %.2f; goal <= 1.3)\n", qs, ls, qs / ls, rr
    printf "median peak per rank: QLoRA %.1f MiB, LoRA %.1f MiB: ratio %.3f (goal <= 0.45)\n", qp / 1048576, lp / 1048576, qp / lp
    printf "largest planned-vs-measured error: %s (goal <= 10%%)\n", w }'
fi

if [[ " $PARTS " == *" bytes "* ]]; then
  echo
  echo "## The frozen base's all-gather: bytes one rank sends in 2 steps (engine counters), 2 ranks, full_shard"
  echo
  # Three runs of one deck (LoRA on q_proj, everything else frozen, fp32 compute): fp32 base, NF4
  # base, and the fp32 base with the blocks' linear weights in fsdp.ignored_params (kept whole:
  # never gathered; the ignored group is fp32, hence fp32 compute here). The third run moves what
  # the other two have in common (adapters, embedding, norms, head), so (run - third) is the linear
  # weights' all-gather bytes of each base; a bf16 base's are exactly half the fp32 base's (the same
  # padded elements at 2 bytes).
  cat > "$OUT/bytes-deck.toml" <<EOF
[run]
threads = 1
[model]
arch = "llama"
vocab_size = 256
seq_len = 64
d_model = 512
n_layers = 4
n_heads = 8
d_ff = 1408
tie_embeddings = false
[lora]
rank = 8
alpha = 16.0
targets = ["q_proj"]
[fsdp]
param_dtype = "fp32"
[train]
max_steps = 2
global_batch = 4
micro_batch = 2
val_every = 0
[data]
dataset = "$OUT/ds"
tokenizer = "byte"
[log]
every = 1
[checkpoint]
resume = "never"
every_steps = 0
EOF
  for cfg in fp32 nf4 rest; do
    extra=()
    [ "$cfg" = nf4 ] && extra=("${nf4[@]}")
    [ "$cfg" = rest ] && extra=(--set 'fsdp.ignored_params=["proj.weight"]')
    "${mpi[@]}" -np 2 "$st" train "$OUT/bytes-deck.toml" --set run.out_dir="$OUT/bytes-$cfg" "${extra[@]}" \
      > "$OUT/bytes-$cfg.txt" 2>&1 < /dev/null || { tail -20 "$OUT/bytes-$cfg.txt"; exit 1; }
    sed -n 's/.*"intra_node_bytes":\([0-9]*\).*/\1/p' "$OUT/bytes-$cfg/metrics.jsonl" | tail -1 > "$OUT/bytes-$cfg.val"
  done
  awk -v f="$(cat "$OUT/bytes-fp32.val")" -v n="$(cat "$OUT/bytes-nf4.val")" -v r="$(cat "$OUT/bytes-rest.val")" 'BEGIN {
    printf "| run | bytes sent | of which the linear weights |\n|---|---:|---:|\n"
    printf "| fp32 base | %d | %d |\n| NF4 base (block 64, double-quantized) | %d | %d |\n| linear weights not gathered | %d | 0 |\n\n", f, f - r, n, n - r, r
    printf "the frozen linear weights all-gather bytes: NF4 / fp32 %.4f, NF4 / bf16 %.4f (goal <= 0.27)\n", (n - r) / (f - r), 2 * (n - r) / (f - r) }'
fi

if [[ " $PARTS " == *" load "* ]]; then
  echo
  /usr/bin/python3 - "$OUT/base" "$root/tests/python" <<'PY'
import json, pathlib, sys, torch
sys.path.insert(0, sys.argv[2])
import hf_models as hf
d = pathlib.Path(sys.argv[1]); d.mkdir(exist_ok=True)
cfg = dict(hf.BASE, architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=1024, intermediate_size=2816,
           num_hidden_layers=20, num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
           max_position_embeddings=256, tie_word_embeddings=False, torch_dtype="float32")
(d / "config.json").write_text(json.dumps(cfg, indent=2))
t = hf.family_tensors({"cfg": cfg, "arch": "LlamaForCausalLM"}, torch.Generator().manual_seed(1))
t = {k: v * 0.1 for k, v in t.items()}
hf.write_safetensors(d / "model.safetensors", t, "F32")
n = sum(v.numel() for v in t.values())
layer = sum(v.numel() for k, v in t.items() if k.startswith("model.layers.0."))
print(f"LOADBASE params={n} bytes={4 * n} layer_params={layer}")
PY
  cat > "$OUT/load-deck.toml" <<EOF
[run]
threads = 1
[model]
seq_len = 32
[fsdp]
param_dtype = "bf16"
[lora]
rank = 16
alpha = 32.0
targets = ["all-linear"]
[train]
max_steps = 1
global_batch = 2
micro_batch = 1
val_every = 0
[data]
dataset = "$OUT/ds"
tokenizer = "byte"
[checkpoint]
init_from = "$OUT/base"
resume = "never"
every_steps = 0
EOF
  echo "## Loading $(du -h "$OUT/base/model.safetensors" | cut -f1) of fp32 weights (318 M parameters; eval of 2 windows, bf16 compute, LoRA r 16)"
  echo
  echo "| ranks | base | peak RSS per rank (max) | its shard at rest | largest unit (bf16) | the rest |"
  echo "|---:|---|---:|---:|---:|---|"
  for np in 1 2; do
    for cfg in bf16 nf4; do
      extra=()
      [ "$cfg" = nf4 ] && extra=("${nf4[@]}")
      log="$OUT/load-$cfg-$np.txt"
      "${mpi[@]}" -np $np /usr/bin/time -f "MAXRSS_KB %M" "$st" train "$OUT/load-deck.toml" \
        --set run.out_dir="$OUT/load-$cfg-$np" "${extra[@]}" > "$log" 2>&1 < /dev/null || { tail -20 "$log"; exit 1; }
      peak=$(sed -n 's/^MAXRSS_KB //p' "$log" | sort -g | tail -1)
      echo "$np $cfg $peak" >> "$OUT/load.val"
    done
  done
  /usr/bin/python3 - "$OUT/load.val" "$OUT/base/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[2]))
h, f, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
lin = L * (4 * h * h + 3 * h * f)          # the blocks' linear weights (NF4 with lora.base_dtype = nf4)
rest = 2 * V * h + (2 * L + 1) * h        # embedding, head, norms (bf16 either way)
layer_bf16 = 2 * (4 * h * h + 3 * h * f)
# The largest unit is the root here (embedding and head: 2 V h), not a block; the engine builds a
# unit's flats whole in fp32 before it keeps its shard, so "one layer" is the largest unit.
layer_bf16 = max(layer_bf16, 2 * 2 * V * h)
nf4_bytes = lin / 2 + lin / 64 + 8 * lin / 16384
mib = 2 ** 20
for np_, cfg, kb in (l.split() for l in open(sys.argv[1])):
    np_ = int(np_)
    shard = (2 * rest + (nf4_bytes if cfg == "nf4" else 2 * lin)) / np_
    peak = int(kb) * 1024
    goal = shard + layer_bf16 + 2 ** 30
    print(f"| {np_} | {cfg} | {peak / mib:.0f} MiB | {shard / mib:.0f} MiB | {layer_bf16 / mib:.0f} MiB |"
          f" peak - shard - layer = {(peak - shard - layer_bf16) / mib:.0f} MiB ({'within' if peak <= goal else 'above'} 1 GiB) |")
PY
fi
echo
echo "# load after: $(uptime | sed 's/.*load average/load average/')"
