"""dipr_heads: DIPR for every query head of a decode step in one call must equal the per-head
loop of RoarGraphIndex.dipr id for id (GQA mapping h // (H // KV), per-head seeds, entries,
filter, degree_cap), pad with INVALID_ID / -inf past each head's count, and reject bad input
before any search."""

import numpy as np
import pytest

import kvsift as ks

N, D, KV, H = 1500, 16, 2, 6


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(5)
    keys = [np.ascontiguousarray(rng.standard_normal((N, D)), dtype=np.float32) for _ in range(KV)]
    train = [np.ascontiguousarray(rng.standard_normal((400, D)), dtype=np.float32) for _ in range(KV)]
    graphs = [ks.RoarGraphIndex(k, t, nq=20, M=16, L=60, threads=1) for k, t in zip(keys, train)]
    q = np.ascontiguousarray(rng.standard_normal((H, D)) * 2.0, dtype=np.float32)
    return keys, graphs, q


def loop(graphs, q, beta, seeds=None, **kw):
    group = q.shape[0] // len(graphs)
    return [
        graphs[h // group].dipr(
            q[h], beta, seed_score=None if seeds is None else float(seeds[h]), **kw
        )
        for h in range(q.shape[0])
    ]


@pytest.mark.parametrize("threads", [1, 3])
def test_equals_the_per_head_loop(setup, threads):
    keys, graphs, q = setup
    # Seeds above some heads' true best (+2) shrink those heads' results: a seed that is
    # ignored, or given to the wrong head, changes the answer.
    group = H // KV
    best = np.array([ks.FlatIndex(keys[h // group]).topk(q[h], 1).scores[0] for h in range(H)])
    seeds = (best + np.array([0, 2, 0, 2, 0, 2])).astype(np.float32)
    window = np.array([0, 1, 2, N - 2, N - 1], dtype=np.int64)
    for kw in (
        {},
        {"entries": window},
        {"filter": ks.IdBelow(1200)},
        {"degree_cap": 8},
    ):
        for s in (None, seeds):
            if s is not None and not kw:
                unseeded = loop(graphs, q, 3.0)
                assert any(len(a.ids) != len(b.ids) for a, b in zip(loop(graphs, q, 3.0, s), unseeded))
            got = ks.dipr_heads(graphs, q, 3.0, seed_scores=s, threads=threads, **kw)
            want = loop(graphs, q, 3.0, s, **kw)
            width = max(1, max(len(w.ids) for w in want))
            assert got.ids.shape == (H, width) and got.scores.shape == (H, width)
            for h, w in enumerate(want):
                c = len(w.ids)
                assert got.counts[h] == c
                np.testing.assert_array_equal(got.ids[h, :c], w.ids)
                np.testing.assert_array_equal(got.scores[h, :c], w.scores)
                assert (got.ids[h, c:] == ks.INVALID_ID).all()
                assert np.isneginf(got.scores[h, c:]).all()
                assert got.best_scores[h] == w.best_score
                assert bool(got.capped[h]) == w.capped
                assert got.distance_computations[h] == w.distance_computations


def test_heads_of_a_group_share_their_kv_head(setup):
    # Swapping the two KV heads' graphs must change the heads that use them: a mapping h % KV
    # instead of h // group would pass the loop test only by accident of symmetric data.
    _, graphs, q = setup
    a = ks.dipr_heads(graphs, q, 3.0)
    b = ks.dipr_heads(graphs[::-1], q, 3.0)
    assert any(
        not np.array_equal(a.ids[h, : a.counts[h]], b.ids[h, : b.counts[h]]) for h in range(H)
    )


def test_feeds_sparse_attention_heads(setup):
    keys, graphs, q = setup
    # One K/V array per KV head stacked as (n, KV, d): the layout sparse_attention_heads takes.
    K = np.ascontiguousarray(np.stack(keys, axis=1))
    V = np.ascontiguousarray(np.stack(keys[::-1], axis=1))
    r = ks.dipr_heads(graphs, q, 2.0)
    o, lse = ks.sparse_attention_heads(q, K, V, r.ids)
    assert o.shape == (H, D) and np.isfinite(o).all() and np.isfinite(lse).all()


def test_bad_input(setup):
    _, graphs, q = setup
    with pytest.raises(ks.DimensionMismatch, match="multiple of the 2"):
        ks.dipr_heads(graphs, q[:5], 1.0)
    with pytest.raises(ks.DimensionMismatch):
        ks.dipr_heads(graphs, q[0], 1.0)
    with pytest.raises(ks.DimensionMismatch, match="seed_scores"):
        ks.dipr_heads(graphs, q, 1.0, seed_scores=np.zeros(H - 1, np.float32))
    with pytest.raises(TypeError, match="RoarGraphIndex"):
        ks.dipr_heads([graphs[0], ks.FlatIndex(setup[0][0])], q, 1.0)
    with pytest.raises(ks.DimensionMismatch):
        ks.dipr_heads([], q, 1.0)
    # A NaN query head behaves as RoarGraphIndex.dipr does (every score NaN ranks last, so
    # nothing is within beta): that head comes back empty, the others unchanged.
    bad = q.copy()
    bad[2, 3] = np.nan
    got, ok = ks.dipr_heads(graphs, bad, 1.0), ks.dipr_heads(graphs, q, 1.0)
    assert got.counts[2] == 0 and (got.ids[2] == ks.INVALID_ID).all()
    for h in (0, 1, 3, 4, 5):
        np.testing.assert_array_equal(got.ids[h, : got.counts[h]], ok.ids[h, : ok.counts[h]])
    with pytest.raises(ks.InvalidArgument):
        ks.dipr_heads(graphs, q, float("nan"))
    with pytest.raises((ks.InvalidArgument, ks.OutOfRange)):
        ks.dipr_heads(graphs, q, 1.0, entries=np.array([N + 5], dtype=np.int64))
    with pytest.raises(ks.InvalidArgument):
        ks.dipr_heads(graphs, q.astype(np.float64), 1.0)
