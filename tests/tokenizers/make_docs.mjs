// Writes the test corpus as JSONL documents ({"text": ...} per line): the given text files
// (Austen's novels) cut at blank lines into documents of at least `min_bytes`, then each extra
// file (the edge-case text) whole. Usage: node make_docs.mjs <out.jsonl> <min_bytes> <files>... -- <extra>...
import fs from "node:fs";

const [out, minBytes, ...rest] = process.argv.slice(2);
const sep = rest.indexOf("--");
const novels = sep < 0 ? rest : rest.slice(0, sep), extra = sep < 0 ? [] : rest.slice(sep + 1);
const docs = [];
for (const f of novels) {
  let cur = "";
  for (const para of fs.readFileSync(f, "utf8").split(/(?<=\n\n)/)) {
    cur += para;
    if (Buffer.byteLength(cur) >= Number(minBytes)) {
      docs.push(cur);
      cur = "";
    }
  }
  if (cur) docs.push(cur);
}
for (const f of extra) docs.push(fs.readFileSync(f, "utf8"));
fs.writeFileSync(out, docs.map((t) => JSON.stringify({ text: t })).join("\n") + "\n");
