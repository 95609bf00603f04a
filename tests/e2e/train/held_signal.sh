# jobscripts/run-training.sh holds a stop signal that comes while the ranks start: a rank that is
# still loading its libraries (here: a wrapper that sleeps 3 s before exec'ing shardtrain) would
# die of SIGUSR1's default action. The script gets SIGUSR1 during that sleep; it must say the
# signal is held, pass it on once rank 0 has created the ready file (all ranks in MPI), and the
# job must checkpoint and exit 42 like a signal mid-run; the ready file is removed.
source "$(dirname "$0")/lib.sh"
REPO=$(cd "$HERE/../../.." && pwd)
make_dataset
cat > "$T/slow-start" <<EOS
#!/bin/bash
touch "$T/started.\$\$"
sleep 3
exec "$ST" "\$@"
EOS
chmod +x "$T/slow-start"
cd "$T"
SHARDTRAIN_BIN=$T/slow-start SHARDTRAIN_NP=2 SHARDTRAIN_LAUNCHER=mpirun SHARDTRAIN_LAUNCHER_ARGS="${MPIFLAGS[*]}" \
  bash "$REPO/jobscripts/run-training.sh" "$DECK" "data.dataset=$T/data" "run.out_dir=$T/run" train.max_steps=500 \
  > "$T/job.log" 2>&1 &
job=$!
for i in $(seq 1 100); do ls "$T"/started.* >/dev/null 2>&1 && break; sleep 0.1; done
ls "$T"/started.* >/dev/null 2>&1 || fail "the ranks never started"
sleep 0.5
kill -USR1 "$job"
set +e
wait "$job"
rc=$?
set -e
grep -v '^step ' "$T/job.log" | grep 'shardtrain-job\|checkpoint:\|error' || true
[ "$rc" = 42 ] || fail "the job exited $rc, expected 42 (checkpointed on the signal)"
grep -q "shardtrain-job: SIGUSR1 received at .* while the ranks start: held until they are up" "$T/job.log" ||
  fail "the signal was not held"
grep -q "shardtrain-job: passing the held SIGUSR1 on" "$T/job.log" || fail "the held signal was not passed on"
grep -q "^checkpoint: step [0-9]* .*signal SIGUSR1" "$T/job.log" || fail "no checkpoint on the signal"
! ls "$T"/.shardtrain-ready.* >/dev/null 2>&1 || fail "the ready file was left behind"
note "OK: a stop signal during start-up was held, passed on, and the job checkpointed (exit 42)"
