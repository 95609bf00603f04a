#!/usr/bin/env bash
# A tokenizer.model through SentencePiece (issue #26). No .model file ships offline, so two
# tiny models are trained here with spm_train (a Llama-2-style BPE with byte fallback, and a
# Unigram with SentencePiece's default NFKC normalization); shardtrain's ids for every line of
# a novel plus the edge-case text must equal spm_encode's, and decode(encode(x)) == x for the
# BPE model. A truncated model is exit 2 naming the file, with nothing written.
# Usage: test_sentencepiece.sh <shardtrain> <work dir>; exit 77 (skip) without the tools or data.
set -euo pipefail
bin="$1" work="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
data="${SHARDTRAIN_DATA_DIR:-$repo/.data}"
for t in spm_train spm_encode node; do command -v $t >/dev/null || { echo "skip: $t not found (Debian package sentencepiece / nodejs)"; exit 77; }; done
text="$data/austen/northangerabbey.txt"
[[ -f "$text" && -f "$data/austen/persuasion.txt" ]] || { echo "skip: $text is missing (run scripts/fetch-data after building)"; exit 77; }
rm -rf "$work" && mkdir -p "$work"
edge="$here/edge_cases.txt"
cat "$text" "$edge" | tr -d '\r' | grep -v '^$' > "$work/lines.txt" || true
spm_train --input="$data/austen/persuasion.txt" --model_prefix="$work/bpe" --vocab_size=2000 --model_type=bpe \
  --byte_fallback=true --split_digits=true --allow_whitespace_only_pieces=true --normalization_rule_name=identity \
  --remove_extra_whitespaces=false --minloglevel=2 >"$work/train.log" 2>&1
spm_train --input="$data/austen/persuasion.txt" --model_prefix="$work/unigram" --vocab_size=2000 --model_type=unigram \
  --minloglevel=2 >>"$work/train.log" 2>&1
# One JSONL document per line, as spm_encode reads its input line by line.
node -e 'const fs=require("fs");const l=fs.readFileSync(process.argv[1],"utf8").split("\n").filter(x=>x.length);
fs.writeFileSync(process.argv[2],l.map(t=>JSON.stringify({text:t})).join("\n")+"\n")' "$work/lines.txt" "$work/lines.jsonl"
fail=0
for m in bpe unigram; do
  spm_encode --model="$work/$m.model" --output_format=id < "$work/lines.txt" > "$work/$m.ref"
  # Control pieces in the text (<s>) are text for spm_encode: --special-tokens text.
  "$bin" data prepare --tokenizer "$work/$m.model" --special-tokens text --source "$work/lines.jsonl" \
    --out "$work/$m.ds" --val-fraction 0 --progress-every 0 >/dev/null
  node -e '
    const fs=require("fs");const [ref,ds,name]=process.argv.slice(1);
    const meta=JSON.parse(fs.readFileSync(ds+"/meta.json","utf8"));
    const theirs=[];for(const l of fs.readFileSync(ref,"utf8").split("\n").slice(0,-1)){
      for(const t of l.split(" ").filter(x=>x.length))theirs.push(Number(t));if(meta.eot_id>=0)theirs.push(meta.eot_id);}
    const b=fs.readFileSync(ds+"/train.bin");const ours=Array.from(new Uint16Array(b.buffer,b.byteOffset,b.length/2));
    let i=0;while(i<Math.min(ours.length,theirs.length)&&ours[i]===theirs[i])++i;
    if(i===ours.length&&i===theirs.length){console.log(name+".model vs spm_encode: "+theirs.length+" ids, 0 mismatches");process.exit(0);}
    console.log("FAIL: "+name+".model vs spm_encode: first mismatch at id "+i+": ours "+ours.slice(i,i+5)+" spm "+theirs.slice(i,i+5));process.exit(1);
  ' "$work/$m.ref" "$work/$m.ds" "$m" || fail=1
done
# decode(encode(x)) == x: identity normalization and byte fallback lose nothing.
"$bin" data encode --tokenizer "$work/bpe.model" --special-tokens text "$work/lines.txt" "$work/bpe.ids" >/dev/null
"$bin" data decode --tokenizer "$work/bpe.model" "$work/bpe.ids" "$work/bpe.txt" >/dev/null
cmp -s "$work/lines.txt" "$work/bpe.txt" && echo "bpe.model: decode(encode(x)) is the text" ||
  { echo "FAIL: bpe.model: decode(encode(x)) differs: $(cmp "$work/lines.txt" "$work/bpe.txt" 2>&1)"; fail=1; }
# A model directory with only tokenizer.model: its tokenizer_config.json sets what is added.
mkdir -p "$work/dir" && cp "$work/bpe.model" "$work/dir/tokenizer.model"
printf '{"add_bos_token": true, "add_eos_token": false, "bos_token": "<s>", "eos_token": "</s>"}' > "$work/dir/tokenizer_config.json"
"$bin" data encode --tokenizer "$work/dir" --special-tokens text "$work/lines.txt" "$work/dir.ids" >/dev/null
cmp -s "$work/bpe.ids" "$work/dir.ids" && echo "model directory: same ids as its tokenizer.model" ||
  { echo "FAIL: the model directory encodes differently from its tokenizer.model"; fail=1; }
# A truncated model: exit 2, one line naming the file, nothing written.
head -c 10000 "$work/bpe.model" > "$work/truncated.model"
set +e
err="$("$bin" data prepare --tokenizer "$work/truncated.model" --source "$work/lines.jsonl" --out "$work/trunc.ds" 2>&1 >/dev/null)"
rc=$?
set -e
if [[ $rc == 2 && "$err" == *"truncated.model' is not a SentencePiece model"* && ! -e "$work/trunc.ds" ]]; then
  echo "truncated.model: exit 2 naming the file, nothing written"
else
  echo "FAIL: truncated.model: rc $rc, stderr: $err, $(ls -d "$work/trunc.ds" 2>&1)"; fail=1
fi
exit $fail
