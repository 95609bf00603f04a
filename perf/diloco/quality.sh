#!/usr/bin/env bash
# quality.sh: DiLoCo's validation loss against synchronous hybrid_shard at equal tokens
# (issue 30's quality goal: within 2%). The deck perf/diloco/quality.toml (GPT-2, 4 blocks of
# d 256, Austen in byte tokens, 2 ranks as 2 simulated hosts of 1, 2000 steps, validation every
# 500) is trained once with parallel.replica_sync = every_step (the reference), once under DiLoCo
# per H of --inner-steps (whole model, fp32 outer gradients) and once in the streaming variant
# (--streaming "F TAU DTYPE H": fragments, overlap steps, outer dtype, H), each once per outer
# optimizer setting of --outer ("LR/MOMENTUM ...", default the deck's 0.7/0.9). Every run has the same
# global batch, so the validation at step s is at equal tokens in all of them. Prints a Markdown
# table: per configuration the validation loss at each validation step, the last one's ratio to
# the reference and whether it is within 2%, with the date, CPU model and load.
#
# --warm-start N: every DiLoCo run starts from the reference's checkpoint of step N (synchronous
# training first, DiLoCo from N on: what the DiLoCo paper does by starting from a pretrained
# model; a user does it by resuming an every_step checkpoint with replica_sync = "diloco").
# --bounds: two more rows that bracket DiLoCo: H = 1 with outer 1/0 (the replicas' AdamW steps
# averaged after every step: the cost of per-replica optimizer state alone) and one replica
# training alone (no exchange at all; half the tokens per step, so not at equal tokens).
#
#   perf/diloco/quality.sh [--build DIR] [--quick] [--steps N] [--val-every V] [--inner-steps "10 50 100 500"]
#                          [--streaming "F TAU DTYPE H"] [--outer "0.7/0.9 1/0"] [--np 2] [--ranks-per-host 1]
#                          [--warm-start N] [--bounds] [--out DIR] [--set KEY=VALUE ...]
#
# --quick: a smoke test of the script and the engine (24 steps, validation every 12 on 2
# batches, H = 4 8 12 24, streaming "2 1 int4 12"): its numbers say nothing about quality.
# The full sweep is 6 runs of 2000 steps of 2 ranks (see perf/README.md "DiLoCo" for its time).
# Data: .data/austen-byte when it exists, else prepared once into OUT/austen-byte (needs the
# Austen source: scripts/fetch-data --for run). Outputs in OUT (default perf/diloco/out): one
# run directory per configuration (metrics.jsonl, the log), quality.tsv, quality.md.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$root/build
steps='' val_every='' val_batches='' quick=0 np=2 rph=1 warm=0 bounds=0
hs="10 50 100 500"
stream="4 1 int4 100"
outers="0.7/0.9"
out=${OUT:-$here/out}
extra=()
usage() {
  echo "usage: $0 [--build DIR] [--quick] [--steps N] [--val-every V] [--inner-steps \"H ...\"]" \
    "[--streaming \"F TAU DTYPE H\"] [--outer \"LR/MOMENTUM ...\"] [--np N] [--ranks-per-host G] [--warm-start N] [--bounds] [--out DIR] [--set KEY=VALUE ...]" >&2
  exit 2
}
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --steps) steps=$2; shift 2 ;;
    --val-every) val_every=$2; shift 2 ;;
    --inner-steps) hs=$(tr ',' ' ' <<<"$2"); shift 2 ;;
    --streaming) stream=$2; shift 2 ;;
    --outer) outers=$(tr ',' ' ' <<<"$2"); shift 2 ;;
    --warm-start) warm=$2; shift 2 ;;
    --bounds) bounds=1; shift ;;
    --np) np=$2; shift 2 ;;
    --ranks-per-host) rph=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --set) extra+=(--set "$2"); shift 2 ;;
    *) usage ;;
  esac
done
if ((quick)); then
  steps=${steps:-24} val_every=${val_every:-12} val_batches=2
  [[ $hs == "10 50 100 500" ]] && hs="4 8 12 24"
  [[ $stream == "4 1 int4 100" ]] && stream="2 1 int4 12"
