# DiLoCo (parallel.replica_sync = "diloco", issue 30) in the training job, 4 ranks as 2 simulated
# hosts x 2 (2 replicas of a 2-rank shard group):
#   A: H = 1 with a linear inner optimizer (SGD, no momentum, no clipping), outer lr 1, no outer
#      momentum follows synchronous hybrid_shard within fp32 rounding (losses and final weights);
#   B: H = 4 with AdamW split mid-cycle at step 6 and resumed: every step's loss, grad norm and LR
#      to the last digit, and identical final checkpoints (the replicas' own states are saved);
#   C: streaming, 3 fragments of H = 6: each fragment takes its outer step once per cycle, at its
#      offset (metrics.jsonl's outer_sync events and counters), and nothing crosses between nodes
#      on the other steps;
#   D: train.reproducible: the same bits with 2 replicas of 2 ranks and of 1 rank;
#   F: overlapped outer steps (diloco.overlap_steps): a resume with an average in flight is exact;
#   G: int8 / int4 outer gradients train, send 0.254x / 0.129x fp32's bytes between nodes per sync,
#      a tiny fsdp.quant_guard_threshold falls back to fp32 with one warning, a resume after the
#      fallback keeps it and is exact, an int4 resume mid-cycle is exact;
#   E: the combinations the engine does not run exit 2 naming the key, before any record.
source "$(dirname "$0")/lib.sh"
make_dataset
NP=4
HY=(--set parallel.strategy=hybrid_shard --set parallel.simulate_ranks_per_host=2)
DL=(--set parallel.replica_sync=diloco)

# field METRICS KEY: the KEY of every training record, one per line.
field() { sed -n "/\"loss\"/s/.*\"$2\":\([^,}]*\).*/\1/p" "$1"; }

note "A: H = 1, SGD, outer lr 1, no momentum == synchronous hybrid_shard within fp32 rounding"
LIN=(--set optimizer.name=sgd --set optimizer.momentum=0 --set optimizer.weight_decay=0 --set optimizer.grad_clip=0
     --set model.dropout=0 --set checkpoint.every_steps=12)
train_ok $NP "$T/A-sync" "${HY[@]}" "${LIN[@]}"
train_ok $NP "$T/A-dl" "${HY[@]}" "${LIN[@]}" "${DL[@]}" --set diloco.inner_steps=1 --set diloco.outer_lr=1 \
  --set diloco.outer_momentum=0 --set diloco.nesterov=false
paste <(field "$T/A-sync/metrics.jsonl" loss) <(field "$T/A-dl/metrics.jsonl" loss) > "$T/A.loss"
[ "$(wc -l < "$T/A.loss")" = 12 ] || fail "A: $(wc -l < "$T/A.loss") steps compared, expected 12"
awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 2e-6 * $1) { print "step " NR ": " $1 " vs " $2; bad = 1 } }
     END { exit bad }' "$T/A.loss" || fail "A: diloco H=1 losses differ from hybrid_shard's beyond fp32 rounding"
/usr/bin/python3 - "$(ckpt_file "$T/A-sync" 12)" "$(ckpt_file "$T/A-dl" 12)" <<'PY' || fail "A: final weights differ"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
worst = 0.0
def visit(name, obj):
    global worst
    if isinstance(obj, h5py.Dataset):
        x, y = a["model"][name][()].astype(np.float64), obj[()].astype(np.float64)
        worst = max(worst, float(np.max(np.abs(x - y)) / (np.max(np.abs(x)) + 1e-30)))
b["model"].visititems(visit)
print("A: largest relative weight difference", worst)
sys.exit(0 if 0 < worst < 1e-5 or worst == 0 else 1)
PY
grep -q '"inter_node_bytes":0[,}]' "$T/A-dl/metrics.jsonl" && fail "A: H = 1 synced nothing between nodes on some step"
[ "$(grep -c '"event":"outer_sync"' "$T/A-dl/metrics.jsonl")" = 12 ] || fail "A: H = 1 did not take 12 outer steps"

note "B: H = 4, AdamW: 12 steps straight vs 6 (mid-cycle) + resume: the same bits"
B=("${HY[@]}" "${DL[@]}" --set diloco.inner_steps=4)
train_ok $NP "$T/B1" "${B[@]}"
train_ok $NP "$T/B2" "${B[@]}" --set train.max_steps=6
train_ok $NP "$T/B2" "${B[@]}"
grep -q "# resumed from $(ckpt_file "$T/B2" 6): step 6," "$T/B2.log" || fail "B did not resume from step 6"
groups=$(h5ls "$(ckpt_file "$T/B2" 6)/optim")
for g in diloco.outer_momentum diloco.local.r0 diloco.local.r1 exp_avg.r1 exp_avg_sq.r0; do
  grep -q "^$g " <<<"$groups" || fail "B: no $g in the checkpoint's /optim: $groups"
