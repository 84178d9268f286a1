"""Retrieval attention for Hugging Face transformers models (RetrievalAttention on kvsift).

A model switches to kvsift attention in three lines::

    import kvsift.transformers as kt
    model.set_attn_implementation(kt.NAME)          # or from_pretrained(..., attn_implementation=)
    cache = kt.KvsiftCache(model.config, sink=4, window=64, k=100)
    out = model.generate(ids, past_key_values=cache, max_new_tokens=32)

What happens:

- **Prefill** (a call with more than one query token) runs transformers' SDPA attention
  unchanged. Right after it, per layer, :class:`KvsiftCache` builds one RoarGraph index per KV
  head over the prompt's *middle* keys (all but the first ``sink`` and the last ``window``
  tokens), trained on the prefill queries of that KV head's query group (GQA-shared, sampled with
  ``kvsift.sample_gqa_queries``).
- **Decode** (one query token) computes, for all query heads at once, exact attention over the
  static window (the first ``sink`` tokens, the last ``window`` prompt tokens and every generated
  token), retrieval over the middle tokens, sparse attention over the retrieved ones
  (``sparse_attention_heads``), and the exact log-sum-exp merge (``merge_states``). Retrieval is
  top-``k`` (``mode="topk"``, one batched ``search_heads`` call) or DIPR (``mode="dipr"``: every
  middle token whose attention logit is within ``beta`` of the best logit, the window's best
  included, as AlayaDB's window-seeded DIPRS; one batched ``dipr_heads`` call), or the
  planner's choice (``mode="auto"``: per layer and step, ``kvsift.Planner`` picks full
  attention, a flat, graph or coarse block index and top-k or DIPR, AlayaDB's rules, and
  ``kvsift.execute_plan`` runs it per query head). With ``k`` >= the number of middle tokens (or a ``beta``
  covering every score) this is exact attention.

Limits (each raises ``kvsift.InvalidArgument`` naming expected and actual values, or says what
to do): batch size 1; no padding (an attention mask hiding cached tokens, e.g. a prompt holding
the pad token id, which generate() masks); one prefill per cache (a second multi-token call on a
built cache, e.g. chunked prefill or a second turn, needs a new cache); no attention logit
soft-capping. Tokens generated after the prefill stay in the exact window, unless
``generated_window=G`` is given: then only the last G generated tokens stay exact, and each
older one is inserted into its layer's per-KV-head indexes (``InsertableGraphIndex``,
RoarGraph's update rule) and retrieved like a prompt token from then on, so a long generation
keeps a bounded window (top-k mode); ``add_queries=N`` also makes every N-th step's queries,
with the ids they retrieved, training queries of those indexes, as a rebuild would learn from
them. Layers with a sliding window (Gemma-3 local layers) keep
transformers' SDPA.

**On a CUDA device** (a model moved with ``model.cuda()``), the same cache runs on the GPU with
``kvsift.cuda`` (the package built with ``KVSIFT_PY_CUDA=ON``): each KV head's index is built by
``kvsift.cuda.build_index`` (training kNN and connectivity searches on the GPU) over every prompt
token, so that graph ids are token positions; each decode step of a layer is one
``kvsift.cuda.decode_step`` call: the batched graph search of all query heads over the cache's key
tensor in place (the KV heads as pages; the window excluded, DIPR seeded with the window's best
score on the device) and one attention pass over the window (the tokens generated since the
prefill included, as ``unindexed`` tokens) and the retrieved tokens, on the current stream, with
no host synchronisation and no copy of the keys. ``warm_start`` seeds each step's search with the
ids the layer's previous step retrieved. ``generated_window`` (inserts) and ``mode="auto"`` (the
plan executor) run on the CPU only.

Thread safety: a cache belongs to one generation at a time; the kvsift calls release the GIL and
run ``threads`` threads over heads.
"""

from __future__ import annotations

import contextvars
import math

import numpy as np
import torch
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from . import _kvsift as _ks

__all__ = ["NAME", "KvsiftCache", "kvsift_attention", "register"]

#: The name kvsift attention is registered under (``config._attn_implementation``).
NAME = "kvsift"

