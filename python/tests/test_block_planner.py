"""Tests of the BlockIndex (Quest min/max) and Planner bindings: block bounds and searches
against exact numpy oracles, the planner's decisions against its documented cost model, and the
errors raised for bad input."""

import gc
import math

import numpy as np
import pytest

import kvsift as ks

N, D, BS = 1000, 16, 64  # 16 blocks, the last one 40 tokens long


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    centers = rng.standard_normal((16, D)).astype(np.float32) * 2.0
    # Each block's tokens lie near one center (as adjacent tokens of a text often do), so blocks
    # differ and the min/max bounds are tight enough to prune.
    keys = np.repeat(centers, BS, axis=0)[:N] + 0.3 * rng.standard_normal((N, D)).astype(np.float32)
    queries = rng.standard_normal((20, D)).astype(np.float32) * 1.5
    return np.ascontiguousarray(keys, dtype=np.float32), queries


@pytest.fixture(scope="module")
def block(data):
    return ks.BlockIndex(data[0], BS)


def block_ranges(n=N, bs=BS):
    return [(b, min(n, b + bs)) for b in range(0, n, bs)]


# ------------------------------------------------------------------------- BlockIndex vs oracle


def test_shape_and_summary_size(block):
    assert (block.size, block.dim, block.block_size, block.blocks) == (N, D, BS, 16)
    assert block.summary_bytes == 16 * 3 * D * 4
    assert block.tokens_of(0) == (0, BS)
    assert block.tokens_of(15) == (960, N)  # the last block is shorter


def test_bounds_bracket_the_best_logit_of_each_block(data, block):
    keys, queries = data
    for q in queries:
        s = keys.astype(np.float64) @ q.astype(np.float64)
        for b, (lo, hi) in enumerate(block_ranges()):
            upper, lower = block.bounds(q, b)
            blk = keys[lo:hi].astype(np.float64)
            quest = np.maximum(q * blk.max(axis=0), q * blk.min(axis=0)).sum()
            assert upper >= s[lo:hi].max() - 1e-4
            assert upper == pytest.approx(quest, rel=1e-3, abs=1e-3)  # Quest's formula
            assert lower <= s[lo:hi].max() + 1e-4
            assert lower == pytest.approx(blk.mean(axis=0) @ q, rel=1e-3, abs=1e-3)


def test_topk_returns_the_best_upper_bounds(data, block):
    _, queries = data
    for q in queries:
        r = block.topk(q, 5)
        assert len(r.blocks) == 5 and r.distance_computations == 16
        uppers = np.array([block.bounds(q, b)[0] for b in range(16)])
        np.testing.assert_allclose(r.scores, uppers[r.blocks], rtol=1e-6)
        assert np.all(np.diff(r.scores) <= 0)
        rest = np.setdiff1d(np.arange(16), r.blocks)
        assert uppers[rest].max() <= r.scores.min()


def test_block_dipr_contains_every_token_in_range(data, block):
    keys, queries = data
    beta = 6.0
    for q in queries:
        s = keys.astype(np.float64) @ q.astype(np.float64)
        r = block.dipr(q, beta)
        tokens = set(block.tokens(r.blocks).tolist())
        in_range = np.nonzero(s >= s.max() - beta)[0]
        assert set(in_range.tolist()) <= tokens
        assert len(r.blocks) < 16  # the bounds prune on this data


def test_filters_restrict_blocks_and_tokens(data, block):
    keys, queries = data
    q = queries[0]
    r = block.topk(q, 16, filter=ks.IdRange(130, 500))
    assert sorted(r.blocks.tolist()) == list(range(2, 8))  # blocks touching [130, 500)
    t = block.tokens(r.blocks, filter=ks.IdRange(130, 500))
    assert sorted(t.tolist()) == list(range(130, 500)) and t.dtype == np.int64
    r = block.dipr(q, 1e3, filter=ks.IdBelow(100))
    assert sorted(r.blocks.tolist()) == [0, 1]
    assert block.tokens(np.array([1, 0]), filter=ks.IdBelow(100)).tolist() == list(range(64, 100)) + list(range(64))


def test_keys_are_not_needed_after_the_build(data):
    keys = data[0].copy()
    b = ks.BlockIndex(keys, BS)
    expected = b.topk(data[1][0], 3).blocks.copy()
    del keys
    gc.collect()
    np.testing.assert_array_equal(b.topk(data[1][0], 3).blocks, expected)


