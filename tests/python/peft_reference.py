#!/usr/bin/env python3
"""An independent implementation of Hugging Face PEFT's LoRA (peft.tuners.lora: LoraConfig,
lora.Linear, get_peft_model_state_dict / set_peft_model_state_dict, merge_and_unload; the LoRA
paper, arXiv:2106.09685, and rsLoRA, arXiv:2312.03732) on top of hf_models.py's plain-PyTorch
Llama / Mistral / Qwen2 (weights upcast to fp32). No transformers or peft package needed.

Semantics. A targeted linear computes y = W x (+ b) + (B (A dropout(x))) * s with A [r, in],
B [out, r] and s = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora (dropout is the
identity here: lora_dropout must be 0 to compute a loss or a step). PEFT's default init is
A ~ kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), B = 0; `random-adapter` draws B
from N(0, 0.02^2) instead so that the adapter changes the output, as a trained hub adapter does.
Targets are matched as PEFT does against the base model's module names ("model.layers.0.
self_attn.q_proj"): a list entry t matches a name equal to t or ending in "." + t; a string is
re.fullmatch'ed, except "all-linear" = every nn.Linear except the output embedding (lm_head),
which PEFT >= 0.15 writes into adapter_config.json as the list of full module names. A module
matched by modules_to_save (regex (^|.*\\.)M($|\\..*)) is never a LoRA target. modules_to_save
entries M wrap every module whose name ends with M as a plain string (PEFT's _set_trainable:
"norm" also takes input_layernorm and post_attention_layernorm); the wrapped copy is trained in
full. `merge` is merge_and_unload: W' = W + (B @ A) * s (in fp32, rounded once to the base's
dtype), modules_to_save copies replace the originals.

Adapter directory: adapter_config.json (the LoraConfig keys PEFT 0.10 - 0.14 write, all
understood by every later version: a missing key takes its default, only peft_type is required)
and adapter_model.safetensors with PEFT's saved names (the adapter name "default" removed):
  base_model.model.<module>.lora_A.weight    [r, in]   F32 (PEFT upcasts adapters to fp32)
  base_model.model.<module>.lora_B.weight    [out, r]  F32
  base_model.model.<module>.<param>          a modules_to_save module's own parameters, e.g.
                                             base_model.model.model.norm.weight (PEFT stores the
                                             copy as <module>.modules_to_save.default.<param> in
                                             memory and saves it under the original module's name)

Training items (`step`): item i of the train split is tokens [i*SEQ, i*SEQ + SEQ + 1), i < (n-1)//SEQ
(shardtrain's TokenSampler); with a loss mask (dataset version 2) target t of an item counts iff
the mask byte of its token t+1 is 1, and the loss is the sum over counted targets / their number.

Usage:
  peft_reference.py random-adapter MODEL_DIR OUT_DIR --r R --alpha A [--rslora]
        [--targets all-linear|q_proj,v_proj,...] [--modules-to-save PATTERN,...] [--seed S]
      a PEFT adapter directory for that model (B random, non-zero). PATTERNs are shardtrain
      parameter-name patterns (a substring, or an fnmatch glob when it holds * ? [) matched
      against the base's parameter names; the config lists the matched modules' full names.
  peft_reference.py loss MODEL_DIR ADAPTER_DIR DATASET_DIR SEQ [--base-nf4 BLOCK [--nf4-double-quant]]
      mean next-token cross-entropy of base + adapter over the val split's non-overlapping
      windows (hf_models.py's `loss`, run on the adapted model; counted targets when masked).
      --base-nf4 (QLoRA, also for `step`): every linear weight of the blocks goes through NF4
      first (nf4_reference.py: bitsandbytes' quantize_4bit / dequantize_4bit "nf4" in blocks of
      BLOCK values, --nf4-double-quant with its double-quantized statistics) and is computed
      with dequantized in the computation's dtype; embeddings, norms, head and biases as stored
  peft_reference.py step MODEL_DIR ADAPTER_DIR DATASET_DIR SEQ --lr LR --weight-decay WD
        --beta1 B1 --beta2 B2 --eps E [--clip C] [--no-decay PATTERN,...] [--float64] OUT_ADAPTER_DIR
      one full-batch step over every training item: the mean cross-entropy, its gradient w.r.t.
      the adapter (LoRA A, B and the modules_to_save parameters) only, optional global-norm
      clipping (coef = C / (norm + 1e-6) when below 1), then torch.optim.AdamW's first step
      (bias-corrected, decoupled decay on every adapter parameter unless --no-decay names it:
      patterns as above on "model.layers.0.self_attn.q_proj.lora_A.weight" / "model.norm.weight").
      Writes OUT_ADAPTER_DIR (the same adapter_config.json, tensors F32) and prints
      `loss_before`, `grad_norm` (before clipping), `items`, `targets`. --float64: the whole
      computation in float64 (RMSNorm and softmax included), for gradient checks.
  peft_reference.py merge MODEL_DIR ADAPTER_DIR OUT_DIR [--base-nf4 BLOCK [--nf4-double-quant]] [--delta-fp64]
      the merged model directory: MODEL_DIR's files (config.json, index, tokenizer files)
      copied, its safetensors files rewritten with the same names, order and dtypes.
      --base-nf4 BLOCK [--nf4-double-quant] (a QLoRA adapter, PEFT's merge on a 4-bit base): every
      linear weight of the blocks, targets or not, through NF4 first (as for `loss`), dequantized
      in fp32. --delta-fp64: W + s * (sum over k of B[:, k] A[k, :]) in fp64, k in order, rounded
      once (shardtrain's merge, so the two can agree bit for bit) instead of PEFT's fp32 B @ A
  peft_reference.py compare-adapters GOT_DIR WANT_DIR [--rtol 1e-6]
      the same tensor names and shapes, every tensor within max|got-want| <= rtol * max|want|
      (the worst is reported), and equal r, lora_alpha, use_rslora, target_modules and
      modules_to_save (as sets) in adapter_config.json
  peft_reference.py self-test [WORK_DIR]
      on hf_models.py's families and a random token dataset, in seconds: B = 0 gives hf_models'
      plain loss bit for bit (every family); a random adapter's merged model has its loss within
      1e-6 (fp32 families); rsLoRA's alpha / sqrt(r); PEFT's names and matching rules; the
      step's gradient against float64 finite differences and AdamW's first step (clipped,
      decayed) against a float64 computation by hand; compare-adapters
Every command prints its results on stdout and exits 1 with a message on a mismatch or error.
"""
import argparse
import contextlib
import fnmatch
import json
import math
import pathlib
import re
import shutil
import struct
import sys
import tempfile
import types

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import hf_models as hm  # noqa: E402


