"""IdMask and IdList filters: every search that takes a filter returns what a brute-force
search over the passing ids returns (exactly for the flat index, by recall for the graph),
and bad masks and lists are refused with the expected and actual values."""

import numpy as np
import pytest

import kvsift as ks

N, D = 1500, 32


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    c = rng.standard_normal((24, D)).astype(np.float32) * 2.0
    keys = c[rng.integers(0, 24, N)] + rng.standard_normal((N, D)).astype(np.float32)
    queries = keys[rng.integers(0, N, 300)] * 0.5 + rng.standard_normal((300, D))
    keys = np.ascontiguousarray(keys, np.float32)
    # A random 15% subset: neither a prefix nor a range, so IdBelow/IdRange could not express it.
    mask = rng.random(N) < 0.15
    return keys, np.ascontiguousarray(queries, np.float32), mask


@pytest.fixture(scope="module")
def graph(data):
    keys, queries, _ = data
    return ks.RoarGraphIndex(keys, queries[:200], nq=20, M=16, L=64, threads=2)


def oracle_topk(keys, q, k, mask):
    """Exact top-k over the passing ids by inner product in float64 (ties: lower id first)."""
    ids = np.flatnonzero(mask)
    s = keys[ids].astype(np.float64) @ q.astype(np.float64)
    return ids[np.lexsort((ids, -s))[:k]]


def filters(mask):
    """The same set of ids as every filter kind that can express it."""
    return {
        "bool mask": ks.IdMask(mask),
        "uint8 mask": ks.IdMask(mask.astype(np.uint8) * 7),  # any nonzero byte passes
        "id list": ks.IdList(np.flatnonzero(mask)),
        "shuffled list with repeats": ks.IdList(
            np.random.default_rng(1).permutation(np.repeat(np.flatnonzero(mask), 2))
        ),
    }


def test_flat_topk_equals_filtered_oracle(data):
    keys, queries, mask = data
    flat = ks.FlatIndex(keys)
    for name, f in filters(mask).items():
        r = flat.topk(queries[200:], 10, filter=f)
        for i, q in enumerate(queries[200:]):
            np.testing.assert_array_equal(r.ids[i], oracle_topk(keys, q, 10, mask), err_msg=name)


def test_graph_search_only_passing_ids_and_recall(data, graph):
    keys, queries, mask = data
    for name, f in filters(mask).items():
        r = graph.search(queries[200:], 10, L=64, filter=f)
        assert mask[r.ids].all(), name
        hit = sum(
            len(set(r.ids[i].tolist()) & set(oracle_topk(keys, q, 10, mask).tolist()))
            for i, q in enumerate(queries[200:])
        )
        assert hit / (10 * len(queries[200:])) >= 0.95, (name, hit)


def test_dipr_equals_filtered_range(data, graph):
    keys, queries, mask = data
    flat = ks.FlatIndex(keys)
    beta = 3.0
    for name, f in filters(mask).items():
        for q in queries[200:220]:
            s = keys.astype(np.float64) @ q.astype(np.float64)
            best = s[mask].max()
            want = set(np.flatnonzero(mask & (s >= best - beta)).tolist())
            assert set(flat.dipr(q, beta, filter=f).ids.tolist()) == want, name
            got = graph.dipr(q, beta, filter=f).ids
            assert mask[got].all(), name


def test_search_heads_and_block_index_take_the_new_filters(data, graph):
    keys, queries, mask = data
    flat = ks.FlatIndex(keys)
    for name, f in filters(mask).items():
        r = ks.search_heads([flat, flat], queries[:4], 5, filter=f)
        for h in range(4):
            np.testing.assert_array_equal(r.ids[h], oracle_topk(keys, queries[h], 5, mask), name)
        block = ks.BlockIndex(keys, 64)
        want = np.flatnonzero(mask[64:192]) + 64
        np.testing.assert_array_equal(block.tokens(np.array([1, 2]), filter=f), want, name)
        top = block.topk(queries[0], 4, filter=f)
        for b in top.blocks:
            first, last = block.tokens_of(int(b))
            assert mask[first:last].any(), name


