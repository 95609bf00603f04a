#!/usr/bin/env python3
"""NF4 (QLoRA's 4-bit NormalFloat) with bitsandbytes' semantics, for the tests.

An independent PyTorch implementation of bitsandbytes' `quantize_4bit` / `dequantize_4bit`
(quant_type "nf4") and of its double quantization of the statistics (`compress_statistics`:
`quantize_blockwise` of absmax - mean(absmax) with `create_dynamic_map()`, blocks of 256), as its
pure-PyTorch default backend computes them (bitsandbytes/backends/default/ops.py,
bitsandbytes/functional.py), written from that source for shardtrain's tests
(bitsandbytes itself is not installable here).

    nf4_reference.py cases DIR     writes test cases and their expected results to DIR
                                   (raw little-endian files and DIR/manifest.json)
"""
import json
import os
import sys

import torch

# The 16 levels of the QLoRA paper (Appendix E), as bitsandbytes stores them (fp32).
NF4 = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=torch.float32)


def dynamic_map():
    """create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8)."""
    data = []
    for i in range(7):
        boundaries = torch.linspace(0.1, 1, 2 ** i + 1, dtype=torch.float32)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-6 + i)) * means).tolist()
        data += (-(10 ** (-6 + i)) * means).tolist()
    data.append(0)
    data.append(1.0)
    assert len(data) == 256
    data.sort()
    return torch.tensor(data, dtype=torch.float32)


