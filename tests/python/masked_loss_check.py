#!/usr/bin/env python3
"""Independent check of eval's loss on instruction data (a dataset with a loss mask): load
shardtrain's safetensors export into the plain-PyTorch HF-semantics GPT-2 of hf_reference.py,
compute the cross-entropy of every window of the split, and average it over the targets whose
mask byte says they count (target t of window w is token w*T+t+1; it counts iff
SPLIT.mask[w*T+t+1] == 1). Prints MISMATCH when eval's reported loss differs.

Usage: masked_loss_check.py MODEL.safetensors DATASET_DIR SPLIT EVAL_JSON N_LAYERS N_HEADS SEQ
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
    st, ds, split, ev, n_layers, n_heads, seq = sys.argv[1:8]
    n_layers, n_heads, seq = int(n_layers), int(n_heads), int(seq)
    params = read_safetensors(st)
    ds = pathlib.Path(ds)
    meta = json.loads((ds / "meta.json").read_text())
    dtype = "<u2" if meta["dtype"] == "uint16" else "<u4"
    ids = np.fromfile(ds / f"{split}.bin", dtype=dtype).astype(np.int64)
    mask = np.fromfile(ds / f"{split}.mask", dtype=np.uint8)
    assert len(mask) == len(ids), (len(mask), len(ids))
    windows = (len(ids) - 1) // seq
    total, counted, everything = 0.0, 0, 0.0
    with torch.no_grad():
        for w0 in range(0, windows, 16):
            ws = range(w0, min(windows, w0 + 16))
            x = torch.from_numpy(np.stack([ids[w * seq : w * seq + seq] for w in ws]))
            y = torch.from_numpy(np.stack([ids[w * seq + 1 : w * seq + seq + 1] for w in ws]))
            m = torch.from_numpy(np.stack([mask[w * seq + 1 : w * seq + seq + 1] for w in ws]).astype(np.bool_))
            logits = gpt2_forward(params, x, n_layers, n_heads)
            ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)).double(), y.reshape(-1),
                                                   reduction="none").reshape(y.shape)
            total += ce[m].sum().item()
            counted += int(m.sum().item())
            everything += ce.sum().item()
    loss = total / counted
    r = json.loads(pathlib.Path(ev).read_text())
    print(f"independent GPT-2: {split} loss {loss:.9f} over {counted} counted of {windows * seq} targets "
          f"(all targets: {everything / (windows * seq):.6f}); shardtrain eval {r['loss']:.9f} over {r['targets']}")
    ok = r["items"] == windows and r["targets"] == counted and abs(loss - r["loss"]) <= 1e-5 * abs(loss)
    if not ok:
        print("MISMATCH")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
