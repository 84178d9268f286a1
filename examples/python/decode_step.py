"""One decode step of one layer, 32 query heads over 8 KV heads (GQA), window + top-100 + merge,
on the CPU: the per-head Python loop against the batched calls that replace it.

    PYTHONPATH=build/python python3 examples/python/decode_step.py [--tokens 8192] [--reps 200]
"""

import argparse
import time

import numpy as np

import kvsift as ks


def loop_step(q, K, V, graphs, n, sink, recent, k, L, group):
    out = np.empty_like(q)
    for h in range(q.shape[0]):
        g = h // group
        o, lse = ks.dense_attention(q[h], K, V, 0, sink, kv_head=g)
        o, lse = ks.merge(o, lse, *ks.dense_attention(q[h], K, V, n - recent, n, kv_head=g))
        r = graphs[g].search(q[h], k, L=L, filter=ks.IdRange(sink, n - recent))
        ids = r.ids[r.ids != ks.INVALID_ID]
        out[h] = ks.merge(o, lse, *ks.sparse_attention(q[h], K, V, ids, kv_head=g))[0]
    return out


def batched_step(q, K, V, graphs, n, sink, recent, k, L, threads):
    o, lse = ks.dense_attention_heads(q, K, V, 0, sink, threads=threads)
    o, lse = ks.merge_states(o, lse, *ks.dense_attention_heads(q, K, V, n - recent, n,
                                                                threads=threads))
    r = ks.search_heads(graphs, q, k, L=L, filter=ks.IdRange(sink, n - recent), threads=threads)
    return ks.merge_states(o, lse, *ks.sparse_attention_heads(q, K, V, r.ids,
                                                              threads=threads))[0]


def timed(fn, reps):
    fn()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t) / reps)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=200)
    a = ap.parse_args()
    H, HKV, D, n, sink, recent, k, L = 32, 8, 64, a.tokens, 4, 64, 100, 128
    rng = np.random.default_rng(0)
    K = rng.standard_normal((n, HKV, D)).astype(np.float32)
    V = rng.standard_normal((n, HKV, D)).astype(np.float32)
    q = rng.standard_normal((H, D)).astype(np.float32)
    graphs = [ks.RoarGraphIndex(K[:, g, :], rng.standard_normal((1000, D)).astype(np.float32),
                                nq=50, M=16, L=100) for g in range(HKV)]
    ref = loop_step(q, K, V, graphs, n, sink, recent, k, L, H // HKV)
    got = batched_step(q, K, V, graphs, n, sink, recent, k, L, 1)
    assert np.array_equal(ref, got), "batched step differs from the per-head loop"
    t_loop = timed(lambda: loop_step(q, K, V, graphs, n, sink, recent, k, L, H // HKV), a.reps)
    t_b1 = timed(lambda: batched_step(q, K, V, graphs, n, sink, recent, k, L, 1), a.reps)
    t_b0 = timed(lambda: batched_step(q, K, V, graphs, n, sink, recent, k, L, 0), a.reps)
    print(f"per-head loop      {t_loop * 1e6:9.1f} us")
    print(f"batched, 1 thread  {t_b1 * 1e6:9.1f} us  ({t_loop / t_b1:.2f}x faster)")
    print(f"batched, all       {t_b0 * 1e6:9.1f} us  ({t_loop / t_b0:.2f}x faster)")


if __name__ == "__main__":
    main()
