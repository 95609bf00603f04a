#!/usr/bin/env python3
"""An independent reference for instruction rows trained whole and apart (data.packing =
"packed" | "padded", issue 45): Hugging Face's semantics, ONE ROW AT A TIME. Each row of a
version-3 dataset is run alone, as its own batch of one, through the plain-PyTorch Llama / GPT-2
of hf_reference.py (a safetensors file: shardtrain's export) or hf_models.py (a Hugging Face
model directory, with a PEFT adapter through peft_reference.py): positions 0..L-1, the causal
mask of the row alone, labels = the row's ids with -100 where the mask byte is 0, shifted as
transformers' ForCausalLM loss shifts them (the target at row position t is token t+1; the last
token predicts nothing). A row longer than SEQ keeps its first SEQ tokens. The loss is the sum
of the counted targets' cross-entropy (fp32 per token, added in fp64) over the rows, divided by
their number. Nothing here knows about windows: the window count is only used to check `items`.

Dataset (shardtrain-tokens, docs/data.md; version 3 from /work/notes/packing-spec.md):
DIR/meta.json, DIR/{train,val}.bin (uint16/uint32 ids), DIR/{train,val}.mask (one byte per
token, versions 2 and 3 with a mask), DIR/{train,val}.rows (version 3: 16-byte records, int64
start, int64 origin = source_index << 32 | line, little-endian; a row ends where the next starts).

Usage:
  packing_reference.py eval MODEL DATASET_DIR SPLIT SEQ [model options] [--eval-json FILE]...
        [--packed FILE]... [--padded FILE]... [--stream-doc FILE]...
      the reference loss of SPLIT; each FILE (shardtrain eval's --out JSON: loss, targets, items)
      must have its loss within 1e-6 (relative), the same number of counted targets and, for
      --packed / --padded, `items` = the first-fit-decreasing window count / the row count.
      --stream-doc: data.packing = "stream" with data.document_mask, against the stream's
      windows with each row's piece of a window computed alone (positions from 0 at the piece).
  packing_reference.py step MODEL DATASET_DIR SEQ --lr LR [model options] [--adapter DIR]
        [--out FILE|DIR] [--compare GOT]... [--metrics metrics.jsonl]... [--rtol 1e-5]
      one plain SGD step (no momentum, decay or clipping) on every row of the train split as one
      global batch: full parameters (writes a safetensors file with the model's names, F32), or
      with --adapter the PEFT adapter's tensors only (writes an adapter directory). Each GOT
      (shardtrain's `ckpt export` / `ckpt export --format peft` after its step) must have every
      tensor within rtol * max|want| and within 1e-2 of the step's largest move; each
      metrics.jsonl's step-1 loss must equal loss_before within 1e-6.
  packing_reference.py compare GOT WANT [--before BEFORE] [--rtol 1e-5]
      the same check between two safetensors files / model or adapter directories.
  packing_reference.py windows DATASET_DIR SPLIT SEQ [--packing packed,padded,stream]
      per packing: "PACKING rows R windows W counted C placed P fill F truncated N median M max X"
      (W is what eval's `items` should be; stream: the (n - 1) / SEQ windows cut through rows)
  packing_reference.py write-dataset OUT_DIR SPEC.json [--version 3|2|1]
      a dataset from {"vocab_size", "tokenizer", "train": [{"ids": [...], "mask": [...]?,
      "origin": [source, line]?}, ...], "val": [...]} (write_dataset below, for tests)
  packing_reference.py write-gpt2 OUT.safetensors --vocab V --d D --layers L --seq T [--seed S]
      a random GPT-2 with Hugging Face names and layout (Conv1D weights [in, out]), scaled so
      that attention depends on the context (a default init's near-uniform attention would hide
      a row that sees another)
  packing_reference.py self-test [WORK_DIR]
      the per-row computation checked two more ways (a packed window with a block-diagonal mask
      and restarted positions, a right-padded batch), the two Llama implementations against each
      other, the dataset writer/reader, first-fit decreasing, truncation, labels -100 vs the mask,
      the step's gradient against float64 finite differences (GPT-2, LoRA), the stream's
      document-masked windows against one block-diagonal forward per window
Model options: MODEL is a safetensors file (--arch llama|gpt2 --n-heads H [--n-kv-heads K]
[--norm-eps E] [--rope-theta R]; the layer count is read from the names) or a Hugging Face
model directory (config.json gives everything). Exit 1 with MISMATCH on a difference.
"""
import argparse
import contextlib
import json
import math
import pathlib
import re
import shutil
import struct
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import hf_models as hm  # noqa: E402
from export_loss_check import read_safetensors  # noqa: E402
from hf_reference import gpt2_forward, llama_forward  # noqa: E402

EVAL_RTOL = 1e-6
ROW_RECORD = struct.Struct("<qq")


class Failure(Exception):
    """A mismatch or an unusable input: printed with MISMATCH, exit 1."""


# ---- datasets ----

class Split:
    """One split: tokens (int64), mask (uint8 or None), row starts (int64) and origins."""

    def __init__(self, tokens, mask, starts, origins, meta):
        self.tokens, self.mask, self.starts, self.origins, self.meta = tokens, mask, starts, origins, meta

    def row_bounds(self):
        ends = np.append(self.starts[1:], len(self.tokens))
        return list(zip(self.starts.tolist(), ends.tolist()))

    def rows(self, seq):
        """(ids, mask or None, full length) per row, each cut to its first `seq` tokens."""
        out = []
        for a, b in self.row_bounds():
            e = min(b, a + seq)
            out.append((self.tokens[a:e], None if self.mask is None else self.mask[a:e], b - a))
        return out


