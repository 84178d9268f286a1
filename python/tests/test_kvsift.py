"""Tests of the kvsift Python module: results against exact numpy oracles, zero-copy views,
and the errors raised for bad input."""

import gc
import math

import numpy as np
import pytest

import kvsift as ks

N, D = 1500, 32


def clustered(rng, n, d, centers=24):
    """Keys around a few directions, queries near them: the peaked, out-of-distribution
    query/key geometry of attention, small enough for CI."""
    c = rng.standard_normal((centers, d)).astype(np.float32) * 2.0
    keys = c[rng.integers(0, centers, n)] + rng.standard_normal((n, d)).astype(np.float32)
    return np.ascontiguousarray(keys, dtype=np.float32)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    keys = clustered(rng, N, D)
    queries = keys[rng.integers(0, N, 400)] * 0.5 + rng.standard_normal((400, D)).astype(np.float32)
    return keys, np.ascontiguousarray(queries, dtype=np.float32)


@pytest.fixture(scope="module")
def graph(data):
    keys, queries = data
    return ks.RoarGraphIndex(keys, queries[:300], nq=20, M=16, L=64, threads=2)


def oracle_topk(keys, q, k, allowed=None):
    """Exact top-k by inner product with numpy (ties: lower id first)."""
    s = keys.astype(np.float64) @ q.astype(np.float64)
    ids = np.arange(len(keys)) if allowed is None else np.asarray(allowed)
    order = np.lexsort((ids, -s[ids]))[:k]
    return ids[order]


def recall(found, exact):
    return len(set(found.tolist()) & set(exact.tolist())) / len(exact)


def softmax_attention(q, keys, values, scale):
    s = scale * (keys.astype(np.float64) @ q.astype(np.float64))
    m = s.max()
    p = np.exp(s - m)
    return (p @ values.astype(np.float64)) / p.sum(), m + math.log(p.sum())


# ------------------------------------------------------------------------- search vs oracle


def test_flat_topk_matches_numpy_oracle(data):
    keys, queries = data
    flat = ks.FlatIndex(keys)
    assert (flat.size, flat.dim) == (N, D)
    res = flat.topk(queries[:20], 10)
    assert res.ids.shape == (20, 10) and res.scores.shape == (20, 10)
    for i in range(20):
        assert res.ids[i].tolist() == oracle_topk(keys, queries[i], 10).tolist()
        np.testing.assert_allclose(res.scores[i], keys[res.ids[i]] @ queries[i], rtol=1e-5, atol=1e-4)
    assert (res.distance_computations == N).all()


def test_single_query_gives_1d_result(data):
    keys, queries = data
    res = ks.FlatIndex(keys).topk(queries[0], 5)
    assert res.ids.shape == (5,) and res.distance_computations.shape == (1,)


def test_roargraph_recall_against_oracle(data, graph):
    keys, queries = data
    held_out = queries[300:]
    res = graph.search(held_out, 10, L=64)
    r = np.mean([recall(res.ids[i], oracle_topk(keys, q, 10)) for i, q in enumerate(held_out)])
    assert r >= 0.9, f"recall@10 {r:.3f}"
    # The graph must scan a fraction of the keys, or it is a slow flat index.
    assert res.distance_computations.mean() < 0.6 * N
    assert graph.max_degree == 32 and 0 <= graph.entry_point < N
    assert graph.build_stats.total_seconds > 0


def test_filtered_search_returns_only_passing_ids(data, graph):
    keys, queries = data
    q = queries[350]
    below = graph.search(q, 10, L=100, filter=ks.IdBelow(500))
    assert (below.ids < 500).all()
    assert recall(below.ids, oracle_topk(keys, q, 10, allowed=range(500))) >= 0.8
    flat = ks.FlatIndex(keys).topk(q, 10, filter=ks.IdRange(200, 900))
    assert flat.ids.tolist() == oracle_topk(keys, q, 10, allowed=range(200, 900)).tolist()