fi
steps=${steps:-2000} val_every=${val_every:-500}
int() { [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "quality.sh: $1: '$2' is not a positive integer" >&2; exit 2; }; }
int --steps "$steps"
int --val-every "$val_every"
int --np "$np"
int --ranks-per-host "$rph"
[[ $warm =~ ^[0-9]+$ ]] && ((warm < steps)) || { echo "quality.sh: --warm-start '$warm': a step below --steps $steps" >&2; exit 2; }
for h in $hs; do int --inner-steps "$h"; done
num='^([0-9]+\.?[0-9]*|\.[0-9]+)$'
for o in $outers; do
  [[ $o == */* && ${o%/*} =~ $num && ${o#*/} =~ $num ]] ||
    { echo "quality.sh: --outer: '$o' is not LR/MOMENTUM, e.g. 0.7/0.9" >&2; exit 2; }
done
if [[ -n $stream ]]; then
  read -r sf stau sdt sh <<<"$stream"
  [[ ${sf:-} =~ ^[1-9][0-9]*$ && ${stau:-} =~ ^[0-9]+$ && ${sdt:-} =~ ^(fp32|bf16|int8|int4)$ && ${sh:-} =~ ^[1-9][0-9]*$ ]] ||
    { echo "quality.sh: --streaming '$stream': F TAU DTYPE H, e.g. \"4 1 int4 100\"" >&2; exit 2; }
