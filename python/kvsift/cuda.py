"""kvsift's CUDA kernels on device tensors: LSE merges, paged sparse attention, the batched
graph search of a decode step and the whole step, the GPU index build, exact kNN, page copies
between pinned host memory and the device, and the bucketed LRU that decides which pages stay
on the device.

Shapes follow FlashInfer, so states interoperate: a partial attention state is ``v``
``[seq, heads, dim]`` (float32, float16 or bfloat16) with ``s`` ``[seq, heads]`` float32, the
log-sum-exp of the state's logits. ``lse_base`` says which logarithm ``s`` uses: ``"e"``
(natural, kvsift's and PyTorch's convention) or ``2`` (FlashInfer's). Tensors come from any
DLPack producer on the current CUDA device (torch, CuPy, JAX) and are read in place; outputs
are allocated by the inputs' own framework, so results are ordinary torch (or CuPy) tensors.
Nothing is copied: a tensor on the host, on another device, of another dtype or not
contiguous is refused with a message naming the fix.

Every call is enqueued on the caller's current stream (``torch.cuda.current_stream()`` for
torch tensors, CuPy's current stream for CuPy arrays) unless ``stream=`` names another
(a ``torch.cuda.Stream``, a ``cupy.cuda.Stream`` or a raw ``cudaStream_t`` integer), and
returns without synchronising.

Bad values on the device (an lse of NaN or +inf, token ids out of range) cannot be checked
before the launch without a synchronisation; pass ``status=`` (an int32 device tensor of shape
(1,) that you zeroed) and the kernels OR a non-zero code into it (see kvsift::cuda's docs), as
the C++ API does. Needs the extension ``kvsift._kvsift_cuda``: build the package with
``-C cmake.define.KVSIFT_PY_CUDA=ON`` (pip) or ``-DKVSIFT_PY_CUDA=ON`` (CMake).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

try:
    from . import _kvsift_cuda as _ext
except ImportError as e:  # pragma: no cover - depends on the build
    raise ImportError(
        "kvsift.cuda needs the extension kvsift._kvsift_cuda, which this build of kvsift does not "
        "have; rebuild with pip install ./python -C cmake.define.KVSIFT_PY_CUDA=ON (nvcc 12+)"
    ) from e

CudaError = _ext.CudaError
current_device = _ext.current_device

from .graphs import GraphSet, RouteStack, graph_set, route_stack  # noqa: E402  (host side)

_LN2 = math.log(2.0)

__all__ = ["merge_state", "merge_state_in_place", "merge_states", "sparse_attention",
           "decode_search", "DecodeSearchResult", "decode_search_capacity", "results_to_csr",
           "decode_step", "GraphSet",
           "graph_set", "RouteStack", "route_stack", "route_seeds", "InsertState", "insert_state", "batch_insert", "build_index",
           "build_indexes", "knn",
           "gather_pages", "scatter_pages", "BucketedLRU", "LruStep", "OffloadedKV", "CudaError",
           "current_device"]


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


_torch_dl = None  # torch.utils.dlpack.to_dlpack, imported on first use (torch is optional)


def _dl(*tensors):
    """Torch tensors as DLPack capsules from torch's C export (about 0.25 us each; the
    Python-level ``Tensor.__dlpack__`` costs about 15 us, which dominated a small merge);
    everything else as it is (the extension calls its ``__dlpack__``). No stream handshake is
    needed for torch: the kernel runs on the stream the caller's work is ordered on (its current
    stream, or the ``stream=`` it names and is responsible for)."""
    global _torch_dl
    out = []
    for t in tensors:
        if t is not None and _is_torch(t):
            if _torch_dl is None:
                from torch.utils.dlpack import to_dlpack as _torch_dl
            t = _torch_dl(t)
        out.append(t)
    return out


def _stream(like, stream) -> int:
    """The cudaStream_t (as an integer) to enqueue on: `stream` when given, else the current
    stream of `like`'s framework, else the legacy default stream (0)."""
    if stream is not None:
        for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
            if hasattr(stream, attr):
                return int(getattr(stream, attr))
        return int(stream)
    if _is_torch(like):
        device = like.device
        if device.type != "cuda":
            return 0  # refused by the extension with the fix named; torch would raise first
        import torch

        # The raw handle (0.1 us) rather than a torch.cuda.Stream object (2.8 us, measured with
        # bench/cuda/merge_overhead.py --breakdown); the public call where torch lacks it.
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return int(raw(device.index))
        return int(torch.cuda.current_stream(device).cuda_stream)
    if type(like).__module__.startswith("cupy"):
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)
    return 0


class _on_stream:
    """Runs the framework-side work of a call (base-2 scalings, output allocation) on the
    stream the kernel uses, so an explicit ``stream=`` orders them like the kernel."""

    def __init__(self, like, stream, explicit):
        self.ctx = None
        if explicit and _is_torch(like):
            import torch

            self.ctx = torch.cuda.stream(torch.cuda.ExternalStream(stream, device=like.device))
        elif explicit and type(like).__module__.startswith("cupy"):
            import cupy

            self.ctx = cupy.cuda.ExternalStream(stream)

    def __enter__(self):
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *exc):
        if self.ctx is not None:
            self.ctx.__exit__(*exc)


def _empty(like, shape, dtype=None):
    """An uninitialised tensor of `like`'s framework and device."""
    if _is_torch(like):
        import torch

        if dtype is None and tuple(like.shape) == tuple(shape):  # half the cost of torch.empty
            return torch.empty_like(like, memory_format=torch.contiguous_format)
        return torch.empty(shape, dtype=like.dtype if dtype is None else getattr(torch, dtype),
                           device=like.device)
    if type(like).__module__.startswith("cupy"):
        import cupy

        return cupy.empty(shape, dtype=like.dtype if dtype is None else dtype)
    raise TypeError(f"kvsift.cuda: outputs can be allocated for torch and CuPy inputs, got "
                    f"{type(like).__name__}")


def _check_base(lse_base) -> bool:
    """True for base 2, False for base e; anything else is an error."""
    if lse_base in ("e", math.e):
        return False
    if lse_base in (2, "2"):
        return True
    raise ValueError(f"lse_base: expected 'e' (natural log) or 2, got {lse_base!r}")


_UNLOADED = object()
_torch_ext = _UNLOADED  # kvsift._kvsift_torch, None without that module


def _load_torch_ext():
    """kvsift._kvsift_torch (built with KVSIFT_PY_TORCH=ON: the merge on at::Tensor; importing
    it also registers torch.ops.kvsift.merge_state), or None when this build has none."""
    global _torch_ext
    try:
        import torch  # noqa: F401  (the module needs torch's libraries loaded first)

        from . import _kvsift_torch
    except ImportError:
        _torch_ext = None
    else:
        _torch_ext = _kvsift_torch
    return _torch_ext


