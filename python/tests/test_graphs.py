"""kvsift.graphs: RoarGraph indexes stacked into the fixed-width arrays of the GPU decode search
(RoarGraphIndex.adjacency / entry_points, graph_set). Host only: runs in CI without a GPU."""

import numpy as np
import pytest

import kvsift as ks
from kvsift.graphs import GraphSet, graph_set


def build(n, d, seed):
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((n, d)).astype(np.float32)
    train = rng.standard_normal((n // 4, d)).astype(np.float32) + 0.5
    return ks.RoarGraphIndex(keys, train, nq=20, M=12, L=60, threads=1)


@pytest.fixture(scope="module")
def indexes():
    return [build(300, 16, 1), build(170, 16, 2)]


def test_adjacency_rows_are_the_graphs_neighbours_padded(indexes):
    idx = indexes[0]
    full = idx.adjacency()
    assert full.dtype == np.uint32 and full.shape == (idx.size, idx.max_degree)
    pad = np.uint32(0xFFFFFFFF)
    for row in full:
        live = row[row != pad]
        assert np.all(row[: len(live)] != pad) and np.all(row[len(live):] == pad)  # pads last
        assert len(set(live.tolist())) == len(live) and np.all(live < idx.size)
    assert np.all((full != pad).sum(1) >= 1)  # a built graph has no isolated node
    wide = idx.adjacency(width=idx.max_degree + 5)
    assert np.array_equal(wide[:, : idx.max_degree], full) and np.all(wide[:, idx.max_degree:] == pad)
    cut = idx.adjacency(width=4)
    assert np.array_equal(cut, full[:, :4])  # the first neighbours, as degree_cap takes them


def test_adjacency_agrees_with_the_cpu_search(indexes):
    # A search that may only expand each node's first 4 neighbours finds only ids reachable
    # from the entry points through the cut table.
    idx = indexes[0]
    cut = idx.adjacency(width=4)
    seen, todo = set(), [int(e) for e in idx.entry_points]
    while todo:
        u = todo.pop()
        if u in seen:
            continue
        seen.add(u)
        todo.extend(int(v) for v in cut[u] if v != 0xFFFFFFFF)
    q = np.random.default_rng(3).standard_normal((20, 16)).astype(np.float32)
    ids = np.asarray(idx.search(q, 10, L=40, degree_cap=4).ids).ravel()
    assert len(ids[ids >= 0]) == 200 and set(ids[ids >= 0].tolist()) <= seen


def test_memory_counts_the_padded_rows_and_the_edges(indexes):
    for idx in indexes:
        m = idx.memory
        full = idx.adjacency()
        edges = int((full != np.uint32(0xFFFFFFFF)).sum())
        assert m["adjacency"] == full.size * 4 and m["degrees"] == idx.size * 4
        assert m["entries"] == len(idx.entry_points) * 4
        assert m["total"] == m["adjacency"] + m["degrees"] + m["entries"]
        assert m["edges"] == edges and m["compact"] == (idx.size + 1) * 8 + edges * 4


def test_entry_points_start_with_the_entry_point(indexes):
    for idx in indexes:
        e = idx.entry_points
        assert e.dtype == np.uint32 and len(e) >= 1 and e[0] == idx.entry_point
        assert np.all(e < idx.size)


def test_graph_set_stacks_the_indexes(indexes):
    gs = graph_set(indexes)
    assert isinstance(gs, GraphSet)
    w = max(i.max_degree for i in indexes)
    assert gs.adjacency.dtype == np.int32 and gs.adjacency.shape == (300 + 170, w)
    assert gs.row_offset.dtype == np.int64 and gs.row_offset.tolist() == [0, 300, 470]
    assert gs.max_keys == 300
    for g, idx in enumerate(indexes):
        rows = gs.adjacency[gs.row_offset[g] : gs.row_offset[g + 1]]
        assert np.array_equal(rows.view(np.uint32), idx.adjacency(width=w))
        e = idx.entry_points
        assert np.array_equal(gs.entries[g, : len(e)].view(np.uint32), e)
        assert np.all(gs.entries[g, len(e):] == -1)
    assert graph_set(indexes, width=3).adjacency.shape == (470, 3)


def test_graph_set_with_capacity_leaves_empty_rows_and_sizes(indexes):
    # Room to grow into (kvsift.cuda.batch_insert): every graph gets `capacity` rows, its own
    # first, the rest empty; sizes says how many keys each holds.
    gs = graph_set(indexes, capacity=320)
    w = max(i.max_degree for i in indexes)
    assert gs.adjacency.shape == (640, w) and gs.row_offset.tolist() == [0, 320, 640]
    assert gs.max_keys == 320 and gs.sizes.dtype == np.int32 and gs.sizes.tolist() == [300, 170]
    for g, idx in enumerate(indexes):
        rows = gs.adjacency[320 * g : 320 * (g + 1)]
        assert np.array_equal(rows[: idx.size].view(np.uint32), idx.adjacency(width=w))
        assert np.all(rows[idx.size :] == -1)
    assert graph_set(indexes).sizes is None  # without capacity every row is a key
    moved = gs.map(lambda a: a.copy())
    assert moved.max_keys == 320 and np.array_equal(moved.sizes, gs.sizes)
    with pytest.raises(ValueError, match="capacity"):
        graph_set(indexes, capacity=299)


def test_insertable_index_exposes_its_graph_and_insert_state():
    # What kvsift.cuda.insert_state reads: the graph as a table, its entry points, the training
    # queries and their kNN lists as they stand after inserts.
    rng = np.random.default_rng(4)
    keys = rng.standard_normal((260, 16)).astype(np.float32)
    train = rng.standard_normal((70, 16)).astype(np.float32)
    idx = ks.InsertableGraphIndex(keys[:200], train, nq=10, M=6, L=40, threads=1,
                                  query_candidates=0)  # every list stays exact
    idx.insert(keys[200:])
    adj = idx.adjacency()
    assert adj.shape == (260, idx.max_degree) and idx.dim == 16
    assert np.all(adj[adj != 0xFFFFFFFF] < 260)
    assert idx.entry_points.dtype == np.uint32 and np.all(idx.entry_points < 200)
    assert np.array_equal(idx.train_queries(), train)
    ids, scores = idx.query_knn()
    assert ids.shape == scores.shape == (70, 10)
    want = np.argsort(-(train @ keys.T), axis=1, kind="stable")[:, :10]
    # Exact lists (scores best first) over every key, inserted ones included: compare scores.
    assert np.allclose(scores, np.take_along_axis(train @ keys.T, want, 1), atol=1e-4)
    assert idx.adjacency(width=3).shape == (260, 3)


def test_bad_input_is_refused(indexes):
    with pytest.raises(ValueError, match="at least one"):
        graph_set([])
    with pytest.raises(TypeError, match="RoarGraphIndex"):
        graph_set([ks.FlatIndex(np.zeros((4, 16), np.float32))])
    with pytest.raises(ValueError, match="width >= 0"):
        graph_set(indexes, width=-1)
    with pytest.raises(Exception, match="0 <= width <= 65536"):
        indexes[0].adjacency(width=-1)
    with pytest.raises(Exception, match="0 <= width <= 65536"):
        indexes[0].adjacency(width=1 << 40)