class Failure(Exception):
    """A mismatch or an unusable input: printed, exit 1."""


# ---- LoRA inside hf_models' Reference ----
#
# Reference.forward calls hf_models' module-level linear(x, p, name, bias) for every projection.
# It is replaced by one that adds the LoRA term when the parameter dict carries LoRA factors for
# that module (a LoraParams); for a plain dict it is the original function, so plain models
# compute exactly what they computed before.

_plain_linear = hm.linear


class LoraParams(dict):
    """The base parameters (with modules_to_save copies in place) plus lora: {module: (A, B, s)}."""

    lora = {}


def _lora_linear(x, p, name, bias):
    result = _plain_linear(x, p, name, bias)  # base_layer(x)
    lora = getattr(p, "lora", None)
    if lora and name in lora:
        a, b, s = lora[name]
        result = result + ((x @ a.t()) @ b.t()) * s  # lora_B(lora_A(dropout(x))) * scaling
    return result


hm.linear = _lora_linear


@contextlib.contextmanager
def float64_semantics():
    """hf_models follows transformers' fp32 upcasts (RMSNorm in fp32, softmax dtype=float32);
    for a float64 finite-difference check those become float64 as well."""

    def rms_norm64(x, w, eps):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    class Torch64(types.ModuleType):
        def __getattr__(self, n):
            return getattr(torch, n)

        @staticmethod
        def softmax(x, dim, dtype=None):
            return torch.softmax(x, dim=dim)

    saved = hm.rms_norm, hm.torch
    hm.rms_norm, hm.torch = rms_norm64, Torch64("torch64")
    try:
        yield
    finally:
        hm.rms_norm, hm.torch = saved


# ---- the base model's module names, as PEFT sees them ----

ALL_LINEAR = "all-linear"


class ModelInfo:
    """Module names of the base model (the keys of LlamaForCausalLM.named_modules())."""

    def __init__(self, model_dir):
        self.dir = pathlib.Path(model_dir)
        self.cfg, raw = hm.read_model_dir(model_dir)
        self.shapes = {k: v[1] for k, v in raw.items()}
        self.dtypes = {k: v[0] for k, v in raw.items()}
        self.tied = bool(self.cfg.get("tie_word_embeddings", False))
        self.params = list(raw)
        leaves = {n.rsplit(".", 1)[0] for n in raw}
        leaves.add("lm_head")  # a Linear in the model even when its weight is the embedding's
        self.leaves = leaves
        keys = set()
        for m in leaves:
            parts = m.split(".")
            for i in range(1, len(parts) + 1):
                keys.add(".".join(parts[:i]))
        self.modules = sorted(keys)
        self.linears = {m for m in leaves
                        if m == "lm_head" or (len(self.shapes.get(m + ".weight", [])) == 2 and m != "model.embed_tokens")}

    def params_of(self, module):
        return [n for n in self.params if n.rsplit(".", 1)[0] == module]

    def in_out(self, module):
        out, inp = self.shapes[module + ".weight"]
        return inp, out


def resolve_targets(info, target_modules, modules_to_save):
    """PEFT's check_target_module_exists over the base model's module names (plus "all-linear")."""
    if target_modules is None:
        raise Failure("adapter_config.json: target_modules is null")
    if isinstance(target_modules, str) and target_modules.lower() == ALL_LINEAR:
        target_modules = sorted(info.linears - {"lm_head"})
    found = []
    for key in info.modules:
        if modules_to_save and any(re.match(rf"(^|.*\.){m}($|\..*)", key) for m in modules_to_save):
            continue
        if isinstance(target_modules, str):
            hit = re.fullmatch(target_modules, key) is not None
        else:
            hit = key in target_modules or any(key.endswith("." + t) for t in target_modules)
        if not hit:
            continue
        if key not in info.linears:
            raise Failure(f"target {key} is not a linear layer (PEFT refuses it)")
        if key == "lm_head":
            raise Failure("a LoRA on lm_head is not supported by this reference (shardtrain's targets are the "
                          "decoder blocks' linears)")
        found.append(key)
    if not found:
        raise Failure(f"target_modules {target_modules!r} match no module of {info.dir}")
    return found


def resolve_modules_to_save(info, modules_to_save):
    """PEFT's _set_trainable: every module whose name ends with an entry (a plain string suffix)."""
    found = []
    for m in modules_to_save or []:
        hits = [k for k in info.modules if k.endswith(m)]
        if not hits:
            print(f"warning: modules_to_save entry {m!r} matches no module (PEFT ignores it)", file=sys.stderr)
        for k in hits:
            if k not in info.leaves or not info.params_of(k):
                raise Failure(f"modules_to_save entry {m!r} matches {k!r}, which is not a module with parameters of "
                              "its own (not supported here)")
            if info.tied and k in ("model.embed_tokens", "lm_head"):
                raise Failure(f"modules_to_save {k} on a model with tied embeddings is not supported here")
            if k not in found:
                found.append(k)
    return sorted(found, key=info.modules.index)


