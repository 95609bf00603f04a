#!/usr/bin/env bash
# e2e test of jobscripts/scaling-study: bad flags fail cleanly (exit 2, one line naming the
# flag); a tiny study (tiny-study.toml: 5 runs of 1-2 ranks, 3 steps) runs end to end with the
# mpirun launcher; the CSV has the right rows and columns; the report and its PNGs exist; a
# second `run` skips the finished points; the Slurm launcher, with stub sbatch/srun on PATH,
# writes array jobs whose tasks run points and a dependent job that collects and reports.
# Usage: bash check_study.sh SHARDTRAIN MPIEXEC
set -euo pipefail
ST=$1; MPIEXEC=$2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SS=$HERE/../../../jobscripts/scaling-study
DECK=$HERE/../train/tiny.toml
export OMP_NUM_THREADS=1
# The interpreter itself, not a wrapper such as a pyenv shim (~1.5 s per start on a busy machine).
PY=$(python3 -c 'import sys; print(sys.executable)')
T=$(mktemp -d "${TMPDIR:-/tmp}/shardtrain-study-XXXXXX")
cleanup() { if [ "${KEEP_TMP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
note() { echo "== [$SECONDS s] $*"; }
cd "$T"

# A byte-token dataset from deterministic text (~40 KB).
awk 'BEGIN { srand(11); split("the of and to a in that it was her she not be his as had with for he you", w, " ");
             for (l = 0; l < 800; ++l) { s = ""; for (i = 0; i < 9; ++i) s = s w[int(rand() * 20) + 1] " ";
             print toupper(substr(s, 1, 1)) substr(s, 2) "." } }' > text.txt
"$ST" data prepare --source text.txt --tokenizer byte --out data > prepare.log 2>&1 || { cat prepare.log; fail "data prepare"; }

# expect_bad TEXT ARGS...: exit code 2 and exactly one 'scaling-study: error: ...' line containing TEXT.
expect_bad() {
  local want=$1; shift
  set +e
  "$PY" "$SS" "$@" > bad.out 2> bad.err
  local rc=$?
  set -e
  [ "$rc" = 2 ] || { cat bad.out bad.err; fail "scaling-study $* exited $rc (expected 2)"; }
  [ "$(wc -l < bad.err)" = 1 ] || { cat bad.err; fail "scaling-study $*: expected one line on stderr"; }
  grep -q '^scaling-study: error: ' bad.err || { cat bad.err; fail "scaling-study $*: not an error line"; }
  grep -qF -- "$want" bad.err || { cat bad.err; fail "scaling-study $*: stderr does not mention '$want'"; }
  echo "   rejected as expected: $(cat bad.err)"
}
note "bad input fails cleanly"
expect_bad "--strategies: unknown value 'zero3'" plan bad --bin "$ST" --deck "$DECK" --strategies full_shard,zero3
expect_bad "--hosts 2 does not divide --ranks 3" plan bad --bin "$ST" --deck "$DECK" --ranks 2,3 --hosts 2
expect_bad "--ranks-per-host 2 does not divide --ranks 3" plan bad --bin "$ST" --deck "$DECK" --ranks 1,3 --ranks-per-host 2
expect_bad "--ranks: '0' must be a positive integer" plan bad --bin "$ST" --deck "$DECK" --ranks 0,2
expect_bad "--modes: unknown value 'sideways'" plan bad --bin "$ST" --deck "$DECK" --modes sideways
expect_bad "--steps 2 must exceed --warmup 2" plan bad --bin "$ST" --deck "$DECK" --steps 2
expect_bad "--bin: shardtrain binary '$T/no-such-binary' not found" plan bad --bin "$T/no-such-binary" --deck "$DECK"
expect_bad "--deck $T/missing.toml: no such file" plan bad --bin "$ST" --deck "$T/missing.toml"
expect_bad "--global-batch 9 is not divisible by 2 ranks" plan bad --bin "$ST" --deck "$DECK" --global-batch 9 \
  --set data.dataset="$T/data"
expect_bad "rejects it: --set train.micro_batch=-1: must be >= 1" plan bad --bin "$ST" --deck "$DECK" --set train.micro_batch=-1
printf 'deck = "%s"\nrnaks = [1, 2]\n' "$DECK" > bad-spec.toml
expect_bad "--spec bad-spec.toml: unknown key 'rnaks'" plan bad --spec bad-spec.toml --bin "$ST"
expect_bad "no study.json here" run "$T/nowhere"
[ ! -e bad/study.json ] || fail "a rejected plan wrote bad/study.json"

note "a tiny study with the mpirun launcher"
start=$(date +%s)
"$PY" "$SS" all study --spec "$HERE/tiny-study.toml" --bin "$ST" --mpirun "$MPIEXEC" \
  --set data.dataset="$T/data" > all.log 2>&1 || { cat all.log; for f in study/runs/*/stderr.log; do echo "--- $f"; tail -5 "$f"; done; fail "scaling-study all"; }
cat all.log
echo "   study took $(( $(date +%s) - start )) s"

"$PY" - study/results.csv study/report/results.csv <<'PY' || fail "results.csv"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
need = ["id", "mode", "strategy", "ranks", "hosts", "ranks_per_host", "global_batch", "micro_batch", "tokens_per_s",
        "step_ms", "peak_mem_mib", "exposed_comm_share", "mfu", "final_loss", "speedup", "efficiency", "status"]
cols = list(rows[0].keys()) if rows else []
missing = [c for c in need if c not in cols]
assert not missing, "missing columns %s in %s" % (missing, cols)
want = {"strong-full_shard-n1-h1": (1, 1, 8, 8), "strong-full_shard-n2-h1": (2, 1, 8, 4),
        "strong-hybrid_shard-n2-h2": (2, 2, 8, 4), "weak-full_shard-n1-h1": (1, 1, 2, 2),
        "weak-full_shard-n2-h1": (2, 1, 4, 2)}
got = {r["id"]: r for r in rows}
assert sorted(got) == sorted(want), "rows %s, expected %s" % (sorted(got), sorted(want))
for i, (n, h, gb, mb) in want.items():
    r = got[i]
    assert r["status"] == "ok", (i, r["status"])
    assert (int(r["ranks"]), int(r["hosts"]), int(r["global_batch"]), int(r["micro_batch"])) == (n, h, gb, mb), (i, r)
    assert int(r["ranks_per_host"]) == n // h and int(r["timed_steps"]) == 2, (i, r)
    assert float(r["tokens_per_s"]) > 0 and float(r["step_ms"]) > 0 and float(r["peak_mem_mib"]) > 10, (i, r)
    assert 0 <= float(r["exposed_comm_share"]) <= 1 and float(r["final_loss"]) > 0, (i, r)
    assert abs(float(r["efficiency"]) * n - float(r["speedup"])) < 1e-3 * float(r["speedup"]), (i, r)
    if n == 1:
        assert abs(float(r["efficiency"]) - 1) < 1e-9, (i, r["efficiency"])
assert got["strong-hybrid_shard-n2-h2"]["shard_size"] == "1" and got["strong-hybrid_shard-n2-h2"]["replicate_size"] == "2"
assert open(sys.argv[2]).read() == open(sys.argv[1]).read(), "report/results.csv differs"
print("   results.csv: %d rows, %d columns, all ok" % (len(rows), len(cols)))
PY
[ -s study/report/report.md ] || fail "no report.md"
for id in strong-full_shard-n2-h1 strong-hybrid_shard-n2-h2 weak-full_shard-n2-h1; do
  grep -q "$id" study/report/results.csv || fail "results.csv lacks $id"
done
grep -q '^## Strong scaling' study/report/report.md && grep -q '^## Weak scaling' study/report/report.md ||
  fail "report.md lacks the strong/weak tables"
for png in throughput efficiency memory comm; do
  f=study/report/$png.png
  [ "$(stat -c %s "$f" 2>/dev/null || echo 0)" -gt 5000 ] || fail "$f missing or tiny"
  [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = "211PNG" ] || fail "$f is not a PNG"
  grep -q "]($png.png)" study/report/report.md || fail "report.md does not show $png.png"
done
[ "$(ls study/runs/strong-full_shard-n2-h1/checkpoints 2>/dev/null | wc -l)" = 0 ] || fail "checkpoints were kept"

note "a second run skips the finished points"
"$PY" "$SS" run study --mpirun "$MPIEXEC" > rerun.log 2>&1 || { cat rerun.log; fail "rerun"; }
grep -q "5 of 5 points already done" rerun.log || { cat rerun.log; fail "rerun did not skip"; }

note "the Slurm launcher (stub sbatch/srun on PATH)"
mkdir fakebin
cat > fakebin/sbatch <<'SH'
#!/usr/bin/env bash
# Stub: runs an array job's tasks one after the other now, then prints a job id (--parsable).
script=${!#}
id=$(( 1000 + $(ls "$FAKE_SLURM_DIR"/*.args 2>/dev/null | wc -l) ))
echo "sbatch $*" > "$FAKE_SLURM_DIR/job-$id.args"
last=$(sed -n 's/^#SBATCH --array=0-\([0-9]*\).*/\1/p' "$script")
if [ -n "$last" ]; then
  for i in $(seq 0 "$last"); do
    SLURM_JOB_ID=$id SLURM_ARRAY_TASK_ID=$i bash "$script" >> "$FAKE_SLURM_DIR/job-$id.out" 2>&1 || exit 1
  done
else
  SLURM_JOB_ID=$id bash "$script" >> "$FAKE_SLURM_DIR/job-$id.out" 2>&1 || exit 1
fi
echo "$id"
SH
cat > fakebin/srun <<'SH'
#!/usr/bin/env bash
# Stub: srun [--mpi=X] [--cpu-bind=Y] [-c C] -n N [-N M] [--ntasks-per-node K] CMD... -> mpirun -np N CMD...
np=1
while [ $# -gt 0 ]; do
  case $1 in
    --mpi=*|--cpu-bind=*) shift ;;
    -n) np=$2; shift 2 ;;
    -N|-c|--ntasks-per-node) shift 2 ;;
    *) break ;;
  esac