def test_filters_keep_and_report_their_input(data):
    _, _, mask = data
    m = ks.IdMask(mask)
    assert m.mask is mask and len(m) == N
    lst = ks.IdList(np.array([5, 3, 5], dtype=np.int32))
    np.testing.assert_array_equal(lst.ids, [5, 3, 5])
    assert lst.ids.dtype == np.int64 and len(lst) == 3


def test_bad_masks_and_lists_raise(data, graph):
    keys, queries, mask = data
    flat = ks.FlatIndex(keys)
    with pytest.raises(ks.DimensionMismatch, match=f"expected {N} entries.*got {N - 1}"):
        flat.topk(queries[0], 3, filter=ks.IdMask(mask[:-1]))
    with pytest.raises(ks.DimensionMismatch, match=f"expected {N} entries.*got {N + 1}"):
        graph.search(queries[0], 3, filter=ks.IdMask(np.ones(N + 1, bool)))
    with pytest.raises(ks.DimensionMismatch, match=f"expected {N} entries"):
        graph.dipr(queries[0], 1.0, filter=ks.IdMask(mask[:10]))
    with pytest.raises(ks.DimensionMismatch, match=f"expected {N} entries"):
        ks.BlockIndex(keys, 64).tokens(np.array([0]), filter=ks.IdMask(mask[:100]))
    with pytest.raises(ks.InvalidArgument, match="bool or uint8.*int64"):
        ks.IdMask(mask.astype(np.int64))
    with pytest.raises(ks.InvalidArgument, match="bool or uint8.*float32"):
        ks.IdMask(mask.astype(np.float32))
    with pytest.raises(ks.DimensionMismatch, match="1-D"):
        ks.IdMask(mask.reshape(3, -1))
    with pytest.raises(ks.InvalidArgument, match="contiguous"):
        ks.IdMask(np.ones(2 * N, bool)[::2])
    with pytest.raises(ks.OutOfRange, match=f"ids < {N}, got {N}"):
        flat.topk(queries[0], 3, filter=ks.IdList(np.array([0, N])))
    with pytest.raises(ks.OutOfRange, match="got -1"):
        ks.IdList(np.array([3, -1]))
    with pytest.raises(ks.InvalidArgument, match="integer array"):
        ks.IdList(np.array([0.5]))
    # An empty set is a valid filter: nothing passes, every result is missing.
    r = flat.topk(queries[0], 3, filter=ks.IdList(np.array([], np.int64)))
    assert (r.ids == ks.INVALID_ID).all()
    r = flat.topk(queries[0], 3, filter=ks.IdMask(np.zeros(N, bool)))
    assert (r.ids == ks.INVALID_ID).all()


