# What a new user meets (issue 29): a finished run started again says "nothing to train" with
# the ways on and changes no file; move_aside moves the whole previous run (samples, eval,
# plots, checkpoints); the console shows a deck summary, not the whole resolved deck (unless
# log.print_deck); `train --help` prints without the BLAS benchmark; errors name the command
# that fixes them (key=value without --set, a dataset never prepared, a missing import source);
# eval and generate report progress.
source "$(dirname "$0")/lib.sh"
make_dataset
NP=2

# Every file under a directory but the lock (taken and released by every job): path, size,
# modification time in ns, content digest.
snapshot() { (cd "$1" && find . -type f ! -name shardtrain.lock -printf '%p %s %T@ ' -exec sha256sum {} \; | sort); }

note "a run of 4 steps with samples, validation and its eval, report and plots"
train_ok $NP "$T/A" --set train.max_steps=4 --set train.sample_every=2 --set train.sample_tokens=4 \
  --set train.val_every=2 --set train.val_batches=1 --set data.val_fraction=0.05
grep -q "^# shardtrain train: $DECK; the keys it and --set give" "$T/A.log" || { head -20 "$T/A.log"; fail "no deck summary"; }
grep -q '^#   \[model\] arch = "gpt2", vocab_size = 256' "$T/A.log" || { head -20 "$T/A.log"; fail "the summary lacks the deck's model keys"; }
grep -q "^#   \[train\] .*max_steps = 4" "$T/A.log" || fail "the summary lacks the --set key"
grep -q "^# resolved deck (every key, defaults included): $T/A/deck.resolved.toml; --set log.print_deck=true" "$T/A.log" ||
  fail "the summary does not name the resolved deck's file and log.print_deck"
grep -q '^\[comm\]' "$T/A.log" && fail "the whole resolved deck was printed on the console"
grep -q '^\[comm\]' "$T/A/deck.resolved.toml" || fail "deck.resolved.toml is not the whole deck"
(( $(grep -c '^#   \[' "$T/A.log") <= 12 )) || fail "the summary is longer than a screen"
"$MPIEXEC" "${MPIFLAGS[@]}" -np $NP "$ST" eval "$DECK" --set "data.dataset=$T/data" --set "run.out_dir=$T/A" \
  > "$T/eval.out" 2> "$T/eval.err" || { cat "$T/eval.err"; fail "eval"; }
grep -q "^# eval: [0-9]* windows of $T/data/val in [0-9]* forwards" "$T/eval.err" || { cat "$T/eval.err"; fail "eval reports no progress"; }
"$ST" generate "$T/A/checkpoints" --prompt The --max-new-tokens 8 > "$T/gen.out" 2> "$T/gen.err" || fail "generate"
grep -q "^# generate: loading $T/A/checkpoints" "$T/gen.err" || { cat "$T/gen.err"; fail "generate does not say it is loading"; }
grep -q "^# generate: 8 tokens in " "$T/gen.err" || { cat "$T/gen.err"; fail "generate reports no tokens and time"; }
"$ST" report "$T/A" > /dev/null 2>&1 || { mkdir -p "$T/A/plots"; echo "gnuplot missing: plots/ made by hand"; }
for f in metrics.jsonl summary.json deck.resolved.toml samples.jsonl eval.json plots; do
  [ -e "$T/A/$f" ] || fail "run A has no $f"
done
RUN_A=$(sed -n 's/.*"run_id": "\(.*\)".*/\1/p' "$T/A/checkpoints/run.json")

note "the finished run started again, also with other keys: nothing to train, exit 0, no file changed"
snapshot "$T/A" > "$T/before"
sleep 1.1  # a rewrite within the same second could keep a coarse mtime
for extra in "" "--set train.sample_every=1" "--set log.print_deck=true"; do
  : > "$T/A.log"
  # shellcheck disable=SC2086
  train_ok $NP "$T/A" --set train.max_steps=4 $extra
  grep -q "^# nothing to train: $T/A/checkpoints/step_00000004.h5 is at step 4 and train.max_steps = 4 (this run is finished); no file was changed" "$T/A.log" ||
    { tail -5 "$T/A.log"; fail "no nothing-to-train note ($extra)"; }
  grep -q "to train this run further: --set train.max_steps=<more than 4>" "$T/A.log" || fail "the note does not say how to continue"
  grep -q "to start a new run: --set run.name=<another name>" "$T/A.log" || fail "the note does not say how to start a new run"
  snapshot "$T/A" > "$T/after"
  diff "$T/before" "$T/after" || fail "a run with nothing to train changed files ($extra)"
done
grep -q '^\[comm\]' "$T/A.log" || fail "log.print_deck=true did not print the whole deck"

note "move_aside: the whole previous run goes to previous-runs/<id>/, checkpoints under checkpoints/"
: > "$T/A.log"
train_ok $NP "$T/A" --set train.max_steps=2 --set checkpoint.resume=never --set checkpoint.previous_run=move_aside
P=$T/A/previous-runs/$RUN_A
for f in metrics.jsonl summary.json deck.resolved.toml samples.jsonl eval.json plots checkpoints/step_00000004.h5 \
         checkpoints/latest checkpoints/run.json; do
  [ -e "$P/$f" ] || { find "$T/A"; fail "$f of the previous run is not in $P"; }
done
for f in samples.jsonl eval.json plots; do
  [ ! -e "$T/A/$f" ] || fail "the previous run's $f stayed in the new run's directory"
done
[ ! -e "$T/A/checkpoints/previous-runs" ] || fail "checkpoints were moved under checkpoints/previous-runs"
grep -q "moved the previous run $RUN_A's outputs to $P" "$T/A.log" || fail "the move of the outputs is not reported"
[ -f "$T/A/checkpoints/step_00000002.h5" ] || fail "the new run did not write its checkpoint"

note "train --help: help, no BLAS benchmark"
"$ST" train --help > "$T/help.out" 2>&1 || fail "train --help exited non-zero"
grep -q -- "--set" "$T/help.out" || fail "train --help printed no help"
grep -q "BLAS" "$T/help.out" && fail "train --help ran the BLAS kernel selection"

note "errors that say the command that fixes them"
set +e
"$ST" deck check "$DECK" train.max_steps=5 > "$T/kv.out" 2>&1; rc=$?
set -e
[ $rc = 2 ] || fail "deck check DECK key=value exited $rc, expected 2"
grep -q "hint: deck keys are set with --set KEY=VALUE: --set train.max_steps=5" "$T/kv.out" || { cat "$T/kv.out"; fail "no --set hint"; }
train $NP "$T/B" --set "data.dataset=$T/austen-byte"
[ "$RC" = 2 ] || fail "a missing dataset exited $RC, expected 2"
grep -q "data.dataset '$T/austen-byte' is not a prepared dataset .*Prepare it with: .*data prepare --source austen --tokenizer byte --out $T/austen-byte" "$T/B.log" ||
  { tail -3 "$T/B.log"; fail "the missing-dataset error does not give the data prepare command"; }
set +e
"$ST" ckpt import "$T/no-such-model" "$T/x.h5" --deck "$DECK" > "$T/imp.out" 2>&1; rc=$?
set -e
[ $rc = 2 ] || fail "ckpt import of a missing directory exited $rc, expected 2"
grep -q "$T/no-such-model: no such file or directory; give a .safetensors file" "$T/imp.out" || { cat "$T/imp.out"; fail "the import error does not name the path and what is expected"; }
[ ! -e "$T/x.h5" ] || fail "a failed import wrote its output"
note "OK: nothing-to-train writes nothing, move_aside moves the whole run, the console and the errors guide"
