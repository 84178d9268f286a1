"""Helper of test_isa.py, run in a subprocess (one build of the extension per process): imports
kvsift under the KVSIFT_ISA it is given, computes a decode step's searches and attention on
integer-valued data, and saves them to the .npz named by argv[1]. With argv[2], it also pickles
its first index there; with argv[3], it unpickles that file and saves the reloaded index's
search too (under the keys it pickled)."""

import pickle
import sys

import numpy as np

import kvsift as ks

H, HKV, D, N = 8, 2, 32, 1500


def data():
    # Small integers: every dot product is exact in f32 whatever the summation order or FMA
    # contraction, so searches must agree bit for bit across instruction sets; attention
    # (exp, weighted sums) agrees to rounding.
    rng = np.random.default_rng(5)
    K = rng.integers(-4, 5, (N, HKV, D)).astype(np.float32)
    V = rng.standard_normal((N, HKV, D)).astype(np.float32)
    q = rng.integers(-3, 4, (H, D)).astype(np.float32)
    train = [rng.integers(-3, 4, (300, D)).astype(np.float32) for _ in range(HKV)]
    return K, V, q, train


def main():
    K, V, q, train = data()
    graphs = [ks.RoarGraphIndex(K[:, g, :], train[g], nq=30, M=12, L=64, threads=1)
              for g in range(HKV)]
    out = {"isa": np.array(ks.isa), "width": np.array(ks._kvsift._simd_width)}
    r = ks.search_heads(graphs, q, 20, L=48, filter=ks.IdRange(4, N - 64))
    out["search_ids"], out["search_scores"] = r.ids, r.scores
    flat = ks.FlatIndex(K[:, 0, :]).topk(q, 20)
    out["flat_ids"], out["flat_scores"] = flat.ids, flat.scores
    d = ks.dipr_heads(graphs, q, 12.0)
    out["dipr_ids"], out["dipr_counts"] = d.ids, d.counts
    for name, dt in (("f32", np.float32), ("f16", np.float16)):
        Kt, Vt = K.astype(dt), V.astype(dt)
        o, lse = ks.dense_attention_heads(q, Kt, Vt, 0, 4)
        o, lse = ks.merge_states(o, lse, *ks.dense_attention_heads(q, Kt, Vt, N - 64, N))
        o2, lse2 = ks.sparse_attention_heads(q, Kt, Vt, r.ids)
        out[f"sparse_o_{name}"], out[f"sparse_lse_{name}"] = o2, lse2
        o, lse = ks.merge_states(o, lse, o2, lse2)
        out[f"step_o_{name}"], out[f"step_lse_{name}"] = o, lse
    own = graphs[0].search(q, 20, L=48)
    out["own_ids"], out["own_scores"] = own.ids, own.scores
    if len(sys.argv) > 2:
        with open(sys.argv[2], "wb") as f:
            pickle.dump(graphs[0], f)
    if len(sys.argv) > 3:
        with open(sys.argv[3], "rb") as f:
            g = pickle.load(f)
        r = g.search(q, 20, L=48)
        out["unpickled_ids"], out["unpickled_scores"] = r.ids, r.scores
    np.savez(sys.argv[1], **out)


if __name__ == "__main__":
    main()
