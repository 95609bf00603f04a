#!/usr/bin/env bash
# Model tokenizers against reference implementations (issue #26): the tokenizer.json files
# scripts/fetch-data builds (Llama 3, Qwen2's pipeline, GPT-2, Mistral in two spellings) encode >= 1 MB of Austen
# plus an edge-case text to the same ids as @huggingface/tokenizers (and as llama3-tokenizer-js /
# mistral-tokenizer-js), through `data prepare` (per document, 2 threads) and `data encode`;
# decode(encode(x)) == x where the tokenizer promises it. 0 mismatches or the test fails.
# Usage: test_references.sh <shardtrain> <work dir>; exit 77 (skip) without node or the data.
set -euo pipefail
bin="$1" work="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
data="${SHARDTRAIN_DATA_DIR:-$repo/.data}"
nm="$data/npm/node_modules" toks="$data/tokenizers"
command -v node >/dev/null || { echo "skip: node not found"; exit 77; }
for f in "$nm/@huggingface/tokenizers/dist/tokenizers.mjs" "$nm/llama3-tokenizer-js/package.json" \
         "$nm/mistral-tokenizer-js/package.json" "$data/austen/emma.txt" "$data/austen/persuasion.txt" \
         "$toks"/{llama3,llama3-pcre,qwen2-style,gpt2,mistral,mistral-metaspace}/tokenizer.json; do
  [[ -f "$f" ]] || { echo "skip: $f is missing (run scripts/fetch-data after building)"; exit 77; }
done
rm -rf "$work" && mkdir -p "$work"
edge="$here/edge_cases.txt"
novels=("$data/austen/emma.txt" "$data/austen/persuasion.txt")   # 1.35 MB
node "$here/make_docs.mjs" "$work/docs.jsonl" 1000 "${novels[@]}" -- "$edge"
cat "${novels[@]}" "$edge" > "$work/all.txt"
fail=0
check() { node "$here/check_ids.mjs" "$nm" "$@" || fail=1; }
roundtrip() {  # <tokenizer> <ids> <original> [encode flags]: decode(encode(x)) == x
  "$bin" data decode --tokenizer "$1" --dtype uint32 "$2" "$2.txt" >/dev/null
  if cmp -s "$3" "$2.txt"; then echo "$(basename "$(dirname "$1")"): decode(encode($(basename "$3"))) is the text"
  else echo "FAIL: $1: decode(encode($3)) differs: $(cmp "$3" "$2.txt" 2>&1 | head -1)"; fail=1; fi
}

# llama3-pcre: Llama 3's split pattern through PCRE2 instead of the hand-written scanner.
# qwen2-style: Llama 3's vocabulary through Qwen2's pipeline (NFC, single-digit split).
for t in llama3 llama3-pcre qwen2-style gpt2 mistral mistral-metaspace; do
  tj="$toks/$t/tokenizer.json"
  "$bin" data prepare --tokenizer "$tj" --source "$work/docs.jsonl" --out "$work/$t" --val-fraction 0 \
    --threads 2 --progress-every 0 >/dev/null
  check hf "$tj" dataset "$work/docs.jsonl" "$work/$t"
done
# Whole text through data encode (one document), and back.
for t in llama3 gpt2; do
  tj="$toks/$t/tokenizer.json"
  "$bin" data encode --tokenizer "$tj" --dtype uint32 "$work/all.txt" "$work/$t.ids" >/dev/null
  check hf "$tj" text "$work/all.txt" "$work/$t.ids"
  roundtrip "$tj" "$work/$t.ids" "$work/all.txt"
done
check llama3 "$toks/llama3/tokenizer.json" text "$work/all.txt" "$work/llama3.ids"
# mistral-tokenizer-js reads special-token text as text: so does --special-tokens text.
"$bin" data prepare --special-tokens text --tokenizer "$toks/mistral/tokenizer.json" --source "$work/docs.jsonl" \
  --out "$work/mistral-text" --val-fraction 0 --threads 2 --progress-every 0 >/dev/null
check mistral "$toks/mistral/tokenizer.json" dataset "$work/docs.jsonl" "$work/mistral-text"
# SentencePiece-style BPE decodes back to the text when no special token is matched in it
# (a matched one is followed by an inserted "▁", which decodes to a space).
for t in mistral mistral-metaspace; do
  tj="$toks/$t/tokenizer.json"
  "$bin" data encode --special-tokens text --tokenizer "$tj" --dtype uint32 "$work/all.txt" "$work/$t.ids" >/dev/null
  roundtrip "$tj" "$work/$t.ids" "$work/all.txt"
done
# A model directory: tokenizer.json is preferred over tokenizer.model; same ids as the file.
mkdir -p "$work/model"
cp "$toks/llama3/tokenizer.json" "$work/model/"
printf 'not a SentencePiece model' > "$work/model/tokenizer.model"
"$bin" data encode --tokenizer "$work/model" --dtype uint32 "$edge" "$work/dir.ids" >/dev/null
"$bin" data encode --tokenizer "$toks/llama3/tokenizer.json" --dtype uint32 "$edge" "$work/file.ids" >/dev/null
cmp -s "$work/dir.ids" "$work/file.ids" && echo "model directory: same ids as its tokenizer.json" ||
  { echo "FAIL: the model directory encodes differently from its tokenizer.json"; fail=1; }
# Vocabularies above 65536 make uint32 token files; meta.json records the tokenizer as given.
grep -q '"dtype": *"uint32"' "$work/llama3/meta.json" && grep -q "\"tokenizer\": *\"$toks/llama3/tokenizer.json\"" "$work/llama3/meta.json" &&
  echo "llama3 dataset: uint32 tokens, tokenizer recorded as given" ||
  { echo "FAIL: $work/llama3/meta.json: expected dtype uint32 and the tokenizer path"; cat "$work/llama3/meta.json"; fail=1; }
exit $fail
