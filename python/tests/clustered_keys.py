"""Shared data of the search-knob tests (test_degree_cap.py, test_expand_limit.py): clustered
keys the graph must route over (a pool of 40 sees under a tenth of them), queries near them, a
RoarGraph built from the first 500 queries, and the exact top-k of the rest."""

import numpy as np

import kvsift as ks

N, D, K = 6000, 32, 10


def clustered_case(seed, queries):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((24, D)).astype(np.float32) * 2.0
    keys = centers[rng.integers(0, 24, N)] + rng.standard_normal((N, D)).astype(np.float32)
    keys = np.ascontiguousarray(keys, dtype=np.float32)
    q = keys[rng.integers(0, N, queries)] * 0.5 + rng.standard_normal((queries, D)).astype(
        np.float32
    )
    q = np.ascontiguousarray(q, dtype=np.float32)
    graph = ks.RoarGraphIndex(keys, q[:500], nq=20, M=32, L=100, threads=2)
    test = q[500:]
    exact = ks.FlatIndex(keys).topk(test, K).ids
    return keys, graph, test, exact