def read_split(dataset, split):
    ds = pathlib.Path(dataset)
    meta = json.loads((ds / "meta.json").read_text())
    if meta.get("format") != "shardtrain-tokens":
        raise Failure(f"{ds}/meta.json: format {meta.get('format')!r}")
    version = meta["version"]
    s = meta["splits"][split]
    dtype = {"uint16": "<u2", "uint32": "<u4"}[meta["dtype"]]
    tokens = np.fromfile(ds / f"{split}.bin", dtype=dtype).astype(np.int64)
    if len(tokens) != s["tokens"]:
        raise Failure(f"{split}.bin holds {len(tokens)} tokens, meta.json says {s['tokens']}")
    mask = None
    if version == 2 or (version == 3 and "mask" in meta):
        mask = np.fromfile(ds / f"{split}.mask", dtype=np.uint8)
        if len(mask) != len(tokens) or int(mask.sum()) != s["counted"] or mask.max(initial=0) > 1:
            raise Failure(f"{split}.mask does not match: {len(mask)} bytes, {int(mask.sum())} ones, "
                          f"meta.json {len(tokens)} tokens, counted {s['counted']}")
    if version != 3:
        raise Failure(f"{ds}: version {version} has no row boundaries (version 3 has {split}.rows)")
    if s["rows"] != f"{split}.rows" or meta["rows"]["bytes_per_row"] != ROW_RECORD.size:
        raise Failure(f"{ds}/meta.json: splits.{split}.rows {s['rows']!r}, rows.bytes_per_row "
                      f"{meta['rows']['bytes_per_row']}")
    raw = (ds / f"{split}.rows").read_bytes()
    if len(raw) != ROW_RECORD.size * s["row_count"]:
        raise Failure(f"{split}.rows has {len(raw)} bytes for row_count {s['row_count']}")
    rec = np.frombuffer(raw, dtype="<i8").reshape(-1, 2)
    starts, origins = rec[:, 0].astype(np.int64), rec[:, 1].astype(np.int64)
    if len(tokens) and (len(starts) == 0 or starts[0] != 0 or np.any(np.diff(starts) <= 0)
                        or starts[-1] >= len(tokens)):
        raise Failure(f"{split}.rows: starts must be 0, strictly increasing, below {len(tokens)}: "
                      f"{starts[:8].tolist()}...")
    return Split(tokens, mask, starts, origins, meta)


def write_dataset(out_dir, splits, vocab_size=256, tokenizer="byte", version=3, chat_format="plain", kind="rows",
                  eot_id=-1, val_fraction=0.0, sources=None):
    """A shardtrain-tokens dataset, as `data prepare` writes it (data files first, meta.json last).
    splits: {"train": rows, "val": rows}, a row = {"ids": [...], "mask": [...] (optional), "origin":
    (source_index, line) (optional; default (0, 1-based row number))}. version 3 writes the row
    records; 2 the mask without rows; 1 neither (masks are dropped)."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dtype = "uint16" if vocab_size <= 65536 else "uint32"
    masked = version == 2 or (version == 3 and any("mask" in r for rows in splits.values() for r in rows))
    meta = {"format": "shardtrain-tokens", "version": version, "tokenizer": tokenizer, "vocab_size": vocab_size,
            "dtype": dtype, "byte_order": "little", "eot_id": eot_id, "splits": {}}
    for split in ("train", "val"):
        rows = splits.get(split, [])
        ids = [int(t) for r in rows for t in r["ids"]]
        if any(not 0 <= t < vocab_size for t in ids) or any(len(r["ids"]) == 0 for r in rows):
            raise Failure(f"{split}: an empty row or an id outside [0, {vocab_size})")
        np.asarray(ids, dtype="<u2" if dtype == "uint16" else "<u4").tofile(out / f"{split}.bin")
        entry = {"file": f"{split}.bin", "tokens": len(ids)}
        if masked:
            mask = [int(m) for r in rows for m in r.get("mask", [1] * len(r["ids"]))]
            if len(mask) != len(ids) or any(m not in (0, 1) for m in mask):
                raise Failure(f"{split}: a mask is not one 0/1 byte per token")
            np.asarray(mask, dtype=np.uint8).tofile(out / f"{split}.mask")
            entry.update({"mask": f"{split}.mask", "counted": sum(mask)})
        if version == 3:
            rec, start = bytearray(), 0
            for i, r in enumerate(rows):
                src, line = r.get("origin", (0, i + 1))
                rec += ROW_RECORD.pack(start, (int(src) << 32) | int(line))
                start += len(r["ids"])
            (out / f"{split}.rows").write_bytes(bytes(rec))
            entry.update({"rows": f"{split}.rows", "row_count": len(rows)})
        meta["splits"][split] = entry
    if masked:
        meta["mask"] = {"bytes_per_token": 1, "chat_format": chat_format,
                        "rule": "byte i is 1 when token i counts as a target (written by packing_reference.py)"}
    if version == 3:
        meta["rows"] = {"bytes_per_row": ROW_RECORD.size, "kind": kind,
                        "rule": "int64 start, int64 origin (source << 32 | line), little-endian (packing_reference.py)"}
    meta["val_fraction"] = val_fraction
    meta["split_rule"] = "written by tests/python/packing_reference.py"
    meta["sources"] = sources if sources is not None else [
        {"name": "packing_reference.py", "bytes": 0, "fnv1a64": "0000000000000000",
         "train_tokens": meta["splits"]["train"]["tokens"], "val_tokens": meta["splits"]["val"]["tokens"],
         "format": "jsonl", "documents": len(splits.get("train", [])) + len(splits.get("val", [])),
         "skipped_lines": 0}]
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


# ---- windows (only to check eval's `items` and report the fill) ----

def first_fit_decreasing(lengths, seq):
    """Rows (lengths already cut to seq) into windows of seq positions: longest first, ties by
    row index, each into the first window with room; inside a window, rows in row order."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    # "The first window with room": a tree of the largest room over ranges of windows, unopened
    # windows (room seq) after the opened ones, so the leftmost fit is found in log(rows) steps.
    size = 1
    while size < max(1, len(lengths)):
        size *= 2
    best = [seq] * (2 * size)
    windows = []
    for i in order:
        n = lengths[i]
        if n > seq or n < 1:
            raise Failure(f"row {i}: length {n} outside [1, {seq}]")
        node = 1
        while node < size:
            node = 2 * node if best[2 * node] >= n else 2 * node + 1
        w = node - size
        if w == len(windows):
            windows.append([])
        windows[w].append(i)
        best[node] -= n
        node //= 2
        while node:
            best[node] = max(best[2 * node], best[2 * node + 1])
            node //= 2
    return [sorted(w) for w in windows]


