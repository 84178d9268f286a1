"""Host-side helpers for kvsift.cuda's decode step: RoarGraph indexes stacked into the
fixed-width arrays the GPU decode search reads. Pure NumPy, importable without the CUDA
extension (kvsift.cuda re-exports both names)."""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple

import numpy as np

__all__ = ["GraphSet", "graph_set"]


class GraphSet(NamedTuple):
    """RoarGraph indexes stacked for ``kvsift.cuda.decode_step``: graph g is rows
    ``row_offset[g] : row_offset[g + 1]`` of ``adjacency``."""

    adjacency: Any  #: int32 [total keys, width]: row u = u's neighbours, -1 (0xFFFFFFFF) pads
    row_offset: Any  #: int64 [graphs + 1]
    entries: Any  #: int32 [graphs, max entry points], -1 pads
    max_keys: int  #: keys of the largest graph


def graph_set(indexes: Iterable[Any], *, width: int = 0) -> GraphSet:
    """Stacks RoarGraphIndex objects (one per (request, KV head), in the order of the page
    table's rows) into a GraphSet of NumPy arrays. Move them to the device with your framework,
    e.g. ``GraphSet(*(torch.from_numpy(a).cuda() for a in gs[:3]), gs.max_keys)``. ``width``
    cuts or pads every row to that many neighbours (0 = the largest max_degree; the GPU search
    reads at most 256). O(total keys * width); copies.

    Raises ValueError for no indexes or a negative width, TypeError for objects that are not
    RoarGraphIndex.
    """
    idx = list(indexes)
    if not idx:
        raise ValueError("graph_set: expected at least one RoarGraphIndex, got none")
    for i in idx:
        if not hasattr(i, "adjacency"):
            raise TypeError(f"graph_set: expected RoarGraphIndex objects, got {type(i).__name__}")
    if int(width) < 0:
        raise ValueError(f"graph_set: expected width >= 0 (0 = max_degree), got {width}")
    w = int(width) or max(max(i.max_degree for i in idx), 1)
    sizes = [int(i.size) for i in idx]
    adjacency = np.concatenate([np.asarray(i.adjacency(width=w)) for i in idx]).view(np.int32)
    row_offset = np.zeros(len(idx) + 1, dtype=np.int64)
    row_offset[1:] = np.cumsum(sizes)
    eps = [np.asarray(i.entry_points) for i in idx]
    entries = np.full((len(idx), max(max(len(e) for e in eps), 1)), -1, dtype=np.int32)
    for g, e in enumerate(eps):
        entries[g, : len(e)] = e.view(np.int32)
    return GraphSet(adjacency, row_offset, entries, max(max(sizes), 1))
