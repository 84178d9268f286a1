"""Q/K/V dumps of bench/data/dump_qk.py as evaluation datasets.

A dump directory holds, per layer L, `L{L}_q{h}.fbin` (query heads), `L{L}_k{g}.fbin` and
`L{L}_v{g}.fbin` (KV heads), row i = token position i, and a manifest.json naming the model,
the dumped layers and heads, the GQA grouping and (Gemma-3) the attention scale. Both the
committed SmolLM2 sample (bench/data/sample, 3072 tokens) and the Gemma-3-270M 32K dump
(/work/data/gemma32k, docs/gemma3_data.md) read through the same class.

The split is by position: train = the first `train_fraction` of positions (the prefill: keys
indexed, queries used to build RoarGraph), eval = the held-out rest (decode), every
`eval_stride`-th position of it to bound the time.
"""
import json
import math
import os
from dataclasses import dataclass

import numpy as np


def read_fbin(path):
    """An .fbin file (uint32 n, uint32 d, n*d little-endian float32) as a C-contiguous (n, d)
    float32 array. Raises ValueError when the size on disk does not match the header."""
    with open(path, "rb") as f:
        header = np.fromfile(f, dtype="<u4", count=2)
        if header.size != 2:
            raise ValueError(f"{path}: expected an 8-byte header, file is shorter")
        n, d = (int(x) for x in header)
        expected = 8 + 4 * n * d
        actual = os.path.getsize(path)
        if actual != expected:
            raise ValueError(f"{path}: header says {n} x {d} (expected {expected} bytes), "
                             f"file has {actual}")
        return np.fromfile(f, dtype="<f4", count=n * d).reshape(n, d).astype(np.float32)


@dataclass
class Split:
    n: int  # tokens
    n_train: int  # positions [0, n_train) are the prefill
    eval_positions: np.ndarray  # held-out positions evaluated (sorted)


def split(n, train_fraction=0.95, eval_stride=1):
    """Train = first floor(train_fraction * n) positions, eval = every eval_stride-th of the
    rest. Raises ValueError when either part would be empty."""
    if not 0 < train_fraction < 1:
        raise ValueError(f"train_fraction: expected in (0, 1), got {train_fraction}")
    if eval_stride < 1:
        raise ValueError(f"eval_stride: expected >= 1, got {eval_stride}")
    n_train = int(math.floor(train_fraction * n))
    if n_train < 1 or n_train >= n:
        raise ValueError(f"split of {n} tokens at {train_fraction}: empty train or eval part")
    return Split(n, n_train, np.arange(n_train, n, eval_stride))


@dataclass
class LayerData:
    layer: int
    kv_head: int
    keys: np.ndarray  # (n, d)
    values: np.ndarray  # (n, d)
    queries: dict  # query head -> (n, d), the heads of kv_head's GQA group
    scale: float  # logits = scale * q.k


class Dump:
    """A dump directory; layer(L, g) loads KV head g of layer L and its query heads."""

    def __init__(self, path):
        self.path = path
        mpath = os.path.join(path, "manifest.json")
        try:
            with open(mpath) as f:
                m = json.load(f)
            self.model = m["model"]
            self.layers = [int(x) for x in m["layers"]]
            self.kv_heads = [int(x) for x in m["kv_heads_dumped"]]
            self.q_heads = [int(x) for x in m["query_heads_dumped"]]
            self.group = {int(q): int(g) for q, g in m["gqa_group"].items()}
            self.head_dim = int(m["head_dim"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{mpath}: not a readable dump manifest ({exc})") from exc
        # Gemma-3 stores q, k unscaled with logits = attention_scale * q.k (1/16, not
        # 1/sqrt(256)); llama-style dumps use 1/sqrt(head_dim).
        self.scale = float(m.get("attention_scale") or 1.0 / math.sqrt(self.head_dim))
        self.manifest = m

    def heads_of(self, kv_head):
        return [q for q in self.q_heads if self.group.get(q) == kv_head]

    def layer(self, layer, kv_head=0):
        if layer not in self.layers:
            raise ValueError(f"layer {layer}: not in the dump (has {self.layers})")
        heads = self.heads_of(kv_head)
        if not heads:
            raise ValueError(f"KV head {kv_head}: no dumped query head of its group")
        p = self.path
        keys = read_fbin(f"{p}/L{layer}_k{kv_head}.fbin")
        values = read_fbin(f"{p}/L{layer}_v{kv_head}.fbin")
        queries = {q: read_fbin(f"{p}/L{layer}_q{q}.fbin") for q in heads}
        for name, a in [("values", values)] + [(f"q{q}", a) for q, a in queries.items()]:
            if a.shape != keys.shape:
                raise ValueError(f"layer {layer} {name}: expected shape {keys.shape} like the "
                                 f"keys, got {a.shape}")
        return LayerData(layer, kv_head, keys, values, queries, self.scale)
