#!/usr/bin/env python3
"""The GPU table of perf/README.md from results.jsonl (one JSON line per configuration, as
perf/gpu/bench_gpu and perf/gpu/fsdp2_peer.py print them; lines with "error" are kept as
failed rows). Used by scripts/gpu-check; tested on CPU results by tests/e2e/bench_gpu.cmake.
  python3 perf/gpu/table.py $OUT/results.jsonl --gpu "NVIDIA H200, 143771 MiB" --torch 2.9.1
"""
import argparse
import json

NAMES = {
    "plain": "plain libtorch (no FSDP), autocast bf16",
    "fsdp": "shardtrain full_shard, world 1",
    "offload": "shardtrain full_shard + CPU offload",
    "fsdp2": "PyTorch FSDP2 fully_shard (python)",
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--gpu", default="?")
    ap.add_argument("--torch", default="?")
    args = ap.parse_args()
    rows = [json.loads(line) for line in open(args.results) if line.strip()]
    ok = [r for r in rows if "error" not in r]
    first = ok[0] if ok else {}
    print(f"{first.get('model', '?')}, micro batch {first.get('micro_batch', '?')} x {first.get('seq', '?')} tokens, "
          f"{first.get('dtype', '?')} compute / fp32 masters, 1 GPU ({args.gpu}), PyTorch {args.torch}")
    print()
    print("| configuration | step ms (median) | tokens/s | TFLOP/s | MFU | peak memory GiB | loss first -> last |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        name = NAMES.get(r["mode"], r["mode"])
        if "error" in r:
            print(f"| {name} | {r['error']} | | | | | |")
            continue
        print(f"| {name} | {r['step_ms_median']:.1f} | {r['tokens_per_s']:.0f} | {r['tflops']:.1f} | "
              f"{100 * r['mfu']:.1f}% | {r['peak_mem_gib']:.1f} | {r['loss_first']:.3f} -> {r['loss_last']:.3f} |")
    by_mode = {r["mode"]: r for r in ok}
    if "fsdp" in by_mode and "fsdp2" in by_mode:
        a, b = by_mode["fsdp"]["mfu"], by_mode["fsdp2"]["mfu"]
        verdict = "met" if a >= 0.5 and a >= b else "NOT met"
        print()
        print(f"Goal (shardtrain full_shard MFU >= 50% and >= FSDP2's): {100 * a:.1f}% vs {100 * b:.1f}%: {verdict}")


if __name__ == "__main__":
    main()
