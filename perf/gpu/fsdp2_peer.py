#!/usr/bin/env python3
"""PyTorch FSDP2 (fully_shard) on the same GPT-2 shape and batch as perf/gpu/bench_gpu.cpp: the
peer of the GPU table that scripts/gpu-check prints (perf/README.md, "GPU").

Model as shardtrain's GPT2 (src/model/gpt2.cpp): learned positions, pre-norm blocks, LayerNorm,
Conv1D projections (y = x W + b), causal attention (F.scaled_dot_product_attention, the fused
kernels shardtrain's attention also uses on CUDA with libtorch 2.x), tanh GELU, biases, LM head
tied to wte. fully_shard on every block and on the root, MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32): fp32 sharded parameters, bf16 compute, as shardtrain's full_shard with
fsdp.param_dtype = bf16. AdamW (fused when the installed torch allows it on DTensors, else
foreach) with no decay on biases and LayerNorms, clip to 1.0, one fixed random batch.

World 1 without a launcher (one GPU); under torchrun or mpirun it uses their rank variables.
  python3 perf/gpu/fsdp2_peer.py --model gpt2-1.5b --micro-batch 8 --seq 1024 --steps 10
Prints one JSON line with the fields of bench_gpu's ("mode": "fsdp2").
"""
import argparse
import json
import math
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

try:  # torch >= 2.6
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
except ImportError:  # torch 2.4 / 2.5
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard

PRESETS = {  # as src/model/model.cpp
    "gpt2-124m": (12, 768, 12),
    "gpt2-355m": (24, 1024, 16),
    "gpt2-774m": (36, 1280, 20),
    "gpt2-1.5b": (48, 1600, 25),
    "tiny": (2, 64, 4),
}


class Conv1D(nn.Module):
    def __init__(self, nin, nout):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nin, nout).normal_(0.0, 0.02))
        self.bias = nn.Parameter(torch.zeros(nout))

    def forward(self, x):
        shape = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.reshape(-1, self.weight.shape[0]), self.weight).view(shape)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d, eps=1e-5)
        self.c_attn = Conv1D(d, 3 * d)
        self.c_proj = Conv1D(d, d)
        self.ln_2 = nn.LayerNorm(d, eps=1e-5)
        self.c_fc = Conv1D(d, 4 * d)
        self.mlp_proj = Conv1D(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).chunk(3, -1)
        split = lambda z: z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, vocab, seq, layers, d, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        nn.init.normal_(self.wte.weight, 0.0, 0.02)
        nn.init.normal_(self.wpe.weight, 0.0, 0.01)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, eps=1e-5)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe.weight[: idx.size(1)]
        for blk in self.h:
            x = blk(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied head


def flops_per_token(n_params, seq, layers, d):
    # As shardtrain's GPT2::train_flops_per_token: 6N (N without wpe) + attention 12*L*d*T.
    return 6.0 * (n_params - seq * d) + 12.0 * layers * d * seq


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2-1.5b", choices=sorted(PRESETS))
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--vocab", type=int, default=50257)
    args = ap.parse_args()

    rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", 0)))
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", 1)))
    local = int(os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)))
    if "MASTER_ADDR" not in os.environ:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        if world == 1:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
        else:
            os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    dev = torch.device("cuda", local)

    layers, d, heads = PRESETS[args.model]
    vocab = 512 if args.model == "tiny" else args.vocab
    t0 = time.time()
    torch.manual_seed(0)
    with torch.device(dev):
        model = GPT2(vocab, args.seq, layers, d, heads)
    n_params = sum(p.numel() for p in model.parameters())
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.h:
        fully_shard(blk, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "ln_" in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "ln_" in n]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    fused = "fused"
    try:
        opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95), fused=True)
    except (RuntimeError, TypeError, ValueError):
        opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95), foreach=True)
        fused = "foreach"
    setup_s = time.time() - t0

    g = torch.Generator().manual_seed(1234 + rank)
    tokens = torch.randint(vocab, (args.micro_batch, args.seq + 1), generator=g).to(dev)
    x, y = tokens[:, :-1], tokens[:, 1:]

    times, first, last = [], None, None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(dev)
        torch.cuda.synchronize()
        t = time.perf_counter()
        logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, vocab), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        l = loss.item()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        if step >= args.warmup:
            times.append(dt)
        first = l if first is None else first
        last = l
    med = statistics.median(times)
    tokens_per_s = args.micro_batch * args.seq * world / med
    tflops = flops_per_token(n_params, args.seq, layers, d) * tokens_per_s / 1e12 / world
    if rank == 0:
        print(json.dumps({
            "mode": "fsdp2", "model": args.model, "params": n_params, "device": str(dev), "ranks": world,
            "dtype": "bf16", "micro_batch": args.micro_batch, "seq": args.seq, "steps": args.steps,
            "setup_s": round(setup_s, 2), "step_ms_median": round(med * 1e3, 2),
            "step_ms_min": round(min(times) * 1e3, 2), "tokens_per_s": round(tokens_per_s, 1),
            "tflops": round(tflops, 2), "mfu": round(tflops / args.peak_tflops, 4),
            "peak_mem_gib": round(torch.cuda.max_memory_allocated(dev) / 2**30, 3),
            "loss_first": round(first, 5), "loss_last": round(last, 5), "torch": torch.__version__,
            "optimizer": fused}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
