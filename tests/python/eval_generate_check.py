#!/usr/bin/env python3
"""Independent check of `shardtrain eval` and `shardtrain generate` on an exported byte-level
GPT-2: the loss over every non-overlapping window of the validation split (window w = tokens
[w*SEQ, w*SEQ+SEQ+1)) and the greedy continuation of a prompt, computed by the plain-PyTorch
GPT-2 of hf_reference.py.

Usage: eval_generate_check.py MODEL.safetensors DATASET_DIR EVAL_JSON N_LAYERS N_HEADS SEQ PROMPT MAX_NEW GENERATED_FILE
Prints MISMATCH (and exits 1) when the loss differs by more than 1e-4 (relative) or the greedy
text differs from GENERATED_FILE (shardtrain's output, the prompt included).
"""
import json
import pathlib
import sys

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from export_loss_check import read_safetensors  # noqa: E402
from hf_reference import gpt2_forward  # noqa: E402


def main():
    st, ds, eval_json, n_layers, n_heads, seq, prompt, max_new, generated = sys.argv[1:10]
    n_layers, n_heads, seq, max_new = int(n_layers), int(n_heads), int(seq), int(max_new)
    params = read_safetensors(st)
    meta = json.loads((pathlib.Path(ds) / "meta.json").read_text())
    dtype = "<u2" if meta["dtype"] == "uint16" else "<u4"
    val = np.fromfile(pathlib.Path(ds) / "val.bin", dtype=dtype).astype(np.int64)
    n_windows = (len(val) - 1) // seq
    total = 0.0
    with torch.no_grad():
        for lo in range(0, n_windows, 64):
            ws = np.stack([val[w * seq : w * seq + seq + 1] for w in range(lo, min(n_windows, lo + 64))])
            ids, targets = torch.from_numpy(ws[:, :-1]), torch.from_numpy(ws[:, 1:])
            logits = gpt2_forward(params, ids, n_layers, n_heads)
            ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="none")
            total += ce.double().sum().item()
    loss = total / (n_windows * seq)
    got = json.loads(pathlib.Path(eval_json).read_text())
    print(f"independent GPT-2: {n_windows} windows, loss {loss:.9f}; shardtrain eval: {got['items']} windows, loss {got['loss']:.9f}")
    ok = got["items"] == n_windows and abs(loss - got["loss"]) <= 1e-4 * max(1.0, abs(loss))

    ctx = list(prompt.encode())
    with torch.no_grad():
        for _ in range(max_new):
            ids = torch.tensor([ctx[-seq:]], dtype=torch.int64)
            ctx.append(int(torch.argmax(gpt2_forward(params, ids, n_layers, n_heads)[0, -1]).item()))
    want = bytes(ctx)
    have = pathlib.Path(generated).read_bytes().rstrip(b"\n")
    print(f"independent greedy: {want!r}\nshardtrain greedy:  {have!r}")
    ok = ok and want == have
    if not ok:
        print("MISMATCH")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
