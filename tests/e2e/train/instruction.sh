# Instruction data with a loss mask, end to end (tiny GPT on byte tokens, --chat-format plain):
# - data prepare: train.bin / train.mask (and val) equal a stream rebuilt independently from the
#   JSONL rows (python3, stdlib only: FNV-1a row split, prompt bytes 0, completion bytes 1);
#   the same bytes at 1 and 2 ranks; bad rows exit 2 naming file:line with nothing written;
#   formats whose special tokens the tokenizer lacks, and text sources, are refused.
# - the training loss is the mean over the counted targets of the global batch: a step over
#   every window with a learning rate too small to move a weight equals `eval` on the train
#   split (which test_masked_loss checks against a hand-computed reference).
# - the same global batch split 1x8, 2x4, 4x2 (ranks x micro-batches) and 1 x (2 of 4) trains
#   the same (losses 1e-5, weights 1e-5), and with train.reproducible the same bits.
source "$(dirname "$0")/lib.sh"
PY=${PYTHON:-python3}
# The stream over masked rows (windows cut through rows) is what this test checks; whole rows
# (data.packing = "packed", instruction data's default) are e2e_packing's.
sed 's/^\[data\]$/[data]\npacking = "stream"/' "$DECK" > "$T/instruction.toml"
DECK=$T/instruction.toml

# ---- rows: prompt/completion and messages, deterministic ----------------------------------
awk 'BEGIN { srand(5); split("the of and to a in that it was her she not be his as had with for he you", w, " ");
  for (l = 0; l < 420; ++l) {
    p = ""; c = "";
    for (i = 0; i < 3 + int(rand() * 5); ++i) p = p w[int(rand() * 20) + 1] " ";
    for (i = 0; i < 2 + int(rand() * 6); ++i) c = c " " w[int(rand() * 20) + 1];
    if (l % 7 == 3)
      printf "{\"messages\": [{\"role\": \"user\", \"content\": \"Say: %s?\\n\"}, {\"role\": \"assistant\", \"content\": \"%s.\"}]}\n", p, c;
    else
      printf "{\"prompt\": \"Q: %s?\\nA:\", \"completion\": \"%s.\"}\n", p, c;
    if (l % 50 == 10) print "";
  } }' > "$T/rows.jsonl"

prep() {  # prep NP OUT [args...]: data prepare; RC, output in OUT.log
  local np=$1 out=$2; shift 2
  set +e
  "$MPIEXEC" "${MPIFLAGS[@]}" -np "$np" "$ST" data prepare --tokenizer byte --chat-format plain --out "$out" "$@" \
    > "$out.log" 2>&1
  RC=$?
  set -e
}

note "prepare: masks equal an independent rebuild; 1 and 2 ranks give the same bytes"
prep 1 "$T/data" --source "$T/rows.jsonl" --val-fraction 0.05 --threads 1
[ "$RC" = 0 ] || { cat "$T/data.log"; fail "data prepare exited $RC"; }
prep 2 "$T/data2" --source "$T/rows.jsonl" --val-fraction 0.05 --threads 3
[ "$RC" = 0 ] || { cat "$T/data2.log"; fail "data prepare at 2 ranks exited $RC"; }
for f in train.bin train.mask train.rows val.bin val.mask val.rows meta.json; do
  cmp -s "$T/data/$f" "$T/data2/$f" || fail "$f differs between 1 and 2 ranks"
done
"$PY" - "$T/rows.jsonl" "$T/data" <<'PY' || fail "the dataset is not the rows' rendering"
import json, sys
rows, ds = sys.argv[1], sys.argv[2]
meta = json.load(open(ds + "/meta.json"))
assert meta["version"] == 3 and meta["mask"]["chat_format"] == "plain" and meta["rows"]["kind"] == "rows", meta
streams = {"train": [bytearray(), bytearray()], "val": [bytearray(), bytearray()]}
for line in open(rows, "rb").read().split(b"\n"):
    if not line.strip():
        continue
    h = 0xcbf29ce484222325
    for b in line:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    split = "val" if (h >> 11) * 2.0 ** -53 < meta["val_fraction"] else "train"
    r = json.loads(line)
    p, c = (r["prompt"], r["completion"]) if "prompt" in r else (r["messages"][0]["content"], r["messages"][1]["content"])
    p, c = p.encode(), c.encode()
    ids, mask = streams[split]
    ids += p + c
    mask += b"\0" * len(p) + b"\1" * len(c)
