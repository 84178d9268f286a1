"""InsertableGraphIndex: keys inserted after the build are found, recall over all keys stays
close to a full build, and bad input is refused before anything changes."""

import numpy as np
import pytest

import kvsift as ks

N, D, BASE = 3000, 32, 2400


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    centers = rng.standard_normal((24, D)).astype(np.float32) * 2.0
    keys = centers[rng.integers(0, 24, N)] + rng.standard_normal((N, D)).astype(np.float32)
    queries = keys[rng.integers(0, N, 500)] * 0.5 + rng.standard_normal((500, D)).astype(
        np.float32)
    return np.ascontiguousarray(keys, np.float32), np.ascontiguousarray(queries, np.float32)


def recall(found, keys, queries, k):
    exact = np.argsort(-(queries @ keys.T), axis=1, kind="stable")[:, :k]
    return np.mean([len(set(f) & set(e)) / k for f, e in zip(found, exact)])


def test_insert_then_search_matches_full_build(data):
    keys, queries = data
    train, evals = queries[:300], queries[300:]
    index = ks.InsertableGraphIndex(keys[:BASE], train[:240], nq=40, M=12, L=64, threads=2)
    assert index.size == BASE
    for i in range(BASE, N, 50):  # batches of 50, as a few decode steps
        assert index.insert(keys[i:i + 50]) == i
    assert index.size == N
    full = ks.RoarGraphIndex(keys, train, nq=40, M=12, L=64, threads=2)
    got = recall(index.search(evals, 10, L=40).ids, keys, evals, 10)
    ref = recall(full.search(evals, 10, L=40).ids, keys, evals, 10)
    assert got >= ref - 0.05, (got, ref)
    # An inserted key is found by its own direction when it is the exact best key.
    best = np.argmax(keys[BASE:] @ keys.T, axis=1)
    own = [x for x in range(BASE, N) if best[x - BASE] == x][:50]
    assert len(own) >= 10
    res = index.search(keys[own], 10, L=40).ids
    assert np.mean([x in r for x, r in zip(own, res)]) >= 0.95


def test_insert_bad_input_changes_nothing(data):
    keys, queries = data
    index = ks.InsertableGraphIndex(keys[:500], queries[:60], nq=20, M=4, L=32, threads=1)
    with pytest.raises(ks.DimensionMismatch, match="expected dimension 32, got 31"):
        index.insert(keys[500:502, :31].copy())
    bad = keys[500:503].copy()
    bad[2, 5] = np.nan
    with pytest.raises(ks.NonFiniteValue):
        index.insert(bad)
    bad[2, 5] = np.inf
    with pytest.raises(ks.NonFiniteValue):
        index.insert(bad)
    with pytest.raises(ValueError):
        index.insert(keys[500:503].astype(np.float16))
    assert index.size == 500
    assert index.insert(np.zeros((0, D), np.float32)) == 500  # empty batch: no-op
    assert index.insert(keys[500:503]) == 500
    assert index.size == 503


def test_search_heads_takes_insertable_indexes(data):
    # One InsertableGraphIndex per KV head in the batched decode search (GQA group of 2), with
    # the answers of each index's own search, inserted keys included.
    keys, queries = data
    a = ks.InsertableGraphIndex(keys[:1000], queries[:100], nq=20, M=8, L=48, threads=1)
    b = ks.InsertableGraphIndex(keys[1000:2000], queries[100:200], nq=20, M=8, L=48, threads=1)
    a.insert(keys[2000:2100])
    b.insert(keys[2100:2200])
    q = np.ascontiguousarray(queries[300:304])  # heads 0, 1 -> a; heads 2, 3 -> b
    r = ks.search_heads([a, b], q, 10, L=40, threads=2)
    np.testing.assert_array_equal(r.ids[:2], a.search(q[:2], 10, L=40).ids)
    np.testing.assert_array_equal(r.ids[2:], b.search(q[2:], 10, L=40).ids)


def grown_walk(data, **kw):
    """Index of 1000 keys grown by 300 inserts with settings `kw`, then searched: the ids found
    and the keys scored (the walk, not only its answers: these agree on such easy data)."""
    keys, queries = data
    g = ks.InsertableGraphIndex(keys[:1000], queries[:100], nq=20, M=8, L=48, threads=1, **kw)
    g.insert(keys[1000:1300])
    r = g.search(np.ascontiguousarray(queries[300:340]), 10, L=40)
    return np.concatenate([r.ids.ravel(), r.distance_computations])


def test_query_knn_lists_limits_the_upkeep(data):
    # query_knn_lists = T offers each inserted key only to its T nearest training queries'
    # kNN lists (an approximation with fewer reverse edges: a different graph); T >= the
    # training queries is the exact upkeep, the same graph as the default.
    def grown(**kw):
        return grown_walk(data, query_candidates=0, **kw)

    exact = grown()
    np.testing.assert_array_equal(grown(query_knn_lists=100), exact)
    assert not np.array_equal(grown(query_knn_lists=2), exact)