def test_dipr_matches_exact_range(data, graph):
    keys, queries = data
    flat = ks.FlatIndex(keys)
    recalls = []
    for q in queries[300:340]:
        s = keys @ q
        exact = np.flatnonzero(s >= s.max() - 3.0)
        fr = flat.dipr(q, 3.0)
        assert sorted(fr.ids.tolist()) == sorted(exact.tolist())
        assert fr.best_score == pytest.approx(s.max(), rel=1e-5)
        gr = graph.dipr(q, 3.0, l0=64)
        assert set(gr.ids.tolist()) <= set(exact.tolist()) | set(np.flatnonzero(s >= gr.best_score - 3.0))
        recalls.append(recall(gr.ids, exact))
    assert np.mean(recalls) >= 0.9


def test_dipr_max_hops_stops_the_walk_and_marks_it_capped(data, graph):
    # A cap at the search's own hops changes nothing; half of them stops it there, capped.
    keys, queries = data
    cut = 0
    for q in queries[300:320]:
        free = graph.dipr(q, 3.0, l0=32)
        assert not free.capped
        same = graph.dipr(q, 3.0, l0=32, max_hops=free.hops)
        assert not same.capped and same.ids.tolist() == free.ids.tolist()
        if free.hops < 2:
            continue
        half = graph.dipr(q, 3.0, l0=32, max_hops=free.hops // 2)
        assert half.capped and half.hops == free.hops // 2
        cut += 1
    assert cut >= 10
    with pytest.raises((TypeError, ValueError, OverflowError)):
        graph.dipr(queries[0], 3.0, max_hops=-1)


def test_dipr_seed_score_narrows_the_range(data):
    keys, queries = data
    q = queries[0]
    best = float((keys @ q).max())
    seeded = ks.FlatIndex(keys).dipr(q, 1.0, seed_score=best + 10.0)
    assert len(seeded.ids) == 0  # nothing within 1 of a score 10 above the best key


def test_float16_keys_zero_copy(data):
    keys, queries = data
    k16 = keys.astype(np.float16)
    res = ks.FlatIndex(k16).topk(queries[0], 10)
    assert res.ids.tolist() == oracle_topk(k16.astype(np.float32), queries[0], 10).tolist()
    g16 = ks.RoarGraphIndex(k16, queries[:300], nq=20, M=16, L=64)
    assert g16.dtype == np.float16
    exact = oracle_topk(k16.astype(np.float32), queries[350], 10)
    assert recall(g16.search(queries[350], 10).ids, exact) >= 0.7


def test_strided_head_slice_is_borrowed_not_copied(data):
    keys, _ = data
    cache = np.zeros((N, 3, D), dtype=np.float32)  # [token][kv head][dim], like a KV cache
    cache[:, 1, :] = keys
    flat = ks.FlatIndex(cache[:, 1, :])  # strided view: accepted without a copy
    q = keys[5]
    before = flat.topk(q, 1).ids[0]
    cache[77, 1, :] = q * 100.0  # the index reads the caller's memory
    assert flat.topk(q, 1).ids[0] == 77 != before


def test_index_keeps_its_keys_alive(data):
    keys, queries = data
    k = keys.copy()
    flat = ks.FlatIndex(k)
    expected = flat.topk(queries[0], 3).ids.tolist()
    del k
    gc.collect()
    assert flat.topk(queries[0], 3).ids.tolist() == expected


# ------------------------------------------------------------------------------ attention


def test_sparse_and_dense_attention_match_numpy(data):
    keys, queries = data
    rng = np.random.default_rng(1)
    values = rng.standard_normal((N, D)).astype(np.float32)
    q = queries[3]
    tokens = rng.choice(N, 200, replace=False)
    o, lse = ks.sparse_attention(q, keys, values, tokens, scale=0.3)
    o_ref, lse_ref = softmax_attention(q, keys[tokens], values[tokens], 0.3)
    np.testing.assert_allclose(o, o_ref, rtol=1e-4, atol=1e-5)
    assert lse == pytest.approx(lse_ref, rel=1e-5)
    o, lse = ks.dense_attention(q, keys, values, 100, 700)
    o_ref, lse_ref = softmax_attention(q, keys[100:700], values[100:700], 1 / math.sqrt(D))
    np.testing.assert_allclose(o, o_ref, rtol=1e-4, atol=1e-5)
    assert lse == pytest.approx(lse_ref, rel=1e-5)


def test_window_plus_rest_merges_to_full_attention(data):
    keys, queries = data
    values = np.ascontiguousarray(keys[::-1])
    q = queries[9]
    full = ks.dense_attention(q, keys, values, 0, N)
    a = ks.dense_attention(q, keys, values, 0, 128)
    b = ks.dense_attention(q, keys, values, N - 512, N)
    c = ks.sparse_attention(q, keys, values, np.arange(128, N - 512))
    o, lse = ks.merge(*ks.merge(*a, *b), *c)
    np.testing.assert_allclose(o, full[0], rtol=1e-4, atol=1e-5)
    assert lse == pytest.approx(full[1], rel=1e-5)
    o_n, lse_n = ks.merge_n(np.stack([a[0], b[0], c[0]]), np.array([a[1], b[1], c[1]], np.float32))
    np.testing.assert_allclose(o_n, full[0], rtol=1e-4, atol=1e-5)
    assert lse_n == pytest.approx(full[1], rel=1e-5)


def test_gqa_cache_layout_and_float16():
    rng = np.random.default_rng(2)
    n, h, d = 300, 3, 16
    k = rng.standard_normal((n, h, d)).astype(np.float32)
    v = rng.standard_normal((n, h, d)).astype(np.float32)
    q = rng.standard_normal(d).astype(np.float32)
    for g in range(h):
        o, lse = ks.dense_attention(q, k, v, 0, n, kv_head=g)
        o_ref, lse_ref = softmax_attention(q, k[:, g], v[:, g], 1 / math.sqrt(d))
        np.testing.assert_allclose(o, o_ref, rtol=1e-4, atol=1e-5)
    o16, _ = ks.dense_attention(q, k.astype(np.float16), v.astype(np.float16), 0, n, kv_head=1)
    o_ref, _ = softmax_attention(q, k[:, 1].astype(np.float16), v[:, 1].astype(np.float16), 1 / math.sqrt(d))
    np.testing.assert_allclose(o16, o_ref, rtol=1e-3, atol=1e-3)


def test_empty_token_set_is_the_empty_state(data):
    keys, queries = data
    o, lse = ks.sparse_attention(queries[0], keys, keys, np.array([], dtype=np.int64))
    assert lse == -math.inf and not o.any()
    o2, lse2 = ks.merge(o, lse, *ks.dense_attention(queries[0], keys, keys, 0, 10))
    assert math.isfinite(lse2) and np.isfinite(o2).all()


def test_sample_gqa_queries(data):
    _, queries = data
    s = ks.sample_gqa_queries([queries[:100], queries[100:300]], 0.25)
    assert s.shape == (25 + 50, D)
    rows = {r.tobytes() for r in queries[:300]}
    assert all(r.tobytes() in rows for r in s)


# ------------------------------------------------------------------------------ bad input


def test_wrong_dtype_shape_and_order_raise(data):
    keys, queries = data
    with pytest.raises(ks.InvalidArgument, match="float32, float16 or bfloat16, got float64"):
        ks.FlatIndex(keys.astype(np.float64))
    with pytest.raises(ks.DimensionMismatch, match="2-D"):
        ks.FlatIndex(keys.ravel())
    with pytest.raises(ks.InvalidArgument, match="contiguous rows"):
        ks.FlatIndex(np.asfortranarray(keys))
    with pytest.raises(ks.InvalidArgument, match="numpy.ndarray"):
        ks.FlatIndex([[1.0, 2.0]])
    with pytest.raises(ValueError, match="float32"):
        ks.FlatIndex(keys).topk(queries[0].astype(np.float64), 3)
    with pytest.raises(ks.DimensionMismatch, match="1-D .* or 2-D"):
        ks.FlatIndex(keys).topk(queries[None, None, 0], 3)


def test_index_for_another_head_dim_raises(data, graph):
    keys, queries = data
    q64 = np.ones(64, dtype=np.float32)
    with pytest.raises(ks.DimensionMismatch, match="expected query dimension 32, got 64"):
        graph.search(q64, 5)
    with pytest.raises(ks.DimensionMismatch, match="32, got 64"):
        graph.dipr(q64, 1.0)
    with pytest.raises(ks.DimensionMismatch):
        ks.RoarGraphIndex(keys, np.ones((10, 64), dtype=np.float32))
    with pytest.raises(ks.DimensionMismatch):
        ks.sparse_attention(q64, keys, keys, np.arange(3))


def test_nan_inf_and_empty_input_raise(data):
    keys, queries = data
    bad = keys.copy()
    bad[17, 3] = np.nan
    with pytest.raises(ks.NonFiniteValue, match="row 17, column 3"):
        ks.RoarGraphIndex(bad, queries[:50], nq=10, M=8, L=16)
    tq = queries[:50].copy()
    tq[2, 0] = np.inf
    with pytest.raises(ks.NonFiniteValue):
        ks.RoarGraphIndex(keys, tq, nq=10, M=8, L=16)
    with pytest.raises(ks.InvalidArgument, match="non-empty key set"):
        ks.RoarGraphIndex(np.zeros((0, D), np.float32), queries[:5], nq=10, M=8, L=16)
    q = queries[0].copy()
    q[0] = np.nan
    with pytest.raises(ks.NonFiniteValue, match="finite query"):
        ks.dense_attention(q, keys, keys, 0, 10)
    with pytest.raises(ks.NonFiniteValue):
        ks.merge(queries[0], math.nan, queries[1], 0.0)


def test_out_of_range_and_bad_parameters_raise(data, graph):
    keys, queries = data
    flat = ks.FlatIndex(keys)
    with pytest.raises(ks.OutOfRange, match=f"expected token ids < {N}, got {N}"):
        ks.sparse_attention(queries[0], keys, keys, np.array([0, N]))
    with pytest.raises(ks.OutOfRange, match="got -1"):
        ks.sparse_attention(queries[0], keys, keys, np.array([-1]))
    with pytest.raises(ks.OutOfRange):
        ks.dense_attention(queries[0], keys, keys, 10, N + 1)
    with pytest.raises(ks.OutOfRange, match="kv_head"):
        ks.dense_attention(queries[0], keys, keys, 0, 5, kv_head=1)
    with pytest.raises(ks.OutOfRange, match="prefix_len"):
        flat.topk(queries[0], 3, filter=ks.IdBelow(N + 1))
    with pytest.raises(ks.OutOfRange):
        graph.search(queries[0], 3, filter=ks.IdRange(5, 5))
    with pytest.raises(ks.OutOfRange, match="entry ids"):
        graph.search(queries[0], 3, entries=np.array([N]))
    with pytest.raises(TypeError, match="IdBelow, kvsift.IdRange, kvsift.IdMask or kvsift.IdList"):
        flat.topk(queries[0], 3, filter=lambda i: True)
    with pytest.raises(ks.InvalidArgument, match="k must be > 0"):
        flat.topk(queries[0], 0)
    with pytest.raises(ks.InvalidArgument, match="L >= k"):
        graph.search(queries[0], 10, L=5)
    with pytest.raises(ks.InvalidArgument, match="beta >= 0"):
        graph.dipr(queries[0], -1.0)
    with pytest.raises(ks.InvalidArgument, match="l0 must be > 0"):
        flat.dipr(queries[0], 1.0, l0=0)
    with pytest.raises(ks.DimensionMismatch, match="bias"):
        ks.sparse_attention(queries[0], keys, keys, np.arange(3), bias=np.zeros(2, np.float32))
    with pytest.raises(ks.InvalidArgument, match="dtype of keys"):
        ks.dense_attention(queries[0], keys, keys.astype(np.float16), 0, 3)
    with pytest.raises(ks.DimensionMismatch, match="lse values"):
        ks.merge_n(np.zeros((2, D), np.float32), np.zeros(3, np.float32))
    with pytest.raises(ks.InvalidArgument, match="ratio"):
        ks.sample_gqa_queries([queries], 0.0)
