#!/usr/bin/env python3
"""kvsift.cuda.BucketedLRU.step from Python: the GPU time of a step (CUDA events) and the host
time of the Python call around it, on the decode shapes of the C++ bench
(`kvsift-cuda-bucketed_lru_bench`): B requests x KV heads pairs, each selecting `select` of
`pages` pages into `capacity` slots; a new random selection per step, half of it resident.

Usage: lru_step_timing.py [--pairs 256] [--capacity 1024] [--pages 4096] [--select 128]
"""

import argparse
import time

from cuda_timing import median_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=256)
    ap.add_argument("--capacity", type=int, default=1024)
    ap.add_argument("--pages", type=int, default=4096)
    ap.add_argument("--select", type=int, default=128)
    a = ap.parse_args()
    import torch
    import kvsift.cuda as kc

    lru = kc.BucketedLRU(a.pairs, a.capacity, a.pages)
    g = torch.Generator(device="cuda").manual_seed(0)
    offsets = torch.arange(0, (a.pairs + 1) * a.select, a.select, dtype=torch.int64, device="cuda")
    steps = [torch.randint(0, a.pages, (a.pairs * a.select,), generator=g, device="cuda",
                           dtype=torch.int32) for _ in range(8)]
    i = [0]

    def step():
        i[0] += 1
        return lru.step(steps[i[0] % len(steps)], offsets)

    gpu = median_ms(step, torch, warmup=5, reps=50)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(200):
        step()
    host_us = (time.perf_counter() - t) / 200 * 1e6  # enqueue only: the call does not sync
    torch.cuda.synchronize()
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}: pairs {a.pairs}, capacity "
          f"{a.capacity}, pages {a.pages}, {a.select} selected per pair")
    print(f"step (CUDA events, median of 50): {gpu * 1e3:8.1f} us;  Python call, host time to "
          f"enqueue (mean of 200): {host_us:6.1f} us")


if __name__ == "__main__":
    main()