for split, (ids, mask) in streams.items():
    got = open(f"{ds}/{split}.bin", "rb").read()
    assert got[0::2] == bytes(ids) and got[1::2] == bytes(len(ids)), split
    assert open(f"{ds}/{split}.mask", "rb").read() == bytes(mask), split + ".mask"
    assert meta["splits"][split]["counted"] == sum(mask), split
    assert meta["splits"][split]["tokens"] == len(ids), split
assert meta["splits"]["val"]["tokens"] > 0
print("dataset = rows:", {k: len(v[0]) for k, v in streams.items()}, "tokens")
PY
grep -q "tokens counted in the loss" "$T/data.log" || fail "the summary does not report the counted tokens"
"$ST" data info "$T/data" > "$T/info.log" 2>&1 || { cat "$T/info.log"; fail "data info on a masked dataset"; }

note "bad rows: exit 2 naming file:line, nothing written"
expect_bad() {  # expect_bad NP PATTERN ROWS...: a file of ROWS fails with PATTERN
  local np=$1 pat=$2; shift 2
  printf '%s\n' "$@" > "$T/bad.jsonl"
  rm -rf "$T/bad"
  prep "$np" "$T/bad" --source "$T/bad.jsonl"
  [ "$RC" = 2 ] || { cat "$T/bad.log"; fail "bad rows ($pat) exited $RC, expected 2"; }
  grep -q -- "$pat" "$T/bad.log" || { cat "$T/bad.log"; fail "the error does not say '$pat'"; }
  [ -e "$T/bad" ] && fail "bad rows ($pat) left $T/bad behind"
  true
}
GOOD='{"prompt": "a", "completion": "b"}'
expect_bad 1 "bad.jsonl:3: no \"completion\"" "$GOOD" "$GOOD" '{"prompt": "x"}' "$GOOD"
expect_bad 2 "bad.jsonl:2: no assistant turn" "$GOOD" '{"messages": [{"role": "user", "content": "hi"}]}' "$GOOD"
expect_bad 1 "bad.jsonl:1: not valid JSON" '{"prompt": "x", ' "$GOOD"
expect_bad 1 "bad.jsonl:2: messages\[0\]: role \"tool\"" "$GOOD" '{"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]}'
expect_bad 1 "bad.jsonl:1: --chat-format plain takes" '{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}'
printf '%s\n' "$GOOD" '{"prompt": "x"}' "$GOOD" "$GOOD" > "$T/skip.jsonl"
prep 1 "$T/skip" --source "$T/skip.jsonl" --skip-bad
[ "$RC" = 0 ] || { cat "$T/skip.log"; fail "--skip-bad exited $RC"; }
grep -q "skipped 1 malformed line(s) (--skip-bad); the first: .*skip.jsonl:2: no \"completion\"" "$T/skip.log" ||
  { cat "$T/skip.log"; fail "--skip-bad did not report the skipped row"; }
rm -rf "$T/bad"
set +e
"$ST" data prepare --tokenizer byte --chat-format llama3 --source "$T/rows.jsonl" --out "$T/bad" > "$T/bad.log" 2>&1
RC=$?
set -e
[ "$RC" = 2 ] && grep -q "needs the special token <|begin_of_text|>" "$T/bad.log" && [ ! -e "$T/bad" ] ||
  { cat "$T/bad.log"; fail "llama3 with the byte tokenizer: expected exit 2 naming the special token"; }
echo "plain text" > "$T/text.txt"
set +e
"$ST" data prepare --tokenizer byte --chat-format plain --source "$T/text.txt" --out "$T/bad" > "$T/bad.log" 2>&1
RC=$?
"$ST" data prepare --tokenizer byte --chat-format auto --source "$T/rows.jsonl" --out "$T/bad" > "$T/bad2.log" 2>&1
RC2=$?
set -e
[ "$RC" = 2 ] && grep -q "text.txt' is a plain text file" "$T/bad.log" || { cat "$T/bad.log"; fail "a text source"; }
[ "$RC2" = 2 ] && grep -q "tokenizer_config.json" "$T/bad2.log" || { cat "$T/bad2.log"; fail "auto without a config"; }

# ---- training -------------------------------------------------------------------------
note "the training loss is the mean over counted targets (a whole-dataset step = eval on train)"
# All rows in train (a val split shorter than the global batch would be refused).
prep 1 "$T/dataW" --source "$T/rows.jsonl" --val-fraction 0
[ "$RC" = 0 ] || { cat "$T/dataW.log"; fail "data prepare (no val) exited $RC"; }
items=$(( ($("$PY" -c "import json; print(json.load(open('$T/dataW/meta.json'))['splits']['train']['tokens'])") - 1) / 32 ))
train_ok 1 "$T/W" --set data.dataset="$T/dataW" --set data.val_fraction=0 \
  --set train.global_batch="$items" --set train.micro_batch="$items" --set train.max_steps=1 \
  --set model.dropout=0 --set optimizer.lr=1e-30 --set lr.schedule=constant --set lr.warmup_steps=0 \
  --set optimizer.weight_decay=0 --set lr.min_lr=0 --set checkpoint.resume=never
