#!/usr/bin/env bash
# Files from the hub (issue 39; docs/security.md, "Files from the hub"): Hugging Face model
# directories and tokenizers crafted as a hostile sender would, through every command that
# reads them (deck check, plan, ckpt import, eval, generate, train). Each refusal must be exit 2
# with one "error:" line naming the file and the key (and the limit), leave nothing written,
# and come within $TMO seconds (every command runs under `timeout`: a regression to minutes
# fails instead of stalling). Also: model.safetensors wins over an index beside it (as in
# transformers), export refuses what fp16 cannot hold (or saturates it with --allow-overflow)
# and round-trips, DiLoCo's rules give `deck check` the answer `train` gives, and a 0-byte
# JSONL source is named. Singleton processes (no mpirun); directories by hub_dir.py (stdlib).
# Usage: hub_files.sh SHARDTRAIN MPIEXEC [mpirun flags...]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PY=${PYTHON:-python3}
HUB="$PY $HERE/hub_dir.py"
TMO=${HUB_TIMEOUT:-60}
CASES=0

# expect_code CODE TEXT CMD...: exit CODE within $TMO s; for CODE 2 stderr is one "error: " line
# holding TEXT. ELAPSED: the seconds it took.
expect_code() {
  local want_rc=$1 want=$2; shift 2
  CASES=$((CASES + 1))
  local t0=$SECONDS
  set +e
  timeout -k 5 "$TMO" "$@" > "$T/case.out" 2> "$T/case.err" < /dev/null
  local rc=$?
  set -e
  ELAPSED=$((SECONDS - t0))
  [ "$rc" != 124 ] && [ "$rc" != 137 ] || fail "did not end within $TMO s: $*"
  [ "$rc" = "$want_rc" ] || { cat "$T/case.out" "$T/case.err" | tail -20; fail "exit $rc, expected $want_rc: $*"; }
  if [ "$want_rc" = 2 ]; then
    [ "$(wc -l < "$T/case.err")" = 1 ] && grep -q '^error: ' "$T/case.err" ||
      { cat "$T/case.err"; fail "stderr is not one 'error:' line: $*"; }
  fi
  [ -z "$want" ] || grep -qF -- "$want" "$T/case.err" "$T/case.out" || { cat "$T/case.err"; fail "no '$want' in the output: $*"; }
  note "exit $rc in ${ELAPSED}s: $(head -c 220 "$T/case.err" | head -1)"
}
absent() { for p in "$@"; do [ ! -e "$p" ] || fail "a refused command left $p"; done; }
# bad NAME [hub_dir options]: a copy of the good directory with its config.json changed (2 layers
# of weights, whatever the config says).
bad() {
  local d=$T/bad_$1; shift
  $HUB llama "$d" --weights-layers 2 "$@"
  echo "$d"
}

make_dataset
cat > "$T/hub.toml" <<'EOF'
# A run whose model is a Hugging Face directory (model.from_hf / checkpoint.init_from).
[run]
name = "hub"
seed = 3
threads = 1
[model]
seq_len = 32
[optimizer]
lr = 1e-3
[lr]
warmup_steps = 0
[train]
max_steps = 2
global_batch = 2
micro_batch = 1
val_every = 0
[data]
tokenizer = "byte"
[log]
every = 1
[checkpoint]
resume = "never"
EOF
HDECK=$T/hub.toml

note "a good directory imports (the reference for the cases below)"
$HUB llama "$T/good"
expect_code 0 "imported" "$ST" ckpt import "$T/good" "$T/good.h5"

note "1. every size within the deck's limits, named by its config.json key, on every command"
d=$(bad h31 --set hidden_size=2147483648)
expect_code 2 "$d/config.json: hidden_size = 2147483648 exceeds the limit 131072" \
  "$ST" deck check "$HDECK" --set "model.from_hf=$d"
d=$(bad v40 --set vocab_size=1099511627776)
expect_code 2 "$d/config.json: vocab_size = 1099511627776 exceeds the limit 2147483647" \
  "$ST" ckpt import "$d" "$T/v40.h5"