def test_strided_head_slice(data):
    keys = data[0]
    cache = np.zeros((N, 3, D), dtype=np.float32)
    cache[:, 1] = keys
    a, b = ks.BlockIndex(cache[:, 1, :], BS), ks.BlockIndex(keys, BS)
    q = data[1][0]
    np.testing.assert_array_equal(a.topk(q, 4).blocks, b.topk(q, 4).blocks)


def test_block_index_bad_input_raises(data, block):
    keys, queries = data
    with pytest.raises(ks.InvalidArgument, match="block_size > 0, got 0"):
        ks.BlockIndex(keys, 0)
    with pytest.raises(ks.InvalidArgument, match="block_size > 0, got -3"):
        ks.BlockIndex(keys, -3)
    with pytest.raises(ks.InvalidArgument, match="float32, got float64"):
        ks.BlockIndex(keys.astype(np.float64), BS)
    with pytest.raises(ks.DimensionMismatch, match="2-D"):
        ks.BlockIndex(keys[0], BS)
    with pytest.raises(ks.InvalidArgument, match="contiguous rows"):
        ks.BlockIndex(np.asfortranarray(keys), BS)
    with pytest.raises(ks.InvalidArgument, match="non-empty key set"):
        ks.BlockIndex(np.zeros((0, D), dtype=np.float32), BS)
    bad = keys.copy()
    bad[70, 2] = np.inf
    with pytest.raises(ks.NonFiniteValue):
        ks.BlockIndex(bad, BS)
    with pytest.raises(ks.DimensionMismatch, match=f"{D}, got {2 * D}"):
        block.topk(np.zeros(2 * D, dtype=np.float32), 3)
    with pytest.raises(ks.DimensionMismatch):
        block.dipr(np.zeros(D - 1, dtype=np.float32), 1.0)
    nan_q = queries[0].copy()
    nan_q[0] = np.nan
    with pytest.raises(ks.NonFiniteValue):
        block.topk(nan_q, 3)
    with pytest.raises(ks.InvalidArgument, match="k must be > 0"):
        block.topk(queries[0], 0)
    with pytest.raises(ks.InvalidArgument, match="beta >= 0"):
        block.dipr(queries[0], -1.0)
    with pytest.raises(ks.InvalidArgument, match="beta >= 0"):
        block.dipr(queries[0], math.nan)
    with pytest.raises(ks.OutOfRange, match="block < 16, got 16"):
        block.tokens_of(16)
    with pytest.raises(ks.OutOfRange, match="got -1"):
        block.tokens_of(-1)
    with pytest.raises(ks.OutOfRange, match="block < 16, got 20"):
        block.bounds(queries[0], 20)
    with pytest.raises(ks.OutOfRange, match="blocks < 16, got 16"):
        block.tokens(np.array([0, 16]))
    with pytest.raises(ks.OutOfRange, match="got -2"):
        block.tokens(np.array([-2]))
    with pytest.raises(ks.InvalidArgument, match="integer array"):
        block.tokens(np.array([0.5]))
    with pytest.raises(ks.OutOfRange, match="prefix_len"):
        block.topk(queries[0], 2, filter=ks.IdBelow(N + 1))
    with pytest.raises(TypeError, match="IdBelow, kvsift.IdRange, kvsift.IdMask or kvsift.IdList"):
        block.topk(queries[0], 2, filter="middle")


# ------------------------------------------------------------------------- planner


def coarse_bytes(context, head_dim=64, block_size=64, k_blocks=16):
    """The planner's documented cost model: f32 min/max/mean summaries per block plus the
    fetched blocks' f16 K and V."""
    return math.ceil(context / block_size) * 3 * head_dim * 4 + 2 * head_dim * 2 * k_blocks * block_size


@pytest.fixture(scope="module")
def planner():
    return ks.Planner(short_context=2048, head_dim=64, dipr_beta=40.0)


def test_planner_parameters_and_rules(planner):
    assert (planner.short_context, planner.head_dim, planner.block_size, planner.k_blocks) == (2048, 64, 64, 16)
    assert planner.dipr_beta == 40.0
    assert planner.rules == ["short_context", "prefix_filter", "coarse_if_budget", "dipr_flat_layer0", "dipr_graph"]
    assert planner.gpu_bytes("coarse", 4096) == coarse_bytes(4096)
    assert planner.gpu_bytes("full", 4096) == 4096 * 2 * 64 * 2


