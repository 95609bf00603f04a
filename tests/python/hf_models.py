#!/usr/bin/env python3
"""Tiny random Hugging Face model directories (Llama 2, Llama 3.1 with llama3 rope scaling,
Llama 3.2 tied, Mistral GQA, Qwen2 with q/k/v biases, an explicit head_dim with attention and
MLP biases and linear rope scaling) and an independent plain-PyTorch implementation of the
transformers semantics (modeling_llama.py, modeling_mistral.py, modeling_qwen2.py,
modeling_rope_utils.py) that loads such a directory by its config.json and safetensors index,
as transformers' from_pretrained does (weights upcast to fp32). No transformers package needed.

Usage:
  hf_models.py write ROOT                      write ROOT/<family>/ for every family; prints the names
  hf_models.py loss MODEL_DIR DATASET_DIR SEQ  mean next-token cross-entropy over the val split's
                                               non-overlapping windows (what `shardtrain eval` computes)
  hf_models.py same-tensors SRC_DIR OUT_DIR    every tensor of SRC is in OUT with the same dtype,
                                               shape and bytes (exit 1 naming the first difference)
  hf_models.py check-loss GOT WANT             |GOT - WANT| <= 1e-6 * |WANT| (prints MISMATCH otherwise)
  hf_models.py stand-in DIR TOKENIZER_JSON     a random Llama 3.2 Instruct-shaped model directory (128256
                                               tokens, 2 small layers, tied, BF16) with that Llama 3
                                               tokenizer.json, its chat template and generation config:
                                               docs/use-cases.md section 1 without a download
"""
import json
import math
import pathlib
import struct
import sys

import numpy as np
import torch

# ---- safetensors, by hand: 8-byte little-endian header length, JSON header, raw data ----

DTYPES = {"F32": (np.float32, 4), "BF16": (np.uint16, 2), "F16": (np.float16, 2)}


def tensor_bytes(t, dtype):
    if dtype == "F32":
        return t.to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
    if dtype == "BF16":
        return t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().astype("<i2").tobytes()
    return t.to(torch.float16).contiguous().numpy().astype("<f2").tobytes()


def write_safetensors(path, tensors, dtype):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        b = tensor_bytes(t, dtype)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    pathlib.Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors_raw(path):
    raw = pathlib.Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[name] = (v["dtype"], v["shape"], raw[8 + n + a : 8 + n + b])
    return out