# ---- adapter directories ----

PREFIX = "base_model.model."


def lora_names(module):
    return PREFIX + module + ".lora_A.weight", PREFIX + module + ".lora_B.weight"


def adapter_config(r, alpha, rslora, targets, modules_to_save, base):
    """The LoraConfig.to_dict() keys of PEFT 0.10 - 0.14 with their defaults, as save_pretrained
    writes them (inference_mode true, sorted keys, indent 2)."""
    return {
        "alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": base, "bias": "none",
        "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True, "layer_replication": None,
        "layers_pattern": None, "layers_to_transform": None, "loftq_config": {}, "lora_alpha": alpha,
        "lora_dropout": 0.0, "megatron_config": None, "megatron_core": "megatron.core",
        "modules_to_save": modules_to_save, "peft_type": "LORA", "r": r, "rank_pattern": {}, "revision": None,
        "target_modules": targets, "task_type": "CAUSAL_LM", "use_dora": False, "use_rslora": rslora,
    }


def scale_of(cfg):
    r, alpha = cfg["r"], cfg.get("lora_alpha", 8)
    return alpha / math.sqrt(r) if cfg.get("use_rslora", False) else alpha / r


class Adapter:
    """An adapter resolved against a base model: lora {module: (A, B)}, saved {param name: tensor}."""

    def __init__(self, cfg, info, lora, saved):
        self.cfg, self.info, self.lora, self.saved = cfg, info, lora, saved
        self.scale = scale_of(cfg)


def check_config(cfg, need_no_dropout):
    if cfg.get("peft_type") != "LORA":
        raise Failure(f"peft_type is {cfg.get('peft_type')!r}, not LORA")
    unsupported = [("use_dora", False), ("fan_in_fan_out", False), ("bias", "none"), ("lora_bias", False),
                   ("rank_pattern", {}), ("alpha_pattern", {}), ("layers_to_transform", None),
                   ("layer_replication", None), ("exclude_modules", None), ("trainable_token_indices", None),
                   ("target_parameters", None)]
    for key, default in unsupported:
        v = cfg.get(key, default)
        if v not in (default, None) and not (isinstance(default, dict) and v == {}) and v != []:
            raise Failure(f"adapter_config.json: {key} = {v!r} is not supported by this reference")
    if need_no_dropout and cfg.get("lora_dropout", 0.0) != 0.0:
        raise Failure(f"lora_dropout {cfg['lora_dropout']} (a loss or a step here needs 0)")


def read_adapter(adapter_dir, model_dir, need_no_dropout=True):
    d = pathlib.Path(adapter_dir)
    cfg = json.loads((d / "adapter_config.json").read_text())
    check_config(cfg, need_no_dropout)
    info = ModelInfo(model_dir)
    mts = cfg.get("modules_to_save")
    targets = resolve_targets(info, cfg.get("target_modules"), mts)
    saved_modules = resolve_modules_to_save(info, mts)
    raw = hm.read_safetensors_raw(d / "adapter_model.safetensors")
    tensors = {k: hm.to_tensor(*v) for k, v in raw.items()}
    r, lora, saved, expected = cfg["r"], {}, {}, set()
    for m in targets:
        na, nb = lora_names(m)
        inp, out = info.in_out(m)
        for n, shape in ((na, [r, inp]), (nb, [out, r])):
            if n not in tensors:
                raise Failure(f"{d}: {n} missing from adapter_model.safetensors")
            if list(tensors[n].shape) != shape:
                raise Failure(f"{d}: {n} has shape {list(tensors[n].shape)}, expected {shape}")
            expected.add(n)
        lora[m] = (tensors[na], tensors[nb])
    for m in saved_modules:
        for pname in info.params_of(m):
            n = PREFIX + pname
            if n not in tensors:
                raise Failure(f"{d}: modules_to_save tensor {n} missing (PEFT's loader fails on it too)")
            if list(tensors[n].shape) != info.shapes[pname]:
                raise Failure(f"{d}: {n} has shape {list(tensors[n].shape)}, expected {info.shapes[pname]}")
            saved[pname] = tensors[n]
            expected.add(n)
    extra = sorted(set(tensors) - expected)
    if extra:
        raise Failure(f"{d}: tensors that belong to no target or module to save: {extra[:4]}")
    return Adapter(cfg, info, lora, saved)


def write_adapter(out_dir, cfg, lora, saved):
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    tensors = {}
    for m, (a, b) in lora.items():
        na, nb = lora_names(m)
        tensors[na], tensors[nb] = a.detach(), b.detach()
    for pname, t in saved.items():
        tensors[PREFIX + pname] = t.detach()
    hm.write_safetensors(out / "adapter_model.safetensors", tensors, "F32")


def param_patterns_match(name, patterns):
    """shardtrain's matches_any: a glob (holds * ? [) matches the whole name, else a substring."""
    for p in patterns:
        if not p:
            continue
        if any(c in p for c in "*?[") and fnmatch.fnmatchcase(name, p):
            return True
        if not any(c in p for c in "*?[") and p in name:
            return True
    return False


