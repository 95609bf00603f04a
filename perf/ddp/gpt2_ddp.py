#!/usr/bin/python3
"""GPT-2 (Hugging Face architecture, plain torch) trained with DistributedDataParallel on CPU.

The PyTorch side of perf/ddp/run.sh: the same model and batch as a shardtrain run, so that the
median step times can be compared. Architecture as shardtrain's GPT2 (src/model/gpt2.cpp):
learned positions, pre-norm blocks, LayerNorm, Conv1D projections (y = x W + b), causal attention
as matmul + mask + fp32 softmax + matmul, tanh GELU, biases, LM head tied to wte. AdamW with
the same no-decay groups (".bias", "ln_"), gradient clipping to 1.0, random tokens.

Launch under mpirun (reads OMPI_COMM_WORLD_RANK/SIZE; gloo over TCP on 127.0.0.1) or torchrun:
  mpirun -np 2 /usr/bin/python3 perf/ddp/gpt2_ddp.py --d-model 384 --layers 6 --heads 6 \
      --seq 256 --micro-batch 2 --steps 8 --warmup 2 --threads 1
Rank 0 prints one JSON line: {"median_step_ms": ..., ...}. The step time of a step is the
maximum over ranks (as shardtrain's metrics), the median is over the timed steps.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Conv1D(nn.Module):
    def __init__(self, nin, nout):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nin, nout))
        self.bias = nn.Parameter(torch.zeros(nout))

    def forward(self, x):
        shape = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.reshape(-1, self.weight.shape[0]), self.weight).view(shape)


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = Conv1D(d, 3 * d)
        self.c_proj = Conv1D(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).chunk(3, -1)
        split = lambda z: z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        q, k, v = split(q), split(k), split(v)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        probs = torch.softmax(scores, -1, dtype=torch.float32).to(q.dtype)
        y = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, d)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc = Conv1D(d, 4 * d)
        self.c_proj = Conv1D(4 * d, d)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d, heads, eps):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d, eps=eps)
        self.attn = Attention(d, heads)
        self.ln_2 = nn.LayerNorm(d, eps=eps)
        self.mlp = MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, vocab, seq, d, layers, heads, eps=1e-5):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.h = nn.ModuleList([Block(d, heads, eps) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d, eps=eps)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                nn.init.zeros_(p)
            elif ".ln_" in name or name.startswith("ln_"):
                nn.init.ones_(p)
            elif name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))
            else:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx):
        t = idx.size(1)
        x = self.wte(idx) + self.wpe.weight[:t]
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied LM head


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8, help="timed steps (after warm-up)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    ap.add_argument("--port", type=int, default=29517)
    a = ap.parse_args()

    if "OMPI_COMM_WORLD_RANK" in os.environ:  # mpirun
        rank, world = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(a.port))
    else:  # torchrun or a single process
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(a.port))
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    torch.manual_seed(1234)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    model = GPT2(a.vocab, a.seq, a.d_model, a.layers, a.heads)
    n_params = sum(p.numel() for p in model.parameters())
    ddp = DDP(model, bucket_cap_mb=a.bucket_mb)
    decay = [p for n, p in model.named_parameters() if not (n.endswith(".bias") or "ln_" in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith(".bias") or "ln_" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(1000 + rank)

    times, losses = [], []
    for step in range(a.warmup + a.steps):
        tokens = torch.randint(0, a.vocab, (a.micro_batch, a.seq + 1), generator=gen)
        x, y = tokens[:, :-1], tokens[:, 1:]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = ddp(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if step >= a.warmup:
            times.append(dt)

    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        ms = [1e3 * v for v in t.tolist()]
        print(json.dumps({"impl": "pytorch_ddp", "ranks": world, "threads": a.threads, "params": n_params,
                          "d_model": a.d_model, "layers": a.layers, "seq": a.seq, "micro_batch": a.micro_batch,
                          "median_step_ms": statistics.median(ms), "min_step_ms": min(ms), "steps_ms": ms,
                          "first_loss": losses[0], "last_loss": losses[-1], "torch": torch.__version__}))
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
