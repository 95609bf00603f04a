#!/usr/bin/python3
"""Reads a shardtrain checkpoint with h5py alone (no shardtrain code) and checks it.

Usage: check_ckpt_h5py.py DIR   (DIR holds ckpt.h5 and expected.json from test_ckpt at np=2)

Checks the root attributes, that every dataset of expected.json has the expected shape,
float32 dtype and exactly the expected values, and recomputes each dataset's digest
attribute with the formula of docs/checkpoint-format.md.
"""
import json
import sys

import h5py
import numpy as np


def digest(arr):
    """(sum, weighted) over the elements as unsigned words, mod 2**64."""
    words = {1: np.uint8, 4: np.uint32, 8: np.uint64}[arr.dtype.itemsize]
    w = np.ascontiguousarray(arr).reshape(-1).view(words).astype(np.uint64)
    idx = np.arange(1, w.size + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return int(w.sum(dtype=np.uint64)), int((w * idx).sum(dtype=np.uint64))


def main(d):
    want = json.load(open(f"{d}/expected.json"))
    failures = []
    with h5py.File(f"{d}/ckpt.h5", "r") as f:
        a = f.attrs
        fmt = a["format"].decode() if isinstance(a["format"], bytes) else a["format"]
        if fmt != "shardtrain-checkpoint" or int(a["version"]) != 1:
            failures.append(f"root attributes: format {fmt!r} version {a['version']}")
        if int(a["world_size"]) != 2 or int(a["step"]) != 77:
            failures.append(f"world_size {a['world_size']} step {a['step']}")
        if list(f["train/data_cursor"][...]) != [1, 2, 3] or list(f["train/rng_state"][...]) != [9, 8, 7, 6]:
            failures.append("train state")
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        for name in names:
            ds = f[name]
            got = ds[...]
            if tuple(int(x) for x in ds.attrs["digest"]) != digest(got):
                failures.append(f"{name}: digest differs from the documented formula")
        for name, w in want.items():
            ds = f[name]
            if ds.dtype != np.float32 or list(ds.shape) != w["shape"]:
                failures.append(f"{name}: {ds.dtype} {ds.shape}, want float32 {w['shape']}")
                continue
            exp = np.array(w["values"], dtype=np.float32).reshape(w["shape"])
            if not np.array_equal(ds[...].view(np.uint32), exp.view(np.uint32)):
                failures.append(f"{name}: values differ")
        print(f"checked {len(want)} tensors against expected values, {len(names)} digests")
    for x in failures:
        print("FAIL", x)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
