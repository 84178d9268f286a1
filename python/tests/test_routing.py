"""kvsift.make_route_set and RouteSet (C++ kvsift::route_set): routing rows are unit-norm training
queries with their exact best keys; RouteSet.seeds writes the lists of a query's best rows, the
seeds of a cold search run with an expand limit; cluster() lets a query score only the rows of
its best `probe` clusters. Checked against numpy on the synthetic OOD workload, whose evaluation
queries share topics with the training queries (so routed seeds pay there)."""

import numpy as np
import pytest

import kvsift as ks

N, D, TRAIN, EVAL, K = 6000, 32, 1200, 120, 10


@pytest.fixture(scope="module")
def ood():
    keys, queries = ks.make_ood(N, TRAIN + EVAL, D)
    train, test = queries[:TRAIN], queries[TRAIN:]
    exact = np.argsort(-(test @ keys.T), axis=1, kind="stable")[:, :K]
    return keys, train, test, exact


@pytest.fixture(scope="module")
def graph(ood):
    keys, train, _, _ = ood
    return ks.RoarGraphIndex(keys, train, threads=2)


@pytest.fixture(scope="module")
def routes(ood):
    keys, train, _, _ = ood
    return ks.make_route_set(train, keys, 400, list_len=10)


def test_rows_are_spread_unit_training_queries_with_their_exact_lists(ood, routes):
    keys, train, _, _ = ood
    assert (routes.rows, routes.dim, routes.list_len, routes.clusters) == (400, D, 10, 0)
    src = train[np.arange(400) * TRAIN // 400]  # floor(i m / rows): the last ones included
    unit = src / np.linalg.norm(src, axis=1, keepdims=True)
    np.testing.assert_allclose(routes.vectors, unit, rtol=1e-5, atol=1e-6)
    scores = unit.astype(np.float64) @ keys.T.astype(np.float64)
    best = -np.sort(-scores, axis=1)[:, :10]
    got = np.take_along_axis(scores, routes.lists.astype(np.int64), axis=1)
    np.testing.assert_allclose(got, best, rtol=1e-5, atol=1e-4)
    assert routes.lists.dtype == np.uint32 and routes.cluster_rows.size == 0
    assert "rows=400" in repr(routes)


def test_seeds_are_the_best_rows_lists_in_order(ood, routes):
    _, _, test, _ = ood
    seeds = routes.seeds(test, top=3)
    assert seeds.shape == (EVAL, 30) and seeds.dtype == np.uint32
    scores = test.astype(np.float64) @ routes.vectors.T.astype(np.float64)
    for i in range(EVAL):
        order = np.argsort(-scores[i], kind="stable")
        for t in range(3):
            got = seeds[i, t * 10:(t + 1) * 10]
            # The t-th best row, or a row whose score ties it within float rounding.
            near = [r for r in order[:6] if abs(scores[i, r] - scores[i, order[t]]) < 1e-4]
            assert any(np.array_equal(got, routes.lists[r]) for r in near)
    np.testing.assert_array_equal(routes.seeds(test[5], top=3), seeds[5])


def test_clustered_probe_all_equals_flat_and_fewer_probes_change_some(ood, routes):
    _, _, test, _ = ood
    flat = routes.seeds(test, top=4)
    clustered = ks.make_route_set(ood[1], ood[0], 400, list_len=10)
    clustered.cluster(20)
    c = clustered.clusters
    assert 15 <= c <= 20
    bounds = clustered.cluster_rows
    assert bounds[0] == 0 and bounds[-1] == 400 and np.all(np.diff(bounds) > 0)
    assert clustered.centroids.shape == (c, D)
    np.testing.assert_allclose(np.linalg.norm(clustered.centroids, axis=1), 1.0, rtol=1e-5)
    # The same (vector, list) rows, regrouped.
    key = lambda rs: sorted(map(tuple, rs.lists.tolist()))  # noqa: E731
    assert key(clustered) == key(routes)
    np.testing.assert_array_equal(clustered.seeds(test, top=4, probe=c), flat)
    one = clustered.seeds(test, top=4, probe=1)
    assert not np.array_equal(one, flat)
    # reads=True: the routing vectors each query scored, every row flat, else the centroids and
    # the rows of its best `probe` clusters.
    seeds, reads = routes.seeds(test, top=4, reads=True)
    np.testing.assert_array_equal(seeds, flat)
    assert reads.dtype == np.uint32 and np.all(reads == 400)
    sizes = np.diff(bounds)
    best = np.argsort(-(test @ clustered.centroids.T), axis=1)[:, :2]
    _, reads = clustered.seeds(test, top=4, probe=2, reads=True)
    np.testing.assert_array_equal(reads, c + sizes[best].sum(axis=1))
    assert clustered.seeds(test[0], top=4, probe=2, reads=True)[1] == reads[0]
    # Probing the best clusters keeps most queries' best route (the flat scan's first list),
    # more with every cluster probed (measured 0.51 / 0.76 / 0.86 / 0.95 at probe 1 / 2 / 3 / 5;
    # rows assigned to clusters at random would keep about probe / 20 of them).
    def same_first(probe):
        got = clustered.seeds(test, top=4, probe=probe)
        return np.mean([np.array_equal(got[i, :10], flat[i, :10]) for i in range(EVAL)])

    kept = [same_first(p) for p in (1, 2, 3, 5)]
    assert kept == sorted(kept) and kept[0] >= 0.35 and kept[3] >= 0.85


def test_routed_seeds_let_a_limited_search_match_the_cold_search_for_fewer_keys(ood, routes, graph):
    _, _, test, exact = ood
    recall = lambda ids: np.mean(  # noqa: E731
        [len(set(ids[i].tolist()) & set(exact[i].tolist())) / K for i in range(EVAL)])
    cold = graph.search(test, K, L=20)
    seeds = routes.seeds(test, top=4)
    routed = [graph.search(test[i], K, L=20, entries=seeds[i], expand_limit=12)
              for i in range(EVAL)]
    routed_ids = np.stack([r.ids for r in routed])
    routed_scored = np.mean([r.distance_computations for r in routed])
    bare = graph.search(test, K, L=20, expand_limit=12)
    assert recall(routed_ids) >= recall(cold.ids)
    assert routed_scored <= 0.75 * cold.distance_computations.mean()
    # The limit alone does not manage both: the seeds do the work.
    assert not (recall(bare.ids) >= recall(cold.ids)
                and bare.distance_computations.mean() <= 0.75 * cold.distance_computations.mean())


def test_padding_is_no_entry_and_a_non_finite_query_gets_no_seeds(ood, graph):
    keys, train, test, _ = ood
    few = ks.make_route_set(train, keys, 3, list_len=5)
    seeds = few.seeds(test[0], top=5)  # 3 rows for 5 routes: the last two lists are padding
    assert np.all(seeds[15:] == ks.INVALID_ID) and np.all(seeds[:15] != ks.INVALID_ID)
    padded = graph.search(test[0], K, L=20, entries=seeds, expand_limit=12)  # padding skipped
    clean = graph.search(test[0], K, L=20, entries=seeds[:15], expand_limit=12)
    np.testing.assert_array_equal(padded.ids, clean.ids)
    bad = test[1].copy()
    bad[3] = np.nan
    assert np.all(few.seeds(bad, top=2) == ks.INVALID_ID)


def test_bad_input_is_refused(ood, routes):
    keys, train, test, _ = ood
    with pytest.raises(ks.InvalidArgument,
                       match=r"expected 1 <= rows <= 1200 \(the queries given\), got 0"):
        ks.make_route_set(train, keys, 0)
    with pytest.raises(ks.InvalidArgument, match="got 1201"):
        ks.make_route_set(train, keys, 1201)
    with pytest.raises(ks.InvalidArgument, match="expected list_len >= 1, got 0"):
        ks.make_route_set(train, keys, 10, list_len=0)
    with pytest.raises(ks.DimensionMismatch):
        ks.make_route_set(train[:, :16], keys, 10)
    with pytest.raises(ks.InvalidArgument, match="float32"):
        ks.make_route_set(train.astype(np.float64), keys, 10)
    nan_keys = keys.copy()
    nan_keys[7, 2] = np.inf
    with pytest.raises(ks.NonFiniteValue):
        ks.make_route_set(train, nan_keys, 10)
    with pytest.raises(ks.InvalidArgument, match="probe 2 needs a clustered set"):
        routes.seeds(test, probe=2)
    with pytest.raises(ks.InvalidArgument, match="expected top >= 1, got 0"):
        routes.seeds(test, top=0)
    with pytest.raises(ks.DimensionMismatch):
        routes.seeds(test[:, :16])
    with pytest.raises(ks.DimensionMismatch):
        routes.seeds(test.reshape(2, EVAL // 2, D))
    copy = ks.make_route_set(train, keys, 50, list_len=4)
    with pytest.raises(ks.InvalidArgument,
                       match=r"expected 1 <= clusters <= 50 \(the routing rows\), got 51"):
        copy.cluster(51)
    with pytest.raises(ks.InvalidArgument, match="got 0"):
        copy.cluster(0)
    assert copy.clusters == 0  # unchanged by the refused calls


def test_route_stack_lays_sets_out_for_the_gpu(ood, routes):
    """kvsift.cuda.route_stack (kvsift::stack_route_sets): graph g's rows, lists and clusters
    read back from the stack are its RouteSet's; shorter lists are padded. Importable and
    checked without the CUDA extension."""
    from kvsift.graphs import route_stack

    keys, train, _, _ = ood
    short = ks.make_route_set(train, keys, 37, list_len=4)
    st = route_stack([routes, short, routes])
    assert st.vectors.dtype == np.float32 and st.lists.dtype == np.int32
    np.testing.assert_array_equal(st.offset, [0, 400, 437, 837])
    assert (st.max_rows, st.max_clusters, st.max_cluster_rows) == (400, 0, 0)
    assert st.centroids is None and st.cluster_offset is None and st.cluster_rows is None
    for g, rs in enumerate([routes, short, routes]):
        rows = slice(st.offset[g], st.offset[g + 1])
        np.testing.assert_array_equal(st.vectors[rows], rs.vectors)
        np.testing.assert_array_equal(st.lists[rows, :rs.list_len].view(np.uint32), rs.lists)
        assert np.all(st.lists[rows, rs.list_len:] == -1)

    a = ks.make_route_set(train, keys, 400, list_len=10)
    a.cluster(20)
    b = ks.make_route_set(train, keys, 60, list_len=10)
    b.cluster(5)
    st = route_stack([a, b])
    np.testing.assert_array_equal(st.cluster_offset, [0, a.clusters, a.clusters + b.clusters])
    np.testing.assert_array_equal(st.cluster_rows,
                                  np.concatenate([a.cluster_rows, 400 + b.cluster_rows[1:]]))
    np.testing.assert_array_equal(st.centroids, np.concatenate([a.centroids, b.centroids]))
    assert st.max_clusters == max(a.clusters, b.clusters)
    assert st.max_cluster_rows == max(np.diff(a.cluster_rows).max(), np.diff(b.cluster_rows).max())
    half = st.map(lambda x: x.astype(np.float16) if x.dtype == np.float32 else x)
    assert half.vectors.dtype == np.float16 and half.cluster_rows.dtype == np.int64

    with pytest.raises(ks.InvalidArgument, match="expected at least one routing set"):
        route_stack([])
    with pytest.raises(TypeError, match="expected RouteSet objects, got int"):
        route_stack([routes, 3])
    with pytest.raises(ks.InvalidArgument,
                       match="expected every set with rows clustered as set 0, set 1 is flat"):
        route_stack([a, routes])
    with pytest.raises(ks.DimensionMismatch):
        route_stack([routes, ks.make_route_set(train[:, :16], keys[:, :16], 5)])


def test_cluster_in_one_thread_while_others_read_the_set(ood):
    """cluster() reorders the set with the GIL released while seeds() and route_stack read it
    with the GIL released: every read sees the set before or after a reorder, never between.
    Flat seeds (probe 0) do not depend on the row order, and a stacked row's list must stay the
    list of the row's vector."""
    import threading
    import time

    from kvsift.graphs import route_stack

    keys, train, test, _ = ood
    rs = ks.make_route_set(train, keys, 400, list_len=10)
    expected = rs.seeds(test, top=2)
    vectors, lists = rs.vectors, rs.lists  # row i's list is lists[i], whatever the order
    stop = time.monotonic() + 2.0
    errors = []

    def writer():
        c = 0
        try:
            while time.monotonic() < stop:
                rs.cluster(2 + c % 30, iterations=0)
                c += 1
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    def reader(stack):
        try:
            while time.monotonic() < stop:
                if stack:
                    st = route_stack([rs] * 8)
                    row = np.argmax(st.vectors @ vectors.T, axis=1)  # unit rows: self is best
                    np.testing.assert_array_equal(st.lists.view(np.uint32), lists[row])
                else:
                    np.testing.assert_array_equal(rs.seeds(test, top=2), expected)
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=writer)]
    threads += [threading.Thread(target=reader, args=(s,)) for s in (False, True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert 1 <= rs.clusters <= 31