# The cache whose update() ran last in this context: transformers passes the cache to the
# attention module but not to the attention function, and every attention layer calls
# past_key_values.update(...) right before the attention function. The function checks that the
# key tensor it receives is that cache's own, so a stale or foreign cache is an error, not a
# silent mix-up.
_active_cache: contextvars.ContextVar[KvsiftCache | None] = contextvars.ContextVar(
    "kvsift_active_cache", default=None
)


def _invalid(message: str) -> Exception:
    return _ks.InvalidArgument("kvsift.transformers: " + message)


def _check_count(name: str, value, lowest: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(f"{name} must be an int, got {type(value).__name__}")
    if value < lowest:
        raise _invalid(f"{name} must be >= {lowest}, got {value}")
    return value


class _LayerIndex:
    """The built state of one attention layer: prompt length and one graph per KV head (CPU),
    or the layer's graphs stacked on the device (``gpu``, a ``kvsift.cuda.GraphSet`` of device
    tensors) when the model runs on CUDA."""

    __slots__ = ("prompt", "graphs", "inserted", "gpu", "previous", "steps")

    def __init__(self, prompt: int, graphs: list, gpu=None):
        self.prompt = prompt
        self.graphs = graphs
        self.inserted = 0  # generated tokens moved from the window into the graphs
        self.gpu = gpu
        # The last decode step's retrieved ids, None before the first step: the next step's
        # seeds with warm_start ((H, k) graph ids, numpy); on CUDA always kept, as the step's
        # carry ((H, capacity) int32 on the device), which is reset to -1 before a cold step.
        self.previous = None
        self.steps = 0  # decode steps taken (add_queries counts them)


def _kvsift_cuda():
    """kvsift.cuda, or an error naming the build option when this package has no CUDA layer."""
    try:
        from . import cuda
    except ImportError as e:
        raise _invalid(
            "the model runs on CUDA, which needs kvsift's CUDA layer: rebuild with pip install "
            "./python -C cmake.define.KVSIFT_PY_CUDA=ON (or move the model to the CPU)"
        ) from e
    return cuda


class KvsiftCache(DynamicCache):
    """A transformers ``DynamicCache`` that also holds kvsift's per-layer, per-KV-head indexes.

    Args:
        config: the model's config (as for ``DynamicCache(config=...)``).
        sink: first tokens always attended exactly (attention sinks), >= 0.
        window: last prompt tokens always attended exactly, >= 0; generated tokens are always
            attended exactly too. ``sink + window`` must be smaller than the prompt.
        k: middle tokens retrieved per query head and step, >= 1 (clamped to the number of
            middle tokens; k >= that number makes decode exact).
        L: search pool size (>= k after clamping; default ``max(k, 128)``).
        degree_cap: expand only each graph node's first ``degree_cap`` neighbours in the
            decode searches (top-k and DIPR), 0 = all: fewer keys scored, at some recall.
        M: RoarGraph out-degree bound; build_L: construction pool; nq: query->key neighbours per
            training query; train_ratio: fraction of each query head's prefill queries used for
            training, in (0, 1] (1.0 costs a longer kNN and scored 9-11% fewer keys at recall@100
            0.95 than 0.1 on Gemma-3 32K, docs/algorithms.md); seed: the build's random seed.
        threads: threads over heads for the per-step kvsift calls (1 is usually fastest for one
            decode step; 0 = all cores).
        mode: ``"topk"`` (k best middle tokens), ``"auto"`` (the planner's choice per layer and
            step, CPU only: ``planner``, a ``kvsift.Planner``, default
            ``Planner(head_dim=<the model's>)``; ``gpu_budget_bytes`` per (layer, KV head) as
            ``Planner.plan`` takes it; the plan's beta and l0 win over ``beta``/``l0``; the
            plan of each layer's last step is in ``cache.plans``) or ``"dipr"`` (middle tokens whose attention
            logit, scaling * q.k, is within ``beta`` of the best one, the window's best included:
            a token kept has at least exp(-beta) times the best token's weight; at most
            ``max_candidates`` a head, 0 = 64 * l0; ``l0``: the DIPRS exploration capacity).
        expand_width: graph nodes expanded per step of the GPU search (1..32 with mode "topk",
            else 1..8; 1 = the CPU's walk, more = fewer sequential steps for some extra
            scoring). Ignored on the CPU.
        warm_start: 0 (default): every decode step's search starts cold. E >= 1 (``mode="topk"``):
            each query head's search is seeded with the ids its previous decode step of the same
            layer retrieved and expands only the best E entries of its pool (``expand_limit``;
            E >= L expands every entry, seeds only). Consecutive decode queries of a head share
            many of their best keys on real models: on Gemma-3-270M's layer 11 at 32K tokens the
            GPU search reached recall@100 0.95 in 1.33x less time with E 70
            (docs/decode_search.md), and a CPU search per head with 1.56x fewer keys scored
            (docs/evaluation.md, warm starts in decode order).
        walk_through: on CUDA, whether a search walks through the window tokens it meets (the
            2-hop rule; the GPU graphs index every prompt token and exclude the window per
            search) or drops them (False: fewer keys scored at a slightly lower recall per pool;
            the same walk on the CPU over Gemma-3's global layers at 32K was 1.4-1.7x faster at
            equal recall@100, docs/performance.md; the GPU step at 128K tokens and 16 requests
            took 0.907 against 1.071 ms at equal recall, docs/decode_search.md). Ignored on the
            CPU, whose graphs hold the middle tokens only.
        max_hops: on CUDA, 0 (default) or a cap on the nodes each search expands (a launch waits
            for its slowest search). Ignored on the CPU.
        generated_window: None (default) keeps every generated token in the exact window; G >= 1
            keeps the last G exact and inserts each older generated token into the indexes
            (one ``InsertableGraphIndex.insert`` per KV head and token, tens of microseconds
            each), from where top-k retrieves it. ``mode="topk"`` only. The indexes are then
            ``InsertableGraphIndex`` (they copy the middle keys as float32).
        add_queries: with ``generated_window``, 0 (default) or N >= 1: every N-th decode step of
            a layer adds each query head's query, with the ids its search retrieved, to its KV
            head's index (``InsertableGraphIndex.add_queries``, about 12 us per query on
            Gemma-3 32K): later inserts are scored against them and offered to their lists, as
            a rebuild would learn from them. In the library's insert benchmark on Gemma-3 32K's
            layer 5 (the last 20% of the keys inserted, every position's query added) recall@100
            went from 0.016 below a rebuild to 0.015 above it (docs/algorithms.md); not measured
            end to end here.

    ``retrieved`` counts the middle tokens attended over all decode steps, layers and heads (a
    DIPR budget is adaptive; top-k retrieves min(k, middle) per head and step); on CUDA it is
    summed on the device and reading it synchronises.

    Raises ``kvsift.InvalidArgument`` for a parameter out of range (before anything is stored),
    and at prefill when ``sink + window`` leaves no middle token of the prompt.
    Build cost per layer: O(n_train * n_mid * d) kNN per KV head plus the projection.
    """

    def __init__(
        self,
        config,
        *,
        sink: int = 4,
        window: int = 64,
        k: int = 100,
        L: int | None = None,
        M: int = 32,
        build_L: int = 200,
        nq: int = 100,
        train_ratio: float = 0.25,
        seed: int = 2024,
        threads: int = 1,
        mode: str = "topk",
        beta: float = 8.0,
        l0: int = 64,
        max_candidates: int = 0,
        degree_cap: int = 0,
        expand_width: int = 1,
        warm_start: int = 0,
        walk_through: bool = True,
        max_hops: int = 0,
        generated_window: int | None = None,
        add_queries: int = 0,
        planner=None,
        gpu_budget_bytes: float = 0.0,
    ):
        self.sink = _check_count("sink", sink, 0)
        self.window = _check_count("window", window, 0)
        self.k = _check_count("k", k, 1)
        self.L = max(self.k, 128) if L is None else _check_count("L", L, 1)
        if self.L < self.k:
            raise _invalid(f"L must be >= k ({self.k}), got {self.L}")
        self.M = _check_count("M", M, 1)
        self.build_L = _check_count("build_L", build_L, 1)
        self.nq = _check_count("nq", nq, 1)
        if not (isinstance(train_ratio, (int, float)) and 0 < train_ratio <= 1):
            raise _invalid(f"train_ratio must be in (0, 1], got {train_ratio!r}")
        self.train_ratio = float(train_ratio)
        self.seed = _check_count("seed", seed, 0)
        self.threads = _check_count("threads", threads, 0)
        if mode not in ("topk", "dipr", "auto"):
            raise _invalid(f"mode must be 'topk', 'dipr' or 'auto', got {mode!r}")
        self.mode = mode
        if planner is not None and not isinstance(planner, _ks.Planner):
            raise _invalid(f"planner must be a kvsift.Planner, got {type(planner).__name__}")
        if planner is not None and mode != "auto":
            raise _invalid(f"planner is used by mode='auto' only, got mode={mode!r}")
        if not (isinstance(gpu_budget_bytes, (int, float)) and 0 <= gpu_budget_bytes < math.inf):
            raise _invalid(f"gpu_budget_bytes must be finite and >= 0, got {gpu_budget_bytes!r}")
        self.gpu_budget_bytes = float(gpu_budget_bytes)
        if mode == "auto" and planner is None:
            head_dim = getattr(config, "head_dim", None) or (
                config.hidden_size // config.num_attention_heads
            )
            planner = _ks.Planner(head_dim=int(head_dim))
        self.planner = planner
        self.plans: dict[int, str] = {}  # mode "auto": each layer's plan at its last step
        if not (isinstance(beta, (int, float)) and 0 <= beta < math.inf):
            raise _invalid(f"beta must be finite and >= 0 (logit units), got {beta!r}")
        self.beta = float(beta)
        self.l0 = _check_count("l0", l0, 1)
        self.max_candidates = _check_count("max_candidates", max_candidates, 0)
        self.degree_cap = _check_count("degree_cap", degree_cap, 0)
        self.expand_width = _check_count("expand_width", expand_width, 1)
        limit = 32 if self.mode == "topk" else 8
        if self.expand_width > limit:
            raise _invalid(
                f"expand_width must be <= {limit} for {self.mode}, got {self.expand_width}")
        self.warm_start = _check_count("warm_start", warm_start, 0)
        if self.warm_start > 0 and mode != "topk":
            raise _invalid(f"warm_start needs mode='topk', got mode={mode!r}")
        if not isinstance(walk_through, (bool, np.bool_)):
            raise _invalid(f"walk_through must be a bool, got {walk_through!r}")
        self.walk_through = bool(walk_through)
        self.max_hops = _check_count("max_hops", max_hops, 0)
        self.generated_window = (
            None
            if generated_window is None
            else _check_count("generated_window", generated_window, 1)
        )
        if self.generated_window is not None and mode != "topk":
            raise _invalid(
                "generated_window (inserting generated tokens into the indexes) needs mode='topk': "
                "the DIPR decode search reads RoarGraphIndex, which does not take inserts"
            )
        self.add_queries = _check_count("add_queries", add_queries, 0)
        if self.add_queries > 0 and self.generated_window is None:
            raise _invalid(
                "add_queries needs generated_window (its queries join InsertableGraphIndex "
                f"indexes), got add_queries={self.add_queries} without"
            )
        super().__init__(config=config)
        self.kvsift_layers: dict[int, _LayerIndex] = {}
        self._retrieved = 0
        self._retrieved_gpu = None  # int64 device scalar: the GPU steps' count, never synced
        self._gpu_inputs = None  # the GPU step's page table and its key (_gpu_page_table)

    @property
    def retrieved(self) -> int:
        """Middle tokens attended so far (all decode steps, layers and query heads)."""
        gpu = 0 if self._retrieved_gpu is None else int(self._retrieved_gpu.item())
        return self._retrieved + gpu

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        # Validate a prefill before it changes anything: the prompt must leave middle tokens.
        built = layer_idx in self.kvsift_layers
        new = key_states.shape[-2]
        if new > 1 and not self._is_sliding(layer_idx):
            if key_states.is_cuda and self.mode == "auto":
                raise _invalid(
                    "mode='auto' (the planner's choice) runs on the CPU only; on CUDA use "
                    "mode='topk' or 'dipr', or run the model on the CPU"
                )
            if key_states.is_cuda:
                if self.generated_window is not None:
                    raise _invalid(
                        "generated_window (inserting generated tokens into the indexes) runs on "
                        "the CPU only; on CUDA generated tokens stay in the exact window: drop "
                        "generated_window or run the model on the CPU"
                    )
                _kvsift_cuda()
            if built:
                raise _invalid(
                    f"layer {layer_idx} already holds a prompt of "
                    f"{self.kvsift_layers[layer_idx].prompt} tokens with its indexes; a second "
                    f"multi-token call ({new} tokens: chunked prefill or a new turn) needs a new "
                    "KvsiftCache"
                )
            prompt = self.get_seq_length(layer_idx) + new
            if self.sink + self.window >= prompt:
                raise _invalid(
                    f"sink ({self.sink}) + window ({self.window}) must be smaller than the prompt "
                    f"({prompt} tokens) so that some tokens are retrieved; lower them or use "
                    "plain attention for short prompts"
                )
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        _active_cache.set(self)
        return keys, values

    def _train_queries(self, q: torch.Tensor, g: int, group: int):
        """KV head g's training queries: ``train_ratio`` of each of its group's prefill queries
        (q: (H, n, d) float32 on the host), sampled with the head's seed. Every build path
        (CPU, planner, GPU) trains on the same queries."""
        heads = range(g * group, (g + 1) * group)
        return _ks.sample_gqa_queries([q[h].contiguous() for h in heads], self.train_ratio,
                                      self.seed + g)

    def _is_sliding(self, layer_idx: int) -> bool:
        return layer_idx < len(self.layers) and getattr(self.layers[layer_idx], "is_sliding", False)

    def _build(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor) -> None:
        """Indexes of one layer from its prefill queries (1, H, n, d) and keys (1, KVH, n, d)."""
        if key.is_cuda:
            self._build_cuda(layer_idx, query, key)
            return
        if self.mode == "auto":
            self._build_auto(layer_idx, query, key)
            return
        heads, kv_heads, prompt = query.shape[1], key.shape[1], key.shape[2]
        group = heads // kv_heads
        lo, hi = self.sink, prompt - self.window
        q = query[0].detach().float()
        graphs = []
        for g in range(kv_heads):
            # The index borrows these keys: a view of the cache tensor, which it keeps alive
            # (DynamicLayer concatenates into new tensors at each step, never in place).
            keys = key[0, g, lo:hi].detach()
            train = self._train_queries(q, g, group)
            build = dict(nq=min(self.nq, hi - lo), M=self.M, L=max(self.build_L, self.M), threads=0)
            if self.generated_window is None:
                graphs.append(_ks.RoarGraphIndex(keys, train, seed=self.seed + layer_idx, **build))
            else:  # owns a growing float32 copy of the keys, so that tokens can join it
                graphs.append(_ks.InsertableGraphIndex(keys.float().contiguous(), train, **build))
        self.kvsift_layers[layer_idx] = _LayerIndex(prompt, graphs)

    def _build_auto(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor) -> None:
        """The planner's indexes of one layer, per KV head over every prompt token (ids are
        positions; each plan's search is restricted to the middle): a RoarGraph (GQA-shared
        training queries), a flat index and a coarse block index of the planner's block size.
        They read float32 keys: the cache's own when it is float32, else a float32 copy."""
        heads, kv_heads, prompt = query.shape[1], key.shape[1], key.shape[2]
        group = heads // kv_heads
        q = query[0].detach().float()
        indexes = []
        for g in range(kv_heads):
            keys = key[0, g].detach().float()  # a view when the cache is float32
            train = self._train_queries(q, g, group)
            graph = _ks.RoarGraphIndex(
                keys, train, nq=min(self.nq, prompt), M=self.M, L=max(self.build_L, self.M),
                threads=0, seed=self.seed + layer_idx,
            )
            indexes.append(
                (_ks.FlatIndex(keys), graph, _ks.BlockIndex(keys, self.planner.block_size))
            )
        self.kvsift_layers[layer_idx] = _LayerIndex(prompt, indexes)

    def _build_cuda(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor) -> None:
        """The GPU build of one layer: the KV heads' graphs over every prompt token (graph
        ids = token positions, which the decode search reads in the cache's key tensor; the
        window is excluded per search by an id range), built by ``kvsift.cuda.build_indexes``
        (up to 4 builders sharing the GPU; each graph the one ``build_index`` of its head
        makes) and stacked into a GraphSet on the model's device. The builders read host
        copies of the prompt's keys and of the groups' queries (float32), dropped once the
        graphs are on the device."""
        kc = _kvsift_cuda()
        heads, kv_heads, prompt = query.shape[1], key.shape[1], key.shape[2]
        group = heads // kv_heads
        q = query[0].detach().float().cpu()
        keys = key[0].detach().float().cpu()
        indexes = kc.build_indexes(
            [keys[g].contiguous() for g in range(kv_heads)],
            [self._train_queries(q, g, group) for g in range(kv_heads)],
            builders=min(4, kv_heads),
            nq=min(self.nq, prompt),
            M=self.M,
            L=max(self.build_L, self.M),
            threads=0,
            seed=self.seed + layer_idx,
        )
        host = kc.graph_set(indexes)
        device = key.device
        gpu = kc.GraphSet(*(torch.from_numpy(a).to(device) for a in host[:3]), host.max_keys)
        self.kvsift_layers[layer_idx] = _LayerIndex(prompt, [], gpu)

    def _gpu_page_table(self, kv_heads: int, device) -> torch.Tensor:
        """The GPU decode step's page table (row g = KV head g, one page of the cache's tokens),
        built once and shared by every layer."""
        key = (kv_heads, device)
        if self._gpu_inputs is None or self._gpu_inputs[0] != key:
            table = torch.arange(kv_heads, dtype=torch.int32, device=device).view(kv_heads, 1)
            self._gpu_inputs = (key, table)
        return self._gpu_inputs[1]


def _cache_for(module, key: torch.Tensor) -> KvsiftCache:
    cache = _active_cache.get()
    layer = getattr(module, "layer_idx", None)
    if (
        cache is None
        or layer is None
        or layer >= len(cache.layers)
        or cache.layers[layer].keys is not key
    ):
        raise RuntimeError(
            "kvsift.transformers: kvsift attention needs its cache: pass "
            "past_key_values=kvsift.transformers.KvsiftCache(model.config, ...) to generate() or "
            "the forward call (a model with attn_implementation='kvsift' cannot use a DynamicCache)"
        )
    return cache


def kvsift_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
):
    """The attention function registered as ``NAME`` (transformers' AttentionInterface).

    query (B, H, q_len, d), key/value (B, KVH, n, d): the whole cached sequence. Prefill (q_len >
    1) and sliding-window layers run SDPA and, on prefill, build the layer's indexes; decode
    (q_len == 1) runs window + top-k retrieval + merge with one batched kvsift call per stage.
    Returns (output (B, q_len, H, d) in the query's dtype, None).
    """
    if kwargs.get("softcap") is not None:
        raise _invalid("attention logit soft-capping is not supported")
    sliding = kwargs.get("sliding_window") is not None
    if query.shape[2] > 1 or sliding:
        out = sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
        if not sliding:
            if query.shape[0] != 1:
                raise _invalid(f"batch size must be 1, got {query.shape[0]}")
            _cache_for(module, key)._build(module.layer_idx, query, key)
        return out
    cache = _cache_for(module, key)
    if query.shape[0] != 1:
        raise _invalid(f"batch size must be 1, got {query.shape[0]}")
    state = cache.kvsift_layers.get(module.layer_idx)
    if state is None:
        raise _invalid(
            f"layer {module.layer_idx}: decode before any prefill (the cache holds no prompt)"
        )
    if attention_mask is not None and not _attends_to_all(attention_mask, key.shape[2]):
        raise _invalid(
            "the attention mask hides cached tokens (padding, e.g. a pad token id in the "
            "prompt); kvsift attention attends to every cached token: pass an unpadded prompt"
        )
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    if state.gpu is not None:
        return _decode_cuda(cache, state, query, key, value, scale), None
    q = query[0, :, 0, :].detach().float().contiguous()  # (H, d): the one copy, d floats a head
    # (n, KVH, d) views of the cache, read in place by kvsift (innermost axis contiguous).
    keys = key[0].detach().transpose(0, 1)
    values = value[0].detach().transpose(0, 1)
    if cache.mode == "auto":
        return _decode_planned(cache, state, module.layer_idx, q, keys, values, scale, query), None
    n, prompt, threads = keys.shape[0], state.prompt, cache.threads
    lo, hi = cache.sink, prompt - cache.window
    if cache.generated_window is not None:
        _insert_due(state, keys, n - cache.generated_window)
    ins = state.inserted  # generated tokens [prompt, prompt + ins) are in the graphs
    if ins == 0:
        o, lse = _ks.dense_attention_heads(q, keys, values, hi, n, scale=scale, threads=threads)
    else:
        o, lse = _ks.dense_attention_heads(
            q, keys, values, prompt + ins, n, scale=scale, threads=threads
        )
        if hi < prompt:
            o, lse = _ks.merge_states(
                o,
                lse,
                *_ks.dense_attention_heads(
                    q, keys, values, hi, prompt, scale=scale, threads=threads
                ),
            )
    if lo > 0:
        o, lse = _ks.merge_states(
            o, lse, *_ks.dense_attention_heads(q, keys, values, 0, lo, scale=scale, threads=threads)
        )
    if cache.mode == "dipr":
        ids = _dipr_ids(cache, state.graphs, q, keys, lo, hi, scale, threads)
    else:
        k = min(cache.k, hi - lo + ins)
        warm = cache.warm_start > 0 and state.previous is not None
        ids = _ks.search_heads(
            state.graphs,
            q,
            k,
            L=max(cache.L, k),
            threads=threads,
            degree_cap=cache.degree_cap,
            entries=state.previous if warm else None,
            expand_limit=min(cache.warm_start, max(cache.L, k)) if warm else 0,
        ).ids
        if cache.warm_start > 0:
            state.previous = ids
        if cache.add_queries > 0 and state.steps % cache.add_queries == 0:
            # Query head h reads KV head h // group (transformers' repeat_kv); its retrieved
            # ids are its index's ids (middle tokens, then inserted ones).
            group = q.shape[0] // len(state.graphs)
            for g, graph in enumerate(state.graphs):
                graph.add_queries(q[g * group : (g + 1) * group], ids[g * group : (g + 1) * group])
        state.steps += 1
    cache._retrieved += int((ids != _ks.INVALID_ID).sum())
    if ins == 0:
        parts = [(keys[lo:hi], values[lo:hi], ids)]
    else:
        # Graph ids: the middle tokens 0 .. mid - 1, then the inserted generated tokens.
        mid, invalid = hi - lo, _ks.INVALID_ID
        valid = ids != invalid
        parts = [
            (keys[lo:hi], values[lo:hi], np.where(valid & (ids < mid), ids, invalid)),
            (
                keys[prompt : prompt + ins],
                values[prompt : prompt + ins],
                np.where(valid & (ids >= mid), ids - mid, invalid),
            ),
        ]
    for k_part, v_part, part_ids in parts:
        o, lse = _ks.merge_states(
            o,
            lse,
            *_ks.sparse_attention_heads(q, k_part, v_part, part_ids, scale=scale, threads=threads),
        )
    out = torch.from_numpy(o).to(query.dtype).view(1, 1, query.shape[1], query.shape[3])
    return out, None


