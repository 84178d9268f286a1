"""kvsift.cuda.decode_search from Python against what a PyTorch user writes instead: the exact
top-k by a batched matmul and torch.topk over the same f16 keys, on the same GPU in one run.

Synthetic out-of-distribution data (keys and queries from different Gaussians, as attention
keys and queries are), one RoarGraph index per graph built on the CPU from training queries of
the queries' distribution. Reports, per pool L: GPU time per call (CUDA events over `--reps`
back-to-back calls), host time per call (the Python enqueue), recall@k against the exact
top-k, and the same for torch's matmul + topk.

    python3 bench/python/cuda_decode_search.py [--graphs 4] [--n 32768] [--group 8]
"""

import argparse
import time

import numpy as np
import torch

import kvsift
import kvsift.cuda as kc
from gpu_timing import per_call_us
from ood_data import ood_keys, ood_queries


def data(args, rng):
    d = args.dim
    shift = rng.standard_normal(d).astype(np.float32)
    keys = ood_keys(rng.standard_normal((args.graphs, args.n, d)), shift)
    qdir = rng.standard_normal(d).astype(np.float32)

    def queries(count):
        return ood_queries(rng.standard_normal((count, d)), qdir)

    return keys.astype(np.float16).astype(np.float32), queries


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=int, default=4)
    ap.add_argument("--n", type=int, default=32768)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--group", type=int, default=8, help="queries per graph (GQA group x batch)")
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--L", default="100,128,192,256")
    ap.add_argument("--expand-width", type=int, default=4)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    keys, queries = data(args, rng)
    t0 = time.perf_counter()
    idx = [kvsift.RoarGraphIndex(keys[g], queries(args.n // 10), threads=args.threads)
           for g in range(args.graphs)]
    build = time.perf_counter() - t0
    gs = kc.graph_set(idx)
    graphs = kc.GraphSet(*(torch.from_numpy(a).cuda() for a in gs[:3]), gs.max_keys)
    kd = torch.from_numpy(keys.reshape(-1, args.dim)).cuda().half()
    q = torch.from_numpy(queries(args.graphs * args.group)).cuda()
    m = q.shape[0]
    print(f"{args.graphs} graphs x {args.n} keys x {args.dim} (f16), {m} queries, k {args.k}; "
          f"CPU build of the indexes {build:.1f} s")
    # The peer: exact scores of every key by one batched matmul, then torch.topk.
    kg = kd.view(args.graphs, args.n, args.dim)
    qg = q.half().view(args.graphs, args.group, args.dim)

    def exact():
        return torch.topk(torch.bmm(qg, kg.transpose(1, 2)).float(), args.k, dim=2)

    truth = exact().indices.view(m, args.k).cpu().numpy()
    t_exact, h_exact = per_call_us(exact, args.reps)
    print(f"{'method':<32} {'recall':>7} {'scored':>8} {'gpu_us':>9} {'host_us':>9}")
    print(f"{'torch bmm + topk (exact)':<32} {1.0:7.4f} {1.0:8.4f} {t_exact:9.1f} {h_exact:9.1f}")
    for L in (int(x) for x in args.L.split(",")):
        def search():
            return kc.decode_search(graphs, q, kd, k=args.k, L=L,
                                    expand_width=args.expand_width)

        r = search()
        ids = r.ids.cpu().numpy()
        rec = np.mean([len(np.intersect1d(ids[i], truth[i])) / args.k for i in range(m)])
        scored = r.scored.double().mean().item() / args.n
        t, h = per_call_us(search, args.reps)
        name = f"kvsift decode_search L={L} w={args.expand_width}"
        print(f"{name:<32} {rec:7.4f} {scored:8.4f} {t:9.1f} {h:9.1f}")


if __name__ == "__main__":
    main()