done
# Mid-cycle the replicas differ (so their own states are what makes the resume exact).
h5diff -q "$(ckpt_file "$T/B2" 6)" "$(ckpt_file "$T/B2" 6)" /optim/diloco.local.r0 /optim/diloco.local.r1 &&
  fail "B: the two replicas' masters are equal mid-cycle: nothing was trained apart"
step_table "$T/B1/metrics.jsonl" > "$T/B1.steps"
step_table "$T/B2/metrics.jsonl" > "$T/B2.steps"
[ "$(wc -l < "$T/B1.steps")" = 12 ] || fail "B1 logged $(wc -l < "$T/B1.steps") steps"
diff "$T/B1.steps" "$T/B2.steps" || fail "B: the resumed run's steps differ"
same_params "$(ckpt_file "$T/B1" 12)" "$(ckpt_file "$T/B2" 12)"
# An every_step run takes a diloco checkpoint's model (the outer copy) and goes on.
train_ok $NP "$T/B2" "${HY[@]}" --set train.max_steps=14 --set lr.decay_steps=14
grep -q '"step":14' "$T/B2/metrics.jsonl" || fail "B: every_step did not continue from the diloco checkpoint"

note "C: streaming, 3 fragments, H = 6: each fragment syncs once per cycle, at its offset"
train_ok $NP "$T/C" "${HY[@]}" "${DL[@]}" --set diloco.inner_steps=6 --set diloco.fragments=3
events=$(sed -n 's/.*"detail":"fragments \([0-9 ]*\)","event":"outer_sync","step":\([0-9]*\).*/\2:\1/p' "$T/C/metrics.jsonl" | tr '\n' ' ')
[ "$events" = "2:1 4:2 6:0 8:1 10:2 12:0 " ] || fail "C: outer_sync events '$events', expected 2:1 4:2 6:0 8:1 10:2 12:0"
last=$(grep '"step":12' "$T/C/metrics.jsonl" | grep '"loss"')
grep -q '"fragment_syncs":6' <<<"$last" || fail "C: step 12 record: $last (expected fragment_syncs 6)"
grep -q '"outer_steps":2' <<<"$last" || fail "C: step 12 record: $last (expected outer_steps 2)"
paste -d' ' <(field "$T/C/metrics.jsonl" step) <(field "$T/C/metrics.jsonl" inter_node_bytes) > "$T/C.bytes"
awk '{ synced = ($1 % 2 == 0); if (synced != ($2 > 0)) { print "step " $1 ": " $2 " bytes between nodes"; bad = 1 } }
     END { exit bad }' "$T/C.bytes" || fail "C: bytes between nodes on steps without an outer step (or none on one)"
sync_bytes=$(awk '$1 == 6 { print $2 }' "$T/C.bytes")
echo "C: inter-node bytes on a fragment's sync step: $sync_bytes; on the others: 0"

note "D: train.reproducible: 2 replicas x 2 ranks and 2 replicas x 1 rank give the same bits"
R=("${DL[@]}" --set diloco.inner_steps=3 --set train.reproducible=true --set parallel.strategy=hybrid_shard)
train_ok 4 "$T/D4" "${R[@]}" --set parallel.simulate_ranks_per_host=2 --set train.max_steps=6
train_ok 2 "$T/D2" "${R[@]}" --set parallel.simulate_ranks_per_host=1 --set train.max_steps=6
h5diff -q "$(ckpt_file "$T/D4" 6)" "$(ckpt_file "$T/D2" 6)" /model /model ||
  fail "D: the reproducible model differs between shard groups of 2 and 1"
diff <(field "$T/D4/metrics.jsonl" loss) <(field "$T/D2/metrics.jsonl" loss) || fail "D: losses differ"

