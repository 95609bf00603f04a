#!/usr/bin/env python3
"""Independent check of an exported GPT-2: load shardtrain's safetensors export into the
plain-PyTorch HF-semantics GPT-2 of hf_reference.py and compute the validation loss that the
training run reported for the same tokens.

Usage: export_loss_check.py MODEL.safetensors DATASET_DIR RUN_DIR N_LAYERS N_HEADS SEQ BATCH
Reads the last val_loss of RUN_DIR/metrics.jsonl; the run evaluated the first BATCH windows of
the validation split (train.val_batches = 1, unshuffled), window w = tokens [w*SEQ, w*SEQ+SEQ+1).
"""
import json
import pathlib
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from hf_reference import gpt2_forward  # noqa: E402


def read_safetensors(path):
    raw = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        lo, hi = info["data_offsets"]
        arr = np.frombuffer(raw[base + lo : base + hi], dtype="<f4").reshape(info["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


def main():
    st, ds, run, n_layers, n_heads, seq, batch = sys.argv[1:8]
    n_layers, n_heads, seq, batch = int(n_layers), int(n_heads), int(seq), int(batch)
    params = read_safetensors(st)
    meta = json.loads((pathlib.Path(ds) / "meta.json").read_text())
    dtype = "<u2" if meta["dtype"] == "uint16" else "<u4"
    val = np.fromfile(pathlib.Path(ds) / "val.bin", dtype=dtype).astype(np.int64)
    windows = np.stack([val[w * seq : w * seq + seq + 1] for w in range(batch)])
    ids, targets = torch.from_numpy(windows[:, :-1]), torch.from_numpy(windows[:, 1:])
    with torch.no_grad():
        logits = gpt2_forward(params, ids, n_layers, n_heads)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1)).item()
    reported = [json.loads(l) for l in (pathlib.Path(run) / "metrics.jsonl").read_text().splitlines() if "val_loss" in l]
    assert reported, "no val_loss in metrics.jsonl"
    want = reported[-1]["val_loss"]
    print(f"independent GPT-2 loss {loss:.6f}, shardtrain reported {want:.6f}")
    if abs(loss - want) > 1e-4 * max(1.0, abs(want)):
        print("MISMATCH")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
