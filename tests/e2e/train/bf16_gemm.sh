# bf16 GEMM path on a CPU (model/bf16_gemm.h, train/bf16_choice.h; docs/performance.md): the
# tiny GPT in bf16 at 2 ranks, dropout off, 6 steps,
#   - fsdp.bf16_gemm = "bf16" (libtorch's bf16 matmul) and "fp32" (fp32 GEMMs on the bf16
#     operands) both track the fp32 run's losses (bf16 rounding only) and train (loss falls);
#   - the two paths differ only in summation order: their losses agree to bf16 precision but are
#     not the same bits (the fp32 path really ran);
#   - "auto" measures, names its choice and writes the cache; a second start reads the cache,
#     chooses the same path and computes the same bits;
#   - an fp32 run prints no bf16 GEMM line.
source "$(dirname "$0")/lib.sh"
make_dataset
export SHARDTRAIN_CACHE_DIR=$T/cache
COMMON=(--set model.dropout=0 --set train.max_steps=6)
train_ok 2 "$T/f32" "${COMMON[@]}"
train_ok 2 "$T/nat" "${COMMON[@]}" --set fsdp.param_dtype=bf16 --set fsdp.bf16_gemm=bf16
train_ok 2 "$T/f32op" "${COMMON[@]}" --set fsdp.param_dtype=bf16 --set fsdp.bf16_gemm=fp32
train_ok 2 "$T/auto1" "${COMMON[@]}" --set fsdp.param_dtype=bf16
train_ok 2 "$T/auto2" "${COMMON[@]}" --set fsdp.param_dtype=bf16
for r in f32 nat f32op auto1 auto2; do step_table "$T/$r/metrics.jsonl" > "$T/$r.steps"; done

note "the lines: which path runs and why"
grep -q '^# bf16 GEMM' "$T/f32.log" && fail "an fp32 run printed a bf16 GEMM line"
grep -q '^# bf16 GEMM: libtorch bf16 (oneDNN) (fsdp.bf16_gemm = "bf16")' "$T/nat.log" || fail "nat: no line naming libtorch bf16"
grep -q '^# bf16 GEMM: fp32 GEMM on bf16 operands (fsdp.bf16_gemm = "fp32")' "$T/f32op.log" || fail "f32op: no line naming the fp32 path"
grep -q "^# bf16 GEMM: .* (measured, cached in $T/cache/bf16-gemm.tsv: libtorch bf16 [0-9]* GFLOP/s, fp32 on bf16 operands [0-9]* GFLOP/s" "$T/auto1.log" ||
  { grep '^# bf16' "$T/auto1.log"; fail "auto1: not measured and cached"; }
grep -q "^# bf16 GEMM: .* (cached in $T/cache/bf16-gemm.tsv:" "$T/auto2.log" || { grep '^# bf16' "$T/auto2.log"; fail "auto2: the cache was not read"; }
[ "$(wc -l < "$T/cache/bf16-gemm.tsv")" = 1 ] || fail "the cache holds $(wc -l < "$T/cache/bf16-gemm.tsv") lines, expected 1"
p1=$(sed -n 's/^# bf16 GEMM: \(.*\) (.*/\1/p' "$T/auto1.log") p2=$(sed -n 's/^# bf16 GEMM: \(.*\) (.*/\1/p' "$T/auto2.log")
[ "$p1" = "$p2" ] || fail "auto chose '$p1', then '$p2' from the cache"
diff "$T/auto1.steps" "$T/auto2.steps" || fail "the cached choice computed other bits than the measured one"
case "$p1" in
  "libtorch bf16 (oneDNN)") diff "$T/auto1.steps" "$T/nat.steps" || fail "auto (libtorch bf16) differs from fsdp.bf16_gemm = bf16" ;;
  *) diff "$T/auto1.steps" "$T/f32op.steps" || fail "auto (fp32 path) differs from fsdp.bf16_gemm = fp32" ;;
esac

note "both bf16 paths track fp32 and train; they differ only in summation order"
python3 - "$T/f32.steps" "$T/nat.steps" "$T/f32op.steps" <<'PY' || fail "the bf16 paths' losses"
import sys
rows = [[tuple(map(float, l.split()[:2])) for l in open(f)] for f in sys.argv[1:]]
f32, nat, op = ([r[1] for r in x] for x in rows)
assert len(f32) == len(nat) == len(op) == 6, [len(f32), len(nat), len(op)]
for name, b in (("bf16", nat), ("fp32-operands", op)):
    for s, (a, c) in enumerate(zip(f32, b)):
        assert abs(a - c) <= 0.02 * abs(a), f"{name} step {s+1}: loss {c} vs fp32 {a}"
    assert b[-1] < b[0], f"{name}: loss did not fall: {b}"
for s, (a, c) in enumerate(zip(nat, op)):
    assert abs(a - c) <= 0.01 * abs(a), f"step {s+1}: bf16 {a} vs fp32-operands {c}"
assert nat != op, "the two bf16 paths gave identical losses: the fp32 path did not run"
print("ok: max |bf16 - fp32| / fp32 =", max(abs(a - c) / a for a, c in zip(f32, nat)),
      "; fp32-operands:", max(abs(a - c) / a for a, c in zip(f32, op)))
PY
note "OK: both bf16 GEMM paths correct, auto measured, cached and reused with the same bits"
