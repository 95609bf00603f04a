#!/usr/bin/env bash
# run.sh: parallel `data prepare` on a JSONL corpus of the Austen novels (one paragraph a line,
# the novels repeated COPIES times): wall time at 1 rank x 1 thread, 2 ranks x 1 thread and
# 1 rank x 2 threads, the ratios to the first measured in this run, and that the three outputs
# are byte-identical. One table per corpus size: every run pays a fixed ~1 s (process start with
# libtorch, MPI start, the tokenizer's files; mpirun itself at 2 ranks) that no rank count
# divides, so the ratio on the small corpus says more about start-up than about the prepare.
#   perf/prepare/run.sh [build-dir]     (default build/; needs bin/shardtrain)
# Env: COPIES (default "4 32 128": ~17, ~135 and ~540 MB), TOKENIZER (default gpt2), REPS (default 2: best of).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
build="${1:-$root/build}"
st="$build/bin/shardtrain"
[ -x "$st" ] || { echo "no $st: cmake --build $build -j2 --target shardtrain" >&2; exit 1; }
COPIES=${COPIES:-"4 32 128"} TOKENIZER=${TOKENIZER:-gpt2} REPS=${REPS:-2}
work=$(mktemp -d "${TMPDIR:-/tmp}/prepare-bench-XXXXXX")
trap 'rm -rf "$work"' EXIT
mpi=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
"$st" data extract-austen --out "$work/novels" >/dev/null
best() {  # best wall seconds of REPS runs of "$@"
  local b=""
  for _ in $(seq "$REPS"); do
    local t0 t1
    t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N)
    b=$(echo "$t0 $t1 ${b:-1e9}" | awk '{d=$2-$1; print (d<$3)?d:$3}')
  done
  echo "$b"
}
make_corpus() {  # make_corpus COPIES: $work/austen.jsonl
/usr/bin/python3 - "$work/novels" "$work/austen.jsonl" "$1" <<'PY'
import glob, json, sys
novels, out, copies = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(out, "w") as f:
    for c in range(copies):
        for p in sorted(glob.glob(novels + "/*.txt")):
            for para in open(p, encoding="utf-8").read().split("\n\n"):
                if para.strip(): f.write(json.dumps({"text": para}) + "\n")
PY
}
for copies in $COPIES; do
  make_corpus "$copies"
  mb=$(du -m "$work/austen.jsonl" | cut -f1)
  echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); corpus $mb MB JSONL ($copies copies), $TOKENIZER"
  t11=$(best "$st" data prepare --tokenizer "$TOKENIZER" --source "$work/austen.jsonl" --out "$work/o11" --threads 1 --progress-every 0)
  t21=$(best "${mpi[@]}" -np 2 "$st" data prepare --tokenizer "$TOKENIZER" --source "$work/austen.jsonl" --out "$work/o21" --threads 1 --progress-every 0)
  t12=$(best "$st" data prepare --tokenizer "$TOKENIZER" --source "$work/austen.jsonl" --out "$work/o12" --threads 2 --progress-every 0)
  for o in o21 o12; do
    for f in train.bin val.bin; do cmp -s "$work/o11/$f" "$work/$o/$f" || { echo "MISMATCH: $o/$f"; exit 1; }; done
  done
  echo "| layout | wall s | / 1 rank x 1 thread | MB/s |"
  echo "|---|---:|---:|---:|"
  for row in "1 rank x 1 thread:$t11" "2 ranks x 1 thread:$t21" "1 rank x 2 threads:$t12"; do
    name=${row%%:*} t=${row##*:}
    awk -v n="$name" -v t="$t" -v b="$t11" -v mb="$mb" 'BEGIN{printf "| %s | %.2f | %.2f | %.1f |\n", n, t, t/b, mb/t}'
  done
  echo "outputs byte-identical: yes"
  echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  rm -rf "$work"/o?? "$work/austen.jsonl"
done