def merge_state(v_a, s_a, v_b, s_b, *, out=None, lse_base="e", stream=None, status=None):
    """Merges two partial attention states per (position, head), like FlashInfer's
    ``merge_state``: returns ``(v, s)``, the state over the union of both token sets.

    v_a, v_b: [seq, heads, dim] float32/float16/bfloat16 (same dtype); s_a, s_b: [seq, heads]
    float32 in base ``lse_base``. An empty state (s = -inf) is the identity. ``out``: a
    ``(v, s)`` pair of the caller's tensors to write (no allocation, CUDA-graph friendly);
    returned. O(seq * heads * dim), one kernel launch (plus two tiny scalings when lse_base is
    2). Torch tensors with natural lse, the current stream and no status word take
    ``kvsift._kvsift_torch`` (torch's C++ API) when the package was built with it
    (``KVSIFT_PY_TORCH=ON``): the same kernel and checks at under half the per-call cost
    (docs/performance.md).
    """
    if lse_base == "e" and stream is None and status is None and _is_torch(v_a):
        ext = _torch_ext if _torch_ext is not _UNLOADED else _load_torch_ext()
        if ext is not None:
            if out is None:
                return ext.merge_state(v_a, s_a, v_b, s_b)
            ext.merge_state_out(v_a, s_a, v_b, s_b, out[0], out[1])
            return out[0], out[1]
    base2 = _check_base(lse_base)
    st = _stream(v_a, stream)
    with _on_stream(v_a, st, stream is not None):
        if base2:
            s_a, s_b = s_a * _LN2, s_b * _LN2
        v, s = out if out is not None else (_empty(v_a, tuple(v_a.shape)),
                                            _empty(s_a, tuple(s_a.shape)))
        _ext.merge_state(*_dl(v_a, s_a, v_b, s_b, v, s), st, *_dl(status))
        if base2:
            s *= 1.0 / _LN2
    return v, s


def merge_state_in_place(v, s, v_other, s_other, *, lse_base="e", stream=None, status=None):
    """In place: ``(v, s) <- merge((v, s), (v_other, s_other))``, writing the caller's tensors
    (FlashInfer's ``merge_state_in_place``). A row with an invalid lse is left unchanged."""
    base2 = _check_base(lse_base)
    st = _stream(v, stream)
    with _on_stream(v, st, stream is not None):
        if base2:
            s *= _LN2
            s_other = s_other * _LN2
        _ext.merge_state_in_place(*_dl(v, s, v_other, s_other), st, *_dl(status))
        if base2:
            s *= 1.0 / _LN2


def merge_states(v, s, indptr, *, lse_base="e", stream=None, status=None):
    """Variable-length merge (FlashInfer's ``variable_length_merge_states``): position p merges
    the states ``indptr[p] .. indptr[p + 1]`` of ``v`` [num_states, heads, dim] / ``s``
    [num_states, heads]; ``indptr`` is int64 [num_pos + 1], non-decreasing (on the device, not
    checked). Returns ``(v_out [num_pos, heads, dim], s_out [num_pos, heads])``; a position
    with no state gets the empty state."""
    base2 = _check_base(lse_base)
    st = _stream(v, stream)
    with _on_stream(v, st, stream is not None):
        if base2:
            s = s * _LN2
        num_pos = int(indptr.shape[0]) - 1
        v_out = _empty(v, (num_pos, int(v.shape[1]), int(v.shape[2])))
        s_out = _empty(s, (num_pos, int(s.shape[1])))
        _ext.merge_states(*_dl(v, s, indptr, v_out, s_out), st, *_dl(status))
        if base2:
            s_out *= 1.0 / _LN2
    return v_out, s_out


def sparse_attention(q, k_pages, v_pages, page_table, indptr, ids, *, scale=None, num_splits=0,
                     lse_base="e", stream=None, status=None):
    """Decode attention of each query head over its own list of tokens in head-wise paged K/V.

    q: [qo_heads, dim] float32, one decode query per head. k_pages, v_pages: [num_pages,
    page_size, dim] (float32/float16/bfloat16, same dtype); token t of KV head g lives in page
    ``page_table[g, t // page_size]``, row ``t % page_size``; page_table: int32 [kv_heads,
    max_pages_per_head]. Query head h reads KV head ``h // (qo_heads // kv_heads)`` (GQA) and
    attends to the tokens ``ids[indptr[h] : indptr[h + 1]]`` (CSR: indptr int64 [qo_heads + 1],
    ids int32). dim must be 64, 128 or 256. ``scale`` defaults to 1 / sqrt(dim).
    ``num_splits``: blocks per head (0 = chosen from the device). Returns ``(o [qo_heads, dim]
    float32, lse [qo_heads] float32)``, a partial state ready for merge_state. O(total tokens *
    dim), two launches at most; the workspace comes from the inputs' framework's allocator.
    """
    base2 = _check_base(lse_base)
    st = _stream(q, stream)
    heads, dim = int(q.shape[0]), int(q.shape[1])
    with _on_stream(q, st, stream is not None):
        o = _empty(q, (heads, dim), "float32")
        lse = _empty(q, (heads,), "float32")
        ws_bytes = _ext.sparse_attention_workspace_size(heads, dim, num_splits)
        ws = _empty(q, (ws_bytes,), "uint8") if ws_bytes > 0 else None
        _ext.sparse_attention(*_dl(q, k_pages, v_pages, page_table, indptr, ids, o, lse, ws),
                              float("nan") if scale is None else float(scale), int(num_splits), st,
                              *_dl(status))
        if base2:
            lse *= 1.0 / _LN2
    return o, lse


class DecodeSearchResult(NamedTuple):
    """Padded result rows of ``decode_search``, one per query (``results_to_csr`` packs them
    for ``sparse_attention``)."""

    ids: object  #: int32 [queries, capacity]: top-k best first, DIPR in discovery order; -1 pads
    scores: object  #: float32 [queries, capacity]: raw scores (q.k, or the squared l2 distance)
    counts: object  #: int32 [queries]: results in each row
    scored: object  #: int32 [queries]: vectors scored by each search (its cost)
    best: object  #: float32 [queries]: DIPR's best raw score seen (seed included); None for top-k
    #: int32 [queries]: DIPR, 1 where the search hit ``max_results`` (its answer may be
    #: incomplete: attention too flat for the cap); None for top-k
    capped: object = None


def _graph_fields(graphs):
    """(adjacency, row_offset, entries, max_keys, sizes) of a GraphSet or a plain 4- or 5-tuple."""
    fields = tuple(graphs)
    if len(fields) not in (4, 5):
        raise ValueError("graphs: expected a GraphSet (adjacency, row_offset, entries, max_keys"
                         f"[, sizes]), got {len(fields)} fields")
    return fields if len(fields) == 5 else fields + (None,)


def _paged_keys(keys, pages, who):
    """(k_pages, page_table) of `pages`, (None, None) for dense keys; exactly one of the two."""
    if (keys is None) == (pages is None):
        got = "neither" if keys is None else "both"
        raise ValueError(f"{who}: expected the keys either dense (keys=) or paged "
                         f"(pages=(k_pages, page_table)), got {got}")
    return (None, None) if pages is None else pages


