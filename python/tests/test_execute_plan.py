"""ks.execute_plan (kvsift::plan_executor): the planner's plans run through the library's one
dispatch; each equals the composition of the single functions (search, window attention,
sparse attention, merge) written out here, a full plan equals dense attention, and bad input
raises before anything runs."""

import numpy as np
import pytest

import kvsift as ks

N, D, SINK, RECENT = 900, 16, 8, 40


@pytest.fixture(scope="module")
def cache():
    rng = np.random.default_rng(9)
    k = rng.standard_normal((N, 2, D)).astype(np.float32)  # (tokens, kv_heads, dim), as a cache
    v = rng.standard_normal((N, 2, D)).astype(np.float32)
    train = rng.standard_normal((200, D)).astype(np.float32)
    g = 1
    keys = k[:, g, :]  # a strided view of the cache, as the e2e example passes
    return {"k": k, "v": v, "g": g, "flat": ks.FlatIndex(keys), "coarse": ks.BlockIndex(keys, 32),
            "graph": ks.RoarGraphIndex(keys, train, nq=20, M=8, L=32),
            "q": rng.standard_normal((6, D)).astype(np.float32) * 2}


def composed(c, plan, q, n, beta):
    """The plan written out with the single functions, as the e2e example did before."""
    k, v, g = c["k"], c["v"], c["g"]
    lo, hi = SINK, n - RECENT
    flt = ks.IdRange(lo, hi)
    if plan.index == "coarse":
        r = c["coarse"].topk(q, int(plan.params["k_blocks"]), filter=flt)
        ids = c["coarse"].tokens(r.blocks, filter=flt)
    else:
        seed = float(max((k[:SINK, g] @ q).max(), (k[n - RECENT:n, g] @ q).max()))
        index = c["flat"] if plan.index == "flat" else c["graph"]
        ids = index.dipr(q, plan.params["beta"], l0=64, max_candidates=4096, seed_score=seed, filter=flt).ids
    o, lse = ks.dense_attention(q, k, v, 0, SINK, kv_head=g)
    o, lse = ks.merge(o, lse, *ks.dense_attention(q, k, v, n - RECENT, n, kv_head=g))
    o, lse = ks.merge(o, lse, *ks.sparse_attention(q, k, v, ids, kv_head=g))
    return ids, o, lse


def run(c, plan, q, n, **kw):
    args = dict(context=n, kv_head=c["g"], window=(SINK, RECENT), flat=c["flat"], graph=c["graph"],
                coarse=c["coarse"], l0=64, max_candidates=4096, seed_from_window=True)
    args.update(kw)
    return ks.execute_plan(plan, q, c["k"], c["v"], **args)


@pytest.mark.parametrize("layer, budget, expected", [(0, 0.0, "flat-dipr"), (1, 0.0, "graph-dipr"),
                                                     (1, 1e9, "coarse-topk")])
def test_planned_step_equals_the_composition(cache, layer, budget, expected):
    planner = ks.Planner(short_context=100, head_dim=D, block_size=32, k_blocks=5, dipr_beta=12.0)
    retrieved = 0
    for i, n in enumerate([600, 750, 900]):
        plan = planner.plan(n, layer=layer, gpu_budget_bytes=budget)
        assert plan.name == expected
        for q in cache["q"]:
            step = run(cache, plan, q, n)
            ids, o, lse = composed(cache, plan, q, n, plan.params.get("beta"))
            np.testing.assert_array_equal(step.ids, ids)
            np.testing.assert_array_equal(step.o, o)
            assert step.lse == lse
            assert not step.everything and step.scanned > 0
            retrieved += len(ids)
    assert retrieved > 50  # the searches returned something to compare


def test_full_plan_is_dense_attention(cache):
    plan = ks.Planner(short_context=4096, head_dim=D).plan(700)
    assert plan.name == "full-full"
    for q in cache["q"]:
        step = run(cache, plan, q, 700, flat=None, graph=None, coarse=None)  # needs no index
        o, lse = ks.dense_attention(q, cache["k"], cache["v"], 0, 700, kv_head=cache["g"])
        np.testing.assert_array_equal(step.o, o)
        assert step.everything and len(step.ids) == 0 and step.lse == lse


def test_bad_input(cache):
    planner = ks.Planner(short_context=100, head_dim=D)
    plan = planner.plan(800, layer=0)  # flat-dipr
    q = cache["q"][0]
    with pytest.raises(ks.InvalidArgument, match="plan_resources::flat, which is null"):
        run(cache, plan, q, 800, flat=None)
    with pytest.raises(ks.InvalidArgument, match="float32 keys"):
        run(cache, plan, q, 800, flat=ks.FlatIndex(cache["k"][:, 0, :].astype(np.float16)))
    bad = q.copy()
    bad[3] = np.nan
    with pytest.raises(ks.NonFiniteValue):
        run(cache, plan, bad, 800)
    with pytest.raises(ks.DimensionMismatch):
        run(cache, plan, q[:-1], 800)
    with pytest.raises(ks.OutOfRange, match="exceeds the 900 tokens"):
        run(cache, plan, q, 901)
    with pytest.raises(ks.OutOfRange):
        run(cache, plan, q, 800, kv_head=2)
    with pytest.raises(ks.InvalidArgument, match="context > 0"):
        run(cache, plan, q, 0, window=(0, 0))
    with pytest.raises(ks.InvalidArgument, match="at most the 30 tokens"):
        run(cache, plan, q, 30)
    with pytest.raises(TypeError):
        run(cache, plan, q, 800, budget=-1)
