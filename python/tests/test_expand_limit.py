"""expand_limit (C++ beam_search_params::expand_limit) from Python: RoarGraphIndex.search expands
only the pool's best expand_limit entries. With entries (seeds) holding the answer any limit
returns it; a small limit makes far fewer hops; L is the classic search; above L is refused."""

import numpy as np
import pytest

import kvsift as ks

N, D, K, L = 6000, 32, 10, 40


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(5)
    centers = rng.standard_normal((24, D)).astype(np.float32) * 2.0
    keys = centers[rng.integers(0, 24, N)] + rng.standard_normal((N, D)).astype(np.float32)
    keys = np.ascontiguousarray(keys, dtype=np.float32)
    queries = keys[rng.integers(0, N, 600)] * 0.5 + rng.standard_normal((600, D)).astype(
        np.float32
    )
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    graph = ks.RoarGraphIndex(keys, queries[:500], nq=20, M=32, L=100, threads=2)
    test = queries[500:]
    exact = ks.FlatIndex(keys).topk(test, K).ids
    return graph, test, exact


def test_limit_L_is_the_classic_search(setup):
    graph, test, _ = setup
    full = graph.search(test, K, L=L)
    same = graph.search(test, K, L=L, expand_limit=L)
    np.testing.assert_array_equal(same.ids, full.ids)
    np.testing.assert_array_equal(same.distance_computations, full.distance_computations)


def test_small_limit_scores_fewer_and_seeds_with_the_answer_return_it(setup):
    graph, test, exact = setup
    full = graph.search(test, K, L=L)
    small = graph.search(test, K, L=L, expand_limit=3)
    assert small.distance_computations.mean() < 0.5 * full.distance_computations.mean()
    for i in range(len(test)):
        r = graph.search(test[i], K, L=K, entries=exact[i].astype(np.uint32), expand_limit=1)
        assert set(r.ids.tolist()) == set(exact[i].tolist())


def test_limit_above_L_is_refused(setup):
    graph, test, _ = setup
    with pytest.raises(ks.InvalidArgument, match=r"expand_limit <= L = 40 \(0 = L\), got 41"):
        graph.search(test, K, L=L, expand_limit=41)
