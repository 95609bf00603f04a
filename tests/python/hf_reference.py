#!/usr/bin/env python3
"""Cross-check of shardtrain's GPT-2 and Llama forward passes against the Hugging Face
semantics, re-implemented here in plain PyTorch (no transformers package needed).

Usage: hf_reference.py DUMP_DIR   (DUMP_DIR/{gpt2,llama} written by test_model's ModelDump tests)
Exit status 0 when every dumped model's logits match the reference.
"""
import math
import pathlib
import sys

import numpy as np
import torch


def load(dirpath):
    tensors = {}
    for line in (dirpath / "manifest.txt").read_text().splitlines():
        name, dtype, *dims = line.split()
        data = np.fromfile(dirpath / f"{name}.bin", dtype=np.int64 if dtype == "int64" else np.float32)
        tensors[name] = torch.from_numpy(data.reshape([int(d) for d in dims]))
    spec = dict(line.split(" ", 1) for line in (dirpath / "spec.txt").read_text().splitlines())
    return tensors, spec


# ---- GPT-2, following transformers/models/gpt2/modeling_gpt2.py ----

def conv1d(x, w, b):  # HF Conv1D: torch.addmm(bias, x.view(-1, nx), weight)
    return torch.addmm(b, x.view(-1, x.size(-1)), w).view(*x.shape[:-1], w.size(1))


def gelu_new(x):  # HF ACT2FN["gelu_new"]
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gpt2_forward(p, ids, n_layers, n_heads):
    B, T = ids.shape
    x = p["transformer.wte.weight"][ids] + p["transformer.wpe.weight"][torch.arange(T)]
    d = x.size(-1)
    hd = d // n_heads
    bias = torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T)
    for l in range(n_layers):
        b = f"transformer.h.{l}."
        h = torch.nn.functional.layer_norm(x, (d,), p[b + "ln_1.weight"], p[b + "ln_1.bias"], 1e-5)
        q, k, v = conv1d(h, p[b + "attn.c_attn.weight"], p[b + "attn.c_attn.bias"]).split(d, dim=2)
        q, k, v = (t.view(B, T, n_heads, hd).permute(0, 2, 1, 3) for t in (q, k, v))
        w = torch.matmul(q, k.transpose(-1, -2)) / (v.size(-1) ** 0.5)
        w = torch.where(bias, w, torch.tensor(torch.finfo(w.dtype).min))
        a = torch.matmul(torch.softmax(w, dim=-1), v).permute(0, 2, 1, 3).reshape(B, T, d)
        x = x + conv1d(a, p[b + "attn.c_proj.weight"], p[b + "attn.c_proj.bias"])
        h = torch.nn.functional.layer_norm(x, (d,), p[b + "ln_2.weight"], p[b + "ln_2.bias"], 1e-5)
        h = gelu_new(conv1d(h, p[b + "mlp.c_fc.weight"], p[b + "mlp.c_fc.bias"]))
        x = x + conv1d(h, p[b + "mlp.c_proj.weight"], p[b + "mlp.c_proj.bias"])
    x = torch.nn.functional.layer_norm(x, (d,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], 1e-5)
    return x @ p["transformer.wte.weight"].t()  # lm_head tied to wte


# ---- Llama, following transformers/models/llama/modeling_llama.py ----

def rms_norm(x, w, eps):
    var = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def llama_forward(p, ids, n_layers, n_heads, n_kv, eps, theta):
    B, T = ids.shape
    x = p["model.embed_tokens.weight"][ids]
    d = x.size(-1)
    hd = d // n_heads
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2).float() / hd))
    freqs = torch.einsum("i,j->ij", torch.arange(T).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]
    mask = torch.full((T, T), float("-inf")).triu(1)
    for l in range(n_layers):
        b = f"model.layers.{l}."
        h = rms_norm(x, p[b + "input_layernorm.weight"], eps)
        q = (h @ p[b + "self_attn.q_proj.weight"].t()).view(B, T, n_heads, hd).transpose(1, 2)
        k = (h @ p[b + "self_attn.k_proj.weight"].t()).view(B, T, n_kv, hd).transpose(1, 2)
        v = (h @ p[b + "self_attn.v_proj.weight"].t()).view(B, T, n_kv, hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = n_heads // n_kv  # repeat_kv
        k = k[:, :, None].expand(B, n_kv, rep, T, hd).reshape(B, n_heads, T, hd)
        v = v[:, :, None].expand(B, n_kv, rep, T, hd).reshape(B, n_heads, T, hd)
        w = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(hd) + mask, dim=-1)
        a = (w @ v).transpose(1, 2).reshape(B, T, d)
        x = x + a @ p[b + "self_attn.o_proj.weight"].t()
        h = rms_norm(x, p[b + "post_attention_layernorm.weight"], eps)
        g = torch.nn.functional.silu(h @ p[b + "mlp.gate_proj.weight"].t())
        x = x + (g * (h @ p[b + "mlp.up_proj.weight"].t())) @ p[b + "mlp.down_proj.weight"].t()
    x = rms_norm(x, p["model.norm.weight"], eps)
    return x @ p["lm_head.weight"].t()


def main():
    root = pathlib.Path(sys.argv[1])
    failures = 0
    for tag in ("gpt2", "llama"):
        tensors, spec = load(root / tag)
        params = {k[len("param."):]: v for k, v in tensors.items() if k.startswith("param.")}
        L, H = int(spec["n_layers"]), int(spec["n_heads"])
        with torch.no_grad():
            if tag == "gpt2":
                ref = gpt2_forward(params, tensors["ids"], L, H)
            else:
                ref = llama_forward(params, tensors["ids"], L, H, int(spec["n_kv_heads"]),
                                    float(spec["norm_eps"]), float(spec["rope_theta"]))
        err = (ref - tensors["logits"]).abs().max().item()
        ok = torch.allclose(ref, tensors["logits"], rtol=1e-4, atol=1e-4) and ref.std().item() > 0.1
        print(f"{tag}: {len(params)} parameters, logits {tuple(ref.shape)}, max |diff| {err:.3g} -> "
              f"{'OK' if ok else 'MISMATCH'}")
        failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
