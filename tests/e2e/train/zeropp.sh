# ZeRO++-style quantized collectives in the training job, 4 ranks as 2 simulated hosts x 2:
# hybrid_shard with int8 weight gathers and int8 replica averages (error feedback) resumes
# exactly (the residuals are checkpointed: a run split at step 5 logs every step's loss, grad
# norm and LR to the last digit of the uninterrupted run's, with identical final checkpoints);
# metrics.jsonl carries the byte counters and the guard's errors, and the quantized run sends
# under half the unquantized run's bytes between nodes; the combinations the engine does not
# run exit 2 naming the key; the guard's fallbacks travel in the checkpoint (F).
source "$(dirname "$0")/lib.sh"
make_dataset
NP=4
Q=(--set parallel.strategy=hybrid_shard --set parallel.simulate_ranks_per_host=2
   --set fsdp.quantize_weights=true --set fsdp.quantize_grads=true --set fsdp.quant_block=64
   --set fsdp.quant_guard_every=4)

note "A: 12 quantized steps uninterrupted"
train_ok $NP "$T/A" "${Q[@]}"
step_table "$T/A/metrics.jsonl" > "$T/A.steps"
[ "$(wc -l < "$T/A.steps")" = 12 ] || fail "A logged $(wc -l < "$T/A.steps") steps, expected 12"
grep -q '"quant_grad_err":' "$T/A/metrics.jsonl" || fail "A: no quant_grad_err in metrics.jsonl"
grep -q '"quant_weight_err":' "$T/A/metrics.jsonl" || fail "A: no quant_weight_err in metrics.jsonl"
grep -q '"quant_fallbacks":0' "$T/A/metrics.jsonl" || fail "A: the guard fell back at the default threshold"

note "B: 5 steps, then resume=auto to 12: the residuals come back from the checkpoint"
train_ok $NP "$T/B" "${Q[@]}" --set train.max_steps=5
train_ok $NP "$T/B" "${Q[@]}"
grep -q "# resumed from $(ckpt_file "$T/B" 5): step 5," "$T/B.log" || fail "B did not report resuming from step 5"
groups=$(h5ls "$(ckpt_file "$T/B" 5)/optim")
grep -q "^qgz_residual.r1 " <<<"$groups" || fail "B: no residual datasets in the checkpoint: $groups"
step_table "$T/B/metrics.jsonl" > "$T/B.steps"
diff "$T/A.steps" "$T/B.steps" || fail "B's steps differ from A's"
same_params "$(ckpt_file "$T/A" 12)" "$(ckpt_file "$T/B" 12)"

note "F: a tiny threshold falls back at the first guard step; split at 5 and resumed, the fallbacks hold: the same bits"
TF=("${Q[@]}" --set fsdp.quant_guard_threshold=1e-12)
train_ok $NP "$T/F1" "${TF[@]}"
train_ok $NP "$T/F2" "${TF[@]}" --set train.max_steps=5
train_ok $NP "$T/F2" "${TF[@]}"
grep -q "# resumed from $(ckpt_file "$T/F2" 5): step 5," "$T/F2.log" || fail "F2 did not resume from step 5"
w1=$(grep -c 'accuracy guard: the quantized' "$T/F1.log")
[ "$w1" -gt 0 ] || fail "F1: the tiny threshold did not fall back"
[ "$(grep -c 'accuracy guard: the quantized' "$T/F2.log")" = "$w1" ] ||
  fail "F2: the resumed run warned again (flats came back quantized): $(grep -c 'accuracy guard' "$T/F2.log") vs $w1"
f1=$(grep '"step":12,' "$T/F1/metrics.jsonl" | grep '"loss"' | sed 's/.*"quant_fallbacks":\([0-9]*\).*/\1/')
f2=$(grep '"step":12,' "$T/F2/metrics.jsonl" | grep '"loss"' | sed 's/.*"quant_fallbacks":\([0-9]*\).*/\1/')
[ -n "$f1" ] && [ "$f1" = "$f2" ] || fail "F: quant_fallbacks at step 12: '$f1' uninterrupted vs '$f2' resumed"
step_table "$T/F1/metrics.jsonl" > "$T/F1.steps"
step_table "$T/F2/metrics.jsonl" > "$T/F2.steps"
diff "$T/F1.steps" "$T/F2.steps" || fail "F: the run resumed after fallbacks differs from the uninterrupted one"
same_params "$(ckpt_file "$T/F1" 12)" "$(ckpt_file "$T/F2" 12)"

note "C: the same without quantization: more bytes between nodes, the same inside"
train_ok $NP "$T/C" --set parallel.strategy=hybrid_shard --set parallel.simulate_ranks_per_host=2 --set train.max_steps=3
bytes() { sed -n "s/.*\"$2\":\([0-9.e+]*\).*/\1/p" "$1" | sed -n 2p; }
qa=$(bytes "$T/A/metrics.jsonl" inter_node_bytes); qc=$(bytes "$T/C/metrics.jsonl" inter_node_bytes)
ia=$(bytes "$T/A/metrics.jsonl" intra_node_bytes); ic=$(bytes "$T/C/metrics.jsonl" intra_node_bytes)
awk -v a="$qa" -v c="$qc" 'BEGIN { exit !(c > 0 && a / c < 0.5) }' ||
  fail "inter-node bytes per step: quantized $qa vs $qc unquantized (expected < 0.5x)"
awk -v a="$ia" -v c="$ic" 'BEGIN { exit !(c > 0 && a > 0) }' || fail "intra-node bytes: quantized $ia, unquantized $ic"
echo "inter-node bytes/step: quantized $qa, unquantized $qc; intra-node: $ia vs $ic"

note "D: combinations the engine does not run exit 2 naming the key"
refused() {  # KEY OUT -- --set ...
  local key=$1 out=$2; shift 2
  train 1 "$out" "$@"
  [ "$RC" = 2 ] || { tail -5 "$out.log"; fail "$out: exit $RC, expected 2"; }
  grep -q "$key" "$out.log" || { tail -5 "$out.log"; fail "$out: the error does not name $key"; }
  [ ! -e "$out/metrics.jsonl" ] || fail "$out: refused, but metrics were written"
}
refused fsdp.quantize_grads "$T/D1" --set parallel.strategy=full_shard --set fsdp.quantize_grads=true
refused fsdp.quantize_grads "$T/D2" --set parallel.strategy=shard_grad_op --set fsdp.quantize_grads=true
refused fsdp.quantize_weights "$T/D3" --set parallel.strategy=no_shard --set fsdp.quantize_weights=true
refused fsdp.quantize_weights "$T/D4" --set fsdp.quantize_weights=true --set fsdp.cpu_offload=true
refused fsdp.secondary_shards "$T/D5" --set parallel.strategy=hybrid_shard --set fsdp.secondary_shards=true

note "E: the other combinations the engine runs train (2 steps each)"
for combo in "shard_grad_op fsdp.quantize_weights=true" \
             "hybrid_shard_zero2 fsdp.quantize_weights=true fsdp.quantize_grads=true" \
             "full_shard fsdp.quantize_weights=true fsdp.secondary_shards=true"; do
  read -r strat keys <<<"$combo"
  sets=(--set parallel.strategy="$strat" --set parallel.simulate_ranks_per_host=2 --set train.max_steps=2)
  for k in $keys; do sets+=(--set "$k"); done
  train_ok $NP "$T/E-$strat" "${sets[@]}"
  grep -q '"step":2' "$T/E-$strat/metrics.jsonl" || fail "E: $combo logged no step 2"
done

note "OK: quantized hybrid run resumed bit-identically; fewer inter-node bytes; refusals name their key"
