"""expand_limit (C++ beam_search_params::expand_limit) from Python: RoarGraphIndex.search expands
only the pool's best expand_limit entries. With entries (seeds) holding the answer any limit
returns it; a small limit makes far fewer hops; L is the classic search; above L is refused."""

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
    return clustered_case(5, 600)[1:]


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
