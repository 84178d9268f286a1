"""The index build overlapped with prefill on the same GPU: how much does a layer's build
(kvsift.cuda.build_index for each KV head: GPU kNN and step-3 searches, CPU merging) slow a
GEMM-heavy prefill stand-in, and how much does the prefill slow the build? One process, one
GPU, every row measured in the same run.

Prefill stand-in: one Llama-3-8B layer's projections over --tokens tokens in bf16 (QKV 4096 x
6144, O 4096 x 4096, gate+up 4096 x 28672, down 14336 x 4096), repeated; its time per layer
comes from CUDA events around each layer. The build: --heads KV heads of --tokens synthetic
out-of-distribution keys x 128, GQA 4 x --ratio sampled queries each, on a Python thread (the
build releases the GIL). Rows:
  prefill alone            layers back to back, nothing else on the GPU
  build alone              the heads one after another
  overlapped, <priority>   the build on its thread while the main thread runs prefill layers
                           on a stream of that priority until the build is done: the prefill's
                           GPU time per layer (events) and its wall time per layer (host gaps
                           included: the build's CPU threads compete with the launching
                           thread) against alone are its slowdown; the last row leaves the
                           build two fewer cores than the host has
kvsift's build streams are created at the default priority, which is the lowest on current
GPUs: an engine that runs its prefill on a higher-priority stream (torch.cuda.Stream(priority=
-1)) has its kernels' blocks scheduled first whenever both have work waiting.

    python3 bench/python/build_overlap.py [--tokens 32768] [--heads 8] [--json out.json]
"""

import argparse
import json
import os
import statistics
import threading
import time

import numpy as np
import torch

import kvsift.cuda as kc
from ood_data import ood_keys, ood_queries


def synthetic(n, d, ratio, heads, seed):
    """Per KV head: keys (n, d) and GQA-4 training queries (4 * n * ratio, d), float32, OOD."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(heads):
        keys = ood_keys(rng.standard_normal((n, d)), rng.standard_normal(d))
        qdir = rng.standard_normal(d)
        train = ood_queries(rng.standard_normal((4 * int(n * ratio), d)), qdir)
        out.append((keys, train))
    return out


class Prefill:
    """One Llama-3-8B layer's projection GEMMs over `tokens` tokens, bf16."""

    def __init__(self, tokens):
        g = torch.Generator(device="cuda").manual_seed(0)

        def w(a, b):
            return torch.randn(a, b, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02

        self.x = torch.randn(tokens, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
        self.w = [w(4096, 6144), w(4096, 4096), w(4096, 28672), w(14336, 4096)]
        self.flops = 2 * tokens * (4096 * 6144 + 4096 * 4096 + 4096 * 28672 + 14336 * 4096)

    def layer(self):
        qkv = self.x @ self.w[0]
        o = qkv[:, :4096] @ self.w[1]
        gu = o @ self.w[2]
        return gu[:, :14336] @ self.w[3]

    def timed_layers(self, stream, until=None, count=0):
        """Per-layer ms (CUDA events) of layers on `stream`: `count` layers, or until `until`
        (a threading.Event) is set (at least 3)."""
        times = []
        self.wall_s = time.perf_counter()
        with torch.cuda.stream(stream):
            while (count and len(times) < count) or (until is not None and (
                    not until.is_set() or len(times) < 3)):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                self.layer()
                b.record()
                b.synchronize()  # one layer in flight: the time is the layer's, not a queue's
                times.append(a.elapsed_time(b))
        self.wall_s = time.perf_counter() - self.wall_s  # host gaps included
        return times


def build_all(data, threads, phases=None):
    """Seconds to build every head; `phases` (a list) gets each index's build_stats."""
    t0 = time.perf_counter()
    for keys, train in data:
        g = kc.build_index(keys, train, threads=threads)
        if phases is not None:
            phases.append(g.build_stats)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--ratio", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=0, help="build's CPU threads (0 = all)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    data = synthetic(args.tokens, 128, args.ratio, args.heads, 0)
    pre = Prefill(args.tokens)
    kc.build_index(data[0][0][:2048], data[0][1][:256], threads=args.threads)  # warm-up
    pre.timed_layers(torch.cuda.current_stream(), count=3)

    rows = {}
    def layer_stats(times):
        """Median and mean GPU ms per layer (CUDA events) and wall ms per layer (the loop's
        host time / layers: what a prefill of these layers takes, host gaps included)."""
        return {"layer_ms": statistics.median(times), "mean_ms": statistics.mean(times),
                "wall_ms": pre.wall_s * 1e3 / len(times), "layers": len(times)}

    rows["prefill alone"] = layer_stats(pre.timed_layers(torch.cuda.current_stream(), count=30))
    phases = []
    rows["build alone"] = {"build_s": build_all(data, args.threads, phases)}
    lo, hi = torch.cuda.Stream.priority_range()
    cores = os.cpu_count() or 1
    spare = max(1, cores - 2)
    for name, prio, threads in (("default priority", 0, args.threads),
                                ("high priority", hi, args.threads),
                                (f"high priority, build on {spare} of {cores} cores", hi, spare)):
        stream = torch.cuda.Stream(priority=prio)
        done = threading.Event()
        result = {}

        def run():
            result["build_s"] = build_all(data, threads)
            done.set()

        th = threading.Thread(target=run)
        th.start()
        times = pre.timed_layers(stream, until=done)
        th.join()
        rows[f"overlapped, prefill at {name}"] = dict(layer_stats(times),
                                                       build_s=result["build_s"])
    base_ms, base_s = rows["prefill alone"]["layer_ms"], rows["build alone"]["build_s"]
    print(f"# GPU {torch.cuda.get_device_name()}; prefill stand-in: Llama-3-8B layer GEMMs over "
          f"{args.tokens} tokens, bf16, {pre.flops / 1e12:.1f} TFLOP per layer; build: "
          f"{args.heads} KV heads x {args.tokens} keys x 128, {int(4 * args.tokens * args.ratio)}"
          f" training queries each, kvsift.cuda.build_index (threads {args.threads or 'all'})")
    base_mean, base_wall = rows["prefill alone"]["mean_ms"], rows["prefill alone"]["wall_ms"]
    print("| run | prefill layer on the GPU: median / mean | prefill layer, wall (host gaps "
          "included) | build | build slowdown |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        build = r.get("build_s")
        gpu = (f"{r['layer_ms']:.2f} / {r['mean_ms']:.2f} ms ({r['mean_ms'] / base_mean:.2f}x)"
               if "layer_ms" in r else "-")
        wall = f"{r['wall_ms']:.2f} ms ({r['wall_ms'] / base_wall:.2f}x)" if "wall_ms" in r else "-"
        print(f"| {name} | {gpu} | {wall} | {'%.2f s' % build if build else '-'} | "
              f"{'%.2fx' % (build / base_s) if build else '-'} |")
    mean = {k: statistics.mean(getattr(p, k) for p in phases)
            for k in ("knn_seconds", "projection_seconds", "connectivity_seconds",
                      "total_seconds")}
    rows["build alone"]["phases_per_head_s"] = mean
    print(f"prefill stand-in alone: {pre.flops / (base_ms * 1e-3) / 1e12:.0f} TFLOP/s; "
          f"build per KV head alone: {base_s / args.heads * 1e3:.0f} ms (kNN "
          f"{mean['knn_seconds'] * 1e3:.0f}, projection {mean['projection_seconds'] * 1e3:.0f}, "
          f"connectivity {mean['connectivity_seconds'] * 1e3:.0f} ms)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tokens": args.tokens, "heads": args.heads, "ratio": args.ratio,
                       "gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
