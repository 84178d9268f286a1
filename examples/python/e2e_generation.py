#!/usr/bin/env python3
"""End-to-end decoding of a real model with attention computed by kvsift.

Model and forward pass: SmolLM2-135M-Instruct (default) or Gemma-3-270M (``--model gemma3``)
exactly as in ``bench/data/dump_qk.py`` (imported from there: GGUF loading, tokenizers, norms,
RoPE, MLPs). The prompt is prefilled with full causal attention (numpy); then every decode
step, in every layer (SmolLM2) or every global layer (Gemma-3: the 3 of its 18 layers with
full attention; the local layers keep their 512-token sliding window in every mode) and query
head, attends through kvsift in one of these modes:

    full         dense attention over the whole context
    window       static window only: the first 128 + the last 512 tokens (StreamingLLM-like)
    window+topk  window merged with the top-100 of the middle of the context, found by a
                 RoarGraph per (layer, KV head) built at prefill from the prompt's queries of
                 every query head of the GQA group (filtered beam search, id_range = middle)
    window+topk-warm  as window+topk, each decode step's search of a (layer, query head)
                 seeded with the ids its previous step retrieved (``entries``) and expanding
                 only the best --warm-limit entries of its pool (``expand_limit``); the first
                 step of each prompt searches cold (KvsiftCache's ``warm_start``)
    window+dipr  window merged with the DIPR range of the middle (every key whose logit is
                 within beta of the best), window-seeded: the best window logit is the seed
    auto         per layer, kvsift.Planner (AlayaDB rules) is asked with the context length,
                 reused prefix 0, the layer id and a GPU memory budget (--gpu-budget), and what
                 it picks runs with the static window: full attention, coarse block top-k
                 (Quest min/max BlockIndex, k_blocks blocks of the middle), or window-seeded
                 DIPR on the flat index (layer 0) or on the RoarGraph (other layers)

The last prompt token is decoded in the mode too (not prefilled), so even the first answer
token is predicted through the mode's attention. Tasks (real long text: Debian licence
texts, as dump_qk.py uses): passkey retrieval at 10 depths, and key-value retrieval (six
"secret code" sentences spread over the text, one asked for). Greedy decoding; a task is
answered when the generated text contains the expected digits.

Reported per mode: accuracy per task, average keys attended per head and step (and as a share
of the context), fraction of the context scored by the index (for coarse block top-k: block
summaries scored, each standing for block_size keys), and per-token time split into
search / attention (kvsift calls) / rest (the numpy model).

    python3 examples/python/e2e_generation.py --context 4096 --out bench/results/e2e_smollm2
    python3 examples/python/e2e_generation.py --model gemma3 --context 16384 --out OUT/e2e_gemma3_16384
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "data"))
import dump_qk as model  # noqa: E402  (the forward pass lives there; nothing is duplicated)

import kvsift as ks  # noqa: E402

MODES = ("full", "window", "window+topk", "window+topk-warm", "window+dipr", "auto")
SINK, RECENT = 128, 512


class E2EError(ValueError):
    """Bad configuration: a prompt that does not fit, a window larger than the prompt."""


class CachedWeights(model.Weights):
    """Dequantises each tensor once (decode reads every matrix at every step)."""

    def __init__(self, reader):
        super().__init__(reader)
        self._cache: dict[str, np.ndarray] = {}

    def get(self, name: str) -> np.ndarray:
        if name not in self._cache:
            self._cache[name] = super().get(name)
        return self._cache[name]


def check_fits(n_prompt: int, max_new: int, n_ctx: int, sink: int = SINK, recent: int = RECENT) -> None:
    """Raise E2EError unless the prompt plus the generated tokens fit the model context and
    the prompt is longer than the static window (otherwise there is nothing to retrieve)."""
    if n_prompt + max_new > n_ctx:
        raise E2EError(f"prompt of {n_prompt} tokens + {max_new} new tokens exceeds the model context {n_ctx}")
    if sink + recent >= n_prompt:
        raise E2EError(f"window of {sink} + {recent} tokens is not smaller than the prompt ({n_prompt} tokens)")


class Decoder:
    """KV cache of one prompt plus the per-mode attention of a decode step."""

    def __init__(self, weights, cfg, n_max: int, index_params: dict, beta: float, topk: int, search_L: int,
                 planner=None, gpu_budget: float = 0.0):
        self.w, self.cfg = weights, cfg
        self.cos, self.sin = model.rope_tables(n_max, cfg.rope_dim, cfg.rope_base)
        shape = (cfg.n_layer, n_max, cfg.n_head_kv, cfg.head_dim)
        self.k = np.zeros(shape, dtype=np.float32)
        self.v = np.zeros(shape, dtype=np.float32)
        self.index_params, self.beta, self.topk, self.search_L = index_params, beta, topk, search_L
        # window+topk-warm: each (layer, query head)'s ids of the previous decode step, and the
        # pool entries a warm search expands; cleared before each mode decodes a prompt.
        self.previous: dict[tuple[int, int], np.ndarray] = {}
        self.warm_limit = 0
        self.scale = 0.0  # attention scale: 0 = 1/sqrt(head_dim) (Llama); Gemma-3 sets its own
        self.graphs: list[list] = []
        self.n_indexed = 0
        # Planner mode: the planner, its budget, the coarse and flat indexes per (layer, KV
        # head), and the plan explanations printed once per layer.
        self.planner, self.gpu_budget = planner, gpu_budget
        self.planner_block_size = 0 if planner is None else planner.block_size
        self.blocks: list[list] = []
        self.flats: list[list] = []
        self.plans_seen: dict[int, str] = {}

    def forward(self, ids: list[int]) -> dict:
        """The prefill's full-attention pass: (q, k, v) of every layer."""
        return model.forward(self.w, self.cfg, ids, set(range(self.cfg.n_layer)), "norm", lambda m: None)[1]

    def retrieves(self, il: int) -> bool:
        """Whether the mode applies in layer il (so its indexes are built): every layer here."""
        return True

    def prefill(self, ids: list[int]) -> float:
        """Full-attention prefill of ids; builds the GQA-shared RoarGraphs of the layers that
        retrieve. Returns build seconds."""
        cfg, n = self.cfg, len(ids)
        dumps = self.forward(ids)
        t0 = time.perf_counter()
        self.graphs, self.blocks, self.flats = [], [], []
        for il in range(cfg.n_layer):
            q, k, v = dumps.pop(il)
            self.k[il, :n], self.v[il, :n] = k, v
            if self.retrieves(il):
                self.build_indexes(il, q, n)
            else:  # keeps the per-layer lists indexed by layer
                self.graphs.append([])
                self.blocks.append([])
                self.flats.append([])
        self.n_indexed = n
        return time.perf_counter() - t0

    def build_indexes(self, il: int, q: np.ndarray, n: int) -> None:
        """Indexes of layer il (appended; layers in order) over the cached keys [0, n), from the
        prompt's queries q (n x n_head x d): a GQA-shared RoarGraph per KV head and, for the
        planner, a flat and a coarse block index per KV head."""
        cfg = self.cfg
        per_head = []
        for g in range(cfg.n_head_kv):
            heads = [np.ascontiguousarray(q[:, h]) for h in range(g * cfg.group, (g + 1) * cfg.group)]
            train = ks.sample_gqa_queries(heads, self.index_params["ratio"], seed=il * 16 + g)
            # Keys are a strided view of the cache (borrowed, not copied).
            per_head.append(ks.RoarGraphIndex(self.k[il, :n, g, :], train, nq=self.index_params["nq"],
                                              M=self.index_params["M"], L=self.index_params["L"]))
        self.graphs.append(per_head)
        if self.planner is not None:
            # Built for every layer although the planner may pick only some kinds: cheap (flat
            # borrows the keys; the block summaries are one O(n d) pass).
            bs = self.planner_block_size
            self.blocks.append([ks.BlockIndex(self.k[il, :n, g, :], bs) for g in range(cfg.n_head_kv)])
            self.flats.append([ks.FlatIndex(self.k[il, :n, g, :]) for g in range(cfg.n_head_kv)])

    def attend(self, mode: str, il: int, q: np.ndarray, n: int, stats: dict) -> np.ndarray:
        """Attention output (n_head x d) of one layer for the token at position n - 1."""
        cfg = self.cfg
        K, V = self.k[il, :n], self.v[il, :n]
        out = np.empty((cfg.n_head, cfg.head_dim), dtype=np.float32)
        lo, hi = SINK, min(n - RECENT, self.n_indexed)  # the middle: [lo, hi), all indexed
        plan = None
        if mode == "auto":
            t0 = time.perf_counter()
            plan = self.planner.plan(n, reused_prefix=0, layer=il, gpu_budget_bytes=self.gpu_budget)
            stats["search"] += time.perf_counter() - t0
            if il not in self.plans_seen:  # once per layer; reasons only when they change
                explain = plan.explain()
                same = il > 0 and self.plans_seen.get(il - 1) == explain
                self.plans_seen[il] = explain
                print(f"  auto, layer {il}, context {n}: " + (f"{plan.name} (as layer {il - 1})" if same else explain),
                      flush=True)
        for h in range(cfg.n_head):
            g = h // cfg.group
            qh = q[h]
            if plan is not None:
                # The library's plan executor: the planned search over the middle [SINK, n -
                # RECENT) (the indexed part, below the plan's prefix), DIPR seeded with the
                # window's best score, then window + retrieved attention merged.
                r = ks.execute_plan(plan, qh, K, V, context=n, kv_head=g, window=(SINK, RECENT),
                                    flat=self.flats[il][g], graph=self.graphs[il][g], coarse=self.blocks[il][g],
                                    beta=self.beta, l0=64, max_candidates=4096, seed_from_window=True,
                                    scale=self.scale)
                out[h] = r.o
                stats["search"] += r.search_seconds
                stats["attention"] += r.attention_seconds
                stats["attended"] += n if r.everything else SINK + RECENT + len(r.ids)
                stats["scanned"] += r.scanned * (self.planner_block_size if plan.index == "coarse" else 1)
                continue
            if mode == "full":
                t0 = time.perf_counter()
                out[h] = ks.dense_attention(qh, K, V, 0, n, kv_head=g, scale=self.scale)[0]
                stats["attention"] += time.perf_counter() - t0
                stats["attended"] += n
                continue
            ids = None
            if mode != "window":
                t0 = time.perf_counter()
                if mode in ("window+topk", "window+topk-warm"):
                    prev = self.previous.get((il, h)) if mode == "window+topk-warm" else None
                    warm = {} if prev is None else {"entries": prev, "expand_limit": self.warm_limit}
                    r = self.graphs[il][g].search(qh, self.topk, L=self.search_L, filter=ks.IdRange(lo, hi),
                                                  **warm)
                    ids = r.ids[r.ids != ks.INVALID_ID]
                    stats["scanned"] += int(r.distance_computations[0])
                    if mode == "window+topk-warm":
                        self.previous[(il, h)] = ids
                else:  # window+dipr on the graph
                    seed = float(max((K[:SINK, g] @ qh).max(), (K[n - RECENT:, g] @ qh).max()))
                    r = self.graphs[il][g].dipr(qh, self.beta, l0=64, max_candidates=4096, seed_score=seed,
                                                filter=ks.IdRange(lo, hi))
                    ids = r.ids
                    stats["scanned"] += r.distance_computations
                stats["search"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            o, lse = ks.dense_attention(qh, K, V, 0, SINK, kv_head=g, scale=self.scale)
            o, lse = ks.merge(o, lse, *ks.dense_attention(qh, K, V, n - RECENT, n, kv_head=g, scale=self.scale))
            if ids is not None:
                o, lse = ks.merge(o, lse, *ks.sparse_attention(qh, K, V, ids, kv_head=g, scale=self.scale))
            out[h] = o
            stats["attention"] += time.perf_counter() - t0
            stats["attended"] += SINK + RECENT + (0 if ids is None else len(ids))
        stats["head_steps"] += cfg.n_head
        return out

    def step(self, token: int, pos: int, mode: str, stats: dict) -> int:
        """Decode token at position pos (its K/V go into the cache); returns the greedy next token."""
        cfg, w = self.cfg, self.w
        x = w.get("token_embd.weight")[token][None, :]
        cos, sin = self.cos[pos : pos + 1], self.sin[pos : pos + 1]
        for il in range(cfg.n_layer):

            def attend(q, k, v, il=il):
                self.k[il, pos], self.v[il, pos] = k[0], v[0]
                out = self.attend(mode, il, np.ascontiguousarray(q[0]), pos + 1, stats)
                return out.reshape(1, cfg.n_embd)

            x = model.transformer_layer(w, cfg, il, x, cos, sin, "norm", attend)
        hidden = model.rms_norm(x, w.get("output_norm.weight"), cfg.rms_eps)
        return int(np.argmax(hidden[0] @ model.lm_head_weight(w).T))


class Gemma3Decoder(Decoder):
    """Gemma-3 (bench/data/dump_qk.py's pass): the mode applies to the global layers (full
    attention in the model, 3 of 18 in Gemma-3-270M), where the indexes are built; the local
    layers attend their sliding window (512 keys, itself included) in every mode, as the model
    does. Attention scale from the file (1/16); embeddings scaled by sqrt(n_embd); tied LM head."""

    def __init__(self, weights, cfg, n_max: int, *args, conv=None, **kwargs):
        super().__init__(weights, cfg, n_max, *args, **kwargs)
        self.conv = conv or model.GemmaConventions()
        self.scale = cfg.attn_scale
        self.rope = {"global": (self.cos, self.sin), "local": model.rope_tables(n_max, cfg.rope_dim, cfg.rope_base_local)}
        self.global_layers = {il for il in range(cfg.n_layer) if model.gemma3_is_global(il, self.conv.swa_period)}

    def forward(self, ids: list[int]) -> dict:
        return model.gemma3_forward(self.w, self.cfg, ids, set(range(self.cfg.n_layer)), self.conv, lambda m: None)[1]

    def retrieves(self, il: int) -> bool:
        return il in self.global_layers

    def attend_local(self, il: int, q: np.ndarray, n: int) -> np.ndarray:
        """Sliding-window attention of a local layer for the token at position n - 1."""
        cfg = self.cfg
        K, V = self.k[il, :n], self.v[il, :n]
        lo = max(0, n - cfg.sliding_window)
        out = np.empty((cfg.n_head, cfg.head_dim), dtype=np.float32)
        for h in range(cfg.n_head):
            out[h] = ks.dense_attention(q[h], K, V, lo, n, kv_head=h // cfg.group, scale=self.scale)[0]
        return out

    def step(self, token: int, pos: int, mode: str, stats: dict) -> int:
        return int(np.argmax(self.logits(token, pos, mode, stats)))

    def logits(self, token: int, pos: int, mode: str, stats: dict) -> np.ndarray:
        """Decodes token at position pos (its K/V go into the cache); returns the next-token logits."""
        cfg, w = self.cfg, self.w
        x = w.get("token_embd.weight")[token][None, :] * np.float32(math.sqrt(cfg.n_embd))
        rope = {kind: (c[pos : pos + 1], s_[pos : pos + 1]) for kind, (c, s_) in self.rope.items()}
        for il in range(cfg.n_layer):

            def attend(q, k, v, is_global, il=il):
                self.k[il, pos], self.v[il, pos] = k[0], v[0]
                q0 = np.ascontiguousarray(q[0])
                out = self.attend(mode, il, q0, pos + 1, stats) if is_global else self.attend_local(il, q0, pos + 1)
                return out.reshape(1, cfg.n_head * cfg.head_dim)

            x, _ = model.gemma3_layer(w, cfg, il, x, rope, self.conv, attend=attend)
        off = np.float32(self.conv.norm_offset)
        hidden = model.rms_norm(x, w.get("output_norm.weight") + off, cfg.rms_eps)
        return hidden[0] @ model.lm_head_weight(w).T


def make_tasks(tok, filler: list[int], context: int, max_new: int, seed: int = 11, bos: list[int] = ()) -> list[dict]:
    """Passkey prompts at 10 depths and 10 key-value retrieval prompts, each `context - max_new`
    tokens long (`bos` first, when the model wants it), from the filler text."""
    rng = np.random.default_rng(seed)
    n_prompt = context - max_new
    intro = list(bos) + tok.encode("There is an important piece of information hidden inside a lot of irrelevant text. "
                       "Find it and memorize it. I will quiz you about it.\n\n")
    tasks = []

    def assemble(inserts: list[tuple[float, list[int]]], question: list[int]) -> list[int]:
        budget = n_prompt - len(intro) - len(question) - sum(len(t) for _, t in inserts)
        body, prev = [], 0
        for depth, ids in sorted(inserts, key=lambda x: x[0]):
            cut = int(round(depth * budget))
            body += filler[prev:cut] + ids
            prev = cut
        body += filler[prev:budget]
        return intro + body + question

    for depth in np.linspace(0.05, 0.95, 10):
        key = str(rng.integers(10000, 99999))
        needle = tok.encode(f"\n\nThe pass key is {key}. Remember it. {key} is the pass key.\n\n")
        question = tok.encode("\n\nWhat is the pass key? The pass key is")
        tasks.append({"task": "passkey", "depth": round(float(depth), 2), "answer": key,
                      "ids": assemble([(float(depth), needle)], question)})
    names = ["red", "blue", "green", "yellow", "purple", "orange"]
    for i in range(10):
        codes = {nm: str(rng.integers(10000, 99999)) for nm in names}
        depths = np.sort(rng.uniform(0.05, 0.95, len(names)))
        order = rng.permutation(names)
        inserts = [(float(dp), tok.encode(f"\n\nThe secret code of the {nm} file is {codes[nm]}.\n\n"))
                   for dp, nm in zip(depths, order)]
        asked = order[i % len(names)]
        question = tok.encode(f"\n\nWhat is the secret code of the {asked} file? The secret code of the {asked} file is")
        depth = float(depths[list(order).index(asked)])
        tasks.append({"task": "kv_retrieval", "depth": round(depth, 2), "answer": codes[asked],
                      "ids": assemble(inserts, question)})
    for t in tasks:
        assert len(t["ids"]) == n_prompt, (len(t["ids"]), n_prompt)
    # Interleaved, so the first N prompts (--tasks, or an interrupted run) cover both tasks.
    return [t for pair in zip(tasks[:10], tasks[10:]) for t in pair]


def decode_text(tok, ids: list[int]) -> str:
    """Text of token ids: the inverse of the byte-level BPE (SmolLM2: symbols -> bytes) or of
    SentencePiece (Gemma-3: '▁' -> space, <0xNN> byte tokens -> bytes), then UTF-8."""
    inv = {v: k for k, v in tok.vocab.items()}
    if isinstance(tok, model.SentencePieceBPE):
        out = bytearray()
        for i in ids:
            piece = inv.get(i, "")
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                out.append(int(piece[3:5], 16))
            elif not (piece.startswith("<") and piece.endswith(">")):  # control tokens: nothing
                out += piece.replace("▁", " ").encode("utf-8")
        return out.decode("utf-8", errors="replace")
    rev = {c: b for b, c in tok.byte_map.items()}
    return bytes(rev[c] for i in ids for c in inv[i] if c in rev).decode("utf-8", errors="replace")


def report(args, argv, cfg, modes, totals, rows, prefill_s, build_s, final: bool, plans=None) -> None:
    """Summarises the prompts done so far; prints the table when final; writes OUT.json/.md."""
    n_ctx_avg = args.context - args.max_new + (args.max_new - 1) / 2  # context length during decode, averaged
    summary = {}
    for mode in modes:
        st = totals[mode]
        acc = {t: float(np.mean([r[mode]["correct"] for r in rows if r["task"] == t]))
               for t in ("passkey", "kv_retrieval") if any(r["task"] == t for r in rows)}
        keys = st["attended"] / st["head_steps"]
        summary[mode] = {
            "accuracy": acc,
            "avg_keys_attended": round(keys, 1),
            "attended_fraction": round(keys / n_ctx_avg, 4),
            "index_scanned_fraction": round(st["scanned"] / st["head_steps"] / n_ctx_avg, 4),
            "ms_per_token": {"search": 1e3 * st["search"] / st["tokens"], "attention": 1e3 * st["attention"] / st["tokens"],
                             "rest": 1e3 * (st["total"] - st["search"] - st["attention"]) / st["tokens"],
                             "total": 1e3 * st["total"] / st["tokens"]},
        }
    result = {"model": cfg.name, "context": args.context, "prompt_tokens": args.context - args.max_new,
              "max_new": args.max_new, "window": [SINK, RECENT], "topk": args.topk, "search_L": args.search_L, "warm_limit": args.warm_limit,
              "dipr_beta_raw": args.beta, "index": {"nq": args.nq, "M": args.M, "L": args.L, "ratio": args.ratio},
              "auto": {"gpu_budget_bytes": args.gpu_budget, "short_context": args.auto_short_context,
                       "block_size": args.block_size, "k_blocks": args.k_blocks, "reused_prefix": 0},
              "prefill_seconds_avg": float(np.mean(prefill_s)), "index_build_seconds_avg": float(np.mean(build_s)),
              "summary": summary, "auto_plans": plans or {}, "prompts_done": len(rows), "prompts": rows,
              "command": "python3 examples/python/e2e_generation.py " + " ".join(argv or sys.argv[1:])}
    lines = [f"| mode | passkey acc | kv acc | keys attended (share) | index scanned | search ms/tok | attention ms/tok | rest ms/tok |",
             "|---|---|---|---|---|---|---|---|"]
    for mode, s in summary.items():
        t = s["ms_per_token"]
        lines.append(f"| {mode} | {s['accuracy'].get('passkey', float('nan')):.2f} | {s['accuracy'].get('kv_retrieval', float('nan')):.2f} | "
                     f"{s['avg_keys_attended']:.0f} ({100 * s['attended_fraction']:.1f}%) | {100 * s['index_scanned_fraction']:.1f}% | "
                     f"{t['search']:.0f} | {t['attention']:.0f} | {t['rest']:.0f} |")
    if final:
        print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=4096, help="prompt + generated tokens")
    ap.add_argument("--max-new", type=int, default=7, help="tokens generated per prompt")
    ap.add_argument("--tasks", type=int, default=20, help="run N of the 20 prompts (smoke runs)")
    ap.add_argument("--first", type=int, default=0, help="skip the first K prompts (split a long run)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--topk", type=int, default=100)
    ap.add_argument("--search-L", type=int, default=160)
    ap.add_argument("--warm-limit", type=int, default=60,
                    help="window+topk-warm: pool entries a seeded search expands (expand_limit)")
    ap.add_argument("--model", choices=("smollm2", "gemma3"), default="smollm2",
                    help="SmolLM2-135M-Instruct (every layer retrieves) or Gemma-3-270M (its global layers retrieve)")
    ap.add_argument("--gguf", type=Path, help="the model file (default: the packaged one, bench/data/requirements.txt)")
    ap.add_argument("--beta", type=float, default=None,
                    help="DIPR range in raw logits q.k, before the attention scale (default: 5 nats, i.e. 40 for "
                         "SmolLM2's 1/8 and 80 for Gemma-3's 1/16)")
    ap.add_argument("--nq", type=int, default=32)
    ap.add_argument("--M", type=int, default=16)
    ap.add_argument("--L", type=int, default=128)
    ap.add_argument("--ratio", type=float, default=0.25, help="share of each head's prompt queries used for the build")
    ap.add_argument("--gpu-budget", type=float, default=131072.0,
                    help="auto: GPU bytes per (layer, KV head); the default, 512 tokens of f16 K+V at head_dim 64, "
                         "is below what the coarse index needs at these contexts, so the planner picks DIPR")
    ap.add_argument("--auto-short-context", type=int, default=2048,
                    help="auto: the planner's full-attention threshold (its default 4096 would pick full at 4096)")
    ap.add_argument("--block-size", type=int, default=64, help="auto: coarse block size")
    ap.add_argument("--k-blocks", type=int, default=16, help="auto: blocks fetched by coarse top-k")
    ap.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in MODES for m in modes):
        ap.error(f"--modes must be a subset of {','.join(MODES)}")

    if args.model == "gemma3":
        reader = model.open_gguf(args.gguf or model.find_packaged_gemma3())
        cfg = model.read_gemma3_config(reader)
        tok = model.SentencePieceBPE.from_reader(reader)
        add_bos = bool(model.field_value(reader, "tokenizer.ggml.add_bos_token", True))
        bos = [int(model.field_value(reader, "tokenizer.ggml.bos_token_id", 2))] if add_bos else []
    else:
        reader = model.open_gguf(args.gguf or model.find_packaged_gguf())
        cfg = model.read_config(reader)
        tok = model.ByteLevelBPE.from_reader(reader)
        bos = []
    if args.beta is None:  # 5 nats of softmax logit below the best, in raw q.k units
        args.beta = 5.0 / (cfg.attn_scale if args.model == "gemma3" else 1.0 / math.sqrt(cfg.head_dim))
    check_fits(args.context - args.max_new, args.max_new, cfg.n_ctx)
    weights = CachedWeights(reader)
    paths = [model.DEFAULT_TEXT_DIR / f for f in model.DEFAULT_TEXT_FILES if (model.DEFAULT_TEXT_DIR / f).is_file()]
    filler, _ = model.load_text(paths, tok, args.context)
    if args.first < 0 or args.tasks < 0:
        ap.error(f"--first and --tasks must be >= 0, got {args.first} and {args.tasks}")
    tasks = make_tasks(tok, filler, args.context, args.max_new, bos=bos)[args.first : args.first + args.tasks]
    planner = None
    if "auto" in modes:
        # DIPR plans carry the same beta as window+dipr (raw logits).
        planner = ks.Planner(short_context=args.auto_short_context, head_dim=cfg.head_dim, block_size=args.block_size,
                             k_blocks=args.k_blocks, dipr_l0=64, dipr_beta=args.beta)
    dec = (Gemma3Decoder if args.model == "gemma3" else Decoder)(weights, cfg, args.context, {"nq": args.nq, "M": args.M, "L": args.L, "ratio": args.ratio},
                  args.beta, args.topk, args.search_L, planner, args.gpu_budget)
    dec.warm_limit = args.warm_limit

    zero = {"search": 0.0, "attention": 0.0, "total": 0.0, "attended": 0, "scanned": 0, "head_steps": 0, "tokens": 0}
    totals = {m: dict(zero) for m in modes}
    rows, prefill_s, build_s = [], [], []
    for ti, task in enumerate(tasks):
        ids = task["ids"]
        t0 = time.perf_counter()
        build_s.append(dec.prefill(ids[:-1]))
        prefill_s.append(time.perf_counter() - t0 - build_s[-1])
        row = {k: task[k] for k in ("task", "depth", "answer")}
        for mode in modes:
            st = totals[mode]
            dec.previous = {}  # window+topk-warm: this prompt's first step searches cold
            out, token = [], ids[-1]
            for pos in range(len(ids) - 1, len(ids) - 1 + args.max_new):
                t1 = time.perf_counter()
                token = dec.step(token, pos, mode, st)
                st["total"] += time.perf_counter() - t1
                st["tokens"] += 1
                out.append(token)
            text = decode_text(tok, out)
            row[mode] = {"text": text, "correct": task["answer"] in text.replace(" ", "")}
        rows.append(row)
        # Written after every prompt, so an interrupted run still leaves its results.
        report(args, argv, cfg, modes, totals, rows, prefill_s, build_s, final=ti + 1 == len(tasks),
               plans=dec.plans_seen)
        print(f"[{ti + 1}/{len(tasks)}] {task['task']} depth {task['depth']:.2f} answer {task['answer']}: "
              + "  ".join(f"{m}={'ok' if row[m]['correct'] else 'x'}({row[m]['text'].strip()[:12]!r})" for m in modes)
              + f"  prefill {prefill_s[-1]:.1f}s build {build_s[-1]:.1f}s", flush=True)

    return 0


if __name__ == "__main__":
    sys.exit(main())
