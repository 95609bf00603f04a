#!/usr/bin/env bash
# `data prepare` on a corpus of JSONL, gzip JSONL, plain and gzip text files in a directory and
# through a glob: byte-identical train.bin / val.bin / meta.json at 1, 2 and 4 ranks and with 1
# or 3 threads; the tokens are exactly the documents split by the documented rule (checked in
# Python from the sources); a malformed line is exit 2 naming file:line with nothing written;
# --skip-bad counts it. Usage: prepare_corpus.sh SHARDTRAIN MPIRUN [MPIRUN_FLAGS...]
set -euo pipefail
bin=$1 mpirun=$2
shift 2
src=$(cd "$(dirname "$0")/../../.." && pwd)
py=/usr/bin/python3
work=$(mktemp -d /tmp/shardtrain-e2e-corpus.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
mkdir -p "$work/c/sub"
# Paragraphs of the docs as JSON lines (text field "body"), one gzipped; a text file, a gzipped one.
"$py" - "$src" "$work/c" <<'PY'
import glob, gzip, json, sys
src, out = sys.argv[1], sys.argv[2]
paras = [p for f in sorted(glob.glob(src + "/docs/*.md")) for p in open(f, encoding="utf-8").read().split("\n\n") if p.strip()]
half = len(paras) // 2
with open(out + "/a.jsonl", "w") as f:
    for i, p in enumerate(paras[:half]):
        f.write(json.dumps({"id": i, "body": p}) + "\n")
        if i % 50 == 7: f.write("\n")  # blank lines are no documents
with gzip.open(out + "/sub/b.jsonl.gz", "wt") as f:
    for p in paras[half:]: f.write(json.dumps({"body": p}) + "\n")
open(out + "/c.txt", "w").write(open(src + "/README.md").read())
with gzip.open(out + "/sub/d.md.gz", "wt") as f: f.write(open(src + "/docs/architecture.md").read())
PY
prep() { "$bin" data prepare --tokenizer byte --text-field body --val-fraction 0.1 --progress-every 0 "$@"; }
for n in 1 2 4; do
  "$mpirun" "$@" -np $n "$bin" data prepare --tokenizer byte --text-field body --val-fraction 0.1 \
    --progress-every 0 --threads 1 --source "$work/c" --out "$work/o$n" >"$work/o$n.log"
done
prep --threads 3 --source "$work/c/a.jsonl" --source "$work/c/c.txt" --source "$work/c/sub/*.gz" --out "$work/t3" >/dev/null
cat "$work/o1.log"
for n in 2 4; do
  for f in train.bin val.bin meta.json; do
    cmp "$work/o1/$f" "$work/o$n/$f" || fail "$f differs between 1 and $n ranks"
  done
done
# The glob and the sorted directory walk name the same files in the same order.
for f in train.bin val.bin; do cmp "$work/o1/$f" "$work/t3/$f" || fail "$f differs with 3 threads / a glob"; done

# Independently: every document's bytes, its last floor(0.1 n) to val, in order (no eot for bytes).
"$py" - "$work/c" "$work/o2" <<'PY'
import gzip, json, sys
c, o = sys.argv[1], sys.argv[2]
def jsonl(lines): return [json.loads(l)["body"] for l in lines if l.strip()]
docs = jsonl(open(c + "/a.jsonl", encoding="utf-8")) + [open(c + "/c.txt", encoding="utf-8").read()]
docs += jsonl(gzip.open(c + "/sub/b.jsonl.gz", "rt", encoding="utf-8"))
docs += [gzip.open(c + "/sub/d.md.gz", "rt", encoding="utf-8").read()]
train, val = bytearray(), bytearray()
for d in docs:
    b = d.encode("utf-8")
    k = int(0.1 * len(b))
    train += b[: len(b) - k]
    val += b[len(b) - k :]
import array
def ids(path):
    a = array.array("H"); a.frombytes(open(path, "rb").read()); return bytes(a.tolist())
assert ids(o + "/train.bin") == bytes(train), "train.bin is not the documents' train parts"
assert ids(o + "/val.bin") == bytes(val), "val.bin is not the documents' val parts"
m = json.load(open(o + "/meta.json"))
names = [s["name"].rsplit("/", 1)[-1] for s in m["sources"]]
assert names == ["a.jsonl", "c.txt", "b.jsonl.gz", "d.md.gz"], names
assert [s["format"] for s in m["sources"]] == ["jsonl", "text", "jsonl.gz", "text.gz"]
assert sum(s["documents"] for s in m["sources"]) == len(docs)
assert all(len(s["fnv1a64"]) == 16 for s in m["sources"])
print(f"independent check: {len(docs)} documents, {len(train)} + {len(val)} tokens: OK")
PY

# A malformed line, found by the second rank: exit 2, file:line, nothing written.
cp "$work/c/a.jsonl" "$work/bad.jsonl"
lines=$(wc -l <"$work/bad.jsonl")
echo '{"body": 42}' >>"$work/bad.jsonl"
echo 'not json at all' >>"$work/bad.jsonl"
set +e
"$mpirun" "$@" -np 2 "$bin" data prepare --tokenizer byte --text-field body --source "$work/bad.jsonl" \
  --out "$work/bad" >"$work/bad.out" 2>"$work/bad.err"
rc=$?
set -e
[ $rc -eq 2 ] || { cat "$work/bad.err"; fail "malformed line: exit $rc, expected 2"; }
grep -q "bad.jsonl:$((lines + 1)): field \"body\" is not a string" "$work/bad.err" ||
  { cat "$work/bad.err"; fail "the error does not name bad.jsonl:$((lines + 1))"; }
[ "$(grep -c '^error' "$work/bad.err")" -eq 1 ] || fail "not exactly one error line"
[ ! -e "$work/bad/meta.json" ] || fail "a dataset was written despite the error"
"$mpirun" "$@" -np 2 "$bin" data prepare --tokenizer byte --text-field body --source "$work/bad.jsonl" \
  --out "$work/skip" --skip-bad --progress-every 0 >"$work/skip.log"
grep -q "skipped 2 malformed line(s)" "$work/skip.log" || { cat "$work/skip.log"; fail "--skip-bad did not count 2 lines"; }
grep -q '"skipped_lines": 2' "$work/skip/meta.json" || fail "meta.json does not record the skipped lines"
# Wrong field name, a glob that matches nothing: exit 2.
set +e
"$bin" data prepare --tokenizer byte --source "$work/c/a.jsonl" --out "$work/x" 2>"$work/x.err"; rc1=$?
prep --source "$work/nothing/*.jsonl" --out "$work/x" 2>"$work/y.err"; rc2=$?
set -e
[ $rc1 -eq 2 ] && grep -q 'no field "text"' "$work/x.err" || fail "a missing --text-field: exit $rc1"
[ $rc2 -eq 2 ] && grep -q "matches no file" "$work/y.err" || fail "an empty glob: exit $rc2"
echo "prepare corpus: OK"