grep -q "loss mask (plain)" "$T/W.log" || fail "the run does not report the loss mask"
"$MPIEXEC" "${MPIFLAGS[@]}" -np 2 "$ST" eval "$DECK" --set "data.dataset=$T/dataW" --set "run.out_dir=$T/W" \
  --set model.dropout=0 --split train --out "$T/W/eval.json" > "$T/W.eval.log" 2>&1 ||
  { cat "$T/W.eval.log"; fail "eval on the masked train split"; }
"$PY" - "$T/W/metrics.jsonl" "$T/W/eval.json" "$items" <<'PY' || fail "step loss != eval loss"
import json, sys
step = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l and '"loss"' in l][0]
ev = json.load(open(sys.argv[2]))
assert ev["items"] == int(sys.argv[3]), ev
assert ev["targets"] < ev["items"] * 32, ev  # only the counted ones
rel = abs(step["loss"] - ev["loss"]) / ev["loss"]
print("step 1 loss %.9f, eval %.9f over %d counted targets, rel %.2e" % (step["loss"], ev["loss"], ev["targets"], rel))
assert rel < 1e-5
PY

note "splits of one global batch train the same: 1x8, 2x4, 4x2, 1 x (2 of 4)"
COMMON=(--set train.global_batch=8 --set train.max_steps=5 --set model.dropout=0 --set checkpoint.resume=never)
train_ok 1 "$T/D1" "${COMMON[@]}" --set train.micro_batch=1 --set train.val_every=5 --set train.val_batches=1
train_ok 2 "$T/D2" "${COMMON[@]}" --set train.micro_batch=1
train_ok 4 "$T/D4" "${COMMON[@]}" --set train.micro_batch=1
train_ok 1 "$T/M1" "${COMMON[@]}" --set train.micro_batch=4
grep -q "micro 1 x accum 4 x 2 ranks" "$T/D2.log" || fail "D2 was not 2 x 4"
grep -q "micro 1 x accum 2 x 4 ranks" "$T/D4.log" || fail "D4 was not 4 x 2"
step_table "$T/D1/metrics.jsonl" > "$T/D1.steps"
[ "$(wc -l < "$T/D1.steps")" = 5 ] || fail "D1 logged $(wc -l < "$T/D1.steps") steps"
for r in D2 D4 M1; do
  step_table "$T/$r/metrics.jsonl" > "$T/$r.steps"
  paste "$T/D1.steps" "$T/$r.steps" | awk -v r="$r" '
    function rel(a, b) { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; if (m < 1e-3) m = 1e-3; return d / m }
    { if ($1 != $5 || rel($2, $6) > 1e-5 || rel($3, $7) > 1e-4) { print r " step " $1 ": " $2 " vs " $6 ", norm " $3 " vs " $7; bad = 1 } }
    END { exit bad }' || fail "$r's losses differ from D1's"
  # (the digest attributes differ with any rounding: count only the datasets' differences)
  h5diff --delta=1e-5 "$(ckpt_file "$T/D1" 5)" "$(ckpt_file "$T/$r" 5)" /model /model > "$T/$r.h5diff" || true
  awk '/^dataset:/ { d = 1; next } /^attribute:/ { d = 0; next } d && /differences found/ { n += $1 }
       END { exit n > 0 }' "$T/$r.h5diff" || { head -20 "$T/$r.h5diff"; fail "$r's weights differ from D1's by more than 1e-5"; }
  echo "$r: the same training as D1 (losses 1e-5, weights 1e-5)"
done

note "validation: the mean over the counted targets of the first val windows (= eval --max-windows)"
"$MPIEXEC" "${MPIFLAGS[@]}" -np 1 "$ST" eval "$DECK" --set "data.dataset=$T/data" --set "run.out_dir=$T/D1" \
  --set model.dropout=0 --split val --max-windows 8 --out "$T/D1/eval.json" > "$T/D1.eval.log" 2>&1 ||
  { cat "$T/D1.eval.log"; fail "eval on the masked val split"; }
grep -q "counted targets" "$T/D1.eval.log" || fail "eval does not report the counted targets"
"$PY" - "$T/D1/metrics.jsonl" "$T/D1/eval.json" <<'PY' || fail "val_loss != eval loss"
import json, sys
val = [json.loads(l) for l in open(sys.argv[1]) if '"val_loss"' in l]
ev = json.load(open(sys.argv[2]))
assert len(val) == 1 and val[0]["step"] == 5, val
rel = abs(val[0]["val_loss"] - ev["loss"]) / ev["loss"]
print("val_loss %.9f, eval %.9f over %d counted targets, rel %.2e" % (val[0]["val_loss"], ev["loss"], ev["targets"], rel))
assert rel < 1e-5 and 0 < ev["targets"] < 8 * 32, ev
PY

