"""kvsift.cuda.batch_insert from Python: generated keys joining the GPU graphs, one launch per
decode step for every graph, against the CPU insert (InsertableGraphIndex.insert, one thread)
of the same keys into the same index in the same run.

Synthetic out-of-distribution data (keys and queries from different Gaussians). Each graph is
built on the CPU over its first (1 - F) keys, then its last F keys are inserted one launch per
key (all graphs at once), for each --expand-widths value from the same starting state.
Reports per launch the GPU time (CUDA events over all launches) and the host time of the
Python call (over the first 32 calls: later calls wait for room in the launch queue), the CPU
insert's time per key on graph 0, and recall@k of held-out queries over all keys through each
grown graph (decode_search with expand_width 8, pool --L), graph 0's beside the CPU-grown
graph 0's through the same search.

    python3 bench/python/cuda_batch_insert.py [--graphs 8] [--n 32768] [--insert-fraction 0.2]
"""

import argparse
import time

import numpy as np
import torch

import kvsift
import kvsift.cuda as kc
from ood_data import ood_keys, ood_queries


def recall(ids, truth):
    return float(np.mean([len(np.intersect1d(a, b)) / len(b) for a, b in zip(ids, truth)]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=int, default=8)
    ap.add_argument("--n", type=int, default=32768)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--insert-fraction", type=float, default=0.2)
    ap.add_argument("--expand-widths", default="1,8")
    ap.add_argument("--group", type=int, default=16, help="evaluation queries per graph")
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--L", type=int, default=200)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    G, n, d = args.graphs, args.n, args.dim
    base = n - int(n * args.insert_fraction)
    shift = rng.standard_normal(d).astype(np.float32)
    keys = ood_keys(rng.standard_normal((G, n, d)), shift).astype(np.float16).astype(np.float32)
    qdir = rng.standard_normal(d).astype(np.float32)
    t0 = time.perf_counter()
    idx = [kvsift.InsertableGraphIndex(keys[g, :base], ood_queries(rng.standard_normal(
        (base // 10, d)), qdir), threads=args.threads) for g in range(G)]
    build = time.perf_counter() - t0
    host_graphs = kc.graph_set(idx, capacity=n)
    host_state = kc.insert_state(idx, capacity=n)
    dense = torch.from_numpy(keys.reshape(-1, d)).cuda().half()
    q = torch.from_numpy(ood_queries(rng.standard_normal((G * args.group, d)), qdir)).cuda()
    qg = q.half().view(G, args.group, d)
    truth = torch.topk(torch.bmm(qg, dense.view(G, n, d).transpose(1, 2)).float(), args.k,
                       dim=2).indices.view(-1, args.k).cpu().numpy()
    print(f"{G} graphs x {n} keys x {d} (f16 on the GPU), built on {base}, {n - base} keys "
          f"inserted per graph; CPU build of the indexes {build:.1f} s")
    print(f"{'insert':<28} {'gpu_us/launch':>14} {'us/key':>8} {'host_us/call':>13} "
          f"{'recall@' + str(args.k):>10}")
    to_gpu = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
    widths = [int(x) for x in args.expand_widths.split(",")]
    for w in widths:  # warm-up (first-call set-up) on throwaway copies
        kc.batch_insert(host_graphs.map(to_gpu), host_state.map(to_gpu), dense, expand_width=w)
    for w in widths:
        graphs, state = host_graphs.map(to_gpu), host_state.map(to_gpu)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # The host's time per call over the first 32 calls only: later ones wait for room in
        # the launch queue, i.e. for the GPU.
        start.record()
        t = time.perf_counter()
        for _ in range(32):
            kc.batch_insert(graphs, state, dense, expand_width=w)
        host = (time.perf_counter() - t) / 32
        for _ in range(base + 32, n):
            kc.batch_insert(graphs, state, dense, expand_width=w)
        end.record()
        torch.cuda.synchronize()
        assert graphs.sizes.tolist() == [n] * G
        launch = start.elapsed_time(end) * 1e3 / (n - base)
        r = kc.decode_search(graphs, q, dense, k=args.k, L=args.L, expand_width=8)
        ids = r.ids.cpu().numpy()
        print(f"{'GPU batch_insert w=' + str(w):<28} {launch:14.1f} {launch / G:8.1f} "
              f"{host * 1e6:13.1f} {recall(ids, truth):10.4f} (graph 0: "
              f"{recall(ids[: args.group], truth[: args.group]):.4f})")
    # The CPU insert of graph 0's keys, one thread (the calling one), and its graph's recall.
    t = time.perf_counter()
    idx[0].insert(keys[0, base:])
    cpu_us = (time.perf_counter() - t) / (n - base) * 1e6
    cpu_ids = np.asarray(idx[0].search(q[: args.group].cpu().numpy(), args.k, L=args.L).ids)
    gpu0 = kc.decode_search(kc.graph_set(idx[:1]).map(to_gpu), q[: args.group], dense[:n],
                            k=args.k, L=args.L, expand_width=8)
    print(f"{'CPU insert (graph 0)':<28} {'':>14} {cpu_us:8.1f} {'':>13} {'':>10} (graph 0: "
          f"{recall(gpu0.ids.cpu().numpy(), truth[: args.group]):.4f}; CPU search "
          f"{recall(cpu_ids, truth[: args.group]):.4f})")


if __name__ == "__main__":
    main()