def to_tensor(dtype, shape, data):
    if dtype == "F32":
        arr = np.frombuffer(data, dtype="<f4")
    elif dtype == "BF16":
        arr = (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    elif dtype == "F16":
        arr = np.frombuffer(data, dtype="<f2").astype(np.float32)
    else:
        raise ValueError(dtype)
    return torch.from_numpy(arr.copy().reshape(shape))


def read_model_dir(d):
    """config.json and the weights as from_pretrained finds them: the index's weight_map, else
    model.safetensors."""
    d = pathlib.Path(d)
    cfg = json.loads((d / "config.json").read_text())
    index = d / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    raw = {}
    for f in files:
        raw.update(read_safetensors_raw(d / f))
    return cfg, raw


# ---- the model, following transformers' modelling code ----

def rope_inv_freq(cfg, head_dim):
    """modeling_rope_utils.py: _compute_default_rope_parameters, _compute_linear_scaling_rope_parameters,
    _compute_llama3_parameters (rope_type, else the older "type", else default)."""
    scaling = cfg.get("rope_scaling") or {}
    base = cfg.get("rope_theta", 10000.0)
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    assert rope_type == "llama3", rope_type
    factor = scaling["factor"]
    low_freq_factor, high_freq_factor = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context_len = scaling.get("original_max_position_embeddings", cfg["max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rms_norm(x, w, eps):  # LlamaRMSNorm / MistralRMSNorm / Qwen2RMSNorm
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def linear(x, p, name, bias):
    y = x @ p[name + ".weight"].t()
    return y + p[name + ".bias"] if bias else y


class Reference:
    def __init__(self, model_dir):
        cfg, raw = read_model_dir(model_dir)
        self.cfg = cfg
        self.p = {k: to_tensor(*v) for k, v in raw.items()}
        arch = cfg["architectures"][0]
        assert arch in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"), arch
        assert cfg.get("hidden_act", "silu") == "silu"
        self.d = cfg["hidden_size"]
        self.H = cfg["num_attention_heads"]
        self.KV = cfg.get("num_key_value_heads") or self.H
        self.hd = cfg.get("head_dim") or self.d // self.H
        self.L = cfg["num_hidden_layers"]
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        # LlamaAttention: bias=config.attention_bias on q, k, v, o; Qwen2Attention: q, k, v only;
        # MistralAttention: none. LlamaMLP: bias=config.mlp_bias.
        llama = arch == "LlamaForCausalLM"
        self.qkv_bias = arch == "Qwen2ForCausalLM" or (llama and cfg.get("attention_bias", False))
        self.o_bias = llama and cfg.get("attention_bias", False)
        self.mlp_bias = llama and cfg.get("mlp_bias", False)
        window = None
        if arch == "MistralForCausalLM":
            window = cfg.get("sliding_window")
        if arch == "Qwen2ForCausalLM" and cfg.get("use_sliding_window", False):
            window = cfg.get("sliding_window")
        self.window = window
        self.inv_freq = rope_inv_freq(cfg, self.hd)
        self.lm_head = self.p["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else self.p["lm_head.weight"]

    def forward(self, ids):
        p, B, T = self.p, ids.shape[0], ids.shape[1]
        H, KV, hd = self.H, self.KV, self.hd
        x = p["model.embed_tokens.weight"][ids]
        pos = torch.arange(T)[None].float()
        freqs = (self.inv_freq[None, :, None].float() @ pos[:, None, :]).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]  # attention_scaling 1.0 for these types
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        allowed = j <= i
        if self.window is not None:
            allowed = allowed & (i - j < self.window)
        mask = torch.zeros(T, T).masked_fill(~allowed, torch.finfo(torch.float32).min)
        for l in range(self.L):
            b = f"model.layers.{l}."
            h = rms_norm(x, p[b + "input_layernorm.weight"], self.eps)
            q = linear(h, p, b + "self_attn.q_proj", self.qkv_bias).view(B, T, H, hd).transpose(1, 2)
            k = linear(h, p, b + "self_attn.k_proj", self.qkv_bias).view(B, T, KV, hd).transpose(1, 2)
            v = linear(h, p, b + "self_attn.v_proj", self.qkv_bias).view(B, T, KV, hd).transpose(1, 2)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            rep = H // KV  # repeat_kv
            k = k[:, :, None].expand(B, KV, rep, T, hd).reshape(B, H, T, hd)
            v = v[:, :, None].expand(B, KV, rep, T, hd).reshape(B, H, T, hd)
            w = torch.matmul(q, k.transpose(2, 3)) * hd**-0.5 + mask
            w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
            a = torch.matmul(w, v).transpose(1, 2).reshape(B, T, H * hd)
            x = x + linear(a, p, b + "self_attn.o_proj", self.o_bias)
            h = rms_norm(x, p[b + "post_attention_layernorm.weight"], self.eps)
            g = torch.nn.functional.silu(linear(h, p, b + "mlp.gate_proj", self.mlp_bias))
            x = x + linear(g * linear(h, p, b + "mlp.up_proj", self.mlp_bias), p, b + "mlp.down_proj", self.mlp_bias)
        x = rms_norm(x, p["model.norm.weight"], self.eps)
        return x @ self.lm_head.t()


def eval_loss(model_dir, dataset, seq):
    """Mean cross-entropy over every non-overlapping window of the val split (window w = tokens
    [w*seq, w*seq+seq+1)), as `shardtrain eval` defines it."""
    ref = Reference(model_dir)
    meta = json.loads((pathlib.Path(dataset) / "meta.json").read_text())
    dtype = "<u2" if meta["dtype"] == "uint16" else "<u4"
    val = np.fromfile(pathlib.Path(dataset) / "val.bin", dtype=dtype).astype(np.int64)
    n = (len(val) - 1) // seq
    total = 0.0
    with torch.no_grad():
        for lo in range(0, n, 16):
            ws = np.stack([val[w * seq : w * seq + seq + 1] for w in range(lo, min(n, lo + 16))])
            ids, targets = torch.from_numpy(ws[:, :-1]), torch.from_numpy(ws[:, 1:])
            logits = ref.forward(ids)
            ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="none")
            total += ce.double().sum().item()
    return total / (n * seq)


# ---- the families ----

BASE = {"hidden_act": "silu", "initializer_range": 0.02, "use_cache": True, "attention_dropout": 0.0}

FAMILIES = {
    # Llama 2: MHA, untied, rope default, F32 in one file.
    "llama2": dict(arch="LlamaForCausalLM", model_type="llama", dtype="F32", shards=1,
                   cfg=dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=4, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=64,
                            tie_word_embeddings=False, vocab_size=300, bos_token_id=1, eos_token_id=2,
                            rope_scaling=None, attention_bias=False, mlp_bias=False, torch_dtype="float32")),
    # Llama 3.1: GQA, llama3 rope scaling (a short original context so it changes every
    # frequency a 32-token window sees), BF16 in three shards with an index.
    "llama31": dict(arch="LlamaForCausalLM", model_type="llama", dtype="BF16", shards=3,
                    cfg=dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=500000.0,
                             max_position_embeddings=128, tie_word_embeddings=False, vocab_size=320,
                             bos_token_id=1, eos_token_id=[2, 3], attention_bias=False, mlp_bias=False,
                             rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 16, "rope_type": "llama3"},
                             torch_dtype="bfloat16")),
    # Llama 3.2: tied embeddings (no lm_head.weight in the file), llama3 rope, explicit head_dim.
    "llama32": dict(arch="LlamaForCausalLM", model_type="llama", dtype="BF16", shards=1,
                    cfg=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=500000.0,
                             max_position_embeddings=128, tie_word_embeddings=True, vocab_size=300,
                             bos_token_id=1, eos_token_id=[2, 4], attention_bias=False, mlp_bias=False,
                             rope_scaling={"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 24, "rope_type": "llama3"},
                             torch_dtype="bfloat16")),
    # Mistral: GQA 4:1, sliding_window above the training window.
    "mistral": dict(arch="MistralForCausalLM", model_type="mistral", dtype="F32", shards=1,
                    cfg=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=1, rms_norm_eps=1e-5, rope_theta=10000.0,
                             max_position_embeddings=256, sliding_window=48, tie_word_embeddings=False,
                             vocab_size=300, bos_token_id=1, eos_token_id=2, torch_dtype="float32")),
    # Qwen2: q/k/v biases (no o_proj bias), rope_theta 1e6, no window.
    "qwen2": dict(arch="Qwen2ForCausalLM", model_type="qwen2", dtype="F32", shards=2,
                  cfg=dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1000000.0,
                           max_position_embeddings=128, use_sliding_window=False, sliding_window=128,
                           max_window_layers=2, tie_word_embeddings=False, vocab_size=300,
                           bos_token_id=1, eos_token_id=2, torch_dtype="float32")),
    # An explicit head_dim (24, not 64 / 4), Llama's attention_bias and mlp_bias, linear rope
    # scaling under the older "type" key.
    "headdim": dict(arch="LlamaForCausalLM", model_type="llama", dtype="F32", shards=1,
                    cfg=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6, rope_theta=10000.0,
                             max_position_embeddings=64, tie_word_embeddings=False, vocab_size=300,
                             bos_token_id=1, eos_token_id=2, attention_bias=True, mlp_bias=True,
                             rope_scaling={"type": "linear", "factor": 2.0}, torch_dtype="float32")),
}


