#!/usr/bin/env bash
# Hosts with unequal numbers of ranks (Slurm's --ntasks=3 on two nodes gives 2 + 1), simulated
# with parallel.simulate_ranks_per_host = 2 on 3 ranks: full_shard, shard_grad_op and no_shard
# (which shard or replicate over all ranks) train; hybrid_shard, which needs equal groups, is
# exit 2 naming the hosts.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
make_dataset
for s in full_shard shard_grad_op no_shard; do
  train_ok 3 "$T/$s" --set parallel.simulate_ranks_per_host=2 --set parallel.strategy=$s --set train.max_steps=2 \
    --set lr.decay_steps=2 --set lr.warmup_steps=1 --set train.global_batch=6 --set checkpoint.resume=never
  grep -q "3 ranks (2 hosts, simulated)" "$T/$s.log" || { grep "# world" "$T/$s.log"; fail "$s: not 2 simulated hosts"; }
  note "$s on 2 + 1 ranks: trained"
done
train 3 "$T/hybrid" --set parallel.simulate_ranks_per_host=2 --set parallel.strategy=hybrid_shard --set train.max_steps=2 \
  --set train.global_batch=6 --set checkpoint.resume=never
[ "$RC" = 2 ] || { tail -20 "$T/hybrid.log"; fail "hybrid_shard on 2 + 1 ranks exited $RC, expected 2"; }
grep -q "^error: .*same number of ranks on every host" "$T/hybrid.log" || { grep error "$T/hybrid.log"; fail "the message"; }
note "hybrid_shard on 2 + 1 ranks: exit 2 naming the unequal hosts"
