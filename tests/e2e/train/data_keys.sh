# data.dataset = "" (synthetic items) and the checks of data.tokenizer / data.val_fraction
# against a prepared dataset:
#  - synthetic tokens: the same global batch at 1 and 2 ranks gives the same losses (1e-5),
#    and a run split by train.max_steps resumes bit-identically (the cursor works)
#  - synthetic images for a ViT train
#  - a byte-token dataset with data.tokenizer = gpt2, or with another data.val_fraction than it
#    was prepared with: exit 2 naming the key, on every rank
source "$(dirname "$0")/lib.sh"
make_dataset   # byte tokens, val fraction 0.05

note "synthetic tokens at 1 and 2 ranks"
train_ok 1 "$T/s1" --set data.dataset= --set model.dropout=0 --set train.max_steps=4
train_ok 2 "$T/s2" --set data.dataset= --set model.dropout=0 --set train.max_steps=4
grep -q "synthetic tokens (data.dataset = \"\")" "$T/s1.log" || { head -12 "$T/s1.log"; fail "no synthetic data line"; }
step_table "$T/s1/metrics.jsonl" > "$T/s1.steps"
step_table "$T/s2/metrics.jsonl" > "$T/s2.steps"
awk 'NR == FNR { l[$1] = $2; next } { d = l[$1] - $2; if (d < 0) d = -d; if (d > 1e-5 * $2) { print "step " $1 ": " l[$1] " vs " $2; bad = 1 } }
     END { exit bad }' "$T/s1.steps" "$T/s2.steps" || fail "synthetic data differs between 1 and 2 ranks"

note "synthetic tokens: split at step 2, resumed"
train_ok 2 "$T/s3" --set data.dataset= --set model.dropout=0 --set train.max_steps=2
train_ok 2 "$T/s3" --set data.dataset= --set model.dropout=0 --set train.max_steps=4
step_table "$T/s3/metrics.jsonl" > "$T/s3.steps"
diff "$T/s2.steps" "$T/s3.steps" || fail "the resumed synthetic run differs"

note "synthetic images for a ViT"
train_ok 2 "$T/vit" --set data.dataset= --set model.arch=vit --set model.d_model=32 --set model.n_heads=2 \
  --set model.n_layers=1 --set train.max_steps=2
grep -q "synthetic images" "$T/vit.log" || fail "no synthetic images line"

note "a byte-token dataset with data.tokenizer = gpt2, and with data.val_fraction = 0.1"
train 2 "$T/tok" --set data.tokenizer=gpt2
[ "$RC" = 2 ] || { tail -5 "$T/tok.log"; fail "tokenizer mismatch exited $RC, expected 2"; }
grep -q 'data.tokenizer = "gpt2" but data.dataset .* was prepared with the byte tokenizer' "$T/tok.log" ||
  { cat "$T/tok.log"; fail "no message naming data.tokenizer"; }
train 2 "$T/vf" --set data.val_fraction=0.1
[ "$RC" = 2 ] || fail "val_fraction mismatch exited $RC, expected 2"
grep -q 'data.val_fraction = 0.1 but data.dataset .* was prepared with 0.05' "$T/vf.log" ||
  { cat "$T/vf.log"; fail "no message naming data.val_fraction"; }
note "OK"