def test_query_candidates_bounds_the_queries_scored(data):
    # query_candidates = C scores an inserted key against at most C training queries, found
    # through the kNN lists of the keys its graph search finds; 0 scans them all. A cap above
    # the training queries still gathers only the queries on those lists, so it differs from
    # the scan too; each setting is deterministic.
    keys, queries = data
    def grown(**kw):
        return grown_walk(data, **kw)

    scan = grown(query_candidates=0)
    capped = grown(query_candidates=8)
    assert not np.array_equal(capped, scan)
    np.testing.assert_array_equal(grown(query_candidates=8), capped)
    np.testing.assert_array_equal(grown(), grown(query_candidates=512))
    with pytest.raises(TypeError):
        ks.InsertableGraphIndex(keys[:1000], queries[:100], query_candidates=-1)


def test_holder_capacity_caps_the_key_to_query_lists(data):
    # holder_capacity = H records at most H training queries per key for the gathering: a
    # cap below what the keys hold changes what is gathered (another graph), one above it
    # does not, and 0 is every holder.
    keys, queries = data
    def grown(**kw):
        return grown_walk(data, query_candidates=16, **kw)

    every = grown()
    np.testing.assert_array_equal(grown(holder_capacity=0), every)
    np.testing.assert_array_equal(grown(holder_capacity=100), every)
    assert not np.array_equal(grown(holder_capacity=1), every)
    with pytest.raises(TypeError):
        ks.InsertableGraphIndex(keys[:1000], queries[:100], holder_capacity=-1)


def test_add_queries_joins_the_training_queries(data):
    """Decode-time queries become training queries: with ids given, a query's list is the best
    nq of them by inner product; without, a search finds them; later inserts update both."""
    keys, queries = data
    index = ks.InsertableGraphIndex(keys[:BASE], queries[:200], nq=20, M=8, L=48, threads=1)
    given = np.full((2, 30), ks.INVALID_ID, dtype=np.uint32)
    given[0, :25] = np.arange(0, 250, 10)
    given[1, :3] = [7, 3, 5]
    assert index.add_queries(queries[200:202], given) == 200
    assert index.add_queries(queries[202:205]) == 202  # lists from a search
    assert index.train_queries().shape == (205, D)
    np.testing.assert_array_equal(index.train_queries()[200:205], queries[200:205])
    ids, scores = index.query_knn()
    assert ids.shape == (205, 20)
    s0 = queries[200] @ keys[given[0, :25]].T
    best = given[0, :25][np.argsort(-s0, kind="stable")[:20]]
    np.testing.assert_array_equal(ids[200], best)
    # Summation order differs from numpy's: an absolute floor for scores near zero.
    np.testing.assert_allclose(scores[200], np.sort(s0)[::-1][:20], rtol=1e-5, atol=1e-4)
    s1 = queries[201] @ keys[[7, 3, 5]].T
    np.testing.assert_array_equal(ids[201, :3], np.array([7, 3, 5])[np.argsort(-s1)])
    assert (ids[201, 3:] == ks.INVALID_ID).all()  # empty slots, for later keys
    # The searched lists: valid, distinct ids, scores descending.
    for r in range(202, 205):
        assert (ids[r] < BASE).all() and len(set(ids[r])) == 20
        assert (np.diff(scores[r]) <= 0).all()
    # Inserted keys reach the added queries' lists (query 201's empty slots at least).
    index.insert(keys[BASE:BASE + 300])
    ids2, _ = index.query_knn()
    assert (ids2[201] != ks.INVALID_ID).all()
    assert (ids2[200:205] >= BASE).any()


def test_add_queries_bad_input_changes_nothing(data):
    keys, queries = data
    index = ks.InsertableGraphIndex(keys[:500], queries[:60], nq=20, M=4, L=32, threads=1)
    with pytest.raises(ks.DimensionMismatch, match="expected dimension 32, got 31"):
        index.add_queries(queries[60:62, :31].copy())
    bad = queries[60:63].copy()
    bad[2, 1] = np.nan
    with pytest.raises(ks.NonFiniteValue):
        index.add_queries(bad)
    with pytest.raises(ks.NonFiniteValue):
        index.add_queries(bad, np.arange(6, dtype=np.uint32).reshape(3, 2))
    with pytest.raises(ks.OutOfRange, match="expected < 500"):
        index.add_queries(queries[60:62], np.array([[1, 2], [3, 500]], np.uint32))
    with pytest.raises(ValueError, match="holds id 4 twice"):
        index.add_queries(queries[60:62], np.array([[1, 2], [4, 4]], np.uint32))
    with pytest.raises(ks.DimensionMismatch):
        index.add_queries(queries[60:62], np.array([[1, 2]], np.uint32))  # one row for two
    with pytest.raises(ks.InvalidArgument, match="expected pool >= 1"):
        index.add_queries(queries[60:62], pool=0)
    assert index.train_queries().shape == (60, D)
    assert index.add_queries(np.zeros((0, D), np.float32)) == 60  # empty batch: no-op
    assert index.train_queries().shape == (60, D)
