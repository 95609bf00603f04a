# run.out_dir on a file system that fills up during training: metrics.jsonl cannot take the
# next record. Every rank must exit 5 naming metrics.jsonl and the reason (before: rc 0 with
# the file cut mid-line and an empty summary.json), the file must hold whole records only,
# summary.json must not exist half-written, and a rerun with space resumes from the last
# checkpoint (in another directory) and completes the metrics.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/io_lib.sh"
NP=2
LIMIT=90
make_dataset
tmpfs "$T/out" 512k
mkdir -p "$T/ck"
# What a run's out_dir holds besides the records (deck.resolved.toml, lock, summary, one
# page of metrics), measured with a 1-step run on the same tmpfs; then the space is cut to
# that plus one page: about three pages (~36 records of ~330 bytes) fit, 60 do not.
FREE0=$(free_bytes "$T/out")
LOG=$T/P.log train_limited $NP "$T/out/probe" $LIMIT --set checkpoint.dir="$T/ck.probe" --set train.max_steps=1
expect_rc 0 "$T/P.log" "probe run"
USED=$(( FREE0 - $(free_bytes "$T/out") ))
rm -rf "$T/out/probe"
fill "$T/out" $(( USED + 4096 ))
note "out_dir with $(free_bytes "$T/out") bytes free (a 1-step run used $USED)"
RUN=(--set checkpoint.dir="$T/ck" --set train.max_steps=60 --set lr.decay_steps=60 --set checkpoint.every_steps=10)
LOG=$T/M.log train_limited $NP "$T/out/run" $LIMIT "${RUN[@]}"
expect_rc 5 "$T/M.log" "metrics on a full out_dir"
note "exit 5 after ${ELAPSED}s"
M=$T/out/run/metrics.jsonl
grep -q "^error: .*$M: write failed: No space left on device" "$T/M.log" ||
  { grep -i error "$T/M.log"; fail "the message does not name metrics.jsonl and the reason"; }
[ -s "$M" ] || fail "no metrics were written at all"
[ "$(tail -c 1 "$M" | od -An -c | tr -d ' ')" = '\n' ] || fail "metrics.jsonl ends inside a record"
python3 - "$M" <<'PY' || fail "metrics.jsonl holds a line that is not a whole JSON record"
import json, sys
for n, line in enumerate(open(sys.argv[1]), 1):
    json.loads(line)
PY
N=$(wc -l < "$M")
(( N > 10 && N < 60 )) || fail "metrics.jsonl has $N records; the disk should fill between step 10 and 60"
[ ! -e "$T/out/run/summary.json" ] || python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$T/out/run/summary.json" ||
  fail "summary.json is not valid JSON"
! grep -q "Segmentation\|signal 11" "$T/M.log" || fail "a rank crashed"

note "rerun with space: resumes from the last checkpoint, metrics complete"
LAST=$(cat "$T/ck/latest")
rm -f "$T/out/filler"
LOG=$T/M.log train_limited $NP "$T/out/run" $LIMIT "${RUN[@]}"
expect_rc 0 "$T/M.log" "rerun with space"
grep -q "# resumed from $T/ck/$LAST: step" "$T/M.log" || fail "the rerun did not resume from $LAST"
python3 - "$M" <<'PY' || fail "the metrics after the rerun are not steps 1..60 once each"
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1])]
assert steps == list(range(1, 61)), steps
PY
python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$T/out/run/summary.json" || fail "summary.json is not valid JSON"
note "OK: a full out_dir ends the job with exit 5, metrics.jsonl keeps whole records, the rerun completes them"