def test_walk_through_false_drops_failing_neighbours(data, graph):
    """walk_through=False (the GPU decode search's switch): a failing neighbour is dropped
    instead of walked through. Every answer still passes; a window-like range keeps its
    recall at fewer keys scored; the selective 15% mask, which the walk needs to cross, loses
    much of it (0.75 against 1.0 here); with no filter the switch changes nothing."""
    keys, queries, mask = data
    q = queries[200:]
    window = np.zeros(N, bool)
    window[4 : N - 64] = True
    cases = [("range", window, ks.IdRange(4, N - 64)), ("15% mask", mask, ks.IdMask(mask))]
    for name, m, f in cases:
        through = graph.search(q, 10, L=64, filter=f)
        dropped = graph.search(q, 10, L=64, filter=f, walk_through=False)
        assert m[dropped.ids].all(), name
        recall = {
            mode: sum(
                len(set(r.ids[i].tolist()) & set(oracle_topk(keys, qi, 10, m).tolist()))
                for i, qi in enumerate(q)
            )
            / (10 * len(q))
            for mode, r in [("through", through), ("dropped", dropped)]
        }
        assert dropped.distance_computations.sum() < through.distance_computations.sum(), name
        if name == "range":
            assert recall["dropped"] >= 0.95, recall
        else:
            assert recall["dropped"] < recall["through"] - 0.15, recall
        for qi in q[:10]:
            d = graph.dipr(qi, 3.0, filter=f, walk_through=False)
            assert m[d.ids].all(), name
        # The decode step's batched calls take the switch too, head by head as search/dipr.
        heads = ks.search_heads([graph], q[:4], 10, L=64, filter=f, walk_through=False)
        np.testing.assert_array_equal(heads.ids, dropped.ids[:4])
        np.testing.assert_array_equal(
            heads.distance_computations, dropped.distance_computations[:4]
        )
        group = ks.dipr_heads([graph], q[:4], 3.0, filter=f, walk_through=False)
        for h in range(4):
            got = group.ids[h][: group.counts[h]]
            one = graph.dipr(q[h], 3.0, filter=f, walk_through=False)
            np.testing.assert_array_equal(got, one.ids)
    plain = graph.search(q, 10, L=64)
    same = graph.search(q, 10, L=64, walk_through=False)
    np.testing.assert_array_equal(plain.ids, same.ids)
    np.testing.assert_array_equal(plain.distance_computations, same.distance_computations)


def test_entry_prefix_enters_at_the_first_ids(data, graph):
    """entry_prefix=P enters the walk at ids [0, P) too (a decode step's sinks), after the
    caller's entries: the same as passing those ids as entries, in every search that takes it."""
    keys, queries, mask = data
    q = queries[200:]
    f = ks.IdRange(4, N - 64)
    extra = np.array([17, 900])
    spelled = np.concatenate([extra, np.arange(4)])
    for through in (True, False):
        a = graph.search(q, 10, L=32, filter=f, entries=extra, walk_through=through, entry_prefix=4)
        b = graph.search(q, 10, L=32, filter=f, entries=spelled, walk_through=through)
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.distance_computations, b.distance_computations)
        heads = ks.search_heads([graph], q[:4], 10, L=32, filter=f, walk_through=through,
                                entry_prefix=4)
        alone = graph.search(q[:4], 10, L=32, filter=f, walk_through=through, entry_prefix=4)
        np.testing.assert_array_equal(heads.ids, alone.ids)
        for qi in q[:10]:
            d = graph.dipr(qi, 3.0, filter=f, entries=extra, walk_through=through, entry_prefix=4)
            e = graph.dipr(qi, 3.0, filter=f, entries=spelled, walk_through=through)
            np.testing.assert_array_equal(d.ids, e.ids)
        group = ks.dipr_heads([graph], q[:4], 3.0, filter=f, walk_through=through, entry_prefix=4)
        for h in range(4):
            one = graph.dipr(q[h], 3.0, filter=f, walk_through=through, entry_prefix=4)
            np.testing.assert_array_equal(group.ids[h][: group.counts[h]], one.ids)
    plain = graph.search(q, 10, L=32, filter=f)
    entered = graph.search(q, 10, L=32, filter=f, entry_prefix=4)
    assert (plain.distance_computations != entered.distance_computations).any()
    # A prefix beyond 32-bit ids is refused with the bound and the value, in every call.
    big = 2**40
    with pytest.raises(
        ks.OutOfRange, match=r"search: entry_prefix: expected at most .*1099511627776"
    ):
        graph.search(q[:2], 10, entry_prefix=big)
    with pytest.raises(ks.OutOfRange, match="dipr: entry_prefix"):
        graph.dipr(q[0], 3.0, entry_prefix=big)
    with pytest.raises(ks.OutOfRange, match="search_heads: entry_prefix"):
        ks.search_heads([graph], q[:4], 10, entry_prefix=big)
    with pytest.raises(ks.OutOfRange, match="dipr_heads: entry_prefix"):
        ks.dipr_heads([graph], q[:4], 3.0, entry_prefix=big)
