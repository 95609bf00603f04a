// Compares shardtrain's ids with a reference tokenizer's ids for the same text; prints one
// summary line, and the first mismatch with its context. Exit 0 when every id is equal.
// Usage:
//   node check_ids.mjs <node_modules> <ref> <tokenizer.json> text <text file> <ids file (raw uint32 LE)>
//   node check_ids.mjs <node_modules> <ref> <tokenizer.json> dataset <docs.jsonl> <dataset dir>
//     dataset: what `shardtrain data prepare --val-fraction 0` wrote from docs.jsonl ({"text": ...}
//     per line): each document's ids followed by meta.json's eot_id, in order, in train.bin.
//   ref: hf       @huggingface/tokenizers reading the tokenizer.json (special tokens matched)
//        llama3   llama3-tokenizer-js, with its own data (special tokens matched)
//        mistral  mistral-tokenizer-js, with its own data (special tokens are plain text)
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [nm, ref, tokPath, mode, inPath, oursPath] = process.argv.slice(2);
const load = async (p) => import(pathToFileURL(path.join(nm, p)).href);

let encode, show;
if (ref === "hf") {
  const { Tokenizer } = await load("@huggingface/tokenizers/dist/tokenizers.mjs");
  const tok = new Tokenizer(JSON.parse(fs.readFileSync(tokPath, "utf8")), {});
  encode = (t) => tok.encode(t, { add_special_tokens: false }).ids;
  show = (ids) => JSON.stringify(ids.map((i) => tok.decode([i])));
} else if (ref === "llama3") {
  const t = (await load("llama3-tokenizer-js/bundle/llama3-tokenizer-with-baked-data.js")).default;
  encode = (s) => t.encode(s, { bos: false, eos: false });
  show = (ids) => JSON.stringify(ids.map((i) => t.vocabById[i]));
} else if (ref === "mistral") {
  const t = (await load("mistral-tokenizer-js/mistral-tokenizer.js")).default;
  encode = (s) => (s.length ? t.encode(s, false, true) : []);
  show = (ids) => JSON.stringify(ids.map((i) => t.vocabById[i]));
} else {
  console.error(`unknown reference '${ref}'`);
  process.exit(2);
}

let theirs = [], ours, bytes = 0, docs = 1;
if (mode === "text") {
  const text = fs.readFileSync(inPath, "utf8");
  bytes = Buffer.byteLength(text);
  theirs = Array.from(encode(text), Number);
  const buf = fs.readFileSync(oursPath);
  ours = Array.from(new Uint32Array(buf.buffer, buf.byteOffset, buf.length / 4));
} else if (mode === "dataset") {
  const meta = JSON.parse(fs.readFileSync(path.join(oursPath, "meta.json"), "utf8"));
  const lines = fs.readFileSync(inPath, "utf8").split("\n").filter((l) => l.length);
  docs = lines.length;
  for (const line of lines) {
    const text = JSON.parse(line).text;
    bytes += Buffer.byteLength(text);
    for (const id of encode(text)) theirs.push(Number(id));
    if (meta.eot_id >= 0) theirs.push(meta.eot_id);
  }
  const buf = fs.readFileSync(path.join(oursPath, "train.bin"));
  const Arr = meta.dtype === "uint32" ? Uint32Array : Uint16Array;
  ours = Array.from(new Arr(buf.buffer, buf.byteOffset, buf.length / Arr.BYTES_PER_ELEMENT));
} else {
  console.error(`unknown mode '${mode}'`);
  process.exit(2);
}
let first = -1;
const n = Math.min(ours.length, theirs.length);
for (let i = 0; i < n && first < 0; ++i) if (ours[i] !== theirs[i]) first = i;
if (first < 0 && ours.length !== theirs.length) first = n;
const label = `${path.basename(path.dirname(tokPath))} vs ${ref} (${mode}): ${docs} document(s), ${bytes} bytes, ${theirs.length} reference ids`;
if (first < 0) {
  console.log(`${label}, 0 mismatches`);
  process.exit(0);
}
console.log(`${label}, ${ours.length} ours: first mismatch at id ${first}`);
console.log(`  ours:      ${show(ours.slice(Math.max(0, first - 3), first + 6))}`);
console.log(`  reference: ${show(theirs.slice(Math.max(0, first - 3), first + 6))}`);
process.exit(1);