note "F: overlapped outer steps (2 fragments, H = 6, tau = 2): 12 straight vs 7 + resume, an average in flight at the save"
F=("${HY[@]}" "${DL[@]}" --set diloco.inner_steps=6 --set diloco.fragments=2 --set diloco.overlap_steps=2)
train_ok $NP "$T/F1" "${F[@]}"
train_ok $NP "$T/F2" "${F[@]}" --set train.max_steps=7
train_ok $NP "$T/F2" "${F[@]}"
grep -q "# resumed from $(ckpt_file "$T/F2" 7): step 7," "$T/F2.log" || fail "F did not resume from step 7"
h5ls "$(ckpt_file "$T/F2" 7)/optim" | grep -q "^diloco.issue.r1 " || fail "F: no pending state in the checkpoint"
# Fragment 0's average, issued after step 6, lands after step 8: at the save after step 7 it is in flight.
/usr/bin/python3 - "$(ckpt_file "$T/F2" 7)" <<'PY' || fail "F: the checkpoint at step 7 holds no average in flight"
import sys, h5py, numpy as np
g = h5py.File(sys.argv[1], "r")["optim/diloco.pending_avg"]
sys.exit(0 if any(np.any(g[n][()] != 0) for n in g) else 1)
PY
step_table "$T/F1/metrics.jsonl" > "$T/F1.steps"
step_table "$T/F2/metrics.jsonl" > "$T/F2.steps"
diff "$T/F1.steps" "$T/F2.steps" || fail "F: the resumed overlapped run's steps differ"
same_params "$(ckpt_file "$T/F1" 12)" "$(ckpt_file "$T/F2" 12)"
# Steps 1-3 run before any average is applied (tau = 0 applies the first after step 3, tau = 2 after step 5).
train_ok $NP "$T/F0" "${F[@]}" --set diloco.overlap_steps=0 --set train.max_steps=6
diff <(field "$T/F0/metrics.jsonl" loss | sed -n 1,3p) <(field "$T/F1/metrics.jsonl" loss | sed -n 1,3p) ||
  fail "F: tau = 2 changed the steps before the first average landed"
[ "$(field "$T/F0/metrics.jsonl" loss | sed -n 6p)" != "$(field "$T/F1/metrics.jsonl" loss | sed -n 6p)" ] ||
  fail "F: tau = 2 and tau = 0 give the same loss at step 6"

note "G: int8 / int4 outer gradients (H = 4): train, fewer bytes between nodes per sync, the guard, exact int4 resume"
G=("${HY[@]}" "${DL[@]}" --set diloco.inner_steps=4)
train_ok $NP "$T/G32" "${G[@]}"
train_ok $NP "$T/G8" "${G[@]}" --set diloco.outer_dtype=int8
train_ok $NP "$T/G4" "${G[@]}" --set diloco.outer_dtype=int4
for r in G8 G4; do
  field "$T/$r/metrics.jsonl" loss | awk -v r=$r 'NR == 1 { first = $1 } { if ($1 != $1 + 0 || $1 ~ /nan|inf/) bad = 1; last = $1 }
    END { if (bad || !(last < first)) { print r ": losses not finite or not falling: " first " -> " last; exit 1 } }' ||
    fail "$r did not train"
  # The first sync of a fragment is a guard sync (fsdp.quant_guard_every = 50: syncs 0, 50, ...).
  grep -q '"outer_quant_err":' "$T/$r/metrics.jsonl" || fail "$r: no outer_quant_err in metrics.jsonl"
  grep -q '"outer_fallbacks":0' "$T/$r/metrics.jsonl" || fail "$r: the guard fell back at the default threshold"
done
# Bytes between nodes at the second sync (step 8: no guard), per the wire format: 2 replicas, so an
# fp32 ring all-reduce sends 4n per rank, an int8 all-gather n + 4 n / 256 (block 256's scales),
# int4 n / 2 + 4 n / 256, plus each flat's padding to 4 bytes.
b32=$(grep '"step":8,' "$T/G32/metrics.jsonl" | grep '"loss"' | sed 's/.*"inter_node_bytes":\([0-9.e+]*\).*/\1/')
b8=$(grep '"step":8,' "$T/G8/metrics.jsonl" | grep '"loss"' | sed 's/.*"inter_node_bytes":\([0-9.e+]*\).*/\1/')
b4=$(grep '"step":8,' "$T/G4/metrics.jsonl" | grep '"loss"' | sed 's/.*"inter_node_bytes":\([0-9.e+]*\).*/\1/')
awk -v a="$b32" -v b="$b8" -v c="$b4" 'BEGIN {
  printf "G: inter-node bytes at a sync: fp32 %s, int8 %s (%.4fx), int4 %s (%.4fx)\n", a, b, b / a, c, c / a
  exit !(a > 0 && b / a > 0.2539 && b / a < 0.256 && c / a > 0.1289 && c / a < 0.131) }' ||
  fail "G: int8 / int4 bytes per sync not 0.254x / 0.129x fp32's ($b8, $b4 vs $b32)"
# A tiny threshold: the first guard sync falls back (one warning), later syncs run in fp32.
train_ok $NP "$T/Gf" "${G[@]}" --set diloco.outer_dtype=int8 --set fsdp.quant_guard_threshold=1e-9
[ "$(grep -c 'accuracy guard: the int8 outer average of diloco fragment 0' "$T/Gf.log")" = 1 ] ||
  fail "Gf: expected one fallback warning: $(grep 'accuracy guard' "$T/Gf.log")"
