"""One graph walk per GQA group against one walk per query head, through the Python API
(``kvsift.search_heads(..., shared_walk=True)`` against the default), on a real dump in
bench/data/dump_qk.py's layout (``L<l>_k0.fbin``, ``L<l>_q<h>.fbin``; one KV head).

The index: one GQA-shared RoarGraphIndex over the layer's keys, trained on every query head's
queries at every ``--stride``-th position before the last 1000. Evaluated: every 4th of the
last 1000 positions, all query heads at once (one ``search_heads`` call per position), against
the exact top-100 over all keys (``FlatIndex``). Printed per setting: recall@100 (mean over
heads and positions), key rows scored per query (a shared walk's distinct keys / H; a walk per
head: its own), and the time per position for all heads (one thread, the call's overhead
included; ratios within one run only). docs/algorithms.md, "One walk per GQA group", has the
C++ measurement (bench/tools/gqa_walk_probe.cpp) this repeats through the binding.

    python3 bench/python/shared_walk.py DIR LAYER [--stride 10] [--L 100,150,200]
        [--E 40,60,80] [--json out.json]
"""

import argparse
import json
import os
import sys
import time

import numpy as np

import kvsift as ks

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "eval"))
from datasets import read_fbin  # noqa: E402

HELD_OUT, EVERY, K = 1000, 4, 100


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("layer")
    ap.add_argument("--stride", type=int, default=10)
    ap.add_argument("--L", default="100,150,200", help="pools of the walk per head")
    ap.add_argument("--E", default="40,60,80", help="expand limits of the shared walk, L 100")
    ap.add_argument("--json")
    args = ap.parse_args()
    def path(name):
        return os.path.join(args.dir, f"L{args.layer}_{name}.fbin")

    keys = read_fbin(path("k0"))
    heads = []
    while os.path.exists(path(f"q{len(heads)}")):
        heads.append(read_fbin(path(f"q{len(heads)}")))
    n, H = keys.shape[0], len(heads)
    if H == 0 or n <= HELD_OUT or args.stride < 1:
        sys.exit(f"expected query heads, more than {HELD_OUT} keys and --stride >= 1")
    train = np.concatenate([q[:n - HELD_OUT:args.stride] for q in heads])
    t0 = time.perf_counter()
    index = ks.RoarGraphIndex(keys, train, threads=0)
    build_s = time.perf_counter() - t0
    positions = range(n - HELD_OUT, n, EVERY)
    queries = [np.ascontiguousarray(np.stack([q[p] for q in heads])) for p in positions]
    flat = ks.FlatIndex(keys)
    exact = [flat.topk(q, K, threads=0).ids for q in queries]
    print(f"L{args.layer}: {n} keys x {keys.shape[1]}, {H} query heads, {train.shape[0]} "
          f"training queries, build {build_s:.1f} s; {len(queries)} positions x {H} heads")
    print(f"{'walk':<10} {'L':>4} {'E':>4} {'recall@100':>10} {'keys/query':>10} "
          f"{'% keys':>7} {'us/position':>12}")

    rows = []

    def measure(shared, L, E):
        hit, scored, secs = 0, 0, 0.0
        for q, want in zip(queries, exact):
            t = time.perf_counter()
            r = ks.search_heads([index], q, K, L=L, threads=1, shared_walk=shared,
                                expand_limit=E)
            secs += time.perf_counter() - t
            hit += sum(len(np.intersect1d(r.ids[h], want[h])) for h in range(H))
            # A shared walk reports its group's keys on every head: count them once.
            scored += r.distance_computations[0] if shared else r.distance_computations.sum()
        row = {"walk": "group" if shared else "per head", "L": L, "E": E,
               "recall_at_100": hit / (len(queries) * H * K),
               "keys_per_query": scored / (len(queries) * H),
               "us_per_position": 1e6 * secs / len(queries)}
        row["keys_fraction"] = row["keys_per_query"] / n
        rows.append(row)
        print(f"{row['walk']:<10} {L:>4} {E:>4} {row['recall_at_100']:>10.4f} "
              f"{row['keys_per_query']:>10.0f} {100 * row['keys_fraction']:>6.2f}% "
              f"{row['us_per_position']:>12.0f}")

    for L in (int(x) for x in args.L.split(",")):
        measure(False, L, 0)
    measure(True, 100, 0)
    for E in (int(x) for x in args.E.split(",")):
        measure(True, 100, E)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"layer": args.layer, "keys": n, "heads": H, "build_s": build_s,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