def _decode_cuda(cache, state, query, key, value, scale) -> torch.Tensor:
    """One decode step of one layer on the GPU (see the module docstring); (1, 1, H, d) in the
    query's dtype. One ``kvsift.cuda.decode_step`` call: the cache's (1, KVH, n, d) key and
    value tensors read in place as KVH pages of n tokens (page-table row g = KV head g), the
    graphs over the prompt, the tokens generated since attended with the window
    (``unindexed``). The step's carry receives its retrieved ids: the next step's seeds with
    ``warm_start``, and the count of tokens attended (``retrieved``) either way."""
    kc = _kvsift_cuda()
    heads, d = query.shape[1], query.shape[3]
    k_pages, v_pages = key[0].detach(), value[0].detach()  # (KVH, n, d), contiguous
    kv_heads, n = k_pages.shape[0], k_pages.shape[1]
    lo, hi = cache.sink, state.prompt - cache.window
    q = query[0, :, 0, :].detach().float().contiguous()
    k = min(cache.k, hi - lo)
    pool = max(cache.L, k)
    capacity = kc.decode_search_capacity(
        mode=cache.mode, k=k, L=pool, l0=cache.l0, max_results=cache.max_candidates
    )
    warm = cache.warm_start > 0 and state.previous is not None
    carry = state.previous
    if carry is None or carry.shape != (heads, capacity):
        carry = torch.empty((heads, capacity), dtype=torch.int32, device=query.device)
    if not warm:
        carry.fill_(-1)  # no seeds: a cold search
    o, _ = kc.decode_step(
        state.gpu,
        q,
        k_pages,
        v_pages,
        cache._gpu_page_table(kv_heads, query.device),
        mode=cache.mode,
        k=k,
        L=pool,
        expand_width=cache.expand_width,
        walk_through=cache.walk_through,
        degree_cap=cache.degree_cap,
        beta=cache.beta / scale,
        l0=cache.l0,
        max_results=cache.max_candidates,
        sink=cache.sink,
        window=cache.window,
        unindexed=n - state.prompt,
        scale=scale,
        carry=carry,
        expand_limit=min(cache.warm_start, pool) if warm else 0,
        max_hops=cache.max_hops,
        seed_from_window=cache.mode == "dipr",
    )
    state.previous = carry
    counted = (carry >= 0).sum()
    cache._retrieved_gpu = counted if cache._retrieved_gpu is None else cache._retrieved_gpu + counted
    return o.to(query.dtype).view(1, 1, heads, d)