note "train.reproducible: 1x8, 2x4, 4x2 the same bits (dropout on)"
REPRO=(--set train.global_batch=8 --set train.micro_batch=1 --set train.max_steps=4 --set train.reproducible=true
       --set checkpoint.resume=never)
train_ok 1 "$T/R1" "${REPRO[@]}"
step_table "$T/R1/metrics.jsonl" > "$T/R1.steps"
for np in 2 4; do
  train_ok "$np" "$T/R$np" "${REPRO[@]}"
  step_table "$T/R$np/metrics.jsonl" > "$T/R$np.steps"
  cmp -s "$T/R1.steps" "$T/R$np.steps" || { diff "$T/R1.steps" "$T/R$np.steps" | head; fail "R$np's steps differ from R1's"; }
  for g in /model /optim; do
    h5diff -q "$(ckpt_file "$T/R1" 4)" "$(ckpt_file "$T/R$np" 4)" "$g" "$g" || fail "$g of R$np differs from R1's"
  done
  echo "R$np: the same bits as R1"
done
note "packed rows (data.packing = packed): train.reproducible 1x8, 2x4, 4x2 and with recomputation the same bits; stopped at step 3 and resumed, the same bits"
# Rows of 40-90 bytes in windows of 128 positions; the global batch of 8 windows is a part of the
# epoch's windows, so the resume at step 3 is mid-epoch. The deck's dropout stays on.
PK=(--set data.packing=packed --set model.seq_len=128 --set train.global_batch=8 --set train.micro_batch=1
    --set train.max_steps=6 --set train.reproducible=true --set checkpoint.every_steps=3)
train_ok 1 "$T/P1" "${PK[@]}" --set checkpoint.resume=never
grep -q "# data: train packed windows of 128: .* fill" "$T/P1.log" || { grep '# data' "$T/P1.log"; fail "P1 does not report its packed windows"; }
step_table "$T/P1/metrics.jsonl" > "$T/P1.steps"
for np in 2 4; do
  train_ok "$np" "$T/P$np" "${PK[@]}" --set checkpoint.resume=never
  step_table "$T/P$np/metrics.jsonl" > "$T/P$np.steps"
  cmp -s "$T/P1.steps" "$T/P$np.steps" || { diff "$T/P1.steps" "$T/P$np.steps" | head; fail "P$np's steps differ from P1's"; }
  for g in /model /optim; do
    h5diff -q "$(ckpt_file "$T/P1" 6)" "$(ckpt_file "$T/P$np" 6)" "$g" "$g" || fail "$g of P$np differs from P1's"
  done
  echo "P$np: the same bits as P1"
done
# Recomputation re-runs each block's forward in backward with the rows it was given.
train_ok 2 "$T/PR" "${PK[@]}" --set checkpoint.resume=never --set fsdp.activation_checkpointing=true
for g in /model /optim; do
  h5diff -q "$(ckpt_file "$T/P1" 6)" "$(ckpt_file "$T/PR" 6)" "$g" "$g" || fail "$g of PR (recomputation) differs from P1's"
done
echo "PR (2 ranks, activation checkpointing): the same bits as P1"
train_ok 2 "$T/Q2" "${PK[@]}" --set checkpoint.resume=never --set train.max_steps=3
train_ok 2 "$T/Q2" "${PK[@]}" --set checkpoint.resume=auto
grep -q "# resumed from $(ckpt_file "$T/Q2" 3): step 3," "$T/Q2.log" || fail "Q2 did not resume from step 3"
for g in /model /optim; do
  h5diff -q "$(ckpt_file "$T/P1" 6)" "$(ckpt_file "$T/Q2" 6)" "$g" "$g" || fail "$g after the resume differs from P1's"
done
echo "Q2: stopped at step 3 and resumed: the same bits as P1"
# The same files under another packing are other data: a resume refuses it, naming the windows.
train 2 "$T/Q2" "${PK[@]}" --set data.packing=padded --set checkpoint.resume=auto --set train.max_steps=9
[ "$RC" = 2 ] && grep -q 'windows: "packed of 128" -> "padded of 128"' "$T/Q2.log" ||
  { tail -5 "$T/Q2.log"; fail "a resume under another data.packing was not refused naming the windows"; }
echo "instruction e2e: all checks passed"
