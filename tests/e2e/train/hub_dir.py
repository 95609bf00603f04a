#!/usr/bin/env python3
"""Tiny Hugging Face Llama directories as a hostile sender could make them, with the Python
standard library only (no torch, numpy or transformers): config.json and F32 safetensors
weights whose values are a small deterministic pattern, for the files-from-the-hub tests.

Usage:
  hub_dir.py llama DIR [--layers N] [--hidden D] [--ff F] [--heads H] [--kv K] [--vocab V]
                       [--weights-layers N]   write weights for N layers (default: --layers)
                       [--set KEY=JSON ...]   override a config.json key after the fact
                       [--value TENSOR=X]     element 0 of TENSOR is X (e.g. 70000: beyond fp16)
                       [--scale S]            every value times S (tell two weight sets apart)
                       [--index]              weights as two shards + model.safetensors.index.json
                       [--no-weights]         config.json only
  hub_dir.py first DIR TENSOR                 element 0 of TENSOR in DIR's safetensors (F32), printed
"""
import json
import pathlib
import struct
import sys


def write_safetensors(path, tensors):
    """tensors: list of (name, shape, list of floats) written as F32, back to back."""
    header, blobs, offset = {}, [], 0
    for name, shape, values in tensors:
        data = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_first(path, name):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        if name not in header:
            return None
        begin = header[name]["data_offsets"][0]
        f.seek(8 + n + begin)
        return struct.unpack("<f", f.read(4))[0]


def llama_tensors(layers, d, f, heads, kv, vocab, scale):
    hd = d // heads
    shapes = [("model.embed_tokens.weight", [vocab, d])]
    for i in range(layers):
        p = "model.layers.%d." % i
        shapes += [(p + "self_attn.q_proj.weight", [heads * hd, d]), (p + "self_attn.k_proj.weight", [kv * hd, d]),
                   (p + "self_attn.v_proj.weight", [kv * hd, d]), (p + "self_attn.o_proj.weight", [d, heads * hd]),
                   (p + "mlp.gate_proj.weight", [f, d]), (p + "mlp.up_proj.weight", [f, d]),
                   (p + "mlp.down_proj.weight", [d, f]), (p + "input_layernorm.weight", [d]),
                   (p + "post_attention_layernorm.weight", [d])]
    shapes += [("model.norm.weight", [d]), ("lm_head.weight", [vocab, d])]
    out = []
    for k, (name, shape) in enumerate(shapes):
        n = 1
        for s in shape:
            n *= s
        norm = name.endswith("norm.weight")
        out.append((name, shape, [1.0 if norm else scale * (((i * 7 + k * 13) % 17) - 8) / 64.0 for i in range(n)]))
    return out


def main(argv):
    if argv[0] == "first":
        d = pathlib.Path(argv[1])
        files = [d / "model.safetensors"] if (d / "model.safetensors").exists() else sorted(d.glob("model-*.safetensors"))
        for f in files:
            v = read_first(f, argv[2])
            if v is not None:
                print(repr(v))
                return 0
        print("no tensor %s in %s" % (argv[2], d), file=sys.stderr)
        return 1
    assert argv[0] == "llama", __doc__
    d = pathlib.Path(argv[1])
    opt = {"layers": 2, "hidden": 32, "ff": 64, "heads": 4, "kv": 2, "vocab": 256, "weights-layers": None,
           "scale": 1.0}
    sets, values, index, weights = [], [], False, True
    args = argv[2:]
    while args:
        a = args.pop(0)
        if a == "--set":
            sets.append(args.pop(0))
        elif a == "--value":
            values.append(args.pop(0))
        elif a == "--index":
            index = True
        elif a == "--no-weights":
            weights = False
        elif a == "--scale":
            opt["scale"] = float(args.pop(0))
        else:
            opt[a[2:]] = int(args.pop(0))
    d.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": opt["hidden"],
              "intermediate_size": opt["ff"], "num_hidden_layers": opt["layers"],
              "num_attention_heads": opt["heads"], "num_key_value_heads": opt["kv"], "vocab_size": opt["vocab"],
              "hidden_act": "silu", "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "torch_dtype": "float32"}
    for s in sets:
        k, v = s.split("=", 1)
        config[k] = json.loads(v)
    (d / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    if not weights:
        return 0
    wl = opt["weights-layers"] if opt["weights-layers"] is not None else opt["layers"]
    tensors = llama_tensors(wl, opt["hidden"], opt["ff"], opt["heads"], opt["kv"], opt["vocab"], opt["scale"])
    for v in values:
        name, x = v.split("=", 1)
        for t in tensors:
            if t[0] == name:
                t[2][0] = float(x)
    if not index:
        write_safetensors(d / "model.safetensors", tensors)
        return 0
    half = len(tensors) // 2
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    write_safetensors(d / names[0], tensors[:half])
    write_safetensors(d / names[1], tensors[half:])
    weight_map = {t[0]: names[0 if i < half else 1] for i, t in enumerate(tensors)}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