absent "$T/v40.h5" "$T/v40.h5.tmp"
d=$(bad neg --set intermediate_size=-64)
expect_code 2 "$d/config.json: intermediate_size = -64 is not a positive integer" \
  "$ST" train "$HDECK" --set "checkpoint.init_from=$d" --set "data.dataset=$T/data" --set "run.out_dir=$T/run_neg"
absent "$T/run_neg"
d=$(bad heads --set num_attention_heads=5 --set num_key_value_heads=5)
expect_code 2 "$d/config.json: hidden_size = 32 is not divisible by num_attention_heads = 5" \
  "$ST" plan "$HDECK" --set "model.from_hf=$d" --ranks 2
d=$(bad width --set num_attention_heads=32 --set head_dim=65536)
expect_code 2 "$d/config.json: num_attention_heads x head_dim = 2097152 exceeds the limit 1048576" \
  "$ST" eval "$HDECK" --set "model.from_hf=$d" --set "checkpoint.resume=$T/good.h5" --set "data.dataset=$T/data"
d=$(bad pos --set max_position_embeddings=1099511627776)
expect_code 2 "$d/config.json: max_position_embeddings = 1099511627776 exceeds the limit" \
  "$ST" deck check "$HDECK" --set "model.from_hf=$d"

note "2. a config declaring more than its weights hold: refused from the headers, before anything is built"
d=$(bad layers --set num_hidden_layers=10000)
expect_code 2 "$d/config.json declares a model of" "$ST" ckpt import "$d" "$T/layers.h5"
grep -qF "num_hidden_layers = 10000" "$T/case.err" && grep -qF "but $d holds" "$T/case.err" ||
  { cat "$T/case.err"; fail "the message does not name num_hidden_layers and the weights"; }
absent "$T/layers.h5" "$T/layers.h5.tmp"
expect_code 2 "$d/config.json declares a model of" "$ST" deck check "$HDECK" --set "model.from_hf=$d"

note "3. start-up linear in the layers: 10,000 layers of width 32 planned (a config without weights)"
# (about 8 s of CPU; quadratic, it took minutes: 120 s tells them apart even on a loaded machine)
$HUB llama "$T/deep" --layers 10000 --no-weights
TMO=120 expect_code 0 "model.layers.9999" "$ST" plan "$HDECK" --set "model.from_hf=$T/deep" --ranks 2

note "4. tokenizer files: ids and added tokens beyond the limits, through generate"
"$PY" - "$T" <<'EOF'
import json, sys
t = sys.argv[1]
def symbol(b):  # GPT-2's byte -> unicode symbol
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for x in range(256):
        if x not in bs:
            bs.append(x); cs.append(256 + n); n += 1
    return chr(dict(zip(bs, cs))[b])
vocab = {symbol(b): b for b in range(256)}
base = {"version": "1.0", "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
        "decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": vocab, "merges": []}}
import os
os.makedirs(t + "/tok_added", exist_ok=True)
added = [{"id": 256 + i, "content": "x" * 8000 + str(i), "special": True, "lstrip": False, "rstrip": False,
          "single_word": False, "normalized": False} for i in range(600)]
json.dump(dict(base, added_tokens=added), open(t + "/tok_added/tokenizer.json", "w"))
os.makedirs(t + "/tok_ids", exist_ok=True)
v = dict(vocab); v["<far>"] = 1 << 27
json.dump(dict(base, model={"type": "BPE", "vocab": v, "merges": []}), open(t + "/tok_ids/tokenizer.json", "w"))
EOF
expect_code 2 "tok_added/tokenizer.json': added_tokens: their contents exceed 4194304 bytes" \
  "$ST" generate "$T/good.h5" --tokenizer "$T/tok_added/tokenizer.json" --prompt x --max-new-tokens 1
expect_code 2 "tok_ids/tokenizer.json': model.vocab: ids above 2^26" \
  "$ST" generate "$T/good.h5" --tokenizer "$T/tok_ids/tokenizer.json" --prompt x --max-new-tokens 1