def first_fit_decreasing_plain(lengths, seq):
    """The same by the definition's words (quadratic): for the self-test."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    room, windows = [], []
    for i in order:
        for w, r in enumerate(room):
            if r >= lengths[i]:
                room[w] -= lengths[i]
                windows[w].append(i)
                break
        else:
            room.append(seq - lengths[i])
            windows.append([i])
    return [sorted(w) for w in windows]


def window_count(split, seq, packing):
    lengths = [len(ids) for ids, _, _ in split.rows(seq)]
    return len(first_fit_decreasing(lengths, seq)) if packing == "packed" else len(lengths)


# ---- models ----

class RowModel:
    """logits(ids [L]) -> [L, V] of one row alone (batch of one, positions 0..L-1), and the
    trainable tensors by name (the model's parameters, or a PEFT adapter's)."""

    def __init__(self, fn, params, trainable, describe, names=None):
        self.fn, self.params, self.trainable, self.describe = fn, params, trainable, describe
        self.names = list(names if names is not None else params)  # the tensors of the file(s)

    def logits(self, ids):
        return self.fn(torch.as_tensor(ids, dtype=torch.int64)[None])[0]


def load_model(path, args, adapter=None, dtype=torch.float32, trainable=False):
    path = pathlib.Path(path)
    if path.is_dir():
        if adapter:
            import peft_reference as pr
            ref, train = pr.build(path, pr.read_adapter(adapter, path), dtype=dtype, trainable=trainable)
            return RowModel(ref.forward, ref.p, train, f"{path} + adapter {adapter}")
        ref = hm.Reference(path)
        ref.p = {k: v.to(dtype).clone().requires_grad_(trainable) for k, v in ref.p.items()}
        tied = ref.cfg.get("tie_word_embeddings", False)
        ref.lm_head = ref.p["model.embed_tokens.weight"] if tied else ref.p["lm_head.weight"]
        return RowModel(ref.forward, ref.p, ref.p if trainable else {}, f"{path} ({ref.cfg['architectures'][0]})")
    if adapter:
        raise Failure("--adapter needs a model directory (config.json), as peft_reference.py does")
    p = {k: v.to(dtype).clone().requires_grad_(trainable) for k, v in read_safetensors(path).items()}
    names = list(p)
    if args.arch is None or args.n_heads is None:
        raise Failure(f"{path}: a safetensors file needs --arch and --n-heads")
    layer = re.compile(r"^(?:transformer\.h|model\.layers)\.(\d+)\.")
    n_layers = 1 + max(int(m.group(1)) for m in map(layer.match, p) if m)
    if args.arch == "gpt2":
        fn = lambda ids: gpt2_forward(p, ids, n_layers, args.n_heads)  # noqa: E731
    else:
        if "lm_head.weight" not in p:  # tied
            p["lm_head.weight"] = p["model.embed_tokens.weight"]
        hd = p["model.embed_tokens.weight"].shape[1] // args.n_heads
        kv = args.n_kv_heads or p["model.layers.0.self_attn.k_proj.weight"].shape[0] // hd
        fn = lambda ids: llama_forward(p, ids, n_layers, args.n_heads, kv, args.norm_eps, args.rope_theta)  # noqa: E731
    train = {k: p[k] for k in names} if trainable else {}
    return RowModel(fn, p, train, f"{path} ({args.arch}, {n_layers} layers, {args.n_heads} heads)", names)


# ---- the loss, one row at a time ----

def row_ce(model, ids, mask):
    """Per-target cross-entropy of one row alone (fp32; fp64 for a float64 model) and which
    targets count: transformers' shift (logits[:-1] against ids[1:])."""
    logits = model.logits(ids)
    target = torch.as_tensor(ids[1:], dtype=torch.int64)
    if logits.dtype != torch.float64:
        logits = logits.float()  # transformers' loss upcasts the logits to fp32
    ce = torch.nn.functional.cross_entropy(logits[:-1], target, reduction="none")
    counted = torch.ones_like(target, dtype=torch.bool) if mask is None else torch.as_tensor(mask[1:] == 1)
    return ce, counted


def rows_loss(model, rows, backward=False, n_counted=None):
    """Sum over rows of the counted targets' CE (each fp32, added in fp64) and their number; with
    backward, the gradient of sum / N accumulates in the trainable tensors (N = n_counted)."""
    total, counted = 0.0, 0
    for ids, mask, _ in rows:
        if len(ids) < 2:
            continue
        ce, c = row_ce(model, ids, mask)
        if not bool(c.any()):
            continue
        picked = ce[c]
        total += picked.double().sum().item()
        counted += int(c.sum())
        if backward:
            (picked.sum() / n_counted).backward()
    return total, counted


def count_targets(rows):
    """Counted targets of the rows: targets 1..L-1 of each row, those whose mask byte is 1."""
    n = 0
    for ids, mask, _ in rows:
        if len(ids) > 1:
            n += len(ids) - 1 if mask is None else int(mask[1:].sum())
    return n


def stream_document_loss(model, split, seq):
    """data.packing = "stream" with data.document_mask: windows [w seq, w seq + seq + 1) of the
    token stream, cut through rows; inside a window each row's piece is computed alone (its own
    causal attention, positions from 0 at the piece's first token), and the target at t (token
    t+1) counts iff token t+1 is in the same row as token t and its mask byte is 1."""
    n_win = (len(split.tokens) - 1) // seq
    row_of = np.searchsorted(split.starts, np.arange(len(split.tokens)), side="right") - 1
    total, counted = 0.0, 0
    for w in range(n_win):
        lo = w * seq
        x, r = split.tokens[lo:lo + seq + 1], row_of[lo:lo + seq + 1]
        a = 0
        while a < seq:
            b = a
            while b + 1 < seq and r[b + 1] == r[a]:
                b += 1
            logits = model.logits(x[a:b + 1]).float()  # the piece [a, b] alone
            for t in range(a, b + 1):
                if r[t + 1] != r[t] or (split.mask is not None and split.mask[lo + t + 1] != 1):
                    continue
                ce = torch.nn.functional.cross_entropy(logits[t - a][None], torch.as_tensor([int(x[t + 1])]))
                total += ce.double().item()
                counted += 1
            a = b + 1
    return total, counted, n_win


# ---- comparisons ----

def read_tensors(path):
    """A safetensors file, a model directory (its safetensors), or a PEFT adapter directory."""
    p = pathlib.Path(path)
    if p.is_dir() and (p / "adapter_model.safetensors").exists():
        raw = hm.read_safetensors_raw(p / "adapter_model.safetensors")
    elif p.is_dir():
        raw = hm.read_model_dir(p)[1]
    else:
        raw = hm.read_safetensors_raw(p)
    return {k: hm.to_tensor(*v) for k, v in raw.items()}