def random_adapter(model_dir, out_dir, r, alpha, rslora, targets, mts_patterns, seed):
    info = ModelInfo(model_dir)
    if targets.lower() == ALL_LINEAR:
        target_modules = sorted(info.linears - {"lm_head"})  # what PEFT >= 0.15 writes for "all-linear"
    else:
        target_modules = sorted({t.strip() for t in targets.split(",") if t.strip()})
    mts = None
    if mts_patterns:
        pats = [p.strip() for p in mts_patterns.split(",") if p.strip()]
        mods = sorted({n.rsplit(".", 1)[0] for n in info.params if param_patterns_match(n, pats)}, key=info.modules.index)
        if not mods:
            raise Failure(f"--modules-to-save {mts_patterns!r} matches no parameter")
        mts = mods
        if resolve_modules_to_save(info, mts) != mods:  # PEFT's suffix rule must give back the same modules
            raise Failure(f"PEFT's modules_to_save rule takes {resolve_modules_to_save(info, mts)} for {mods}")
    cfg = adapter_config(r, alpha, rslora, target_modules, mts, str(pathlib.Path(model_dir).resolve()))
    modules = resolve_targets(info, target_modules, mts)
    gen = torch.Generator().manual_seed(seed)
    lora, saved = {}, {}
    for m in modules:
        inp, out = info.in_out(m)
        bound = 1.0 / math.sqrt(inp)  # kaiming_uniform_(a=sqrt(5)): gain sqrt(2/6) * sqrt(3/fan_in)
        a = (torch.rand(r, inp, generator=gen, dtype=torch.float64) * 2 - 1) * bound
        b = torch.randn(out, r, generator=gen, dtype=torch.float64) * 0.02
        lora[m] = (a.float(), b.float())
    base = hm.Reference(model_dir).p
    for m in resolve_modules_to_save(info, mts):
        for pname in info.params_of(m):  # a trained copy: the base value moved a little
            saved[pname] = base[pname] + torch.randn(base[pname].shape, generator=gen) * 0.02
    write_adapter(out_dir, cfg, lora, saved)
    print(f"{out_dir}: {len(lora)} LoRA targets, r {r}, lora_alpha {alpha}, scale {scale_of(cfg)!r}"
          f"{' (rslora)' if rslora else ''}, modules_to_save {mts}")


# ---- the adapted model ----

# QLoRA's base: every linear weight of the blocks (model.layers.N.*.weight with two dimensions)
# stored as NF4 codes of blocks of `nf4_block` values (bitsandbytes' quantize_4bit "nf4",
# optionally with its double-quantized statistics) and computed with in `dtype`; embeddings,
# norms, the head and biases stay as they are (bitsandbytes' load_in_4bit skips lm_head).
_BLOCK_LINEAR = re.compile(r"^model\.layers\.\d+\..+\.weight$")


def nf4_round_trip(w, block, double_quant, dtype):
    import nf4_reference as nf4
    packed, absmax = nf4.quantize_nf4(w, block)
    if double_quant:
        absmax = nf4.dequantize_absmax(*nf4.quantize_absmax(absmax))
    return nf4.dequantize_nf4(packed, absmax, w.numel(), block, dtype).reshape(w.shape)


def build(model_dir, adapter, dtype=torch.float32, trainable=False, nf4_block=None, nf4_double_quant=False):
    """hf_models' Reference with the adapter in: LoRA factors on the targets, the modules_to_save
    copies in place of the originals; with nf4_block, the blocks' linear weights through NF4 (QLoRA).
    Returns (model, the trainable tensors by name)."""
    ref = hm.Reference(model_dir)
    def base(k, v):
        if nf4_block and v.dim() == 2 and _BLOCK_LINEAR.match(k) and k not in adapter.saved:
            return nf4_round_trip(v, nf4_block, nf4_double_quant, dtype)
        return v.to(dtype)
    p = LoraParams({k: base(k, v) for k, v in ref.p.items()})
    train = {}
    for pname, t in adapter.saved.items():
        p[pname] = t.detach().to(dtype).clone().requires_grad_(trainable)
        train[pname] = p[pname]
    lora = {}
    for m, (a, b) in adapter.lora.items():
        a = a.detach().to(dtype).clone().requires_grad_(trainable)
        b = b.detach().to(dtype).clone().requires_grad_(trainable)
        lora[m] = (a, b, adapter.scale)
        train[m + ".lora_A.weight"], train[m + ".lora_B.weight"] = a, b
    p.lora = lora
    ref.p = p
    ref.lm_head = p["model.embed_tokens.weight"] if ref.cfg.get("tie_word_embeddings", False) else p["lm_head.weight"]
    return ref, train


@contextlib.contextmanager
def reference_is(model):
    """hf_models.eval_loss builds Reference(model_dir); let it evaluate this model instead."""
    saved = hm.Reference
    hm.Reference = lambda _dir: model
    try:
        yield
    finally:
        hm.Reference = saved


def read_split(dataset, split):
    ds = pathlib.Path(dataset)
    meta = json.loads((ds / "meta.json").read_text())
    dtype = "<u2" if meta["dtype"] == "uint16" else "<u4"
    tokens = np.fromfile(ds / f"{split}.bin", dtype=dtype).astype(np.int64)
    mask = None
    if meta.get("version") == 2 or "mask" in meta:
        mask = np.fromfile(ds / f"{split}.mask", dtype=np.uint8)
        if len(mask) != len(tokens):
            raise Failure(f"{split}.mask has {len(mask)} bytes for {len(tokens)} tokens")
    return tokens, mask


def windows_loss(model, tokens, mask, seq, backward=False):
    """Sum of the counted targets' cross-entropy over every item [i*seq, i*seq+seq+1) and their
    number; with backward, the gradient of sum / number accumulates in the trainable tensors."""
    n = (len(tokens) - 1) // seq
    if n < 1:
        raise Failure(f"{len(tokens)} tokens make no window of {seq} + 1")
    counted = n * seq if mask is None else int(sum(mask[w * seq + 1: w * seq + seq + 1].sum() for w in range(n)))
    total = 0.0
    for lo in range(0, n, 16):
        ws = np.stack([tokens[w * seq: w * seq + seq + 1] for w in range(lo, min(n, lo + 16))])
        ids, targets = torch.from_numpy(ws[:, :-1]), torch.from_numpy(ws[:, 1:])
        logits = model.forward(ids)
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                                               reduction="none")
        if mask is not None:
            m = np.stack([mask[w * seq + 1: w * seq + seq + 1] for w in range(lo, min(n, lo + 16))])
            ce = ce * torch.from_numpy(m.reshape(-1).astype(np.float32)).to(ce.dtype)
        total += ce.double().sum().item()
        if backward and counted > 0:
            (ce.sum() / counted).backward()
    return total, counted, n