def family_tensors(spec, gen):
    c, arch = spec["cfg"], spec["arch"]
    d, H, hd = c["hidden_size"], c["num_attention_heads"], c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    KV, f, V = c["num_key_value_heads"], c["intermediate_size"], c["vocab_size"]
    llama = arch == "LlamaForCausalLM"
    qkv_bias = arch == "Qwen2ForCausalLM" or (llama and c.get("attention_bias", False))
    o_bias = llama and c.get("attention_bias", False)
    mlp_bias = llama and c.get("mlp_bias", False)

    def mat(*shape, std=0.15):
        return torch.randn(*shape, generator=gen) * std

    t = {"model.embed_tokens.weight": mat(V, d, std=0.5)}
    for l in range(c["num_hidden_layers"]):
        b = f"model.layers.{l}."
        t[b + "input_layernorm.weight"] = 1 + mat(d, std=0.1)
        for name, rows in (("q_proj", H * hd), ("k_proj", KV * hd), ("v_proj", KV * hd)):
            t[b + f"self_attn.{name}.weight"] = mat(rows, d)
            if qkv_bias:
                t[b + f"self_attn.{name}.bias"] = mat(rows, std=0.1)
        t[b + "self_attn.o_proj.weight"] = mat(d, H * hd)
        if o_bias:
            t[b + "self_attn.o_proj.bias"] = mat(d, std=0.1)
        t[b + "post_attention_layernorm.weight"] = 1 + mat(d, std=0.1)
        for name, shape in (("gate_proj", (f, d)), ("up_proj", (f, d)), ("down_proj", (d, f))):
            t[b + f"mlp.{name}.weight"] = mat(*shape)
            if mlp_bias:
                t[b + f"mlp.{name}.bias"] = mat(shape[0], std=0.1)
    t["model.norm.weight"] = 1 + mat(d, std=0.1)
    if not c.get("tie_word_embeddings", False):
        t["lm_head.weight"] = mat(V, d, std=0.3)
    return t


