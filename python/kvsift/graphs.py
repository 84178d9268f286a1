"""Host-side helpers for kvsift.cuda's decode step: RoarGraph indexes stacked into the
fixed-width arrays the GPU decode search reads, and routing sets stacked for its routing pass.
NumPy and the CPU extension only, importable without the CUDA extension (kvsift.cuda
re-exports these names)."""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple

import numpy as np

__all__ = ["GraphSet", "graph_set", "RouteStack", "route_stack"]


class GraphSet(NamedTuple):
    """RoarGraph indexes stacked for ``kvsift.cuda.decode_step``: graph g is rows
    ``row_offset[g] : row_offset[g + 1]`` of ``adjacency``, of which it holds the first
    ``sizes[g]`` keys (all of them when ``sizes`` is None; the rest are room to grow into with
    ``kvsift.cuda.batch_insert``)."""

    adjacency: Any  #: int32 [total rows, width]: row u = u's neighbours, -1 (0xFFFFFFFF) pads
    row_offset: Any  #: int64 [graphs + 1]
    entries: Any  #: int32 [graphs, max entry points], -1 pads
    max_keys: int  #: rows of the largest graph
    sizes: Any = None  #: int32 [graphs]: keys graph g holds now, or None (every row)

    def map(self, f) -> "GraphSet":
        """The same set with ``f`` applied to every array (e.g. ``lambda a:
        torch.from_numpy(a).cuda()`` to move it to the device)."""
        return GraphSet(f(self.adjacency), f(self.row_offset), f(self.entries), self.max_keys,
                        None if self.sizes is None else f(self.sizes))


def graph_set(indexes: Iterable[Any], *, width: int = 0, capacity: int = 0) -> GraphSet:
    """Stacks RoarGraphIndex or InsertableGraphIndex objects (one per (request, KV head), in the
    order of the page table's rows) into a GraphSet of NumPy arrays. Move them to the device
    with your framework, e.g. ``gs.map(lambda a: torch.from_numpy(a).cuda())``. ``width``
    cuts or pads every row to that many neighbours (0 = the largest max_degree; the GPU search
    reads at most 256). ``capacity`` > 0 gives every graph that many rows, its keys first and
    the rest empty, and sets ``sizes``: room for ``kvsift.cuda.batch_insert`` to add generated
    keys in place (graph g's key i is then key row ``g * capacity + i``). O(graphs * rows *
    width); copies.

    Raises ValueError for no indexes, a negative width or a capacity below an index's size,
    TypeError for objects that are not graph indexes.
    """
    idx = list(indexes)
    if not idx:
        raise ValueError("graph_set: expected at least one RoarGraphIndex, got none")
    for i in idx:
        if not hasattr(i, "adjacency"):
            raise TypeError("graph_set: expected RoarGraphIndex or InsertableGraphIndex objects, "
                            f"got {type(i).__name__}")
    if int(width) < 0:
        raise ValueError(f"graph_set: expected width >= 0 (0 = max_degree), got {width}")
    w = int(width) or max(max(i.max_degree for i in idx), 1)
    sizes = [int(i.size) for i in idx]
    cap = int(capacity)
    if cap < 0 or (cap and cap < max(sizes)):
        raise ValueError(f"graph_set: expected capacity 0 or >= every index's size (largest "
                         f"{max(sizes)}), got {capacity}")
    rows = [cap] * len(idx) if cap else sizes
    adjacency = np.full((sum(rows), w), -1, dtype=np.int32)
    row_offset = np.zeros(len(idx) + 1, dtype=np.int64)
    row_offset[1:] = np.cumsum(rows)
    for g, i in enumerate(idx):
        start = int(row_offset[g])
        adjacency[start: start + sizes[g]] = np.asarray(i.adjacency(width=w)).view(np.int32)
    eps = [np.asarray(i.entry_points) for i in idx]
    entries = np.full((len(idx), max(max(len(e) for e in eps), 1)), -1, dtype=np.int32)
    for g, e in enumerate(eps):
        entries[g, : len(e)] = e.view(np.int32)
    key_counts = np.asarray(sizes, dtype=np.int32) if cap else None
    return GraphSet(adjacency, row_offset, entries, max(max(rows), 1), key_counts)


class RouteStack(NamedTuple):
    """RouteSets stacked for ``kvsift.cuda.route_seeds`` (kvsift::route_set_stack): graph g's
    routing rows are ``offset[g] : offset[g + 1]`` of ``vectors`` and ``lists``; when the sets
    are clustered, its clusters are centroid rows ``cluster_offset[g] : cluster_offset[g + 1]``
    and cluster c holds the rows ``cluster_rows[c] : cluster_rows[c + 1]``."""

    vectors: Any  #: float32 [total rows, dim], unit norm (route in float16 with ``.map``)
    lists: Any  #: int32 [total rows, list_len]: key ids of graph g, -1 (INVALID_ID) pads
    offset: Any  #: int64 [graphs + 1]
    centroids: Any  #: float32 [total clusters, dim], or None: not clustered
    cluster_offset: Any  #: int64 [graphs + 1], or None
    cluster_rows: Any  #: int64 [total clusters + 1] (global rows), or None
    max_rows: int  #: most rows of one graph
    max_clusters: int  #: most clusters of one graph (0: not clustered)
    max_cluster_rows: int  #: most rows of one cluster (0: not clustered)

    def map(self, f) -> "RouteStack":
        """The same stack with ``f`` applied to every array (e.g. ``lambda a:
        torch.from_numpy(a).cuda()``); the vectors and centroids may change dtype (float16,
        bfloat16), the integer arrays must keep theirs."""
        g = (lambda a: None if a is None else f(a))
        return RouteStack(f(self.vectors), f(self.lists), f(self.offset), g(self.centroids),
                          g(self.cluster_offset), g(self.cluster_rows), self.max_rows,
                          self.max_clusters, self.max_cluster_rows)


def route_stack(sets: Iterable[Any]) -> RouteStack:
    """Stacks RouteSet objects (one per graph, in the GraphSet's order; one set may appear more
    than once) into a RouteStack of NumPy arrays for ``kvsift.cuda.route_seeds``: the layout of
    kvsift::stack_route_sets. Sets may differ in ``list_len`` (shorter lists are INVALID_ID
    padded, which the searches skip) and in rows (a set of no rows routes nothing); those with
    rows share ``dim`` and are all clustered or all not. O(total rows * (dim + list_len));
    copies.

    Raises ValueError for no sets, a set whose arrays disagree, clustered and flat sets mixed,
    sets of different dims; TypeError for objects that are not RouteSets.
    """
    from . import _kvsift

    items = list(sets)
    for s in items:
        if not isinstance(s, _kvsift.RouteSet):
            raise TypeError(f"route_stack: expected RouteSet objects, got {type(s).__name__}")
    fields = list(_kvsift._stack_route_sets(items))
    fields[1] = fields[1].view(np.int32)  # as GraphSet's ids: torch has few uint32 operations
    return RouteStack(*fields)