def test_short_context_is_full_attention(planner):
    p = planner.plan(2048, layer=5, gpu_budget_bytes=0)
    assert (p.index, p.query, p.decided_by, p.filter) == ("full", "full", "short_context", None)
    assert "2048 <= 2048" in p.explain()


def test_tight_budget_picks_dipr_flat_in_layer0_graph_elsewhere(planner):
    need = coarse_bytes(4096)
    p0 = planner.plan(4096, layer=0, gpu_budget_bytes=need - 1)
    p5 = planner.plan(4096, layer=5, gpu_budget_bytes=need - 1)
    assert (p0.name, p0.decided_by) == ("flat-dipr", "dipr_flat_layer0")
    assert (p5.name, p5.decided_by) == ("graph-dipr", "dipr_graph")
    assert p5.params == {"beta": 40.0, "l0": 64.0}
    assert f"coarse index needs {need} B > budget {need - 1} B" in p5.explain()
    assert repr(p5) == "<kvsift.Plan graph-dipr>"


def test_budget_holding_the_coarse_index_picks_block_topk(planner):
    p = planner.plan(4096, layer=0, gpu_budget_bytes=coarse_bytes(4096))  # exactly enough
    assert (p.index, p.query, p.decided_by) == ("coarse", "topk", "coarse_if_budget")
    assert p.params == {"block_size": 64.0, "k_blocks": 16.0}
    assert p.gpu_bytes == coarse_bytes(4096)


def test_reused_prefix_adds_an_id_below_filter(planner):
    p = planner.plan(4096, reused_prefix=1000, layer=3, gpu_budget_bytes=0)
    assert p.name == "graph-dipr+id_below(1000)" and p.filter_prefix == 1000
    assert isinstance(p.filter, ks.IdBelow) and p.filter.prefix_len == 1000
    assert planner.plan(4096, reused_prefix=4096, layer=3).filter is None  # the whole context


def test_removing_a_rule_changes_the_decision():
    pl = ks.Planner(short_context=16, head_dim=64)
    pl.remove_rule("coarse_if_budget")
    assert pl.plan(4096, layer=2, gpu_budget_bytes=1e12).name == "graph-dipr"
    with pytest.raises(ks.InvalidArgument, match="unknown rule 'coarse_if_budget'"):
        pl.remove_rule("coarse_if_budget")


def test_parse_name(planner):
    assert planner.parse_name("auto") is None
    assert planner.parse_name("coarse-topk") == ("coarse", "topk")


def test_planner_bad_input_raises(planner):
    with pytest.raises(ks.InvalidArgument, match="context > 0, got 0"):
        planner.plan(0)
    with pytest.raises(ks.InvalidArgument, match="reused prefix of 5000 tokens is longer than the context of 4096"):
        planner.plan(4096, reused_prefix=5000)
    with pytest.raises(ks.InvalidArgument, match="GPU budget >= 0 bytes, got -1"):
        planner.plan(4096, gpu_budget_bytes=-1)
    with pytest.raises(ks.InvalidArgument, match="GPU budget"):
        planner.plan(4096, gpu_budget_bytes=math.inf)
    with pytest.raises(ks.InvalidArgument, match="GPU budget"):
        planner.plan(4096, gpu_budget_bytes=math.nan)
    with pytest.raises(ks.InvalidArgument, match="latency budget"):
        planner.plan(4096, latency_budget_us=-5.0)
    with pytest.raises(ks.InvalidArgument, match=">= 0, got -4096"):
        planner.plan(-4096)
    with pytest.raises(ks.InvalidArgument, match=">= 0"):
        planner.plan(4096, layer=-1)
    with pytest.raises(ks.InvalidArgument, match="unknown index kind 'hnsw'; registered: coarse, flat, full, graph"):
        planner.parse_name("hnsw-dipr")
    with pytest.raises(ks.InvalidArgument, match="unknown query kind 'range'"):
        planner.parse_name("graph-range")
    with pytest.raises(ks.InvalidArgument, match="'auto' or 'index-query'"):
        planner.parse_name("graph")
    with pytest.raises(ks.InvalidArgument, match="unknown index kind 'gpu'"):
        planner.gpu_bytes("gpu", 4096)
    with pytest.raises(ks.InvalidArgument, match="block_size, k_blocks, dipr_l0 > 0"):
        ks.Planner(block_size=0)
    with pytest.raises(ks.InvalidArgument, match="block_size >= 0, got -1"):
        ks.Planner(block_size=-1)
    with pytest.raises(ks.InvalidArgument, match="dipr_beta"):
        ks.Planner(dipr_beta=math.nan)