def _decode_planned(cache, state, layer_idx, q, keys, values, scale, query) -> torch.Tensor:
    """One decode step of one layer in mode "auto": the planner's plan for this layer and
    context, run per query head by ``kvsift.execute_plan`` over the middle (window: the first
    ``sink`` tokens and everything from ``prompt - window`` on, generated tokens included), with
    the window's attention merged in. (1, 1, H, d) in the query's dtype."""
    n, heads = keys.shape[0], q.shape[0]
    group = heads // keys.shape[1]
    lo, hi = cache.sink, state.prompt - cache.window
    plan = cache.planner.plan(
        n, reused_prefix=0, layer=layer_idx, gpu_budget_bytes=cache.gpu_budget_bytes
    )
    cache.plans[layer_idx] = plan.name
    k = min(cache.k, hi - lo)
    out = np.empty((heads, q.shape[1]), dtype=np.float32)
    for h in range(heads):
        flat, graph, coarse = state.graphs[h // group]
        r = _ks.execute_plan(
            plan, q[h], keys, values, context=n, kv_head=h // group, window=(lo, n - hi),
            flat=flat, graph=graph, coarse=coarse, topk=k, beam=max(cache.L, k), l0=cache.l0,
            beta=cache.beta / scale, max_candidates=cache.max_candidates, seed_from_window=True,
            scale=scale,
        )
        out[h] = r.o
        cache._retrieved += hi - lo if r.everything else len(r.ids)
    return torch.from_numpy(out).to(query.dtype).view(1, 1, heads, q.shape[1])


def _insert_due(state, keys, upto: int) -> None:
    """Inserts the generated tokens [prompt + inserted, upto) into every KV head's graph (keys
    (n, KVH, d)); nothing when they are already in. O(tokens * insert)."""
    start = state.prompt + state.inserted
    if upto <= start:
        return
    for g, graph in enumerate(state.graphs):
        graph.insert(keys[start:upto, g].float().contiguous())
    state.inserted += upto - start


def _dipr_ids(cache, graphs, q, keys, lo, hi, scale, threads):
    """(H, width) int64 middle-token ids per query head, INVALID_ID-padded: window-seeded DIPR.

    The seed is each head's best raw score over the window ([0, lo) and [hi, n)), so a middle
    token is kept only when it is within beta of the best logit of the whole context. The
    graph scores raw q.k, so the logit range beta is beta / scale there."""
    heads, d = q.shape
    kv_heads = keys.shape[1]
    window = torch.cat([keys[:lo], keys[hi:]]).float()  # (n_w, KVH, d): O(n_w d) copy
    best = torch.einsum("wkd,kgd->kgw", window, q.view(kv_heads, heads // kv_heads, d))
    best = best.amax(dim=-1).reshape(heads).detach().numpy().astype(np.float32)
    return _ks.dipr_heads(
        graphs,
        q,
        cache.beta / scale,
        l0=cache.l0,
        max_candidates=cache.max_candidates,
        seed_scores=best,
        threads=threads,
        degree_cap=cache.degree_cap,
    ).ids


def _attends_to_all(mask: torch.Tensor, n: int) -> bool:
    """Whether a decode step's mask (bool: True attends; float: 0 attends) lets the query see
    all n cached tokens. O(n), against the O(n d) of the step's window alone."""
    row = mask[..., :n]
    return bool(row.all()) if row.dtype == torch.bool else bool((row == 0).all())


def register(name: str = NAME) -> None:
    """Registers kvsift attention (and SDPA's mask format for it) under ``name``. Idempotent;
    importing this module registers ``NAME``."""
    AttentionInterface.register(name, kvsift_attention)
    AttentionMaskInterface.register(name, sdpa_mask)


register()