def adapter_loss(model_dir, adapter_dir, dataset, seq, nf4_block=None, nf4_double_quant=False):
    adapter = read_adapter(adapter_dir, model_dir)
    model, _ = build(model_dir, adapter, nf4_block=nf4_block, nf4_double_quant=nf4_double_quant)
    tokens, mask = read_split(dataset, "val")
    if mask is None:
        with reference_is(model):
            return hm.eval_loss(model_dir, dataset, seq)  # exactly hf_models' `loss`, on the adapted model
    with torch.no_grad():
        total, counted, _ = windows_loss(model, tokens, mask, seq)
    return total / counted if counted else 0.0


def step(model_dir, adapter_dir, dataset, seq, lr, wd, b1, b2, eps, clip, no_decay, out_dir, float64=False,
         nf4_block=None, nf4_double_quant=False):
    adapter = read_adapter(adapter_dir, model_dir)
    dtype = torch.float64 if float64 else torch.float32
    ctx = float64_semantics() if float64 else contextlib.nullcontext()
    with ctx:
        model, train = build(model_dir, adapter, dtype=dtype, trainable=True, nf4_block=nf4_block,
                             nf4_double_quant=nf4_double_quant)
        tokens, mask = read_split(dataset, "train")
        total, counted, n = windows_loss(model, tokens, mask, seq, backward=True)
    loss = total / counted if counted else 0.0
    names = list(train)
    for k in names:
        if train[k].grad is None:
            train[k].grad = torch.zeros_like(train[k])
    norm = math.sqrt(sum(float(train[k].grad.double().pow(2).sum()) for k in names))
    if clip is not None and clip > 0:
        coef = clip / (norm + 1e-6)  # torch.nn.utils.clip_grad_norm_ / shardtrain's clip_grad_norm
        if coef < 1.0:
            for k in names:
                train[k].grad.mul_(coef)
    decay = [train[k] for k in names if not param_patterns_match(k, no_decay)]
    keep = [train[k] for k in names if param_patterns_match(k, no_decay)]
    groups = [g for g in ({"params": decay, "weight_decay": wd}, {"params": keep, "weight_decay": 0.0}) if g["params"]]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(b1, b2), eps=eps, foreach=False)
    opt.step()
    lora = {m: (train[m + ".lora_A.weight"].float(), train[m + ".lora_B.weight"].float()) for m in adapter.lora}
    saved = {k: train[k].float() for k in adapter.saved}
    write_adapter(out_dir, adapter.cfg, lora, saved)
    src_cfg = pathlib.Path(adapter_dir) / "adapter_config.json"
    shutil.copyfile(src_cfg, pathlib.Path(out_dir) / "adapter_config.json")  # the same config, byte for byte
    return loss, norm, n, counted, {k: train[k].grad for k in names}


def write_safetensors_like(path, entries):
    """entries: (name, dtype, shape, bytes) in order; the header as hf_models writes it."""
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, dt, shape, data in entries:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    pathlib.Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(e[3] for e in entries))


def merge(model_dir, adapter_dir, out_dir, nf4_block=None, nf4_double_quant=False, delta_fp64=False):
    """merge_and_unload: W' = W + (B @ A) * s per target (fp32, rounded once to the tensor's
    dtype); modules_to_save copies replace the originals; everything else byte for byte.
    nf4_block (QLoRA): every linear weight of the blocks is first dequantized from NF4 (fp32),
    targets or not. delta_fp64: W' = fp32(W + s * sum_k B[:, k] A[k, :]) with the sum in fp64 in
    the order of k (shardtrain's merge) instead of the fp32 GEMM."""
    adapter = read_adapter(adapter_dir, model_dir, need_no_dropout=False)
    src, out = pathlib.Path(model_dir), pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    new = {}
    for m, (a, b) in adapter.lora.items():
        if delta_fp64:
            d = torch.zeros(b.shape[0], a.shape[1], dtype=torch.float64)
            for k in range(a.shape[0]):
                d += b[:, k:k + 1].double() * a[k:k + 1, :].double()
            new[m + ".weight"] = d
        else:
            new[m + ".weight"] = (b.float() @ a.float()) * adapter.scale  # get_delta_weight
    def nf4_base(name, w):
        if nf4_block and w.dim() == 2 and _BLOCK_LINEAR.match(name) and name not in adapter.saved:
            return nf4_round_trip(w, nf4_block, nf4_double_quant, torch.float32)
        return w
    files = sorted(src.glob("*.safetensors"))
    index = src / "model.safetensors.index.json"
    if index.exists():
        files = [src / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copyfile(f, out / f.name)
    changed = 0
    for f in files:
        entries = []
        for name, (dt, shape, data) in hm.read_safetensors_raw(f).items():
            w = hm.to_tensor(dt, shape, data)
            quantized = nf4_base(name, w)
            if name in new or name in adapter.saved:
                if name not in new:
                    w = adapter.saved[name].float()
                elif delta_fp64:
                    w = (quantized.double() + new[name] * adapter.scale).float()
                else:
                    w = quantized + new[name]
                data = hm.tensor_bytes(w, dt)
                changed += 1
            elif quantized is not w:
                data = hm.tensor_bytes(quantized, dt)
            entries.append((name, dt, shape, data))
        write_safetensors_like(out / f.name, entries)
    want = len(new) + len(adapter.saved)
    if changed != want:
        raise Failure(f"merged {changed} tensors of {want}")
    return changed


def compare_adapters(got_dir, want_dir, rtol):
    got, want = pathlib.Path(got_dir), pathlib.Path(want_dir)
    cg = json.loads((got / "adapter_config.json").read_text())
    cw = json.loads((want / "adapter_config.json").read_text())

    def as_set(v):
        if v is None:
            return set()
        return {v} if isinstance(v, str) else set(v)

    for key, norm in (("peft_type", None), ("r", None), ("lora_alpha", None), ("use_rslora", bool),
                      ("target_modules", as_set), ("modules_to_save", as_set)):
        a, b = cg.get(key), cw.get(key)
        if norm is not None:
            a, b = norm(a), norm(b)
        if a != b:
            raise Failure(f"adapter_config.json {key}: got {cg.get(key)!r}, want {cw.get(key)!r}")
    tg = hm.read_safetensors_raw(got / "adapter_model.safetensors")
    tw = hm.read_safetensors_raw(want / "adapter_model.safetensors")
    if set(tg) != set(tw):
        missing, extra = sorted(set(tw) - set(tg)), sorted(set(tg) - set(tw))
        raise Failure(f"tensor names differ: missing {missing[:3]}, unexpected {extra[:3]}")
    worst, worst_name = 0.0, None
    for name in sorted(tw):
        if tg[name][1] != tw[name][1]:
            raise Failure(f"{name}: shape {tg[name][1]}, want {tw[name][1]}")
        a, b = hm.to_tensor(*tg[name]).double(), hm.to_tensor(*tw[name]).double()
        if not torch.isfinite(a).all():
            raise Failure(f"{name}: non-finite values")
        diff, scale = (a - b).abs().max().item(), b.abs().max().item()
        rel = diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)
        if rel > worst or worst_name is None:
            worst, worst_name = rel, name
        if diff > rtol * scale:
            raise Failure(f"{name}: max |got - want| {diff:.3g} > {rtol:g} * max |want| {scale:.3g} (relative {rel:.3g})")
    return len(tw), worst, worst_name


