"""kvsift.cuda.build_index (kNN and step-3 searches on the GPU) against the CPU constructor
kvsift.RoarGraphIndex on all host cores, from Python, same keys, same process: build seconds
per phase, and recall@k of held-out queries through each graph (CPU search, exact oracle).

Synthetic out-of-distribution data (keys and queries from different Gaussians); training
queries n * --ratio of the queries' distribution.

With --heads H (> 0) it measures instead a layer's H KV heads of --n keys each: one
kvsift.cuda.build_index per head, one after the other, against kvsift.cuda.build_indexes over
--builders B builders (a comma list), same process, and checks that the graphs are equal.

    python3 bench/python/cuda_build.py [--n 131072] [--dim 128] [--ratio 0.1]
    python3 bench/python/cuda_build.py --n 32768 --heads 8 --builders 2,4
"""

import argparse
import time

import numpy as np

import kvsift
import kvsift.cuda as kc
from ood_data import ood_keys, ood_queries


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=131072)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--ratio", type=float, default=0.1)
    ap.add_argument("--eval", type=int, default=200)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--L", type=int, default=200)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--heads", type=int, default=0)
    ap.add_argument("--builders", default="4")
    args = ap.parse_args()
    if args.heads > 0:
        sharded(args)
        return
    rng = np.random.default_rng(0)
    d = args.dim
    keys = ood_keys(rng.standard_normal((args.n, d)), rng.standard_normal(d))
    qdir = rng.standard_normal(d)
    m = int(args.n * args.ratio)
    queries = ood_queries(rng.standard_normal((m + args.eval, d)), qdir)
    train, held = queries[:m], queries[m:]
    truth = np.argsort(-(held @ keys.T), axis=1)[:, : args.k]
    kc.build_index(keys[:2048], train[:256], threads=args.threads)  # CUDA context, cuBLAS
    print(f"{args.n} keys x {d}, {m} training queries, {args.eval} held out; recall@{args.k} "
          f"at L {args.L}")
    print(f"{'build':<28} {'total_s':>8} {'knn_s':>7} {'proj_s':>7} {'conn_s':>7} {'wall_s':>7} "
          f"{'recall':>7}")
    for name, build in (("CPU RoarGraphIndex", kvsift.RoarGraphIndex),
                        ("GPU kvsift.cuda.build_index", kc.build_index)):
        t0 = time.perf_counter()
        g = build(keys, train, threads=args.threads)
        wall = time.perf_counter() - t0
        st = g.build_stats
        ids = g.search(held, args.k, L=args.L).ids
        rec = np.mean([len(np.intersect1d(ids[i], truth[i])) / args.k for i in range(args.eval)])
        print(f"{name:<28} {st.total_seconds:8.2f} {st.knn_seconds:7.2f} "
              f"{st.projection_seconds:7.2f} {st.connectivity_seconds:7.2f} {wall:7.2f} "
              f"{rec:7.4f}")


def sharded(args):
    rng = np.random.default_rng(1)
    d, m = args.dim, int(args.n * args.ratio)
    keys, trains = [], []
    for _ in range(args.heads):
        keys.append(ood_keys(rng.standard_normal((args.n, d)), rng.standard_normal(d)))
        trains.append(ood_queries(rng.standard_normal((m, d)), rng.standard_normal(d)))
    kc.build_index(keys[0][:2048], trains[0][:256], threads=args.threads)  # CUDA context, cuBLAS
    print(f"{args.heads} heads x {args.n} keys x {d}, {m} training queries each")
    t0 = time.perf_counter()
    one = [kc.build_index(k, t, threads=args.threads) for k, t in zip(keys, trains)]
    base = time.perf_counter() - t0
    print(f"build_index per head, one after the other: {base:7.3f} s "
          f"({1e3 * base / args.heads:.0f} ms per head)")
    for b in (int(x) for x in args.builders.split(",")):
        t0 = time.perf_counter()
        many = kc.build_indexes(keys, trains, builders=b, threads=args.threads)
        wall = time.perf_counter() - t0
        same = sum(np.array_equal(x.adjacency(), y.adjacency()) for x, y in zip(one, many))
        print(f"build_indexes, {b} builders: {wall:7.3f} s ({1e3 * wall / args.heads:.0f} ms per "
              f"head, x{base / wall:.2f}); {same} of {args.heads} graphs equal build_index's")


if __name__ == "__main__":
    main()
