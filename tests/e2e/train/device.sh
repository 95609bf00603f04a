# run.device and optimizer.host_threads at 2 ranks. On a build or machine without a usable GPU:
# run.device = cuda fails on every rank with exit 2 and a message naming the key, before any
# output is written; run.device = cpu and auto both train on the CPU, and the optimizer's host
# thread count (1 vs 3) changes no bit of any step or of the final checkpoint. With SGD too.
# (tests/gpu/train_gpu.sh is the same run on a GPU.)
source "$(dirname "$0")/lib.sh"
make_dataset
NP=2

if "$MPIEXEC" "${MPIFLAGS[@]}" -np 1 "$ST" info "$DECK" --set run.device=cuda > "$T/info.log" 2>&1; then
  note "this build and machine have a usable GPU: the CPU-only checks are skipped"
  GPU=1
else
  GPU=0
  note "run.device = cuda without a usable GPU: exit 2 on every rank, nothing written"
  train $NP "$T/cuda" --set run.device=cuda
  [ "$RC" = 2 ] || { tail -20 "$T/cuda.log"; fail "run.device = cuda exited $RC, expected 2"; }
  grep -q "error: \[rank 0\] run.device = cuda, but" "$T/cuda.log" || { cat "$T/cuda.log"; fail "no error naming run.device"; }
  [ ! -e "$T/cuda" ] || fail "run.device = cuda left $T/cuda behind"
  "$MPIEXEC" "${MPIFLAGS[@]}" -np 2 "$ST" info "$DECK" > "$T/info.log" 2>&1 || { cat "$T/info.log"; fail "info"; }
  grep -q "run.device = auto" "$T/info.log" || { cat "$T/info.log"; fail "info does not print run.device"; }
  grep -Eq "^ +1 .* cpu " "$T/info.log" || { cat "$T/info.log"; fail "info: rank 1 is not on the cpu"; }
fi

for opt in adamw sgd; do
  note "$opt: run.device = cpu with 1 optimizer thread vs auto with 3: the same bits"
  train_ok $NP "$T/$opt-1" --set run.device=cpu --set optimizer.host_threads=1 --set optimizer.name=$opt \
    --set checkpoint.every_steps=6
  train_ok $NP "$T/$opt-3" --set run.device=auto --set optimizer.host_threads=3 --set optimizer.name=$opt \
    --set checkpoint.every_steps=6
  grep -q "^# device cpu (run.device = cpu); collectives mpi" "$T/$opt-1.log" ||
    { head -20 "$T/$opt-1.log"; fail "no device line"; }
  if [ $GPU = 0 ]; then
    grep -q "^# device cpu (run.device = auto)" "$T/$opt-3.log" || fail "auto did not choose the cpu"
  fi
  step_table "$T/$opt-1/metrics.jsonl" > "$T/$opt-1.steps"
  step_table "$T/$opt-3/metrics.jsonl" > "$T/$opt-3.steps"
  [ "$(wc -l < "$T/$opt-1.steps")" = 12 ] || fail "$opt logged $(wc -l < "$T/$opt-1.steps") steps"
  if [ $GPU = 0 ]; then
    diff "$T/$opt-1.steps" "$T/$opt-3.steps" || fail "$opt: 3 optimizer threads changed the steps"
    same_params "$(ckpt_file "$T/$opt-1" 12)" "$(ckpt_file "$T/$opt-3" 12)"
  fi
  ! grep -q peak_device_bytes "$T/$opt-1/metrics.jsonl" || fail "a CPU run logged peak_device_bytes"
done
note "OK"
