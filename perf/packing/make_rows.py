#!/usr/bin/env python3
"""make_rows.py: a long-tail instruction set from Jane Austen's novels, offline, for
perf/packing/run.sh: JSONL rows {"prompt", "completion"}, each a passage of consecutive
paragraphs whose first part is the prompt ("Continue the passage:" and the opening words) and
the rest the completion. Row lengths (GPT-2 tokens, estimated from words) follow a log-normal
with the given median, cut to [--min, --max]: most rows short, a few near the window length,
as chat / instruction sets are. Deterministic for a seed; standard library only.

  make_rows.py --out rows.jsonl [--austen DIR] [--rows 4000] [--median 100] [--sigma 0.9]
               [--min 16] [--max 1024] [--tokens-per-word 1.3] [--seed 45]

DIR (default <repo>/.data/austen) holds the novels as *.txt, as `shardtrain data extract-austen`
(or scripts/fetch-data) writes them. GPT-2's BPE gives about 1.27 tokens per word on Austen
(993 328 tokens); `packing_reference.py windows` reports the true lengths after data prepare.
"""
import argparse
import json
import math
import pathlib
import random
import sys

PREFIX = "Continue the passage:\n\n"


def paragraphs(directory):
    paras = []
    files = sorted(pathlib.Path(directory).glob("*.txt"))
    if not files:
        sys.exit(f"make_rows.py: no *.txt in {directory} (run `shardtrain data extract-austen --out {directory}`)")
    for f in files:
        for block in f.read_text(encoding="utf-8").split("\n\n"):
            words = block.split()
            # Chapter headings and short fragments are not prose.
            if len(words) < 8 or block.strip().isupper():
                continue
            paras.append(words)
    return paras


def main():
    root = pathlib.Path(__file__).resolve().parents[2]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--austen", default=str(root / ".data" / "austen"))
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--median", type=float, default=100.0)
    ap.add_argument("--sigma", type=float, default=0.9)
    ap.add_argument("--min", type=int, default=16)
    ap.add_argument("--max", type=int, default=1024)
    ap.add_argument("--tokens-per-word", type=float, default=1.3)
    ap.add_argument("--seed", type=int, default=45)
    a = ap.parse_args()
    paras = paragraphs(a.austen)
    rng = random.Random(a.seed)
    prefix_words = len(PREFIX.split())
    lengths = []
    with open(a.out, "w", encoding="utf-8") as out:
        for _ in range(a.rows):
            tokens = min(a.max, max(a.min, round(math.exp(rng.gauss(math.log(a.median), a.sigma)))))
            n = max(4, round(tokens / a.tokens_per_word) - prefix_words)
            i = rng.randrange(len(paras))
            words, breaks = [], []
            while len(words) < n:  # consecutive paragraphs from a random one
                p = paras[i % len(paras)]
                breaks.append(len(words))
                words.extend(p[: n - len(words)])
                i += 1
            cut = max(1, min(n - 2, round(n * rng.uniform(0.2, 0.6))))

            def text(lo, hi):
                parts, last = [], lo
                for b in [b for b in breaks if lo < b < hi] + [hi]:
                    parts.append(" ".join(words[last:b]))
                    last = b
                return "\n\n".join(parts)

            out.write(json.dumps({"prompt": PREFIX + text(0, cut), "completion": " " + text(cut, n)},
                                 ensure_ascii=False) + "\n")
            lengths.append(tokens)
    lengths.sort()
    print(f"{a.out}: {a.rows} rows from {len(paras)} paragraphs; planned lengths (tokens, estimated) "
          f"min {lengths[0]}, median {lengths[len(lengths) // 2]}, p90 {lengths[int(0.9 * len(lengths))]}, "
          f"max {lengths[-1]}, total {sum(lengths)}")


if __name__ == "__main__":
    main()