def _graph_of(like, m, groups, graph):
    """`graph` as given, or, when None, the GQA order: int32 [m], query i -> graph
    i // (m // groups), in `like`'s framework. Raises ValueError when m is not a multiple of
    the graphs (a graph id per query is then needed)."""
    if graph is not None:
        return graph
    if groups < 1 or m % groups != 0:
        raise ValueError(f"graph: queries ({m}) are not a multiple of the graphs "
                         f"({groups}); pass graph= (int32 [queries])")
    if _is_torch(like):
        import torch

        return torch.div(torch.arange(m, device=like.device, dtype=torch.int32), m // groups,
                         rounding_mode="floor")
    import cupy

    return (cupy.arange(m, dtype=cupy.int32) // (m // groups)).astype(cupy.int32)


def decode_search(graphs, q, keys=None, *, pages=None, graph=None, mode="topk", metric="ip",
                  k=100, L=128, expand_width=1, walk_through=True, degree_cap=0, beta=1.0, l0=64,
                  max_results=0, seed_score=None, id_range=None, seeds=None, expand_limit=0,
                  max_hops=0, entry_prefix=0,
                  stream=None, status=None):
    """Batched graph search on the GPU: every query over its own graph in one launch (a block
    of four or eight warps per top-k search, one warp per DIPR search), the retrieval stage of a
    decode step on its own. With ``expand_width=1`` the results equal the CPU's
    ``RoarGraphIndex.search`` / ``dipr`` id for id (the same walk).

    graphs: a ``GraphSet`` (``graph_set(indexes)``) with its three arrays on the device.
    q: [queries, dim] float32. The keys, where they live, either ``keys`` (a dense
    [adjacency rows, dim] tensor, graph g's key i at row ``row_offset[g] + i``) or
    ``pages=(k_pages, page_table)`` (head-wise paged K, [num_pages, page_size, dim], and an int32
    page table whose row g holds graph g's tokens), float32, float16 or bfloat16; nothing is
    copied. ``graph``: int32 [queries], the graph of each query; None = GQA order, query i
    searches graph ``i // (queries // graphs)``.

    ``mode`` "topk": the best ``k`` of a pool of ``L`` (k <= L <= 1024). "dipr": every key
    within ``beta`` raw score units (unscaled q.k) of the best, exploration beam ``l0``, at
    most ``max_results`` (0 = 64 * l0); ``seed_score`` (float32 [queries], NaN = none) is the
    best score already seen elsewhere (the window). ``metric`` "ip" or "l2".
    ``expand_width`` (1..32 for top-k, 1..8 for DIPR): nodes expanded per step; more cuts the
    search's sequential steps at some extra scoring (16 was the fastest for 256-512 queries at
    128K tokens on the H200, 8 for 1024). ``degree_cap`` > 0 reads each node's first neighbours only.
    ``id_range=(first, last)``: int32/uint32 [queries] each, only ids in [first, last) are
    returned (the walk crosses the others with the 2-hop rule unless ``walk_through=False``,
    top-k only, which drops them).
    ``seeds``: int32/uint32 [queries, s], each query's own entry points after its graph's
    (the CPU's ``extra_entries``), e.g. the previous decode step's ``ids`` as returned (-1
    padding is skipped). ``expand_limit`` (top-k, 0..L, 0 = L): only the pool's best
    ``expand_limit`` entries are expanded. Together they warm-start a decode step from the
    last one: on Gemma-3 layer 11 at 32K, recall@100 0.95 in 1.33x less time and half the keys
    scored (docs/decode_search.md); without seeds a limit only loses recall. ``max_hops``
    (top-k, >= 0, 0 = no cap): a search expands at most that many nodes (the CPU's
    ``max_hops``); a launch waits for its slowest search, so a cap with a larger pool is
    faster at equal recall: 512 searches at 131072 keys, expand_width 16, L 256 with
    max_hops 272 reached recall@100 0.951 in 0.350 ms against 0.384 ms uncapped at L 224
    (H200, docs/decode_search.md). DIPR takes the same cap: a search about to expand one node
    more stops and is capped (``capped`` in the result), as at ``max_results``.
    ``entry_prefix`` (0..max seeds, 0 = none): each search also enters its graph at ids
    [0, entry_prefix) after the entry points and ``seeds`` (a decode step's sinks, which on real
    models neighbour the queries' best keys), as the CPU's ``entry_prefix``.

    Returns a ``DecodeSearchResult`` of tensors of q's framework. The workspace comes from q's
    framework's allocator. ``status``: int32 device word that you zeroed, ORed with bits of
    kvsift::cuda's decode_status (1 bad graph, 2 bad id, 4 a capped DIPR search, 8 a bad
    filter or seed). Work per query O(hops * width * dim); asynchronous, no synchronisation.

    Raises ValueError for bad parameters or shapes (naming the expected values), TypeError
    for a tensor that cannot be used in place.
    """
    st = _stream(q, stream)
    m = int(q.shape[0])
    adjacency, row_offset, entries, max_keys, sizes = _graph_fields(graphs)
    num_graphs = int(entries.shape[0])
    k_pages, page_table = _paged_keys(keys, pages, "decode_search")
    first, last = (None, None) if id_range is None else id_range
    knobs = (str(mode), str(metric), int(k), int(L), int(expand_width), bool(walk_through),
             int(degree_cap), float(beta), int(l0), int(max_results), int(expand_limit),
             int(max_hops))
    capacity, ws_bytes = _ext.decode_search_sizes(num_graphs, int(adjacency.shape[0]),
                                                  int(adjacency.shape[1]), int(entries.shape[1]),
                                                  int(max_keys), m, *knobs, int(entry_prefix))
    with _on_stream(q, st, stream is not None):
        graph = _graph_of(q, m, num_graphs, graph)
        ids = _empty(q, (m, capacity), "int32")
        scores = _empty(q, (m, capacity), "float32")
        counts = _empty(q, (m,), "int32")
        scored = _empty(q, (m,), "int32")
        best = _empty(q, (m,), "float32") if mode == "dipr" else None
        capped = _empty(q, (m,), "int32") if mode == "dipr" else None
        ws = _empty(q, (max(ws_bytes, 1),), "uint8")
        _ext.decode_search(*_dl(adjacency, row_offset, entries), int(max_keys),
                           *_dl(q, keys, k_pages, page_table, graph, seed_score, first, last,
                                seeds, ids, scores, counts, scored, best, capped, ws),
                           *knobs, st, *_dl(status, sizes), int(entry_prefix))
    return DecodeSearchResult(ids, scores, counts, scored, best, capped)


def _route_fields(routes, probe, who):
    """A RouteStack's nine fields, checked: ``who`` names the probe argument in the message."""
    fields = tuple(routes)
    if len(fields) != 9:
        raise ValueError("routes: expected a RouteStack (vectors, lists, offset, centroids, "
                         "cluster_offset, cluster_rows, max_rows, max_clusters, "
                         f"max_cluster_rows), got {len(fields)} fields")
    if probe and fields[3] is None:
        raise ValueError(f"{who} {probe} needs a clustered RouteStack (cluster the RouteSets "
                         "with RouteSet.cluster before route_stack)")
    return fields


def route_seeds(routes, q, *, top=4, group=1, probe=0, graph=None, stream=None, status=None):
    """Seeds for cold decode searches on the GPU: every query scores its graph's routing rows
    (inner product) and the lists of the best ``top`` become its seeds, concatenated, the GPU
    counterpart of ``RouteSet.seeds`` (kvsift::cuda::route_seeds). Pass them as
    ``decode_search(seeds=...)`` with an ``expand_limit``: on the synthetic decode benchmark
    (H200, 1024 searches over 131072 keys) routing plus search took 0.156 ms against 0.447 ms
    for the cold search, at recall@100 0.95 (docs/decode_search.md, "Clustered routing").

    routes: a ``RouteStack`` (``route_stack(sets)``, one RouteSet per graph of the GraphSet)
    with its arrays on the device; the vectors and centroids float32, float16 or bfloat16.
    q: [queries, dim] float32. ``graph``: int32 [queries], the graph of each query; None = GQA
    order, query i routes in graph ``i // (queries // graphs)``. ``group`` (1..8): consecutive
    queries sharing a graph (a GQA group's heads) that one block routes together, reading each
    routing vector once. ``probe`` (0..16): with a clustered stack, only the rows of each
    query's ``probe`` best clusters compete (0: every row).

    Returns int32 [queries, top * list_len] of q's framework: the lists of the best routes,
    best first, -1 (INVALID_ID) where a graph has fewer routes and for queries holding NaN or
    Inf. ``status``: int32 device word that you zeroed; bit 1 (bad graph) marks a graph id
    out of range, a graph above ``max_rows`` rows, broken cluster bounds, or a block of queries
    over different graphs (those rows are all -1). Work per group of queries O(rows * dim), or
    with probe O((clusters + probed rows) * dim); asynchronous, no synchronisation.

    Raises ValueError for bad parameters or shapes (naming the expected values), TypeError
    for a tensor that cannot be used in place.
    """
    (vectors, lists, offset, centroids, cluster_offset, cluster_rows, max_rows, max_clusters,
     max_cluster_rows) = _route_fields(routes, probe, "route_seeds: probe")
    st = _stream(q, stream)
    m = int(q.shape[0])
    num_graphs = int(offset.shape[0]) - 1
    ld = _ext.route_seeds_ld(int(lists.shape[1]), int(top), int(group), int(probe))
    with _on_stream(q, st, stream is not None):
        graph = _graph_of(q, m, num_graphs, graph)
        seeds = _empty(q, (m, ld), "int32")
        _ext.route_seeds(*_dl(vectors, lists, offset, centroids, cluster_offset, cluster_rows),
                         int(max_rows), int(max_clusters), int(max_cluster_rows),
                         *_dl(q, graph, seeds), int(top), int(group), int(probe), st,
                         *_dl(status))
    return seeds


def decode_search_capacity(*, mode="topk", k=100, L=128, l0=64, max_results=0):
    """The row length of ``decode_search``'s ``ids`` and of ``decode_step``'s ``carry`` for these
    parameters, as the library sizes them: ``k`` for top-k, ``max_results`` for DIPR (0 = 64 *
    ``l0``, at most the library's cap). Host only, O(1); ValueError for bad parameters."""
    # The library's own rule on a probe graph set of one row, as kvsift::cuda's
    # decode_search_capacity computes it: the capacity does not depend on the graphs.
    return int(_ext.decode_search_sizes(1, 1, 1, 1, 1, 1, str(mode), "ip", int(k), int(L), 1, True,
                                        0, 1.0, int(l0), int(max_results), 0, 0, 0)[0])


def results_to_csr(result, *, stream=None):
    """``DecodeSearchResult`` rows as the CSR lists ``sparse_attention`` reads: ``(indptr int64
    [queries + 1], indices int32 [queries * capacity])``; the first ``indptr[-1]`` indices are
    used (the host does not know that total without a synchronisation, so the array has room
    for every slot). O(queries * capacity), two launches, asynchronous."""
    ids, counts = result.ids, result.counts
    st = _stream(ids, stream)
    m, capacity = int(ids.shape[0]), int(ids.shape[1])
    with _on_stream(ids, st, stream is not None):
        indptr = _empty(ids, (m + 1,), "int64")
        indices = _empty(ids, (m * capacity,), "int32")
        _ext.decode_results_to_csr(*_dl(ids, counts, indptr, indices), st)
    return indptr, indices


def decode_step(graphs, q, k_pages, v_pages, page_table, *, mode="topk", k=100, L=128,
                expand_width=1, walk_through=True, degree_cap=0, beta=1.0, l0=64, max_results=0,
                sink=4, window=512, scale=None, lse_base="e", stream=None, status=None,
                carry=None, expand_limit=0, max_hops=0, dense_when_capped=False,
                seed_from_window=False, capped=None, entry_prefix=0, unindexed=0, routes=None,
                route_top=4, route_group=None, route_probe=0):
    """One decode step of retrieval attention for one layer, on the GPU: the graph search of
    every query head over its KV head's index (the window excluded), then one sparse attention
    pass over the window (the first ``sink`` and last ``window`` tokens) and the retrieved
    tokens together (disjoint sets: attention over their union). Each stage is a launch or two
    on one stream, with no host synchronisation.

    graphs: a ``GraphSet`` (``graph_set(indexes)``) with its three arrays on the
    device; graph g indexes every token of KV head g. q: [qo_heads, dim] float32; query head
    h searches graph ``h // (qo_heads // graphs)`` (GQA). k_pages, v_pages, page_table: as
    ``sparse_attention``, page-table row g = KV head g. ``mode`` "topk" (``k`` of a pool of
    ``L``) or "dipr" (keys within ``beta`` raw score units of the best, pool ``l0``, at most
    ``max_results``); ``expand_width`` nodes expanded per step (1 = the CPU's walk, up to 32 for
    top-k, 8 for DIPR);
    ``walk_through=False`` drops window tokens met by the walk instead of walking through
    them (top-k and DIPR; faster, docs/decode_search.md); ``degree_cap`` > 0 reads each node's first
    neighbours only. Returns ``(o [qo_heads, dim] float32, lse [qo_heads] float32)``: with a
    retrieval that finds every middle token, full attention. The workspace comes from q's
    framework's allocator. ``status``: int32 device word, bits of kvsift::cuda's
    decode_status (bad ids, a capped DIPR search).

    ``carry``: int32 [qo_heads, k] (top-k; DIPR: its result capacity) on the device, the warm
    start: read as each query head's search seeds and overwritten with this step's retrieved
    ids; start it at -1 (no seeds). With ``expand_limit`` (0..L, 0 = L) below L the search
    stops after fewer steps; it pays where consecutive queries of a head share many keys
    (docs/decode_search.md). ``max_hops`` (0 = no cap) caps the nodes a search expands, as
    in ``decode_search`` (a DIPR search that reaches it is capped): with L 256 and 272 hops the B = 16 step at 131072 tokens
    took 0.381-0.387 ms against torch SDPA's 1.897-1.976 ms (H200, docs/decode_search.md).

    ``dense_when_capped`` (DIPR): a query head whose search hit ``max_results`` or ``max_hops``
    (more keys within beta of the best than the caps allow: nearly flat attention) attends every
    token instead
    of the truncated answer, in a second attention pass merged with the first; False (the
    default) attends what the capped walk found. An exact answer for flat heads within a
    bounded search, at the price of their whole context: on Gemma-3 layer 11 a larger top-k
    reaches the same output error with fewer tokens (docs/decode_search.md).

    ``seed_from_window`` (DIPR): each search starts from its head's best raw score over the
    window tokens, so the range is every middle token within ``beta`` of the best token of the
    whole context (window included), as an exact DIPR over the context keeps of the middle;
    False (the default) measures the range from the best middle token, a wider range where the
    window holds the best keys.

    ``capped``: int32 [qo_heads] on the device, written with 1 where the head's DIPR search
    hit ``max_results`` or ``max_hops`` (with ``dense_when_capped``, the heads that attended
    every token), else 0 (always 0 for top-k).

    ``entry_prefix``: each search also enters its graph at ids [0, entry_prefix), e.g.
    ``entry_prefix=sink`` (the sinks, hubs next to most queries' best keys on Gemma-3's layer 11,
    not on its layers 5 and 17): on that layer at 32K, with ``walk_through=False`` and seeded
    DIPR, it gave back the set recall that dropping the walk-through loses, 1.28-1.31x faster
    than the walk-through (docs/decode_search.md).

    ``unindexed`` (0..2^30): tokens past each graph's rows (its ``sizes`` entry, or its rows),
    e.g. generated since the index was built: attended with the window, never searched; the
    page table must map them. The window is then the first ``sink`` tokens and everything from
    ``n_g - window`` to ``n_g + unindexed``.

    ``routes``: a ``RouteStack`` (``route_stack(sets)``, one RouteSet per graph) with its arrays
    on the device: the step routes every query head first (as ``route_seeds`` with
    ``route_top``, ``route_probe``, and ``route_group`` heads a block, default the largest
    divisor of the GQA group up to 8) and its search starts from the lists of the best routes,
    after the ``carry``; pair it with an ``expand_limit`` below L. On the synthetic benchmark
    (H200, 16 requests, 131072 tokens, 16384 routing rows in 256 clusters, probe 1, L 128,
    expand_limit 32) the step took 0.175 ms against 0.277 ms without routes at the same recall
    (docs/decode_search.md, "Routing inside the decode step"); on real keys routing saves less
    (1.3x of the keys scored against the 3x of the synthetic queries).
    """
    base2 = _check_base(lse_base)
    st = _stream(q, stream)
    heads, dim = int(q.shape[0]), int(q.shape[1])
    adjacency, row_offset, entries, max_keys, sizes = _graph_fields(graphs)
    route_fields, route_list_len = None, 0
    if routes is not None:
        route_fields = _route_fields(routes, route_probe, "decode_step: route_probe")
        route_list_len = int(route_fields[1].shape[1])
        route_fields = tuple(_dl(*route_fields[:6])) + route_fields[6:]
        if route_group is None:
            graphs_n = int(entries.shape[0])
            gqa = heads // graphs_n if graphs_n > 0 and heads % graphs_n == 0 else 1
            route_group = max(g for g in range(1, 9) if gqa % g == 0)
    route_knobs = (int(route_top), 1 if route_group is None else int(route_group),
                   int(route_probe))
    knobs = (str(mode), int(k), int(L), int(expand_width), bool(walk_through), int(degree_cap),
             float(beta), int(l0), int(max_results), int(expand_limit), int(max_hops), int(sink),
             int(window), bool(dense_when_capped))
    with _on_stream(q, st, stream is not None):
        o = _empty(q, (heads, dim), "float32")
        lse = _empty(q, (heads,), "float32")
        # Checks max_keys against the adjacency's rows before a workspace is sized by it.
        ws_bytes = _ext.decode_step_workspace_size(int(entries.shape[0]), int(adjacency.shape[0]),
                                                   int(adjacency.shape[1]), int(entries.shape[1]),
                                                   int(max_keys), heads, dim, *knobs,
                                                   bool(seed_from_window), int(entry_prefix),
                                                   int(unindexed), route_list_len, *route_knobs)
        ws = _empty(q, (max(ws_bytes, 1),), "uint8")
        _ext.decode_step(*_dl(adjacency, row_offset, entries), int(max_keys),
                         *_dl(q, k_pages, v_pages, page_table, o, lse, ws), *knobs,
                         float("nan") if scale is None else float(scale), st,
                         *_dl(status, carry, sizes), bool(seed_from_window), *_dl(capped),
                         int(entry_prefix), int(unindexed), route_fields, *route_knobs)
        if base2:
            lse *= 1.0 / _LN2
    return o, lse


class InsertState(NamedTuple):
    """The query side ``batch_insert`` keeps per graph (``insert_state`` makes it on the host;
    ``state.map(lambda a: torch.from_numpy(a).cuda())`` moves it): the training queries of
    every graph's build, their kNN lists as they stand, and per key row the queries whose lists
    hold it. Row numbering follows the GraphSet made with the same ``capacity``."""

    queries: Any  #: float32 [training queries of all graphs, dim]
    query_offset: Any  #: int64 [graphs + 1]: graph g's queries are rows [off[g], off[g + 1])
    max_queries: int  #: the most training queries of one graph
    knn_ids: Any  #: int32 [queries, nq]: each query's kNN keys (graph-local ids), -1 empty
    knn_keys: Any  #: float32 [queries, nq]: their rank keys (inner product, or -l2)
    worst_key: Any  #: float32 [queries]
    best_id: Any  #: int32 [queries]: the list's best key (its pivot)
    best_key: Any  #: float32 [queries]
    holders: Any  #: int32 [rows, holder_capacity]: key -> query lists, ascending, -1 removed
    holder_counts: Any  #: int32 [rows]
    layouts: Any  #: int32 [rows]: per full row, edges its last pruning kept (-1 unknown)

    def map(self, f) -> "InsertState":
        """The same state with ``f`` applied to every array (e.g. to move it to the device)."""
        return InsertState(*(v if isinstance(v, int) else f(v) for v in self))


def insert_state(indexes, *, capacity, holder_capacity=128, train=None, metric="ip"):
    """The query side of ``batch_insert`` for graphs stacked by ``graph_set(indexes,
    capacity=capacity)``, as NumPy arrays (an ``InsertState``). From ``InsertableGraphIndex``
    objects it is their own state (training queries and kNN lists as they stand), so the GPU
    continues where the CPU index is: with equal parameters the GPU inserts give the CPU's graph
    id for id on data whose scores are exact. For ``RoarGraphIndex`` objects (e.g. from
    ``build_index``) pass ``train``: one ``(queries float32 [m, d], knn_ids [m, nq], knn_scores
    float32 [m, nq])`` per index, the build's training queries and their kNN over its keys
    (raw scores, as ``kvsift.cuda.knn`` returns them). ``holder_capacity``: the key -> query
    list length H (as ``InsertableGraphIndex(holder_capacity=)``, 1..1024). O(queries * nq +
    graphs * capacity * H) host work and memory.

    Raises ValueError for a capacity below an index's size, a bad H or a missing ``train``,
    and when the per-graph arrays disagree in dimension or list length.
    """
    idx = list(indexes)
    if not idx:
        raise ValueError("insert_state: expected at least one index, got none")
    cap = int(capacity)
    sizes = [int(i.size) for i in idx]
    if cap < max(sizes):
        raise ValueError(f"insert_state: expected capacity >= every index's size (largest "
                         f"{max(sizes)}), got {capacity}")
    if train is None:
        missing = [type(i).__name__ for i in idx if not hasattr(i, "query_knn")]
        if missing:
            raise ValueError(f"insert_state: {missing[0]} keeps no training queries; pass "
                             "train=[(queries, knn_ids, knn_scores), ...], one per index")
        train = [(i.train_queries(), *i.query_knn()) for i in idx]
    train = list(train)
    if len(train) != len(idx):
        raise ValueError(f"insert_state: expected one train entry per index ({len(idx)}), "
                         f"got {len(train)}")
    parts = []
    for g, (q, ids, scores) in enumerate(train):
        q = np.ascontiguousarray(q, dtype=np.float32)
        ids = np.asarray(ids)
        ids = np.ascontiguousarray(ids.view(np.uint32) if ids.dtype == np.int32
                                   else ids.astype(np.uint32))
        if q.ndim != 2 or ids.ndim != 2 or q.shape[0] != ids.shape[0]:
            raise ValueError(f"insert_state: graph {g}: expected queries [m, dim] and kNN ids "
                             f"[m, nq] (one query per kNN row), got shapes {q.shape} and "
                             f"{ids.shape}")
        lists = _ext.make_insert_lists(ids, np.ascontiguousarray(scores, dtype=np.float32), cap,
                                       int(holder_capacity), str(metric))
        parts.append((q, lists))
    dims = {q.shape[1] for q, _ in parts}
    nqs = {lst["knn_ids"].shape[1] for _, lst in parts}
    if len(dims) != 1 or len(nqs) != 1:
        raise ValueError(f"insert_state: expected one query dimension and one kNN length for "
                         f"all graphs, got dims {sorted(dims)} and lengths {sorted(nqs)}")
    counts = [q.shape[0] for q, _ in parts]
    offset = np.zeros(len(idx) + 1, dtype=np.int64)
    offset[1:] = np.cumsum(counts)

    def cat(name, as_int=False):
        a = np.concatenate([lst[name] for _, lst in parts])
        return a.view(np.int32) if as_int else a

    return InsertState(np.concatenate([q for q, _ in parts]), offset, max(counts),
                       cat("knn_ids", True), cat("knn_keys"), cat("worst_key"),
                       cat("best_id", True), cat("best_key"), cat("holders", True),
                       cat("holder_counts", True), cat("layouts", True))


def batch_insert(graphs, state, keys=None, *, pages=None, degree=0, L=48, expand_width=1,
                 query_neighbors=4, query_candidates=512, update_query_knn=True, fill=True,
                 metric="ip", stream=None, status=None):
    """One generated key into every graph of a decode step, in one launch (RoarGraph's update
    rule as ``InsertableGraphIndex.insert`` runs it; ``kvsift::cuda::batch_insert``). Graph g's
    new key is key ``sizes[g]``, which you have already stored where the searches read keys:
    ``keys`` (dense [adjacency rows, dim], graph g's key i at row ``row_offset[g] + i``) or
    ``pages=(k_pages, page_table)`` (token ``sizes[g]`` of page-table row g; f32, f16 or
    bf16). The graphs' adjacency, ``sizes`` and the state change in place; a graph with no spare
    row, or whose key holds NaN/Inf or sits on an unmapped page, is left as it is and sets a bit
    in ``status`` (int32 device word: 1 << 16 no room, 1 << 17 bad key, besides decode_search's
    bits).

    graphs: a ``GraphSet`` from ``graph_set(indexes, capacity=...)`` (it needs ``sizes``),
    state: the ``InsertState`` from ``insert_state`` with the same capacity, both on the device.
    Parameters as ``InsertableGraphIndex``: ``L`` (its ``insert_L``), ``query_neighbors``,
    ``query_candidates`` (1..4096); ``degree`` 0 = width / 2 (the CPU's max_degree / 2 when
    the set's width is the graphs' max_degree). ``expand_width`` > 1 widens the graph search's
    steps (faster launches, another graph: docs/algorithms.md); 1 is the CPU's walk, whose
    graph equals the CPU insert's. Asynchronous on the stream, workspace from the state's
    framework; run it on a stream of its own beside the decode step (it must not overlap a
    search of the same graphs).

    Raises ValueError for bad parameters or shapes (naming the expected values).
    """
    adjacency, row_offset, entries, max_keys, sizes = _graph_fields(graphs)
    if sizes is None:
        raise ValueError("batch_insert: the graphs have no sizes; make them with "
                         "graph_set(indexes, capacity=...) to leave room for new keys")
    k_pages, page_table = _paged_keys(keys, pages, "batch_insert")
    like = state.queries
    st = _stream(like, stream)
    dim = int((keys if keys is not None else k_pages).shape[-1])
    knobs = (int(degree), int(L), int(expand_width), int(query_neighbors), int(query_candidates),
             bool(update_query_knn), bool(fill), str(metric))
    ws_bytes = _ext.batch_insert_workspace_size(
        int(entries.shape[0]), int(adjacency.shape[0]), int(adjacency.shape[1]),
        int(entries.shape[1]), int(max_keys), dim, int(state.max_queries),
        int(state.knn_ids.shape[1]) if len(state.knn_ids.shape) == 2 else 0,
        int(state.holders.shape[1]) if len(state.holders.shape) == 2 else 0, *knobs)
    with _on_stream(like, st, stream is not None):
        ws = _empty(like, (max(ws_bytes, 1),), "uint8")
        _ext.batch_insert(*_dl(adjacency, row_offset, entries), int(max_keys),
                          *_dl(sizes, keys, k_pages, page_table, state.queries,
                               state.query_offset), int(state.max_queries),
                          *_dl(state.knn_ids, state.knn_keys, state.worst_key, state.best_id,
                               state.best_key, state.holders, state.holder_counts,
                               state.layouts, ws), *knobs, st, *_dl(status))


def build_index(keys, train_queries, *, nq=100, M=35, L=500, threads=0, seed=2024):
    """A ``kvsift.RoarGraphIndex`` built with the GPU doing the heavy steps: the training
    queries' exact kNN (step 1) and the connectivity searches (step 3) run on the current CUDA
    device, projection, pruning and repair on ``threads`` CPU threads (0 = all). Arguments and
    result are the CPU constructor's (keys (n, d) float32 or float16 in host memory, borrowed
    by the index; training queries (m, d) float32; nq, M, L, seed the same meaning), and on data
    whose scores are exact in float32 the graph is the CPU build's, edge for edge.

    Synchronous: returns when the graph is built (the GIL is released meanwhile). The GPU holds
    copies of the keys and the graph while it builds. ``index.build_stats`` has its phases.
    Raises ValueError (InvalidArgument) for bad shapes, dtypes or parameters, as the CPU
    constructor does; CudaError when the device fails.
    """
    from . import RoarGraphIndex

    graph, stats = _ext.build_roargraph(keys, train_queries, int(nq), int(M), int(L),
                                        int(threads), int(seed))
    return RoarGraphIndex.from_bytes(graph, keys, build_stats=stats)


def build_indexes(keys, train_queries, *, builders=4, devices=None, nq=100, M=35, L=500,
                  threads=0, seed=2024):
    """``build_index`` for many heads at once (a layer's or a model's KV heads): the heads are
    cut into ``builders`` contiguous shards, each built on its own thread by its own GPU engine
    with ``threads / builders`` CPU threads (0 = all the host's), so the builds fill each
    other's serial phases. Index h is the one ``build_index(keys[h], train_queries[h], ...)``
    returns, edge for edge; on one H200 four builders built 8 heads of 32768 keys in about half
    the time of one (docs/cuda.md).

    devices: GPU ids; builder b runs on ``devices[b % len(devices)]`` (at least as many builders
    as devices). None: the current device. Two GPUs of one host built 16 heads of 131072 keys
    1.92x faster than one (docs/cuda.md); the graphs do not depend on the devices.

    keys, train_queries: sequences of equal length; every keys[h] float32 or float16 (all the
    same dtype) in host memory, (n_h, d); train_queries[h] float32 (m_h, d). Returns a list of
    ``kvsift.RoarGraphIndex`` in order, each borrowing its keys. Synchronous (the GIL is
    released meanwhile). Raises ValueError (InvalidArgument) for mismatched lists, shapes,
    dtypes, builders < 1, an empty ``devices``, a device id out of range or fewer builders than
    devices, before anything is built; CudaError when the device fails.
    """
    from . import RoarGraphIndex

    keys, train_queries = list(keys), list(train_queries)
    if devices is not None:
        devices = [int(d) for d in devices]
        if not devices:
            raise ValueError("devices: expected at least one device id (or None), got []")
    built = _ext.build_roargraphs(keys, train_queries, int(nq), int(M), int(L), int(threads),
                                  int(seed), int(builders), devices or [])
    return [RoarGraphIndex.from_bytes(graph, k, build_stats=stats)
            for (graph, stats), k in zip(built, keys)]


def knn(queries, keys, k, *, stream=None):
    """Exact top-``k`` keys by inner product for every query, on the GPU: the training-query kNN
    of a RoarGraph build, or a brute-force baseline. With 16-bit inputs, dim 64, 128 or 256,
    k <= 128 and at least 4096 queries one fused kernel scores on tensor cores and selects
    without writing the scores (H200, 13107 x 131072 x 128 f16: 5.0 ms against 24.8 ms for
    ``(q @ k.T).topk``); otherwise a cuBLAS GEMM streamed through a bounded workspace, then a
    per-query selection.

    queries: [m, dim], keys: [n, dim], both float32, float16 or bfloat16 (the same dtype;
    16-bit inputs use tensor cores, scores accumulate in float32). 1 <= k <= min(n, 1024).
    Returns ``(scores [m, k] float32, ids [m, k] int32)``, row i best first (higher score, then
    lower id). O(m n dim) flops; the workspace (a few hundred MiB at most with the default
    tiles) comes from the inputs' framework's allocator. NaN scores rank last.
    """
    st = _stream(queries, stream)
    m, n = int(queries.shape[0]), int(keys.shape[0])
    if not 1 <= int(k) <= n:
        raise ValueError(f"k: expected 1 <= k <= n = {n}, got {k}")
    with _on_stream(queries, st, stream is not None):
        scores = _empty(queries, (m, int(k)), "float32")
        ids = _empty(queries, (m, int(k)), "int32")
        ws = _empty(queries, (_ext.knn_workspace_size(m, n, int(k)),), "uint8")
        _ext.knn(*_dl(queries, keys), int(k), *_dl(scores, ids, ws), st)
    return scores, ids


def gather_pages(copies, host_pool, device_pool, *, stream=None, status=None):
    """Copies host page ``copies[i, 0]`` of ``host_pool`` to device page ``copies[i, 1]`` of
    ``device_pool`` for every i, in one launch: the GPU reads pinned host memory directly (no
    staging copy on the CPU), as the KV manager's fetch of offloaded pages does.

    copies: int64 [count, 2] on the device. host_pool: a pinned host tensor (``pin_memory=True``)
    [host_pages, ...]; device_pool: a device tensor [device_pages, ...]; a page is one row, of
    the same byte size in both (a positive multiple of 16), any dtype. A page id beyond its pool
    skips that copy and sets bit 1 of ``status``. Overlapping destinations race, as with memcpy.
    O(count * page bytes).
    """
    _copy_pages(True, copies, host_pool, device_pool, stream, status)


def scatter_pages(copies, host_pool, device_pool, *, stream=None, status=None):
    """The way back: device page ``copies[i, 1]`` to host page ``copies[i, 0]`` for every i.
    Same contract as :func:`gather_pages`."""
    _copy_pages(False, copies, host_pool, device_pool, stream, status)


def _copy_pages(gather, copies, host_pool, device_pool, stream, status):
    st = _stream(device_pool, stream)
    _ext.copy_pages(gather, *_dl(copies, host_pool, device_pool), st, *_dl(status))


class LruStep(NamedTuple):
    """What one :meth:`BucketedLRU.step` did, per pair p (int32 device tensors): its evictions
    are ``evicted_keys/evicted_slots[e : e + counts[p, 1]]`` with ``e = offsets[p]``, or
    ``e = p * eviction_stride`` when the step had limits (a lowered limit can evict more pages
    than the step selected), its admissions ``admitted_keys/admitted_slots[offsets[p] :
    offsets[p] + counts[p, 2]]``, in the CPU reference's order; ``counts[p]`` is (hits,
    evictions, admissions); ``status[p]`` is 0, or 1 for a page id >= pages, or 2 for more
    distinct selected pages than slots (or than the pair's limit), or 3 for a limit above the
    capacity (that pair's state is then unchanged)."""

    evicted_keys: object
    evicted_slots: object
    admitted_keys: object
    admitted_slots: object
    counts: object
    status: object
    eviction_stride: int = 0


class BucketedLRU:
    """Spin's bucketed LRU on the GPU for ``pairs`` (request, KV head) pairs at once: which of
    ``pages`` logical KV pages hold one of ``capacity`` device page slots. Each step promotes
    the selected resident pages to the newest age bucket, ages the others (``buckets`` buckets,
    saturating), evicts the oldest where the selection's misses need room (lowest slot first
    among equals) and admits the misses into the freed slots: the same evictions and
    admissions as the CPU reference ``kvsift::bucketed_lru``, entry for entry.

    State, as torch tensors on ``device`` (default: the current CUDA device): ``keys``
    [pairs, capacity] int32, the page in each slot (-1 free); ``ages`` [pairs, capacity] uint8;
    ``slot_of`` [pairs, pages] int32, each page's slot or -1: a page table for
    :func:`sparse_attention` when the slots are pages of the device pool. Memory O(pairs *
    (capacity + pages)); one launch per step, one thread block per pair, asynchronous.
    """

    def __init__(self, pairs, capacity, pages, *, buckets=64, device=None):
        import torch

        for name, value, lo, hi in (("pairs", pairs, 1, 2**32 - 1),
                                    ("capacity", capacity, 1, 8192),
                                    ("pages", pages, 1, 2**31 - 1),
                                    ("buckets", buckets, 2, 256)):
            if not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError(f"{name}: expected an integer in [{lo}, {hi}], got {value!r}")
        self.buckets = buckets
        dev = torch.device("cuda", _ext.current_device()) if device is None else torch.device(device)
        self.keys = torch.full((pairs, capacity), -1, dtype=torch.int32, device=dev)
        self.ages = torch.zeros((pairs, capacity), dtype=torch.uint8, device=dev)
        self.slot_of = torch.full((pairs, pages), -1, dtype=torch.int32, device=dev)

    def step(self, selected, offsets, *, limits=None, stream=None) -> LruStep:
        """One decode step: pair p selected the pages ``selected[offsets[p] : offsets[p + 1]]``
        (int32 device tensor; repeats count once) with ``offsets`` int64 [pairs + 1] on the
        device, non-decreasing (device data: not checked). ``limits``: int32 [pairs] on the
        device, or None (every pair may fill its capacity): pair p holds at most ``limits[p]``
        pages (<= capacity), e.g. from ``kvsift.BufferElasticity.pair_limits``; a limit below
        what a pair holds evicts its oldest pages at this step, and a selection of more distinct
        pages than the limit is refused (status 2). Returns an :class:`LruStep`.
        O(capacity + selection) per pair."""
        import torch

        st = _stream(self.keys, stream)
        pairs = int(self.keys.shape[0])
        total = int(selected.shape[0]) if selected.dim() == 1 else -1
        with _on_stream(self.keys, st, stream is not None):
            if total == 0:  # the kernel takes no empty buffers; the offsets say "nothing"
                selected = torch.zeros(1, dtype=torch.int32, device=self.keys.device)
            width = max(total, 1)
            stride = 0 if limits is None else int(self.keys.shape[1])
            ev_width = width if limits is None else pairs * stride
            out = [_empty(self.keys, (ev_width if i < 2 else width,), "int32") for i in range(4)]
            counts = _empty(self.keys, (pairs, 3), "int32")
            status = _empty(self.keys, (pairs,), "int32")
            _ext.bucketed_lru_step(*_dl(self.keys, self.ages, self.slot_of, selected, offsets, *out,
                                        counts, status), self.buckets, st, *_dl(limits))
        return LruStep(*out, counts, status, stride)


class OffloadedKV:
    """One layer's offloaded K/V (RetrievalAttention / Spin): every (request, KV head) pair's
    pages live in pinned host memory, ``capacity`` of them per pair on the device, and
    :meth:`attend` pages a decode step's retrieved tokens in as a bucketed LRU decides, then
    attends over them (``kvsift::cuda::offloaded_attention``: selection, LRU step, device page
    table and copy list, warp gather of K and V, paged sparse attention; no host round trip).

    k_host, v_host: pinned torch tensors (``pin_memory=True``) [host_pages, page_size, dim],
    float32/float16/bfloat16, same dtype and shape; dim 64, 128 or 256. Logical page p of pair
    i (tokens ``[p * page_size, (p + 1) * page_size)`` of that KV head) is host page
    ``host_page[i, p]`` (int64 [pairs, pages] on the device; default ``i * pages + p`` with
    ``pages = host_pages // pairs``). The device tier, ``k_device`` / ``v_device`` [pairs *
    capacity + 1, page_size, dim] (the last page a guard that non-resident table entries
    point at), the LRU state and ``page_table`` [pairs, pages] (int32: each page's device page)
    are allocated on ``device`` (default: the current CUDA device). Memory: device O(pairs *
    (capacity * page bytes + pages)).
    """

    def __init__(self, k_host, v_host, pairs, capacity, *, host_page=None, buckets=64,
                 device=None):
        import torch

        for name, value, lo, hi in (("pairs", pairs, 1, 2**31 - 1),
                                    ("capacity", capacity, 1, 8192),
                                    ("buckets", buckets, 2, 256)):
            if not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError(f"{name}: expected an integer in [{lo}, {hi}], got {value!r}")
        if not (_is_torch(k_host) and _is_torch(v_host)):
            raise TypeError("OffloadedKV: expected k_host and v_host as pinned torch tensors")
        if k_host.dim() != 3:
            raise ValueError(f"k_host: expected [host_pages, page_size, dim], got {k_host.dim()} "
                             "axes")
        dev = torch.device("cuda", _ext.current_device()) if device is None else torch.device(device)
        if host_page is None:
            pages = int(k_host.shape[0]) // pairs
            if pages < 1:
                raise ValueError(f"k_host: {int(k_host.shape[0])} host pages hold no page for "
                                 f"each of {pairs} pairs")
            host_page = torch.arange(pairs * pages, dtype=torch.int64, device=dev).view(pairs, pages)
        pages = int(host_page.shape[-1])
        shape = (pairs * capacity + 1, int(k_host.shape[1]), int(k_host.shape[2]))
        self.buckets = buckets
        self.keys = torch.empty((pairs, capacity), dtype=torch.int32, device=dev)
        self.ages = torch.empty((pairs, capacity), dtype=torch.uint8, device=dev)
        self.slot_of = torch.empty((pairs, pages), dtype=torch.int32, device=dev)
        self.page_table = torch.empty((pairs, pages), dtype=torch.int32, device=dev)
        self.host_page = host_page
        self.k_host, self.v_host = k_host, v_host
        self.k_device = torch.empty(shape, dtype=k_host.dtype, device=dev)
        self.v_device = torch.empty(shape, dtype=k_host.dtype, device=dev)
        self._state = (self.keys, self.ages, self.slot_of, self.page_table, host_page, k_host,
                       v_host, self.k_device, self.v_device)
        # Workspace bytes per (query heads, max_ids rounded up to a power of two): the state's
        # shapes never change and the size grows with max_ids, so the size query (a DLPack
        # export and check of all nine state tensors) runs once per size class, not per call.
        self._ws_bytes = {}
        self.reset()

    def reset(self, *, stream=None):
        """Empties the LRU (no page resident) and points the page table at the guard page."""
        _ext.offloaded_reset(_dl_state(self._state), _stream(self.keys, stream))

    def attend(self, q, indptr, ids, *, max_ids=None, scale=None, lse_base="e", stream=None,
               status=None, limits=None):
        """One decode step: query head h (pair ``h // (qo_heads // pairs)``) attends to the
        tokens ``ids[indptr[h] : indptr[h + 1]]`` of its pair; their pages come in first.

        q: [qo_heads, dim] float32; indptr: int64 [qo_heads + 1]; ids: int32; all on the device
        (a CPU search's ids: ``torch.from_numpy(ids).cuda(non_blocking=True)`` from pinned
        memory). At most ``max_ids`` (default: ``len(ids)``) ids are paged in. Returns ``(o
        [qo_heads, dim] float32, lse [qo_heads] float32)``, a partial state to merge with the
        window's. ``status``: int32 device word that you zeroed, ORed with kvsift::cuda's
        offloaded_status bits (1 an id past its pair's pages, 2 more distinct pages in a pair
        than ``capacity``, 4 more ids than max_ids, 8 a host page id past the host tier; the
        failing pair keeps its state and reads the guard page); with it the attention also
        checks every id and skips bad ones (bit 1); without it, ids must be valid. Work
        O(ids * dim) plus the admitted pages' bytes over PCIe; asynchronous.

        ``limits``: int32 [pairs] on the device, or None (every pair may fill its
        ``capacity``): the pages each pair may hold this step, e.g. buffer elasticity's shares
        (``kvsift.BufferElasticity.pair_limits``). A limit below what a pair holds evicts the
        excess (oldest first) before its misses come in; a limit above ``capacity`` sets
        status bit 16 and skips the pair, more distinct pages than the limit bit 2.
        """
        base2 = _check_base(lse_base)
        st = _stream(q, stream)
        heads, dim = int(q.shape[0]), int(q.shape[1])
        n_ids = int(ids.shape[0]) if max_ids is None else int(max_ids)
        with _on_stream(q, st, stream is not None):
            o = _empty(q, (heads, dim), "float32")
            lse = _empty(q, (heads,), "float32")
            size_class = 1 << max(n_ids - 1, 0).bit_length()  # >= n_ids
            ws_bytes = self._ws_bytes.get((heads, size_class))
            if ws_bytes is None:
                # Each call consumes its DLPack capsules: a fresh export for the size query.
                ws_bytes = _ext.offloaded_attention_workspace_size(_dl_state(self._state), heads,
                                                                   size_class)
                self._ws_bytes[(heads, size_class)] = ws_bytes
            ws = _empty(q, (max(ws_bytes, 1),), "uint8")
            _ext.offloaded_attention(_dl_state(self._state), *_dl(q, indptr, ids), n_ids,
                                     *_dl(o, lse, ws),
                                     float("nan") if scale is None else float(scale),
                                     self.buckets, st, *_dl(status), *_dl(limits))
            if base2:
                lse *= 1.0 / _LN2
        return o, lse


def _dl_state(state):
    """The state tuple with its device tensors as DLPack capsules; the pinned host pools stay
    tensors (the extension reads them through DLPack's host export)."""
    return tuple(_dl(*state[:5])) + (state[5], state[6]) + tuple(_dl(*state[7:]))