def compare(got, want, before=None, rtol=1e-5, move_rtol=1e-2, label=""):
    """Every tensor of WANT in GOT with its shape, max|got - want| <= rtol * max|want|, and, with
    BEFORE, <= move_rtol * max|want - before| for every tensor the step moved (so a step that
    moved the weights the wrong way cannot pass on the weights' size alone). Returns the worst."""
    names_g, names_w = set(got), set(want)
    if names_g != names_w:
        raise Failure(f"{label}tensor names differ: missing {sorted(names_w - names_g)[:3]}, "
                      f"unexpected {sorted(names_g - names_w)[:3]}")
    worst, worst_move, moved = (0.0, None), (0.0, None), 0
    for n in sorted(want):
        g, w = got[n].double(), want[n].double()
        if g.shape != w.shape:
            raise Failure(f"{label}{n}: shape {list(g.shape)}, want {list(w.shape)}")
        if not torch.isfinite(g).all():
            raise Failure(f"{label}{n}: non-finite values")
        diff, scale = (g - w).abs().max().item(), w.abs().max().item()
        rel = diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)
        if rel >= worst[0]:
            worst = (rel, n)
        if rel > rtol:
            raise Failure(f"{label}{n}: max |got - want| {diff:.3g} > {rtol:g} * max |want| {scale:.3g}")
        if before is not None:
            move = (w - before[n].double()).abs().max().item()
            if move > 0:
                moved += 1
                r = diff / move
                if r >= worst_move[0]:
                    worst_move = (r, n)
                if r > move_rtol:
                    raise Failure(f"{label}{n}: max |got - want| {diff:.3g} is {r:.3g} of the step's largest move "
                                  f"{move:.3g} (more than {move_rtol:g})")
    if before is not None and moved == 0:
        raise Failure(f"{label}the reference step moved no tensor: the comparison could not fail")
    msg = f"{label}{len(want)} tensors within {rtol:g}: worst {worst[0]:.3g} of max|want| ({worst[1]})"
    if before is not None:
        msg += f", worst {worst_move[0]:.3g} of the step's move ({worst_move[1]}; {moved} tensors moved)"
    print(msg)
    return worst


def eval_json_check(path, loss, counted, items=None, what=""):
    r = json.loads(pathlib.Path(path).read_text())
    got = r.get("loss")
    ok = got is not None and abs(got - loss) <= EVAL_RTOL * abs(loss) and r.get("targets") == counted
    if items is not None:
        ok = ok and r.get("items") == items
    rel = abs(got - loss) / abs(loss) if got is not None else math.inf
    print(f"  {path}{what}: shardtrain eval {got!r} over {r.get('targets')} targets, {r.get('items')} items; "
          f"relative difference {rel:.3g}" + (f" (items expected {items})" if items is not None else "")
          + ("" if ok else "  <- MISMATCH"))
    return ok, got


def metrics_step1_loss(path):
    for line in pathlib.Path(path).read_text().splitlines():
        r = json.loads(line)
        if r.get("step") == 1 and "loss" in r:
            return r["loss"]
    raise Failure(f"{path}: no step-1 loss")


# ---- commands ----

def cmd_eval(args):
    split = read_split(args.dataset, args.split)
    rows = split.rows(args.seq)
    model = load_model(args.model, args)
    with torch.no_grad():
        total, counted = rows_loss(model, rows)
    if counted == 0:
        raise Failure("no counted target in the split")
    loss = total / counted
    trunc = sum(1 for _, _, n in rows if n > args.seq)
    print(f"reference ({model.describe}), one row at a time: {args.split} loss {loss!r} over {counted} counted "
          f"targets of {len(rows)} rows ({trunc} truncated to {args.seq} tokens)")
    ok, seen = True, []
    checks = [(f, None, "") for f in args.eval_json]
    checks += [(f, window_count(split, args.seq, "packed"), " [packed]") for f in args.packed]
    checks += [(f, window_count(split, args.seq, "padded"), " [padded]") for f in args.padded]
    for f, items, what in checks:
        good, got = eval_json_check(f, loss, counted, items, what)
        ok = ok and good
        if got is not None:
            seen.append(got)
    if len(seen) > 1:
        spread = (max(seen) - min(seen)) / abs(loss)
        print(f"  the {len(seen)} eval results agree within {spread:.3g} (relative)"
              + ("" if spread <= EVAL_RTOL else "  <- MISMATCH"))
        ok = ok and spread <= EVAL_RTOL
    for f in args.stream_doc:
        with torch.no_grad():
            t_doc, c_doc, n_win = stream_document_loss(model, split, args.seq)
        good, _ = eval_json_check(f, t_doc / c_doc, c_doc, n_win, " [stream, document_mask]")
        print(f"    (the stream's {n_win} windows, each row's piece alone: {t_doc / c_doc!r} over {c_doc} targets)")
        ok = ok and good
    if not ok:
        raise Failure("shardtrain eval differs from the one-row-at-a-time reference")
    return 0


def cmd_step(args):
    split = read_split(args.dataset, "train")
    rows = split.rows(args.seq)
    model = load_model(args.model, args, adapter=args.adapter, trainable=True)
    counted = count_targets(rows)
    if counted == 0:
        raise Failure("no counted target in the train split")
    before = {k: v.detach().clone() for k, v in model.trainable.items()}
    total, n = rows_loss(model, rows, backward=True, n_counted=counted)
    assert n == counted, (n, counted)
    loss = total / counted
    norm = math.sqrt(sum(float(t.grad.double().pow(2).sum()) for t in model.trainable.values() if t.grad is not None))
    after = {}
    with torch.no_grad():
        for k, t in model.trainable.items():
            g = t.grad if t.grad is not None else torch.zeros_like(t)
            after[k] = t.detach().float().add(g.float(), alpha=-args.lr)  # torch.optim.SGD, no momentum
    print(f"reference step ({model.describe}): {len(rows)} rows, {counted} counted targets, loss_before {loss!r}, "
          f"grad_norm {norm!r}, lr {args.lr:g}")
    print(f"loss_before {loss!r}")
    print(f"grad_norm {norm!r}")
    print(f"windows packed {window_count(split, args.seq, 'packed')} padded {len(rows)}")
    if args.adapter:
        import peft_reference as pr
        ad = pr.read_adapter(args.adapter, args.model)
        lora = {m: (after[m + ".lora_A.weight"], after[m + ".lora_B.weight"]) for m in ad.lora}
        saved = {k: after[k] for k in ad.saved}
        want = {}
        for m, (a, b) in lora.items():
            na, nb = pr.lora_names(m)
            want[na], want[nb] = a, b
        for k, t in saved.items():
            want[pr.PREFIX + k] = t
        want_before = {}
        for m, (a, b) in ad.lora.items():
            na, nb = pr.lora_names(m)
            want_before[na], want_before[nb] = a, b
        for k, t in ad.saved.items():
            want_before[pr.PREFIX + k] = t
        if args.out:
            pr.write_adapter(args.out, ad.cfg, lora, saved)
            shutil.copyfile(pathlib.Path(args.adapter) / "adapter_config.json",
                            pathlib.Path(args.out) / "adapter_config.json")
    else:
        want = {k: after[k] for k in model.names}  # a tied head is the embedding: not a tensor of its own
        want_before = {k: before[k].float() for k in model.names}
        if args.out:
            hm.write_safetensors(args.out, want, "F32")
    bad = []
    for g in args.compare:
        try:
            compare(read_tensors(g), want, want_before, args.rtol, label=f"{g}: ")
        except Failure as e:
            print(f"MISMATCH: {e}")
            bad.append(g)
    for m in args.metrics:
        got = metrics_step1_loss(m)
        rel = abs(got - loss) / abs(loss)
        good = rel <= EVAL_RTOL
        print(f"{m}: step 1 loss {got!r}, reference {loss!r}, relative difference {rel:.3g}"
              + ("" if good else "  <- MISMATCH"))
        if not good:
            bad.append(m)
    if bad:
        raise Failure(f"shardtrain's step differs from the reference: {bad}")
    return 0


