"""degree_cap (C++ beam_search_params / dipr_params::degree_cap) from Python: RoarGraphIndex.search,
RoarGraphIndex.dipr and search_heads expand only each node's first degree_cap neighbours. On
6,000 clustered keys (the graph must route: a pool of 40 sees under a tenth of them) the cap
must score fewer vectors, keep recall against the exact oracle sane, and change nothing once it
reaches the graph's maximum degree."""

import os
import sys

import numpy as np
import pytest

import kvsift as ks

sys.path.insert(0, os.path.dirname(__file__))
from clustered_keys import K, clustered_case  # noqa: E402

L = 40


@pytest.fixture(scope="module")
def setup():
    return clustered_case(11, 700)


def recall(found, exact):
    return np.mean([len(set(a) & set(b)) / K for a, b in zip(found.tolist(), exact.tolist())])


def test_cap_scores_fewer_vectors_and_keeps_recall_sane(setup):
    _, graph, test, exact = setup
    full = graph.search(test, K, L=L)
    cost = {0: full.distance_computations.mean()}
    rec = {0: recall(full.ids, exact)}
    for cap in (4, 16):
        r = graph.search(test, K, L=L, degree_cap=cap)
        cost[cap], rec[cap] = r.distance_computations.mean(), recall(r.ids, exact)
    # Measured: 137 / 309 / 469 vectors scored, recall@10 0.21 / 0.58 / 0.81.
    assert cost[4] < cost[16] < 0.8 * cost[0]
    assert rec[4] < rec[16] <= rec[0]
    assert rec[16] >= 0.45 and rec[0] >= 0.7


def test_cap_at_the_maximum_degree_changes_nothing(setup):
    _, graph, test, _ = setup
    full = graph.search(test, K, L=L)
    for cap in (graph.max_degree, graph.max_degree + 1, 10**6):
        r = graph.search(test, K, L=L, degree_cap=cap)
        np.testing.assert_array_equal(r.ids, full.ids)
        np.testing.assert_array_equal(r.distance_computations, full.distance_computations)


def test_dipr_with_a_cap_scores_fewer_and_stays_in_range(setup):
    keys, graph, test, _ = setup
    full_cost, cap_cost = [], []
    for q in test[:50]:
        full = graph.dipr(q, 3.0, l0=64)
        capped = graph.dipr(q, 3.0, l0=64, degree_cap=8)
        full_cost.append(full.distance_computations)
        cap_cost.append(capped.distance_computations)
        s = keys @ q
        assert len(capped.ids) > 0
        assert (s[capped.ids] >= capped.best_score - 3.0 - 1e-4).all()
        same = graph.dipr(q, 3.0, l0=64, degree_cap=graph.max_degree)
        np.testing.assert_array_equal(same.ids, full.ids)
    assert np.mean(cap_cost) < 0.8 * np.mean(full_cost)  # measured 261 vs 479


def test_search_heads_passes_the_cap_to_every_head(setup):
    _, graph, test, _ = setup
    q = np.ascontiguousarray(test[:4])
    heads = ks.search_heads([graph, graph], q, K, L=L, degree_cap=8)
    one = graph.search(q, K, L=L, degree_cap=8)
    np.testing.assert_array_equal(heads.ids, one.ids)
    np.testing.assert_array_equal(heads.distance_computations, one.distance_computations)
    uncapped = ks.search_heads([graph], q, K, L=L)
    assert (heads.distance_computations < uncapped.distance_computations).all()
    # A FlatIndex head scans every key whatever the cap.
    flat = ks.FlatIndex(setup[0])
    np.testing.assert_array_equal(
        ks.search_heads([flat], q, K, degree_cap=8).ids, flat.topk(q, K).ids
    )


def test_bad_caps_raise(setup):
    _, graph, test, _ = setup
    with pytest.raises(ks.OutOfRange, match=r"search: degree_cap: expected at most .*1099511627776"):
        graph.search(test[0], K, degree_cap=2**40)
    with pytest.raises(ks.OutOfRange, match="dipr: degree_cap"):
        graph.dipr(test[0], 3.0, degree_cap=2**40)
    with pytest.raises(ks.OutOfRange, match="search_heads: degree_cap"):
        ks.search_heads([graph], test[:2], K, degree_cap=2**40)
    with pytest.raises(TypeError):
        graph.search(test[0], K, degree_cap=-1)