done
flags=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
exec "$FAKE_MPIEXEC" "${flags[@]}" -np "$np" "$@"
SH
chmod +x fakebin/sbatch fakebin/srun
export FAKE_SLURM_DIR=$T/fake-slurm FAKE_MPIEXEC=$MPIEXEC
mkdir "$FAKE_SLURM_DIR"
"$PY" "$SS" run study --launcher slurm --dry-run --force > dry.log 2>&1 || { cat dry.log; fail "slurm dry run"; }
grep -q "would submit: sbatch --parsable .*n2-sim.sbatch   (3 tasks)" dry.log || { cat dry.log; fail "dry run plan"; }
grep -q "^#SBATCH --array=0-2$" study/slurm/n2-sim.sbatch || fail "n2-sim.sbatch: no 3-task array"
grep -q '^#SBATCH --ntasks=2$' study/slurm/n2-sim.sbatch || fail "n2-sim.sbatch: ntasks"
[ "$(ls "$FAKE_SLURM_DIR" | wc -l)" = 0 ] || fail "the dry run submitted something"
rm -f study/report/*.png
PATH=$T/fakebin:$PATH "$PY" "$SS" run study --launcher slurm --only=-n1- --force > slurm.log 2>&1 ||
  { cat slurm.log; cat "$FAKE_SLURM_DIR"/*.out 2>/dev/null; fail "slurm launcher"; }
cat slurm.log
grep -q "submitted .*n1-sim.sbatch as job 1000 (2 tasks)" slurm.log || fail "array job not submitted"
grep -q "dependency=afterany:1000 " "$FAKE_SLURM_DIR"/job-1001.args || fail "report job without dependency"
for id in strong-full_shard-n1-h1 weak-full_shard-n1-h1; do
  grep -q '"launcher": "srun"' "study/runs/$id/status.json" || fail "$id was not rerun through srun"
  grep -q '"slurm_job": "1000"' "study/runs/$id/status.json" || fail "$id: no Slurm job id"
done
grep -q '"launcher": "mpirun"' study/runs/strong-full_shard-n2-h1/status.json || fail "--only reran other points"
[ -s study/report/throughput.png ] || fail "the report job did not redraw the plots"
echo "PASS"