def _scale(flat, blocksize):
    """Each block's absmax and the values scaled into [-1, 1], bitsandbytes' way."""
    n = flat.numel()
    rem = n % blocksize
    full = n - rem
    com = flat[:full].reshape(full // blocksize, blocksize)
    absmax = com.abs().max(dim=-1)[0]
    scaled = torch.clamp(com * (1.0 / absmax.clamp(min=1e-38).view(-1, 1)), -1, 1).reshape(-1)
    if rem:
        am = flat[full:].abs().max().clamp(min=1e-38)
        absmax = torch.cat([absmax, am.unsqueeze(0)])
        scaled = torch.cat([scaled, torch.clamp(flat[full:] / am, -1, 1)])
    return scaled, absmax


def _bounds(code):
    return (code[:-1] + code[1:]) / 2


def quantize_nf4(x, blocksize):
    flat = x.reshape(-1).float()
    scaled, absmax = _scale(flat, blocksize)
    if scaled.numel() % 2:
        scaled = torch.nn.functional.pad(scaled, (0, 1))
    q = torch.bucketize(scaled, _bounds(NF4), out_int32=True).to(torch.uint8)
    packed = (q[::2] << 4) | q[1::2]
    return packed, absmax


def dequantize_nf4(packed, absmax, n, blocksize, dtype):
    idx = torch.empty(packed.numel() * 2, dtype=torch.int64)
    idx[1::2] = (packed & 0xF).to(torch.int64)
    idx[::2] = (packed >> 4).to(torch.int64)
    vals = NF4[idx][:n]
    rem = n % blocksize
    out = torch.empty(n, dtype=torch.float32)
    full = n - rem
    if full:
        out[:full] = (vals[:full].view(-1, blocksize) * absmax[:full // blocksize].view(-1, 1)).reshape(full)
    if rem:
        out[full:] = vals[full:] * absmax[full // blocksize]
    return out.to(dtype)


def quantize_absmax(absmax, blocksize=256):
    offset = absmax.mean()
    scaled, absmax2 = _scale(absmax - offset, blocksize)
    codes = torch.bucketize(scaled, _bounds(dynamic_map()), out_int32=True).to(torch.uint8)
    return codes, absmax2, offset


def dequantize_absmax(codes, absmax2, offset, blocksize=256):
    vals = dynamic_map()[codes.to(torch.int64)]
    n = vals.numel()
    rem = n % blocksize
    full = n - rem
    out = torch.empty(n, dtype=torch.float32)
    if full:
        out[:full] = (vals[:full].view(-1, blocksize) * absmax2[:full // blocksize].view(-1, 1)).reshape(full)
    if rem:
        out[full:] = vals[full:] * absmax2[full // blocksize]
    return out + offset


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cases():
    g = torch.Generator().manual_seed(39)
    normal = lambda n, s=0.02: torch.randn(n, generator=g) * s
    out = []
    out.append(("normal_4096_b64", normal(4096), 64, "fp32"))
    out.append(("tail_1001_b64_odd", normal(1001), 64, "fp32"))
    z = normal(64 * 6 + 10)
    z[128:192] = 0.0      # one whole block of zeros
    z[64 * 6:] = 0.0      # and a short last block of zeros
    out.append(("zero_blocks", z, 64, "fp32"))
    o = normal(512)
    o[70] = 30.0          # one outlier: its block's other values collapse towards 0
    o[300] = -45.0
    out.append(("outliers", o, 64, "fp32"))
    # Values on the midpoints (absmax 1): each takes the lower level.
    b = _bounds(NF4)
    mids = torch.cat([b, -b, torch.tensor([1.0]), NF4])
    out.append(("on_midpoints", mids, 64, "fp32"))
    out.append(("bf16_input_b128", normal(3000).to(torch.bfloat16), 128, "bf16"))
    out.append(("fp16_input_b32", normal(777, 0.5).to(torch.float16), 32, "fp16"))
    out.append(("single_value", torch.tensor([0.37]), 64, "fp32"))
    out.append(("wide_range_b256", torch.randn(5000, generator=g) * torch.logspace(-6, 3, 5000), 256, "fp32"))
    return out


def write_cases(d):
    os.makedirs(d, exist_ok=True)
    manifest = {"dynamic_map": "dynamic_map.f32", "cases": []}
    dynamic_map().numpy().tofile(os.path.join(d, "dynamic_map.f32"))
    for name, x, block, src in cases():
        x = x.to(DTYPES[src])
        n = x.numel()
        packed, absmax = quantize_nf4(x, block)
        entry = {"name": name, "n": n, "block": block, "input_dtype": src}
        raw = x.contiguous().view(torch.int16 if src != "fp32" else torch.int32).numpy()
        raw.tofile(os.path.join(d, name + ".input"))
        packed.numpy().tofile(os.path.join(d, name + ".codes"))
        absmax.numpy().tofile(os.path.join(d, name + ".absmax"))
        for dt, t in DTYPES.items():
            v = dequantize_nf4(packed, absmax, n, block, t)
            v.contiguous().view(torch.int16 if dt != "fp32" else torch.int32).numpy().tofile(
                os.path.join(d, name + ".values_" + dt))
        codes2, absmax2, offset = quantize_absmax(absmax)
        codes2.numpy().tofile(os.path.join(d, name + ".dq_codes"))
        absmax2.numpy().tofile(os.path.join(d, name + ".dq_absmax2"))
        offset.reshape(1).numpy().tofile(os.path.join(d, name + ".dq_offset"))
        dequantize_absmax(codes2, absmax2, offset).numpy().tofile(os.path.join(d, name + ".dq_absmax"))
        manifest["cases"].append(entry)
    # Double quantization over more than one block of 256 statistics (a 64 x 700 block tensor).
    g = torch.Generator().manual_seed(40)
    absmax = (torch.rand(700, generator=g) * 0.1).float()
    absmax[5] = 0.0
    codes2, absmax2, offset = quantize_absmax(absmax)
    absmax.numpy().tofile(os.path.join(d, "stats_700.absmax"))
    codes2.numpy().tofile(os.path.join(d, "stats_700.dq_codes"))
    absmax2.numpy().tofile(os.path.join(d, "stats_700.dq_absmax2"))
    offset.reshape(1).numpy().tofile(os.path.join(d, "stats_700.dq_offset"))
    dequantize_absmax(codes2, absmax2, offset).numpy().tofile(os.path.join(d, "stats_700.dq_absmax"))
    manifest["stats"] = [{"name": "stats_700", "n": 700}]
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "cases":
        sys.exit(__doc__)
    torch.set_num_threads(1)
    write_cases(sys.argv[2])
