# `shardtrain train` on the GPU, end to end (label gpu; scripts/gpu-check runs it):
#   A  1 rank, run.device = cuda, fp32: NCCL chosen, model and batches on cuda:0, the allocator's
#      peak in metrics.jsonl; every step's loss and grad norm within 1e-4 of the same run on the CPU
#   R  A split at step 6 (checkpoint of device-resident optimizer state, resume onto the GPU):
#      steps 7-12 equal A's within 1e-5
#   D  dropout 0.1, split at step 6: the GPU generator's state is restored (equal within 1e-5)
#   X  A's step-6 checkpoint resumed on the CPU: steps 7-12 within 1e-4 of A's
#   O  fsdp.cpu_offload = true: within 1e-5 of A
#   S  SGD on the device (tensor implementation), split at 6 and resumed: equal within 1e-5
#   B  bf16 parameters: trains (last loss < first)
#   2  with 2 GPUs: 2 ranks full_shard on cuda within 1e-4 of 2 CPU ranks
# Exits 77 (skipped) only where `info` refuses run.device = cuda for the documented reasons (no
# GPU, CPU libtorch: exit 2 naming run.device) on a machine without a GPU. Any other failure of
# `info` (a library the loader cannot find, a crash) fails, and so does any refusal where a GPU
# is present (/dev/nvidia*) or SHARDTRAIN_GPU_REQUIRED=1 (scripts/gpu-check): see gpu_required.h.
# Usage: bash train_gpu.sh SHARDTRAIN MPIEXEC [mpirun flags...]
source "$(dirname "$0")/../e2e/train/lib.sh"

info_rc=0
"$MPIEXEC" "${MPIFLAGS[@]}" -np 1 "$ST" info "$DECK" --set run.device=cuda > "$T/info.log" 2>&1 || info_rc=$?
if [ "$info_rc" != 0 ]; then
  why=$(sed -n 's/^.*error: //p' "$T/info.log" | head -1)
  if [ "$info_rc" = 2 ] && [[ "$why" == *"run.device = cuda, but"* ]] && [ "${SHARDTRAIN_GPU_REQUIRED:-0}" != 1 ] &&
     [ ! -e /dev/nvidia0 ] && [ ! -e /dev/nvidiactl ]; then
    echo "SKIP: $why"
    exit 77
  fi
  cat "$T/info.log"
  fail "shardtrain info --set run.device=cuda exited $info_rc${why:+: $why} (on a GPU machine, or not the documented refusal: a failure, not a skip)"
fi
GPUS=$(sed -n 's/.*torch sees \([0-9]*\)).*/\1/p' "$T/info.log")
note "$(grep libtorch "$T/info.log"); torch sees $GPUS GPU(s)"
make_dataset
COMMON=(--set model.dropout=0 --set checkpoint.every_steps=6)

# close A B TOL: per step, |loss| and |grad norm| relative differences <= TOL (and the same steps).
close() {
  step_table "$1/metrics.jsonl" > "$1.steps"
  step_table "$2/metrics.jsonl" > "$2.steps"
  awk -v tol="$3" -v a="$1" -v b="$2" '
    NR == FNR { l[$1] = $2; g[$1] = $3; next }
    ($1 in l) { n++; for (k = 2; k <= 3; ++k) { x = (k == 2 ? l[$1] : g[$1]); d = x - $k; if (d < 0) d = -d;
                  s = (x < 0 ? -x : x) + 1e-12; if (d / s > tol) { printf "step %d: %s %s vs %s\n", $1, (k == 2 ? "loss" : "grad norm"), x, $k; bad++ } } }
    END { if (n == 0) { print "no common steps"; exit 1 } if (bad) exit 1 }' "$1.steps" "$2.steps" ||
    fail "$(basename "$2") differs from $(basename "$1") by more than $3"
}

note "A: one rank on the GPU vs the CPU"
train_ok 1 "$T/A" --set run.device=cuda "${COMMON[@]}"
grep -q "^# device cuda:<local rank> (run.device = cuda); collectives nccl" "$T/A.log" ||
  { head -30 "$T/A.log"; fail "A: not on cuda with nccl"; }
grep -q '"peak_device_bytes":[1-9]' "$T/A/metrics.jsonl" || fail "A: no peak_device_bytes in metrics.jsonl"
train_ok 1 "$T/Acpu" --set run.device=cpu "${COMMON[@]}"
close "$T/Acpu" "$T/A" 1e-4

note "R: A stopped at step 6, resumed on the GPU"
train_ok 1 "$T/R" --set run.device=cuda "${COMMON[@]}" --set train.max_steps=6
train_ok 1 "$T/R" --set run.device=cuda "${COMMON[@]}"
grep -q "# resumed from $(ckpt_file "$T/R" 6): step 6," "$T/R.log" || fail "R did not resume from step 6"
close "$T/A" "$T/R" 1e-5

note "D: dropout on the GPU, split at 6: the GPU generator's state resumes too"
train_ok 1 "$T/D" --set run.device=cuda --set checkpoint.every_steps=6
train_ok 1 "$T/D2" --set run.device=cuda --set checkpoint.every_steps=6 --set train.max_steps=6
train_ok 1 "$T/D2" --set run.device=cuda --set checkpoint.every_steps=6
grep -q "# RNG" "$T/D2.log" && fail "D2: the generator was reseeded: $(grep '# RNG' "$T/D2.log")"
close "$T/D" "$T/D2" 1e-5

note "X: A's GPU checkpoint of step 6 resumed on the CPU"
train_ok 1 "$T/X" --set run.device=cpu "${COMMON[@]}" --set checkpoint.resume="$(ckpt_file "$T/A" 6)"
close "$T/A" "$T/X" 1e-4

note "O: CPU offload"
train_ok 1 "$T/O" --set run.device=cuda "${COMMON[@]}" --set fsdp.cpu_offload=true
grep -q "pinned host memory" "$T/O.log" || fail "O: offload not reported"
close "$T/A" "$T/O" 1e-5

note "S: SGD on the device, split at 6"
train_ok 1 "$T/S" --set run.device=cuda "${COMMON[@]}" --set optimizer.name=sgd
train_ok 1 "$T/S2" --set run.device=cuda "${COMMON[@]}" --set optimizer.name=sgd --set train.max_steps=6
train_ok 1 "$T/S2" --set run.device=cuda "${COMMON[@]}" --set optimizer.name=sgd
close "$T/S" "$T/S2" 1e-5

note "B: bf16"
train_ok 1 "$T/B" --set run.device=cuda "${COMMON[@]}" --set fsdp.param_dtype=bf16 --set train.max_steps=12
step_table "$T/B/metrics.jsonl" | awk 'NR == 1 { f = $2 } { l = $2 } END { exit !(l < f) }' ||
  fail "B: bf16 loss did not fall"

if [ "${GPUS:-1}" -ge 2 ]; then
  note "2: two ranks on two GPUs vs two CPU ranks"
  train_ok 2 "$T/G2" --set run.device=cuda "${COMMON[@]}"
  train_ok 2 "$T/C2" --set run.device=cpu "${COMMON[@]}"
  close "$T/C2" "$T/G2" 1e-4
else
  note "2: NOT RUN (needs 2 GPUs, torch sees ${GPUS:-?}); every other part ran"
fi
note "OK"