def cmd_windows(args):
    """One line per packing: rows, windows, counted targets, tokens placed in the windows, fill."""
    split = read_split(args.dataset, args.split)
    rows = split.rows(args.seq)
    lengths = [len(ids) for ids, _, _ in rows]
    full = sorted(n for _, _, n in rows)
    for packing in args.packing.split(","):
        if packing == "stream":  # windows [w T, w T + T + 1) of the token stream, cut through rows
            n_tok = len(split.tokens)
            w = (n_tok - 1) // args.seq
            counted = w * args.seq if split.mask is None else int(split.mask[1:w * args.seq + 1].sum())
            placed = w * args.seq
        else:
            w = window_count(split, args.seq, packing)
            counted, placed = count_targets(rows), sum(lengths)
        print(f"{packing} rows {len(rows)} windows {w} counted {counted} placed {placed} "
              f"fill {placed / max(1, w * args.seq):.4f} truncated {sum(1 for n in full if n > args.seq)} "
              f"median {full[len(full) // 2] if full else 0} max {full[-1] if full else 0}")
    return 0


def gpt2_params(vocab, d, layers, seq, seed, std=0.15):
    """HF GPT-2 tensors (Conv1D [in, out]) with weights large enough for context-dependent attention."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, s=std):
        return torch.randn(*shape, generator=g) * s

    p = {"transformer.wte.weight": r(vocab, d, s=0.5), "transformer.wpe.weight": r(seq, d, s=0.3)}
    for l in range(layers):
        b = f"transformer.h.{l}."
        p[b + "ln_1.weight"], p[b + "ln_1.bias"] = 1 + r(d, s=0.1), r(d, s=0.1)
        p[b + "attn.c_attn.weight"], p[b + "attn.c_attn.bias"] = r(d, 3 * d, s=0.4), r(3 * d, s=0.1)
        p[b + "attn.c_proj.weight"], p[b + "attn.c_proj.bias"] = r(d, d), r(d, s=0.1)
        p[b + "ln_2.weight"], p[b + "ln_2.bias"] = 1 + r(d, s=0.1), r(d, s=0.1)
        p[b + "mlp.c_fc.weight"], p[b + "mlp.c_fc.bias"] = r(d, 4 * d), r(4 * d, s=0.1)
        p[b + "mlp.c_proj.weight"], p[b + "mlp.c_proj.bias"] = r(4 * d, d), r(d, s=0.1)
    p["transformer.ln_f.weight"], p["transformer.ln_f.bias"] = 1 + r(d, s=0.1), r(d, s=0.1)
    return p


# ---- self-test: the per-row computation, two more ways ----

def gpt2_window_forward(p, ids, pos, allowed, n_layers, n_heads):
    """GPT-2 over one window of several rows: explicit position ids and an attention mask
    (allowed[i, j]: query i may see key j), written apart from hf_reference.gpt2_forward."""
    T = ids.shape[0]
    x = p["transformer.wte.weight"][ids] + p["transformer.wpe.weight"][pos]
    d = x.shape[-1]
    hd = d // n_heads
    for l in range(n_layers):
        b = f"transformer.h.{l}."
        h = torch.nn.functional.layer_norm(x, (d,), p[b + "ln_1.weight"], p[b + "ln_1.bias"], 1e-5)
        qkv = h @ p[b + "attn.c_attn.weight"] + p[b + "attn.c_attn.bias"]
        q, k, v = (t.reshape(T, n_heads, hd).transpose(0, 1) for t in qkv.split(d, dim=-1))
        s = (q @ k.transpose(1, 2)) / math.sqrt(hd)
        s = s.masked_fill(~allowed, float("-inf"))
        a = (torch.softmax(s, dim=-1) @ v).transpose(0, 1).reshape(T, d)
        x = x + a @ p[b + "attn.c_proj.weight"] + p[b + "attn.c_proj.bias"]
        h = torch.nn.functional.layer_norm(x, (d,), p[b + "ln_2.weight"], p[b + "ln_2.bias"], 1e-5)
        h = torch.nn.functional.gelu(h @ p[b + "mlp.c_fc.weight"] + p[b + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ p[b + "mlp.c_proj.weight"] + p[b + "mlp.c_proj.bias"]
    x = torch.nn.functional.layer_norm(x, (d,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], 1e-5)
    return x @ p["transformer.wte.weight"].t()


def llama_window_forward(p, ids, pos, allowed, n_layers, n_heads, n_kv, eps, theta):
    """Llama over one window with explicit position ids (RoPE angles pos * inv_freq) and mask."""
    T = ids.shape[0]
    x = p["model.embed_tokens.weight"][ids]
    d = x.shape[-1]
    hd = d // n_heads
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = pos.double()[:, None] * inv[None, :]
    cos = torch.cat((ang.cos(), ang.cos()), -1).float()
    sin = torch.cat((ang.sin(), ang.sin()), -1).float()

    def rope(t):  # [heads, T, hd]
        t1, t2 = t[..., : hd // 2], t[..., hd // 2:]
        return t * cos + torch.cat((-t2, t1), -1) * sin

    def norm(t, w):
        return w * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps))

    for l in range(n_layers):
        b = f"model.layers.{l}."
        h = norm(x, p[b + "input_layernorm.weight"])
        q = rope((h @ p[b + "self_attn.q_proj.weight"].t()).reshape(T, n_heads, hd).transpose(0, 1))
        k = rope((h @ p[b + "self_attn.k_proj.weight"].t()).reshape(T, n_kv, hd).transpose(0, 1))
        v = (h @ p[b + "self_attn.v_proj.weight"].t()).reshape(T, n_kv, hd).transpose(0, 1)
        k, v = k.repeat_interleave(n_heads // n_kv, 0), v.repeat_interleave(n_heads // n_kv, 0)
        s = (q @ k.transpose(1, 2)) / math.sqrt(hd)
        a = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ v
        x = x + a.transpose(0, 1).reshape(T, d) @ p[b + "self_attn.o_proj.weight"].t()
        h = norm(x, p[b + "post_attention_layernorm.weight"])
        g = torch.nn.functional.silu(h @ p[b + "mlp.gate_proj.weight"].t())
        x = x + (g * (h @ p[b + "mlp.up_proj.weight"].t())) @ p[b + "mlp.down_proj.weight"].t()
    return norm(x, p["model.norm.weight"]) @ p["lm_head.weight"].t()


def window_layout(lengths, block_diagonal=True):
    """Position ids and the attention mask of rows laid end to end in one window: positions
    restart at each row and a row sees only its own earlier tokens (block_diagonal), or one
    causal sequence (the stream, what packing must NOT compute)."""
    row = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    if block_diagonal:
        pos = torch.cat([torch.arange(n) for n in lengths])
    else:
        pos = torch.arange(sum(lengths))
    i, j = torch.arange(len(row))[:, None], torch.arange(len(row))[None, :]
    allowed = j <= i
    if block_diagonal:
        allowed = allowed & (row[:, None] == row[None, :])
    return pos, allowed


def self_test(work):
    work = pathlib.Path(work)
    ok = True

    def check(cond, what):
        nonlocal ok
        print(f"{'ok  ' if cond else 'FAIL'} {what}")
        ok = ok and bool(cond)

    seq = 24
    rng = np.random.default_rng(11)
    lengths = [5, 24, 9, 17, 40, 3, 12, 24, 7, 30, 2, 11]  # two longer than seq
    rows = []
    for i, n in enumerate(lengths):
        ids = rng.integers(0, 256, n).tolist()
        cut = int(rng.integers(1, n)) if n > 2 else 1
        rows.append({"ids": ids, "mask": [0] * cut + [1] * (n - cut), "origin": (0, 2 * i + 1)})
    rows[5]["mask"] = [0, 0, 0]  # a row with no counted target
    val = [{"ids": rng.integers(0, 256, 6).tolist(), "mask": [0, 0, 1, 1, 1, 1], "origin": (0, 100)}]
    ds = work / "ds"
    write_dataset(ds, {"train": rows, "val": val})
    sp = read_split(ds, "train")
    # 1. The writer / reader: the spec's records, meta keys, bytes.
    raw = (ds / "train.rows").read_bytes()
    recs = [ROW_RECORD.unpack_from(raw, o) for o in range(0, len(raw), 16)]
    meta = json.loads((ds / "meta.json").read_text())
    check(len(raw) == 16 * len(rows) and recs[0] == (0, 1) and recs[3] == (sum(lengths[:3]), 7)
          and meta["version"] == 3 and meta["splits"]["train"]["row_count"] == len(rows)
          and meta["splits"]["train"]["rows"] == "train.rows" and meta["rows"]["bytes_per_row"] == 16
          and meta["splits"]["train"]["counted"] == sum(sum(r["mask"]) for r in rows),
          "version-3 writer: 16-byte records (start, source << 32 | line), meta.json keys, counted")
    back = sp.rows(10 ** 9)
    check(all(b[0].tolist() == r["ids"] and b[1].tolist() == r["mask"] for b, r in zip(back, rows)),
          "reader: every row's ids and mask back, ending where the next starts")
    v2 = work / "v2"
    write_dataset(v2, {"train": rows, "val": val}, version=2)
    try:
        read_split(v2, "train")
        check(False, "a version-2 dataset (no rows) is refused")
    except Failure as e:
        check("no row boundaries" in str(e), f"a version-2 dataset is refused ({e})")
    # 2. First-fit decreasing on a hand example, and its invariants on the dataset.
    check(first_fit_decreasing([5, 30, 20, 12, 3], 32) == [[1], [2, 3], [0, 4]],
          "first-fit decreasing: [5, 30, 20, 12, 3] in 32 -> [1], [2, 3], [0, 4]")
    cut = [len(ids) for ids, _, _ in sp.rows(seq)]
    wins = first_fit_decreasing(cut, seq)
    check(sorted(i for w in wins for i in w) == list(range(len(cut)))
          and all(sum(cut[i] for i in w) <= seq for w in wins) and max(cut) == seq,
          f"{len(cut)} rows (cut to {seq}) in {len(wins)} windows, each once, none overfull")
    lens = [int(x) for x in rng.integers(1, 1025, 3000)] + [int(x) for x in rng.integers(1, 40, 500)]
    check(first_fit_decreasing(lens, 1024) == first_fit_decreasing_plain(lens, 1024),
          "first-fit decreasing: the tree search = the plain first fit (3500 rows in 1024)")

    # Models: hf_models' Llama 2 directory, the same weights through hf_reference.llama_forward,
    # and a random GPT-2.
    models = work / "models"
    hm.write_family(models, "llama2", hm.FAMILIES["llama2"], seed=100)
    cfg = hm.FAMILIES["llama2"]["cfg"]
    la = argparse.Namespace(arch="llama", n_heads=cfg["num_attention_heads"], n_kv_heads=cfg["num_key_value_heads"],
                            norm_eps=cfg["rms_norm_eps"], rope_theta=cfg["rope_theta"])
    hm.write_safetensors(work / "llama.safetensors", hm.Reference(models / "llama2").p, "F32")
    hm.write_safetensors(work / "gpt2.safetensors", gpt2_params(256, 32, 2, seq, 4), "F32")
    ga = argparse.Namespace(arch="gpt2", n_heads=4, n_kv_heads=0, norm_eps=1e-5, rope_theta=1e4)
    llama_dir = load_model(models / "llama2", la)
    llama_st = load_model(work / "llama.safetensors", la)
    gpt2 = load_model(work / "gpt2.safetensors", ga)
    L = cfg["num_hidden_layers"]
    window_fns = {
        "llama": lambda ids, pos, al: llama_window_forward(llama_st.params, ids, pos, al, L, la.n_heads, la.n_kv_heads,
                                                           la.norm_eps, la.rope_theta),
        "gpt2": lambda ids, pos, al: gpt2_window_forward(gpt2.params, ids, pos, al, 2, 4),
    }
    rows_cut = sp.rows(seq)
    with torch.no_grad():
        # 3. The two Llama implementations agree on every row alone.
        worst = max((llama_dir.logits(ids) - llama_st.logits(ids)).abs().max().item() for ids, _, _ in rows_cut)
        check(worst <= 1e-4, f"Llama: hf_models.Reference and hf_reference.llama_forward agree per row ({worst:.2g})")
        for name, model in (("llama", llama_st), ("gpt2", gpt2)):
            wf = window_fns[name]
            # 4. Each packed window, computed with a block-diagonal mask and restarted positions,
            # gives every row's logits alone; one causal sequence over the window does not.
            worst, leak = 0.0, 0.0
            for w in wins:
                ids = torch.as_tensor(np.concatenate([rows_cut[i][0] for i in w]))
                lens = [len(rows_cut[i][0]) for i in w]
                pos, al = window_layout(lens)
                packed = wf(ids, pos, al)
                pos_s, al_s = window_layout(lens, block_diagonal=False)
                stream = wf(ids, pos_s, al_s)
                o = 0
                for i, n in zip(w, lens):
                    alone = model.logits(rows_cut[i][0])
                    worst = max(worst, (packed[o:o + n] - alone).abs().max().item())
                    if o > 0:
                        leak = max(leak, (stream[o:o + n] - alone).abs().max().item())
                    o += n
            check(worst <= 1e-4, f"{name}: packed windows (block-diagonal mask, positions from 0) = each row alone "
                                 f"(max |diff| {worst:.2g})")
            check(leak > 1e-2, f"{name}: the same window as one causal stream differs ({leak:.2g}): the check can fail")
            # 5. A right-padded batch (causal mask, padding after each row) gives each row alone.
            batch = [rows_cut[i][0] for i in range(6)]
            T = max(len(b) for b in batch)
            padded = torch.zeros(len(batch), T, dtype=torch.int64)
            for r, b in enumerate(batch):
                padded[r, :len(b)] = torch.as_tensor(b)
            out = model.fn(padded)
            worst = max((out[r, :len(b)] - model.logits(b)).abs().max().item() for r, b in enumerate(batch))
            check(worst <= 1e-4, f"{name}: a right-padded batch of 6 rows = each row alone ({worst:.2g})")
        # 6. The loss: mask and shift vs transformers' labels with -100 and ignore_index.
        total, counted = rows_loss(gpt2, rows_cut)
        t2, c2 = 0.0, 0
        for ids, mask, _ in rows_cut:
            labels = torch.as_tensor(ids).clone()
            labels[torch.as_tensor(mask) == 0] = -100
            lg = gpt2.logits(ids)
            ce = torch.nn.functional.cross_entropy(lg[:-1], labels[1:], ignore_index=-100, reduction="sum")
            t2 += ce.double().item()
            c2 += int((labels[1:] != -100).sum())
        check(counted == c2 == count_targets(rows_cut) and abs(total - t2) <= 1e-5 * abs(t2),
              f"loss: mask on shifted targets = labels -100 (ignore_index): {total / counted:.9f} over {counted}")
        # 6b. stream + document_mask: each row's piece of a stream window alone = the window in one
        # forward with a block-diagonal mask over the pieces and positions restarting at each.
        t_doc, c_doc, n_win = stream_document_loss(gpt2, sp, seq)
        row_of = np.searchsorted(sp.starts, np.arange(len(sp.tokens)), side="right") - 1
        t2, c2 = 0.0, 0
        for w in range(n_win):
            lo = w * seq
            r = row_of[lo:lo + seq + 1]
            pieces = [int(n) for n in np.diff(np.flatnonzero(np.diff(np.append(r[:seq], -1)) != 0) + 1, prepend=0)]
            pos, al = window_layout(pieces)
            lg = window_fns["gpt2"](torch.as_tensor(sp.tokens[lo:lo + seq]), pos, al)
            keep = torch.as_tensor((r[1:] == r[:-1]) & (sp.mask[lo + 1:lo + seq + 1] == 1))
            y = torch.as_tensor(sp.tokens[lo + 1:lo + seq + 1])
            ce = torch.nn.functional.cross_entropy(lg, y, reduction="none")
            t2 += ce[keep].double().sum().item()
            c2 += int(keep.sum())
        check(c_doc == c2 and abs(t_doc - t2) <= 1e-5 * abs(t2),
              f"stream + document_mask: row pieces alone = one block-diagonal forward per window "
              f"({t_doc / c_doc:.9f} vs {t2 / c2:.9f} over {c_doc} targets, {n_win} windows)")
        # 7. Truncation: a row longer than seq is its first seq tokens (the 40-token row).
        long_ids, long_mask, n = rows_cut[4]
        ce, c = row_ce(gpt2, long_ids, long_mask)
        full = sp.rows(10 ** 9)[4]
        ce_full, _ = row_ce(llama_st, full[0], full[1])  # the Llama has 64 positions, the GPT-2 24
        ce_cut, _ = row_ce(llama_st, full[0][:seq], full[1][:seq])
        check(n == 40 and len(long_ids) == seq and len(ce) == seq - 1
              and torch.allclose(ce_full[:seq - 1], ce_cut, atol=1e-5),
              "truncation: a 40-token row keeps its first 24 tokens (23 targets), = the longer row's first targets")
    # 8. The step: the gradient of the row-wise loss against float64 finite differences (GPT-2).
    g64 = load_model(work / "gpt2.safetensors", ga, dtype=torch.float64, trainable=True)
    N = count_targets(rows_cut)
    total, _ = rows_loss(g64, rows_cut, backward=True, n_counted=N)
    for name, idx in (("transformer.h.1.attn.c_attn.weight", (3, 40)), ("transformer.wpe.weight", (2, 5)),
                      ("transformer.wte.weight", (int(rows_cut[0][0][1]), 7))):
        t = g64.params[name]
        g = t.grad[idx].item()
        with torch.no_grad():
            orig = t[idx].item()
            t[idx] = orig + 1e-6
            up = rows_loss(g64, rows_cut)[0] / N
            t[idx] = orig - 1e-6
            down = rows_loss(g64, rows_cut)[0] / N
            t[idx] = orig
        fd = (up - down) / 2e-6
        check(abs(fd - g) <= 1e-6 * max(abs(g), 1e-3) and abs(g) > 1e-6,
              f"GPT-2 float64 gradient of {name}{list(idx)}: autograd {g:.10g}, finite difference {fd:.10g}")
    # wpe's last row: only a truncated row's last token sits there, and it predicts nothing and is
    # seen by no later token: its gradient is zero.
    check(g64.params["transformer.wpe.weight"].grad[seq - 1].abs().max().item() == 0.0,
          "the last position of a row predicts nothing: wpe[seq-1] has no gradient")
    # 9. LoRA (peft_reference): gradient of the adapters against float64 finite differences.
    import peft_reference as pr
    pr.random_adapter(models / "llama2", work / "ad", 4, 8, False, "all-linear", None, 3)
    with pr.float64_semantics():
        lm = load_model(models / "llama2", la, adapter=work / "ad", dtype=torch.float64, trainable=True)
        rows_loss(lm, rows_cut, backward=True, n_counted=N)
        for name, idx in (("model.layers.0.self_attn.q_proj.lora_A.weight", (1, 5)),
                          ("model.layers.1.mlp.down_proj.lora_B.weight", (7, 2))):
            t = lm.trainable[name]
            g = t.grad[idx].item()
            with torch.no_grad():
                orig = t[idx].item()
                t[idx] = orig + 1e-6
                up = rows_loss(lm, rows_cut)[0] / N
                t[idx] = orig - 1e-6
                down = rows_loss(lm, rows_cut)[0] / N
                t[idx] = orig
            fd = (up - down) / 2e-6
            check(abs(fd - g) <= 1e-6 * max(abs(g), 1e-3) and abs(g) > 1e-7,
                  f"LoRA float64 gradient of {name}{list(idx)}: autograd {g:.10g}, finite difference {fd:.10g}")
    # 10. The step command end to end, and compare catching a wrong step.
    out = work / "stepped.safetensors"
    sargs = argparse.Namespace(model=str(work / "gpt2.safetensors"), dataset=str(ds), seq=seq, lr=0.5, adapter=None,
                               out=str(out), compare=[], metrics=[], rtol=1e-5, **vars(ga))
    with contextlib.redirect_stdout(open("/dev/null", "w")):
        cmd_step(sargs)
    stepped, start = read_tensors(out), read_tensors(work / "gpt2.safetensors")
    compare(stepped, stepped, start, label="the step against itself: ")
    wrong = dict(stepped)
    wrong["transformer.h.0.mlp.c_fc.weight"] = start["transformer.h.0.mlp.c_fc.weight"] + 0.9 * (
        stepped["transformer.h.0.mlp.c_fc.weight"] - start["transformer.h.0.mlp.c_fc.weight"])
    try:
        compare(wrong, stepped, start, label="a 10% shorter step on one tensor: ")
        check(False, "compare notices a step 10% short on one tensor")
    except Failure as e:
        check(True, f"compare notices a step 10% short on one tensor ({e})")
    return ok


# ---- command line ----

def model_options(p):
    p.add_argument("--arch", choices=["llama", "gpt2"])
    p.add_argument("--n-heads", type=int)
    p.add_argument("--n-kv-heads", type=int, default=0)
    p.add_argument("--norm-eps", type=float, default=1e-5)
    p.add_argument("--rope-theta", type=float, default=10000.0)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("eval")
    p.add_argument("model")
    p.add_argument("dataset")
    p.add_argument("split", choices=["train", "val"])
    p.add_argument("seq", type=int)
    model_options(p)
    p.add_argument("--eval-json", action="append", default=[])
    p.add_argument("--packed", action="append", default=[])
    p.add_argument("--padded", action="append", default=[])
    p.add_argument("--stream-doc", action="append", default=[])
    p = sub.add_parser("step")
    p.add_argument("model")
    p.add_argument("dataset")
    p.add_argument("seq", type=int)
    model_options(p)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--adapter")
    p.add_argument("--out")
    p.add_argument("--compare", action="append", default=[])
    p.add_argument("--metrics", action="append", default=[])
    p.add_argument("--rtol", type=float, default=1e-5)
    p = sub.add_parser("compare")
    p.add_argument("got")
    p.add_argument("want")
    p.add_argument("--before")
    p.add_argument("--rtol", type=float, default=1e-5)
    p = sub.add_parser("windows")
    p.add_argument("dataset")
    p.add_argument("split", choices=["train", "val"])
    p.add_argument("seq", type=int)
    p.add_argument("--packing", default="packed", help="packed, padded, stream, or several with commas")
    p = sub.add_parser("write-dataset")
    p.add_argument("out_dir")
    p.add_argument("spec")
    p.add_argument("--version", type=int, choices=[1, 2, 3], default=3)
    p = sub.add_parser("write-gpt2")
    p.add_argument("out")
    for a in ("--vocab", "--d", "--layers", "--seq"):
        p.add_argument(a, type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("self-test")
    p.add_argument("work_dir", nargs="?")
    args = ap.parse_args(argv)

    if args.cmd == "eval":
        return cmd_eval(args)
    if args.cmd == "step":
        return cmd_step(args)
    if args.cmd == "compare":
        compare(read_tensors(args.got), read_tensors(args.want), read_tensors(args.before) if args.before else None,
                args.rtol)
        return 0
    if args.cmd == "windows":
        return cmd_windows(args)
    if args.cmd == "write-dataset":
        spec = json.loads(pathlib.Path(args.spec).read_text())
        write_dataset(args.out_dir, {k: spec.get(k, []) for k in ("train", "val")}, spec.get("vocab_size", 256),
                      spec.get("tokenizer", "byte"), args.version, spec.get("chat_format", "plain"))
        print(f"{args.out_dir}: version {args.version}")
        return 0
    if args.cmd == "write-gpt2":
        hm.write_safetensors(args.out, gpt2_params(args.vocab, args.d, args.layers, args.seq, args.seed), "F32")
        return 0
    if args.work_dir:
        good = self_test(args.work_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="packing-ref-") as d:
            good = self_test(d)
    print("self-test passed" if good else "MISMATCH: self-test failed")
    return 0 if good else 1


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (Failure, OSError, KeyError, ValueError, json.JSONDecodeError) as e:
        print(f"MISMATCH: {e}" if isinstance(e, Failure) else f"ERROR: {type(e).__name__}: {e}")
        sys.exit(1)