grep -q '"outer_fallbacks":1' "$T/Gf/metrics.jsonl" || fail "Gf: no outer_fallbacks 1 in metrics.jsonl"
bf=$(grep '"step":8,' "$T/Gf/metrics.jsonl" | grep '"loss"' | sed 's/.*"inter_node_bytes":\([0-9.e+]*\).*/\1/')
[ "$bf" = "$b32" ] || fail "Gf: after the fallback a sync sent $bf bytes between nodes, fp32 sends $b32"
# The fallback travels in the checkpoint: split after it (step 6) and resumed, the run goes on in
# fp32 with no second warning, and gives the bits of the uninterrupted one (a resume that came
# back quantized would differ at the step-8 sync).
train_ok $NP "$T/Gfr" "${G[@]}" --set diloco.outer_dtype=int8 --set fsdp.quant_guard_threshold=1e-9 --set train.max_steps=6
train_ok $NP "$T/Gfr" "${G[@]}" --set diloco.outer_dtype=int8 --set fsdp.quant_guard_threshold=1e-9
grep -q "# resumed from $(ckpt_file "$T/Gfr" 6): step 6," "$T/Gfr.log" || fail "Gfr did not resume from step 6"
[ "$(grep -c 'accuracy guard: the int8 outer average' "$T/Gfr.log")" = 1 ] ||
  fail "Gfr: expected the one fallback warning of the first part: $(grep 'accuracy guard' "$T/Gfr.log")"
grep '"step":12,' "$T/Gfr/metrics.jsonl" | grep '"loss"' | grep -q '"outer_fallbacks":1' ||
  fail "Gfr: the resumed run does not count the checkpoint's fallback"
step_table "$T/Gf/metrics.jsonl" > "$T/Gf.steps"
step_table "$T/Gfr/metrics.jsonl" > "$T/Gfr.steps"
diff "$T/Gf.steps" "$T/Gfr.steps" || fail "G: the run resumed after a fallback differs from the uninterrupted one"
same_params "$(ckpt_file "$T/Gf" 12)" "$(ckpt_file "$T/Gfr" 12)"
# int4, split mid-cycle at step 6 and resumed: the same bits.
train_ok $NP "$T/G4r" "${G[@]}" --set diloco.outer_dtype=int4 --set train.max_steps=6
train_ok $NP "$T/G4r" "${G[@]}" --set diloco.outer_dtype=int4
grep -q "# resumed from $(ckpt_file "$T/G4r" 6): step 6," "$T/G4r.log" || fail "G4r did not resume from step 6"
step_table "$T/G4/metrics.jsonl" > "$T/G4.steps"
step_table "$T/G4r/metrics.jsonl" > "$T/G4r.steps"
diff "$T/G4.steps" "$T/G4r.steps" || fail "G: the resumed int4 run's steps differ"
same_params "$(ckpt_file "$T/G4" 12)" "$(ckpt_file "$T/G4r" 12)"

note "E: combinations the engine does not run exit 2 naming the key"
refused() {  # KEY OUT -- --set ...
  local key=$1 out=$2; shift 2
  train $NP "$out" "$@"
  [ "$RC" = 2 ] || { tail -5 "$out.log"; fail "$out: exit $RC, expected 2"; }
  grep -q "$key" "$out.log" || { tail -5 "$out.log"; fail "$out: the error does not name $key"; }
  [ ! -e "$out/metrics.jsonl" ] || fail "$out: refused, but metrics were written"
}
refused parallel.replica_sync "$T/E1" "${DL[@]}" --set parallel.strategy=full_shard
refused fsdp.quantize_grads "$T/E2" "${HY[@]}" "${DL[@]}" --set fsdp.quantize_grads=true
refused diloco.fragments "$T/E3" "${HY[@]}" "${DL[@]}" --set diloco.fragments=4
refused diloco.overlap_steps "$T/E4" "${HY[@]}" "${DL[@]}" --set diloco.inner_steps=4 --set diloco.fragments=2 \
  --set diloco.overlap_steps=2
refused diloco.outer_dtype "$T/E5" "${HY[@]}" "${DL[@]}" --set diloco.outer_dtype=int4 --set train.reproducible=true
grep -q 'parallel.replica_sync = "diloco"' "$T/E1.log" || fail "E1: the error does not show the value"

note "OK: diloco H=1 == hybrid_shard; exact mid-cycle resume; fragments once per cycle; reproducible; int8/int4 with the guard; refusals"