note "5. model.safetensors wins over an index beside it (transformers' order)"
$HUB llama "$T/both" --index --scale 2
$HUB llama "$T/single"
cp "$T/single/model.safetensors" "$T/both/model.safetensors"
expect_code 0 "imported" "$ST" ckpt import "$T/both" "$T/both.h5"
mkdir -p "$T/both_out"
expect_code 0 "" "$ST" ckpt export "$T/both.h5" "$T/both_out/model.safetensors"
want=$($HUB first "$T/single" model.layers.0.self_attn.q_proj.weight)
got=$($HUB first "$T/both_out" model.layers.0.self_attn.q_proj.weight)
[ "$got" = "$want" ] || fail "imported q_proj[0] = $got: not model.safetensors' $want (the index's is twice it)"

note "6. export --dtype fp16 refuses what fp16 cannot hold, --allow-overflow saturates; both round-trip"
$HUB llama "$T/big" --value model.layers.0.mlp.up_proj.weight=70000
expect_code 0 "imported" "$ST" ckpt import "$T/big" "$T/big.h5"
expect_code 2 "tensor 'model.layers.0.mlp.up_proj.weight': 1 value(s) beyond F16's range" \
  "$ST" ckpt export --format hf --dtype fp16 "$T/big.h5" "$T/big16"
absent "$T/big16"
ls -a "$T" | grep -q '^\.big16\.tmp' && fail "the refused export left its temporary directory"
expect_code 0 "saturated" "$ST" ckpt export --format hf --dtype fp16 --allow-overflow "$T/big.h5" "$T/big16"
expect_code 0 "imported" "$ST" ckpt import "$T/big16" "$T/big16.h5"
mkdir -p "$T/big16_out"
expect_code 0 "" "$ST" ckpt export "$T/big16.h5" "$T/big16_out/model.safetensors"
got=$($HUB first "$T/big16_out" model.layers.0.mlp.up_proj.weight)
[ "$got" = "65504.0" ] || fail "the saturated value came back as $got, not 65504"
expect_code 0 "F16" "$ST" ckpt export --format hf --dtype fp16 "$T/good.h5" "$T/good16"

note "7. DiLoCo's rules: deck check says what train says (one function)"
for sets in "parallel.replica_sync=diloco" \
            "parallel.strategy=hybrid_shard parallel.replica_sync=diloco diloco.inner_steps=10 diloco.fragments=2 diloco.overlap_steps=5" \
            "parallel.strategy=hybrid_shard parallel.replica_sync=diloco diloco.outer_dtype=int8 train.reproducible=true"; do
  args=()
  for s in $sets; do args+=(--set "$s"); done
  expect_code 2 "" "$ST" deck check "$DECK" "${args[@]}"
  said=$(sed 's/^error: \[rank 0\] //; s/^error: //' "$T/case.err")
  expect_code 2 "" "$ST" train "$DECK" "${args[@]}" --set "data.dataset=$T/data" --set "run.out_dir=$T/run_diloco"
  [ "$(sed 's/^error: \[rank 0\] //; s/^error: //' "$T/case.err")" = "$said" ] ||
    { echo "deck check: $said"; cat "$T/case.err"; fail "deck check and train disagree on: $sets"; }
  absent "$T/run_diloco"
done

note "8. a 0-byte JSONL source is named, alone or beside a good one"
: > "$T/empty.jsonl"
printf '{"text": "hello world, a document"}\n' > "$T/good.jsonl"
expect_code 2 "empty.jsonl' is empty (0 bytes)" "$ST" data prepare --tokenizer byte --source "$T/empty.jsonl" --out "$T/ds0"
expect_code 2 "empty.jsonl' is empty (0 bytes)" "$ST" data prepare --tokenizer byte --source "$T/good.jsonl" \
  --source "$T/empty.jsonl" --out "$T/ds1"
absent "$T/ds0" "$T/ds1"

note "$CASES cases: hub files refused by name within ${TMO}s each, nothing written"