# ---- self-test ----

def write_token_dataset(d, train, val, vocab):
    d = pathlib.Path(d)
    d.mkdir(parents=True, exist_ok=True)
    np.asarray(train, dtype="<u2").tofile(d / "train.bin")
    np.asarray(val, dtype="<u2").tofile(d / "val.bin")
    meta = {"format": "shardtrain-tokens", "version": 1, "tokenizer": "byte", "vocab_size": vocab, "dtype": "uint16",
            "byte_order": "little", "eot_id": -1,
            "splits": {"train": {"file": "train.bin", "tokens": len(train)}, "val": {"file": "val.bin", "tokens": len(val)}},
            "val_fraction": 0.1, "split_rule": "self-test", "sources": []}
    (d / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def self_test(work):
    work = pathlib.Path(work)
    models = work / "models"
    for i, (name, spec) in enumerate(hm.FAMILIES.items()):
        hm.write_family(models, name, spec, seed=100 + i)
    rng = np.random.default_rng(3)
    ds = work / "ds"
    write_token_dataset(ds, rng.integers(0, 256, 32 * 24 + 5), rng.integers(0, 256, 32 * 6 + 1), 256)
    seq, ok = 32, True

    def check(cond, what):
        nonlocal ok
        print(f"{'ok  ' if cond else 'FAIL'} {what}")
        ok = ok and bool(cond)

    for fam, spec in hm.FAMILIES.items():
        md = models / fam
        plain = hm.eval_loss(md, ds, seq)
        # 1. B = 0 (PEFT's own init): the adapted model is the base model, bit for bit.
        zero = work / f"{fam}-zero"
        random_adapter(md, zero, 4, 8, False, "all-linear", None, 1)
        a = read_adapter(zero, md)
        write_adapter(zero, a.cfg, {m: (x, torch.zeros_like(y)) for m, (x, y) in a.lora.items()}, {})
        check(adapter_loss(md, zero, ds, seq) == plain, f"{fam}: B = 0 gives the plain loss bit for bit ({plain!r})")
        # 2. a random adapter changes the loss; merged = adapter (fp32 families within 1e-6).
        ad = work / f"{fam}-ad"
        random_adapter(md, ad, 4, 16, False, "all-linear", "norm", 2)
        la = adapter_loss(md, ad, ds, seq)
        check(abs(la - plain) > 1e-4, f"{fam}: the random adapter changes the loss ({la!r} vs {plain!r})")
        merged = work / f"{fam}-merged"
        merge(md, ad, merged)
        lm = hm.eval_loss(merged, ds, seq)
        tol = 1e-6 if spec["dtype"] == "F32" else 2e-2
        check(abs(lm - la) <= tol * abs(la),
              f"{fam}: merged loss {lm!r} vs adapter loss {la!r} (relative {abs(lm - la) / la:.2g}, tolerance {tol:g})")
    md = models / "qwen2"
    # 3. rsLoRA: alpha / sqrt(r). r 4, alpha 8 with rslora (s = 4) equals alpha 16 without (s = 16 / 4 = 4).
    rs, plain_ad = work / "rs", work / "rs-plain"
    random_adapter(md, rs, 4, 8, True, "q_proj,v_proj,down_proj", None, 5)
    a = read_adapter(rs, md)
    write_adapter(plain_ad, dict(a.cfg, use_rslora=False, lora_alpha=16), a.lora, a.saved)
    check(a.scale == 4.0 and read_adapter(plain_ad, md).scale == 4.0, "rslora scale alpha / sqrt(r) = 8 / 2 = 4")
    check(adapter_loss(md, rs, ds, seq) == adapter_loss(md, plain_ad, ds, seq),
          "rslora r 4 alpha 8 gives the loss of alpha 16 without rslora, bit for bit")
    check(adapter_loss(md, rs, ds, seq) != adapter_loss(md, dict_cfg_copy(work / "rs-off", rs, use_rslora=False), ds, seq),
          "turning use_rslora off (s = 2) changes the loss")
    merged = work / "rs-merged"
    merge(md, rs, merged)
    info = ModelInfo(md)
    _, raw_m = hm.read_model_dir(merged)
    _, raw_b = hm.read_model_dir(md)
    m = "model.layers.1.mlp.down_proj"
    delta = hm.to_tensor(*raw_m[m + ".weight"]) - hm.to_tensor(*raw_b[m + ".weight"])
    want = 4.0 * (a.lora[m][1] @ a.lora[m][0])
    check(torch.allclose(delta, want, rtol=1e-4, atol=1e-6), f"merge of {m} adds (B @ A) * alpha / sqrt(r)")
    check(sorted(raw_m) == sorted(raw_b) and all(raw_m[k][2] == raw_b[k][2] for k in raw_b
                                                  if not any(k.startswith(t) for t in a.lora)),
          "merge leaves every other tensor byte for byte, in the same files")
    # 4. Names: PEFT's saved keys.
    names = set(hm.read_safetensors_raw(work / "qwen2-ad" / "adapter_model.safetensors"))
    check("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in names
          and "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight" in names
          and "base_model.model.model.norm.weight" in names
          and "base_model.model.model.layers.0.input_layernorm.weight" in names
          and len(names) == 2 * 7 * 2 + 2 * 2 + 1, f"PEFT tensor names ({len(names)} tensors)")
    cfg = json.loads((work / "qwen2-ad" / "adapter_config.json").read_text())
    check(resolve_modules_to_save(info, ["norm"]) == resolve_modules_to_save(info, cfg["modules_to_save"]),
          "PEFT's suffix rule: modules_to_save ['norm'] wraps the same modules as the full names written")
    check(resolve_targets(info, ["q_proj", "v_proj"], None) == [k for k in info.modules if k.endswith((".q_proj", ".v_proj"))]
          and len(resolve_targets(info, "all-linear", None)) == 14 and resolve_targets(info, cfg["target_modules"], None)
          == resolve_targets(info, "all-linear", None), "target matching: a list of local names, all-linear, full names")
    # 5. step: finite differences (float64) and AdamW's first step.
    sd = work / "step-ad"
    random_adapter(md, sd, 4, 8, False, "q_proj,v_proj,gate_proj", "post_attention_layernorm", 7)
    adapter = read_adapter(sd, md)
    with float64_semantics():
        model, train = build(md, adapter, dtype=torch.float64, trainable=True)
        tokens, _ = read_split(ds, "train")
        total, counted, _ = windows_loss(model, tokens, None, seq, backward=True)
        entries = [("model.layers.0.self_attn.q_proj.lora_A.weight", (1, 5)),
                   ("model.layers.1.mlp.gate_proj.lora_B.weight", (7, 2)),
                   ("model.layers.0.post_attention_layernorm.weight", (3,))]
        for name, idx in entries:
            t, h = train[name], 1e-5
            g = t.grad[idx].item()
            with torch.no_grad():
                orig = t[idx].item()
                t[idx] = orig + h
                up = windows_loss(model, tokens, None, seq)[0] / counted
                t[idx] = orig - h
                down = windows_loss(model, tokens, None, seq)[0] / counted
                t[idx] = orig
            fd = (up - down) / (2 * h)
            check(abs(fd - g) <= 1e-6 * max(abs(g), 1e-3),
                  f"float64 gradient of {name}{list(idx)}: autograd {g:.10g}, finite difference {fd:.10g}")
    out = work / "step-out"
    loss, norm, n, _, grads = step(md, sd, ds, seq, 1e-3, 0.0, 0.9, 0.95, 1e-8, None, [], out)
    worst = max(((grads[k].double() - t.grad).abs().max() / t.grad.abs().max()).item() for k, t in train.items())
    check(worst <= 1e-5, f"step's fp32 gradient against the float64 one: worst relative {worst:.2g} per tensor")
    check(n == (len(tokens) - 1) // seq and abs(loss - total / counted) <= 1e-6 * loss,
          f"step: {n} items, loss_before {loss!r} (float64 {total / counted!r})")
    after = read_adapter(out, md)
    # Step 1 of Adam without decay moves each entry by lr * g / (|g| + eps) (bias-corrected).
    for name, idx in entries:
        before = (adapter.saved[name] if name in adapter.saved else
                  adapter.lora[name.rsplit(".", 2)[0]][0 if ".lora_A." in name else 1])[idx].item()
        now = (after.saved[name] if name in after.saved else
               after.lora[name.rsplit(".", 2)[0]][0 if ".lora_A." in name else 1])[idx].item()
        g = train[name].grad[idx].item()
        want = before - 1e-3 * g / (abs(g) + 1e-8)
        check(abs(now - want) <= 1e-7 + 1e-6 * abs(want), f"AdamW step 1 on {name}{list(idx)}: {now:.9g} vs {want:.9g}")
    # Clipping and decay: the whole update against a hand computation from the float64 gradients.
    out2 = work / "step-clip"
    lr, wd, b1, b2, eps, clip = 2e-3, 0.1, 0.9, 0.99, 1e-6, 0.05
    loss2, norm2, _, _, grads2 = step(md, sd, ds, seq, lr, wd, b1, b2, eps, clip, ["norm"], out2)
    check(abs(norm2 - norm) <= 1e-9 * norm and norm > clip, f"grad_norm {norm!r} > clip {clip}")
    after2 = read_adapter(out2, md)
    coef = clip / (norm2 + 1e-6)
    worst, worst_clip = 0.0, 0.0
    for name, t in train.items():
        g = grads2[name].double()  # the step's fp32 gradient after clipping
        worst_clip = max(worst_clip, ((g - (t.grad * coef)).abs().max() / g.abs().max()).item())
        p0 = t.detach()
        m_, v_ = (1 - b1) * g, (1 - b2) * g * g
        d = 0.0 if "norm" in name else wd
        want = p0 * (1 - lr * d) - lr * (m_ / (1 - b1)) / ((v_ / (1 - b2)).sqrt() + eps)
        got = (after2.saved[name] if name in after2.saved else
               after2.lora[name.rsplit(".", 2)[0]][0 if ".lora_A." in name else 1]).double()
        worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
    check(worst_clip <= 1e-5, f"clipped gradient = gradient * clip / (norm + 1e-6): worst relative {worst_clip:.2g}")
    check(worst <= 1e-6, f"clipped, decayed (not 'norm') AdamW step against float64 by hand: worst relative {worst:.2g}")
    # 6. compare-adapters.
    check(compare_adapters(out2, out2, 1e-6)[1] == 0.0, "compare-adapters: a directory equals itself")
    try:
        compare_adapters(out, out2, 1e-6)
        check(False, "compare-adapters notices a different step")
    except Failure as e:
        check(True, f"compare-adapters notices a different step ({e})")
    return ok


def dict_cfg_copy(dst, src, **changes):
    dst, src = pathlib.Path(dst), pathlib.Path(src)
    dst.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((src / "adapter_config.json").read_text())
    cfg.update(changes)
    (dst / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    shutil.copyfile(src / "adapter_model.safetensors", dst / "adapter_model.safetensors")
    return dst


# ---- command line ----

def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("random-adapter")
    p.add_argument("model_dir")
    p.add_argument("out_dir")
    p.add_argument("--r", type=int, required=True)
    p.add_argument("--alpha", type=float, required=True)
    p.add_argument("--rslora", action="store_true")
    p.add_argument("--targets", default="all-linear")
    p.add_argument("--modules-to-save", default=None)
    p.add_argument("--seed", type=int, default=0)
    def nf4_options(p):
        p.add_argument("--base-nf4", type=int, default=None, metavar="BLOCK",
                       help="QLoRA: the blocks' linear weights through NF4 with blocks of BLOCK values")
        p.add_argument("--nf4-double-quant", action="store_true", help="with --base-nf4: double-quantized statistics")
    p = sub.add_parser("loss")
    for a in ("model_dir", "adapter_dir", "dataset_dir"):
        p.add_argument(a)
    p.add_argument("seq", type=int)
    nf4_options(p)
    p = sub.add_parser("step")
    for a in ("model_dir", "adapter_dir", "dataset_dir"):
        p.add_argument(a)
    p.add_argument("seq", type=int)
    nf4_options(p)
    p.add_argument("out_adapter_dir")
    for a in ("--lr", "--weight-decay", "--beta1", "--beta2", "--eps"):
        p.add_argument(a, type=float, required=True)
    p.add_argument("--clip", type=float, default=None)
    p.add_argument("--no-decay", default="")
    p.add_argument("--float64", action="store_true")
    p = sub.add_parser("merge")
    for a in ("model_dir", "adapter_dir", "out_dir"):
        p.add_argument(a)
    nf4_options(p)
    p.add_argument("--delta-fp64", action="store_true")
    p = sub.add_parser("compare-adapters")
    p.add_argument("got_dir")
    p.add_argument("want_dir")
    p.add_argument("--rtol", type=float, default=1e-6)
    p = sub.add_parser("self-test")
    p.add_argument("work_dir", nargs="?")
    args = ap.parse_args(argv)

    if args.cmd == "random-adapter":
        alpha = int(args.alpha) if args.alpha == int(args.alpha) else args.alpha
        random_adapter(args.model_dir, args.out_dir, args.r, alpha, args.rslora, args.targets, args.modules_to_save,
                       args.seed)
    elif args.cmd == "loss":
        print(repr(adapter_loss(args.model_dir, args.adapter_dir, args.dataset_dir, args.seq, args.base_nf4,
                                args.nf4_double_quant)))
    elif args.cmd == "step":
        no_decay = [s for s in args.no_decay.split(",") if s]
        loss, norm, n, counted, _ = step(args.model_dir, args.adapter_dir, args.dataset_dir, args.seq, args.lr,
                                      args.weight_decay, args.beta1, args.beta2, args.eps, args.clip, no_decay,
                                      args.out_adapter_dir, args.float64, args.base_nf4, args.nf4_double_quant)
        print(f"loss_before {loss!r}")
        print(f"grad_norm {norm!r}")
        print(f"items {n}")
        print(f"targets {counted}")
    elif args.cmd == "merge":
        n = merge(args.model_dir, args.adapter_dir, args.out_dir, args.base_nf4, args.nf4_double_quant, args.delta_fp64)
        print(f"{args.out_dir}: {n} tensors merged")
    elif args.cmd == "compare-adapters":
        n, worst, name = compare_adapters(args.got_dir, args.want_dir, args.rtol)
        print(f"{n} tensors within rtol {args.rtol:g}; worst relative difference {worst:.3g} ({name})")
    elif args.cmd == "self-test":
        if args.work_dir:
            ok = self_test(args.work_dir)
        else:
            with tempfile.TemporaryDirectory(prefix="peft-ref-") as d:
                ok = self_test(d)
        print("self-test passed" if ok else "MISMATCH: self-test failed")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (Failure, OSError, KeyError, ValueError, json.JSONDecodeError) as e:
        print(f"MISMATCH: {e}" if isinstance(e, Failure) else f"ERROR: {type(e).__name__}: {e}")
        sys.exit(1)
