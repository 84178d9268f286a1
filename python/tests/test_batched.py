"""Batched decode-step APIs: every query head in one call (GQA mapping h -> h // group) must
equal the per-head loop it replaces, bit for bit (same kernels), and reject wrong shapes."""

import numpy as np
import pytest

import kvsift as ks

H, HKV, D, N = 8, 2, 16, 600


@pytest.fixture(scope="module")
def step():
    rng = np.random.default_rng(11)
    K = rng.standard_normal((N, HKV, D)).astype(np.float32)
    V = rng.standard_normal((N, HKV, D)).astype(np.float32)
    q = rng.standard_normal((H, D)).astype(np.float32)
    train = [rng.standard_normal((200, D)).astype(np.float32) for _ in range(HKV)]
    graphs = [ks.RoarGraphIndex(K[:, g, :], train[g], nq=20, M=12, L=48) for g in range(HKV)]
    return K, V, q, graphs


def per_head(q, fn):
    outs = [fn(h, q[h], h // (H // HKV)) for h in range(H)]
    return np.stack([o for o, _ in outs]), np.array([l for _, l in outs], np.float32)


@pytest.mark.parametrize("threads", [1, 0])
def test_decode_step_equals_the_per_head_loop(step, threads):
    K, V, q, graphs = step
    r = ks.search_heads(graphs, q, 20, L=64, filter=ks.IdRange(8, N - 32), threads=threads)
    assert r.ids.shape == (H, 20) and r.ids.dtype == np.int64
    for h in range(H):
        one = graphs[h // (H // HKV)].search(q[h], 20, L=64, filter=ks.IdRange(8, N - 32))
        np.testing.assert_array_equal(r.ids[h], one.ids)
    ids = r.ids.copy()
    ids[:, -3:] = ks.INVALID_ID  # padding, as a short search returns it
    o_w, l_w = ks.dense_attention_heads(q, K, V, 0, 8, threads=threads)
    o_r, l_r = ks.sparse_attention_heads(q, K, V, ids, threads=threads)
    o, lse = ks.merge_states(o_w, l_w, o_r, l_r)
    want_w = per_head(q, lambda h, qh, g: ks.dense_attention(qh, K, V, 0, 8, kv_head=g))
    want_r = per_head(q, lambda h, qh, g: ks.sparse_attention(qh, K, V, ids[h][ids[h] != ks.INVALID_ID], kv_head=g))
    np.testing.assert_array_equal(o_w, want_w[0])
    np.testing.assert_array_equal(l_w, want_w[1])
    np.testing.assert_array_equal(o_r, want_r[0])
    np.testing.assert_array_equal(l_r, want_r[1])
    for h in range(H):
        oh, lh = ks.merge(want_w[0][h], want_w[1][h], want_r[0][h], want_r[1][h])
        np.testing.assert_array_equal(o[h], oh)
        assert lse[h] == np.float32(lh)


def test_gqa_mapping_reads_the_groups_kv_head(step):
    K, V, q, _ = step
    # Zero KV head 1: query heads 4..7 (group 1) then see all-equal logits and zero values.
    K2, V2 = K.copy(), V.copy()
    K2[:, 1], V2[:, 1] = 0, 0
    o, lse = ks.dense_attention_heads(q, K2, V2, 0, N)
    assert np.all(o[4:] == 0) and np.allclose(lse[4:], np.log(N))
    assert np.all(np.abs(o[:4]).sum(axis=1) > 0)


def test_batched_apis_reject_wrong_shapes(step):
    K, V, q, graphs = step
    with pytest.raises(ks.DimensionMismatch, match="multiple of the 2 KV heads"):
        ks.dense_attention_heads(q[:3], K, V, 0, 4)
    with pytest.raises(ks.DimensionMismatch, match="head dim 16"):
        ks.dense_attention_heads(q[:, :8], K, V, 0, 4)
    with pytest.raises(ks.DimensionMismatch, match="8 query heads x k"):
        ks.sparse_attention_heads(q, K, V, np.zeros((7, 3), np.int64))
    with pytest.raises(ks.OutOfRange, match="at \\(1, 2\\)"):
        bad = np.zeros((H, 3), np.int64)
        bad[1, 2] = -5
        ks.sparse_attention_heads(q, K, V, bad)
    with pytest.raises(ks.OutOfRange):
        ks.sparse_attention_heads(q, K, V, np.full((H, 3), N, np.int64))
    with pytest.raises(ks.InvalidArgument, match="integer array"):
        ks.sparse_attention_heads(q, K, V, np.zeros((H, 3), np.float32))
    with pytest.raises(ks.DimensionMismatch, match="multiple of the 3 indexes"):
        ks.search_heads(graphs + graphs[:1], q, 4)
    with pytest.raises(TypeError,
                       match="RoarGraphIndex, InsertableGraphIndex or FlatIndex, got int"):
        ks.search_heads([graphs[0], 3], q, 4)
    with pytest.raises(ks.DimensionMismatch, match="one shape"):
        ks.merge_states(q, np.zeros(H, np.float32), q[:4], np.zeros(4, np.float32))
    with pytest.raises(ks.DimensionMismatch, match="lse values"):
        ks.merge_states(q, np.zeros(H, np.float32), q, np.zeros(3, np.float32))
    with pytest.raises(ks.InvalidArgument):
        ks.merge_states(q, np.full(H, np.nan, np.float32), q, np.zeros(H, np.float32))
    # Empty step: zero heads give empty results.
    o, lse = ks.dense_attention_heads(q[:0], K, V, 0, 4)
    assert o.shape == (0, D) and lse.shape == (0,)


def test_shared_walk_is_one_walk_per_group(step):
    """search_heads(shared_walk=True): one gqa_beam_search per KV head for its query heads."""
    K, V, q, graphs = step
    filt = ks.IdRange(8, N - 32)
    # One query head per KV head: the shared walk is that head's beam search.
    one = ks.search_heads(graphs, q[:HKV], 20, L=64, filter=filt, shared_walk=True)
    alone = ks.search_heads(graphs, q[:HKV], 20, L=64, filter=filt)
    np.testing.assert_array_equal(one.ids, alone.ids)
    np.testing.assert_array_equal(one.distance_computations, alone.distance_computations)
    # Copies of one query in a group: each head gets that query's beam search, walked once.
    g = H // HKV
    copies = np.repeat(q[::g], g, axis=0)
    r = ks.search_heads(graphs, copies, 20, L=64, filter=filt, shared_walk=True, threads=0)
    for h in range(H):
        want = graphs[h // g].search(copies[h], 20, L=64, filter=filt)
        np.testing.assert_array_equal(r.ids[h], want.ids)
        assert r.distance_computations[h] == want.distance_computations
    # Distinct heads: valid answers (true scores, best first, inside the filter), every head
    # of a group reports its group's walk, and the walk scores fewer keys than a walk per head.
    s = ks.search_heads(graphs, q, 20, L=64, filter=filt, shared_walk=True, expand_limit=40)
    p = ks.search_heads(graphs, q, 20, L=64, filter=filt, expand_limit=40)
    for h in range(H):
        ids = s.ids[h]
        assert np.all((ids >= 8) & (ids < N - 32)) and len(set(ids.tolist())) == 20
        np.testing.assert_allclose(s.scores[h], K[ids, h // g, :] @ q[h], rtol=1e-5, atol=1e-5)
        assert np.all(np.diff(s.scores[h]) <= 0)
    for kv in range(HKV):
        assert np.all(s.distance_computations[kv * g:(kv + 1) * g] == s.distance_computations[kv * g])
        assert s.distance_computations[kv * g] < p.distance_computations[kv * g:(kv + 1) * g].sum()
    # A head whose query holds NaN returns nothing; the group's other heads still search.
    bad = q.copy()
    bad[1, 3] = np.nan
    n = ks.search_heads(graphs, bad, 20, L=64, shared_walk=True)
    assert np.all(n.ids[1] == ks.INVALID_ID) and np.all(n.ids[0] != ks.INVALID_ID)


def test_shared_walk_rejects_bad_input(step):
    K, V, q, graphs = step
    flat = [ks.FlatIndex(K[:, kv, :]) for kv in range(HKV)]
    with pytest.raises(ks.InvalidArgument, match="shared_walk needs graph indexes"):
        ks.search_heads(flat, q, 4, shared_walk=True)
    with pytest.raises(ks.InvalidArgument, match="expand_limit"):
        ks.search_heads(graphs, q, 4, L=8, expand_limit=9, shared_walk=True)
    with pytest.raises(ks.InvalidArgument, match="L"):
        ks.search_heads(graphs, q, 40, L=8, shared_walk=True)
    with pytest.raises(ks.DimensionMismatch, match="multiple of the 2 indexes"):
        ks.search_heads(graphs, q[:3], 4, shared_walk=True)


def test_search_heads_entries_warm_start(step):
    """search_heads(entries=...): extra entry points per query head, as RoarGraphIndex.search's
    entries; a shared walk starts from the union of its group's rows; INVALID_ID is padding."""
    K, V, q, graphs = step
    g = H // HKV
    rng = np.random.default_rng(5)
    E = rng.integers(0, N, size=(H, 6)).astype(np.int64)
    E[:, -2:] = ks.INVALID_ID
    r = ks.search_heads(graphs, q, 20, L=32, entries=E, expand_limit=24)
    for h in range(H):
        want = graphs[h // g].search(q[h], 20, L=32, entries=E[h, :4], expand_limit=24)
        np.testing.assert_array_equal(r.ids[h], want.ids)
        assert r.distance_computations[h] == want.distance_computations
    # All padding is the cold search.
    cold = ks.search_heads(graphs, q, 20, L=32)
    pad = ks.search_heads(graphs, q, 20, L=32, entries=np.full((H, 3), ks.INVALID_ID, np.int64))
    np.testing.assert_array_equal(pad.ids, cold.ids)
    # Copies of one query in a group, entries on two of its heads: the shared walk is that
    # query's search from both rows' entries.
    copies = np.repeat(q[::g], g, axis=0)
    E2 = np.full((H, 4), ks.INVALID_ID, np.int64)
    E2[::g] = rng.integers(0, N, size=(HKV, 4))
    E2[1::g, :2] = rng.integers(0, N, size=(HKV, 2))
    s = ks.search_heads(graphs, copies, 20, L=32, entries=E2, shared_walk=True)
    for h in range(H):
        first = h - h % g
        union = np.concatenate([E2[first], E2[first + 1, :2]])
        want = graphs[h // g].search(copies[h], 20, L=32, entries=union)
        np.testing.assert_array_equal(s.ids[h], want.ids)
        assert s.distance_computations[h] == want.distance_computations
    # Seeded with the exact answer, one expansion keeps it: recall 1, fewer keys scored.
    exact = np.stack([ks.FlatIndex(np.ascontiguousarray(K[:, h // g, :])).topk(q[h], 20).ids
                      for h in range(H)])
    for shared in (False, True):
        cold = ks.search_heads(graphs, q, 20, L=20, shared_walk=shared)
        warm = ks.search_heads(graphs, q, 20, L=20, entries=exact, expand_limit=1,
                               shared_walk=shared)
        np.testing.assert_array_equal(warm.ids, exact)
        assert warm.distance_computations.sum() < cold.distance_computations.sum()


def test_search_heads_entries_reject_bad_input(step):
    K, V, q, graphs = step
    ok = np.zeros((H, 2), np.int64)
    flat = [ks.FlatIndex(K[:, kv, :]) for kv in range(HKV)]
    with pytest.raises(ks.DimensionMismatch, match="entries: expected a 2-D array \\(8 query heads"):
        ks.search_heads(graphs, q, 4, entries=ok[:5])
    with pytest.raises(ks.DimensionMismatch, match="entries"):
        ks.search_heads(graphs, q, 4, entries=ok[:, 0].copy())
    bad = ok.copy()
    bad[6, 1] = N
    with pytest.raises(ks.OutOfRange, match=f"expected ids < {N} \\(the size of query head 6"):
        ks.search_heads(graphs, q, 4, entries=bad, shared_walk=True)
    bad[6, 1] = -1
    with pytest.raises(ks.OutOfRange, match="at \\(6, 1\\)"):
        ks.search_heads(graphs, q, 4, entries=bad)
    with pytest.raises(ks.InvalidArgument, match="integer array"):
        ks.search_heads(graphs, q, 4, entries=ok.astype(np.float32))
    with pytest.raises(ks.InvalidArgument, match="entries need graph indexes"):
        ks.search_heads(flat, q, 4, entries=ok)
    # Empty rows (no entries at all) are the cold search.
    e = ks.search_heads(graphs, q, 4, entries=np.zeros((H, 0), np.int64))
    np.testing.assert_array_equal(e.ids, ks.search_heads(graphs, q, 4).ids)