fi
((np % rph == 0 && np / rph >= 2)) || { echo "quality.sh: --np $np over --ranks-per-host $rph: need 2 or more hosts (replicas)" >&2; exit 2; }
st=$build/bin/shardtrain
[[ -x $st ]] || { echo "quality.sh: no $st (cmake --build $build --target shardtrain)" >&2; exit 2; }
deck=$here/quality.toml
mkdir -p "$out"
out=$(cd "$out" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mpi=(mpirun --oversubscribe --bind-to none)
[[ $(id -u) == 0 ]] && mpi+=(--allow-run-as-root)

# label|ranks|warm (1: resumes the reference's step-N checkpoint)|--set arguments; the reference first
configs=("hybrid_shard every_step|$np|0|parallel.replica_sync=every_step")
# Per outer setting: every H, then the streaming variant. The label names the setting only when
# the sweep has more than one.
nouter=$(wc -w <<<"$outers")
w=$((warm > 0 ? 1 : 0))
wtag=''
((warm > 0)) && wtag=" from sync step $warm"
for o in $outers; do
  olr=${o%/*} omom=${o#*/}
  tag='' oset="diloco.outer_lr=$olr diloco.outer_momentum=$omom"
  ((nouter > 1)) && tag=" outer $olr/$omom"
  for h in $hs; do configs+=("diloco H=$h$tag$wtag|$np|$w|parallel.replica_sync=diloco diloco.inner_steps=$h $oset"); done
  [[ -n $stream ]] && configs+=("streaming H=$sh F=$sf tau=$stau $sdt$tag$wtag|$np|$w|parallel.replica_sync=diloco diloco.inner_steps=$sh diloco.fragments=$sf diloco.overlap_steps=$stau diloco.outer_dtype=$sdt $oset")
done
if ((bounds)); then
  configs+=("bound: diloco H=1 outer 1/0$wtag|$np|$w|parallel.replica_sync=diloco diloco.inner_steps=1 diloco.outer_lr=1 diloco.outer_momentum=0")
  configs+=("bound: 1 replica alone (half the tokens)|$rph|0|parallel.replica_sync=every_step")
fi
# The reference writes the checkpoint the warm runs resume (its bits do not depend on it).
ref_ckpt=()
((warm > 0)) && ref_ckpt=(--set "checkpoint.every_steps=$warm" --set checkpoint.keep_last=1048576)

common=(--set "train.max_steps=$steps" --set "train.val_every=$val_every" --set "parallel.simulate_ranks_per_host=$rph"
        --set "parallel.strategy=hybrid_shard")
[[ -n $val_batches ]] && common+=(--set "train.val_batches=$val_batches")
# Refuse before hours of training when the binary does not run a configuration (no DiLoCo yet).
for c in "${configs[@]}"; do
  IFS='|' read -r _ _ _ setlist <<<"$c"
  read -r -a sets <<<"$setlist"
  args=()
  for a in "${sets[@]}"; do args+=(--set "$a"); done
  "$st" deck check "$deck" "${common[@]}" "${args[@]}" "${extra[@]}" > "$out/deck-check.log" 2>&1 ||
    { echo "quality.sh: ${c%%|*}: the deck is refused:" >&2; tail -3 "$out/deck-check.log" >&2; exit 2; }
done

data=$root/.data/austen-byte
if [[ ! -d $data ]]; then
  data=$out/austen-byte
  [[ -d $data ]] || "$st" data prepare --source austen --tokenizer byte --out "$data" > "$out/prepare.log" 2>&1 ||
    { tail -5 "$out/prepare.log" >&2; echo "quality.sh: data prepare failed (scripts/fetch-data --for run installs the source)" >&2; exit 1; }
fi

started=$(date -u +%Y-%m-%dT%H:%MZ)
load0=$(cut -d' ' -f1 /proc/loadavg)
echo -e "config\tstep\tval_loss\twall_s" > "$out/quality.tsv"
refdir=''
for c in "${configs[@]}"; do
  IFS='|' read -r label ranks fromref setlist <<<"$c"
  read -r -a sets <<<"$setlist"
  args=()
  for a in "${sets[@]}"; do args+=(--set "$a"); done
  dir=$out/$(tr -c 'a-zA-Z0-9\n' '_' <<<"$label")
  if [[ -z $refdir ]]; then
    refdir=$dir
    args+=("${ref_ckpt[@]}")
  elif ((fromref)); then
    ck=$(printf '%s/checkpoints/step_%08d.h5' "$refdir" "$warm")
    [[ -f $ck ]] || { echo "quality.sh: the reference wrote no $ck" >&2; exit 1; }
    args+=(--set "checkpoint.resume=$ck")
  fi
  rm -rf "$dir"
  t0=$(date +%s)
  (cd "$root" && "${mpi[@]}" -np "$ranks" "$st" train "$deck" "${common[@]}" "${args[@]}" "${extra[@]}" \
    --set "data.dataset=$data" --set "run.out_dir=$dir") > "$dir.log" 2>&1 ||
    { tail -20 "$dir.log" >&2; echo "quality.sh: $label failed" >&2; exit 1; }
  wall=$(($(date +%s) - t0))
  /usr/bin/python3 - "$dir/metrics.jsonl" "$label" "$wall" >> "$out/quality.tsv" <<'PY'
import json, sys
seen = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "val_loss" in r and "step_ms" not in r:
        seen[r["step"]] = r["val_loss"]
for s in sorted(seen):
    print("%s\t%d\t%.6f\t%s" % (sys.argv[2], s, seen[s], sys.argv[3]))
PY
  echo "quality.sh: $label: $wall s" >&2
done

/usr/bin/python3 - "$out/quality.tsv" "$started" "$load0" "$(cut -d' ' -f1 /proc/loadavg)" "$steps" "$np" "$rph" > "$out/quality.md" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
started, load0, load1, steps, np_, rph = sys.argv[2:8]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
import os
configs = []
for r in rows:
    if r["config"] not in configs:
        configs.append(r["config"])
steps_v = sorted({int(r["step"]) for r in rows})
val = {(r["config"], int(r["step"])): float(r["val_loss"]) for r in rows}
wall = {r["config"]: r["wall_s"] for r in rows}
ref = configs[0]
last = steps_v[-1] if steps_v else None
print("# DiLoCo quality: perf/diloco/quality.sh, started %s; %s, %d cores; load %s at the start, %s at the end" %
      (started, cpu, os.cpu_count(), load0, load1))
print("# %s steps, %s ranks as %d hosts of %s (hybrid_shard: %d replicas); validation loss at equal tokens" %
      (steps, np_, int(np_) // int(rph), rph, int(np_) // int(rph)))
print()
print("| configuration | " + " | ".join("val loss @ %d" % s for s in steps_v) + " | last ÷ %s | within 2%% | wall s |" % ref)
print("|---|" + "---:|" * len(steps_v) + "---:|---|---:|")
for c in configs:
    cells = ["%.4f" % val[(c, s)] if (c, s) in val else "-" for s in steps_v]
    if last is not None and (c, last) in val and (ref, last) in val:
        q = val[(c, last)] / val[(ref, last)]
        ratio, ok = "%.4f" % q, ("yes" if q <= 1.02 else "NO")
    else:
        ratio, ok = "-", "-"
    print("| %s | %s | %s | %s | %s |" % (c, " | ".join(cells), ratio, ok, wall.get(c, "")))
PY
cat "$out/quality.md"