def write_family(root, name, spec, seed):
    d = pathlib.Path(root) / name
    d.mkdir(parents=True, exist_ok=True)
    cfg = dict(BASE, architectures=[spec["arch"]], model_type=spec["model_type"], **spec["cfg"])
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    tensors = family_tensors(spec, torch.Generator().manual_seed(seed))
    n = spec["shards"]
    if n == 1:
        write_safetensors(d / "model.safetensors", tensors, spec["dtype"])
    else:
        names = list(tensors)
        weight_map, total = {}, 0
        for i in range(n):
            part = {k: tensors[k] for k in names[i::n]}  # interleaved: files do not follow model order
            fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            write_safetensors(d / fname, part, spec["dtype"])
            for k, v in part.items():
                weight_map[k] = fname
                total += v.numel() * DTYPES[spec["dtype"]][1]
        (d / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    # Tokenizer files travel with an export (their content is not read by these tests).
    (d / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128, "family": name}) + "\n")
    (d / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}) + "\n")


def same_tensors(src, out):
    _, a = read_model_dir(src)
    _, b = read_model_dir(out)
    for name, (dt, shape, data) in a.items():
        if name not in b:
            return f"{name}: missing in {out}"
        if b[name][0] != dt or b[name][1] != shape:
            return f"{name}: {dt} {shape} in {src}, {b[name][0]} {b[name][1]} in {out}"
        if b[name][2] != data:
            return f"{name}: the bytes differ"
    extra = sorted(set(b) - set(a))
    if extra:
        return f"{out} has tensors the source has not: {extra[:3]}"
    return None


# The Llama 3 Instruct chat template (Meta-Llama-3-8B-Instruct's tokenizer_config.json).
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")


def write_stand_in(d, tokenizer_json):
    """Llama 3.2 1B Instruct's layout and vocabulary at a toy size: what a user downloads, minus
    the training (random weights, so generated text is noise)."""
    import shutil
    d = pathlib.Path(d)
    d.mkdir(parents=True, exist_ok=True)
    spec = dict(arch="LlamaForCausalLM", model_type="llama", dtype="BF16", shards=1,
                cfg=dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=500000.0,
                         max_position_embeddings=131072, tie_word_embeddings=True, vocab_size=128256,
                         bos_token_id=128000, eos_token_id=[128001, 128008, 128009], attention_bias=False,
                         mlp_bias=False, rope_scaling={"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                       "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                         torch_dtype="bfloat16"))
    cfg = dict(BASE, architectures=[spec["arch"]], model_type=spec["model_type"], **spec["cfg"])
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_safetensors(d / "model.safetensors", family_tensors(spec, torch.Generator().manual_seed(7)), "BF16")
    shutil.copyfile(tokenizer_json, d / "tokenizer.json")
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "model_max_length": 131072,
         "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": LLAMA3_CHAT_TEMPLATE}, indent=2) + "\n")
    (d / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "do_sample": True,
         "temperature": 0.6, "top_p": 0.9}, indent=2) + "\n")
    print(d)


def main():
    cmd = sys.argv[1]
    if cmd == "stand-in":
        write_stand_in(sys.argv[2], sys.argv[3])
        return 0
    if cmd == "write":
        for i, (name, spec) in enumerate(FAMILIES.items()):
            write_family(sys.argv[2], name, spec, seed=100 + i)
        print(" ".join(FAMILIES))
        return 0
    if cmd == "loss":
        print(repr(eval_loss(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
        return 0
    if cmd == "same-tensors":
        why = same_tensors(sys.argv[2], sys.argv[3])
        if why:
            print("MISMATCH: " + why)
            return 1
        print("same tensors, same bytes")
        return 0
    if cmd == "check-loss":
        got, want = float(sys.argv[2]), float(sys.argv[3])
        rel = abs(got - want) / abs(want)
        ok = rel <= 1e-6
        print(f"shardtrain {got!r} reference {want!r} relative difference {rel:.3g} -> {'OK' if ok else 'MISMATCH'}")
        return 0 if ok else 1
    raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    sys.exit(main())
