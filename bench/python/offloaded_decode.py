"""One offloaded decode step per layer (RetrievalAttention's layout): every token's K/V in pinned
host memory, the indexes on the CPU over those same host keys, the GPU holding only the static
window and a page cache. A step: the window's attention is enqueued on the GPU, the CPU
searches (``kvsift.search_heads``, all query heads, ``--threads`` threads) meanwhile, then
``kvsift.cuda.OffloadedKV.attend`` pages the retrieved tokens in and attends, and
``merge_state`` merges the two states. Compared in the same run with torch SDPA over the whole
cache resident on the GPU (what the step replaces), with the search and the paging timed alone,
recall@k of the CPU search against the exact top-k, and the step's output checked against
float64 attention over the same tokens.

Synthetic out-of-distribution keys and queries (as bench/python/cuda_decode_search.py); a
query drifts slowly between steps, so retrieved pages are partly reused.

    python3 bench/python/offloaded_decode.py [--requests 2] [--n 32768] [--slots 512]
        [--shared-walk 1] [--expand-limit E]
"""

import argparse
import json
import statistics
import time

import numpy as np
import torch

import kvsift
import kvsift.cuda as kc
from ood_data import ood_keys, ood_queries


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--n", type=int, default=32768)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--slots", type=int, default=512, help="device pages per (request, KV head)")
    ap.add_argument("--sink", type=int, default=4)
    ap.add_argument("--window", type=int, default=60)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--L", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--drift", type=float, default=0.05, help="query change per step (relative)")
    ap.add_argument("--shared-walk", type=int, default=0,
                    help="1: one walk per KV head for its query heads (search_heads shared_walk)")
    ap.add_argument("--expand-limit", type=int, default=0, help="search_heads expand_limit")
    ap.add_argument("--json")
    args = ap.parse_args()
    B, G, grp, n, d, page = args.requests, args.kv_heads, args.group, args.n, args.dim, args.page
    pairs, heads, pages = B * G, B * G * grp, n // page
    lo, hi = args.sink, n - args.window
    dev = torch.device("cuda")
    rng = np.random.default_rng(3)

    # Host tier: pair i's tokens are host pages [i * pages, (i + 1) * pages), f16, pinned.
    shift = rng.standard_normal(d).astype(np.float32)
    k_host = torch.empty(pairs * pages, page, d, dtype=torch.float16).pin_memory()
    v_host = torch.empty_like(k_host).pin_memory()
    for i in range(pairs):
        k = ood_keys(rng.standard_normal((n, d)).astype(np.float32), shift)
        k_host[i * pages:(i + 1) * pages] = torch.from_numpy(k).view(pages, page, d)
        v_host[i * pages:(i + 1) * pages] = torch.randn(pages, page, d)
    keys_of = [k_host[i * pages:(i + 1) * pages].view(n, d) for i in range(pairs)]
    qdir = rng.standard_normal(d).astype(np.float32)

    def queries(count):
        return ood_queries(rng.standard_normal((count, d)), qdir)

    # CPU indexes over the host tier itself (borrowed, no copy), built with the GPU's help.
    t0 = time.perf_counter()
    indexes = [kc.build_index(keys_of[i], queries(n // 10), nq=100, M=32, L=200)
               for i in range(pairs)]
    build_s = time.perf_counter() - t0

    # Device: the window of every pair (resident) and the offloaded page cache.
    win = torch.cat([torch.arange(0, lo), torch.arange(hi, n)])
    w = win.numel()
    k_win = torch.stack([keys_of[i][win] for i in range(pairs)]).to(dev)  # [pairs, w, d]
    v_win = torch.stack([v_host[i * pages:(i + 1) * pages].view(n, d)[win]
                         for i in range(pairs)]).to(dev)
    win_table = torch.arange(pairs, dtype=torch.int32, device=dev).view(pairs, 1)
    win_ids = torch.arange(w, dtype=torch.int32, device=dev).repeat(heads)
    win_indptr = torch.arange(heads + 1, dtype=torch.int64, device=dev) * w
    off = kc.OffloadedKV(k_host, v_host, pairs, args.slots)
    # The whole cache resident, for torch SDPA: [B, G, n, d] (what offloading saves).
    k_all = k_host.view(B, G, n, d).to(dev)
    v_all = v_host.view(B, G, n, d).to(dev)
    scale = d ** -0.5

    q0 = queries(heads)
    search_s, page_ms, step_ms, sdpa_ms, recalls, errors = [], [], [], [], [], []
    filt = kvsift.IdRange(lo, hi)
    for step in range(args.steps):
        q = q0 + args.drift * step * rng.standard_normal(q0.shape).astype(np.float32)
        q_dev = torch.from_numpy(q).to(dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        o_w, lse_w = kc.sparse_attention(q_dev, k_win, v_win, win_table, win_indptr, win_ids,
                                         scale=scale)  # enqueued; runs while the CPU searches
        t1 = time.perf_counter()
        found = kvsift.search_heads(indexes, q, args.k, L=args.L, filter=filt,
                                    threads=args.threads, shared_walk=bool(args.shared_walk),
                                    expand_limit=args.expand_limit)
        search_s.append(time.perf_counter() - t1)
        valid = found.ids != kvsift.INVALID_ID
        counts = valid.sum(axis=1)
        indptr = torch.zeros(heads + 1, dtype=torch.int64)
        indptr[1:] = torch.from_numpy(np.cumsum(counts))
        # Padded rows: move each head's valid ids to the front (top-k pads at the end).
        ids_dev = torch.from_numpy(found.ids[valid].astype(np.int32)).to(dev, non_blocking=True)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        o_r, lse_r = off.attend(q_dev, indptr.to(dev, non_blocking=True), ids_dev, scale=scale)
        b.record()
        o, lse = kc.merge_state(o_w[None], lse_w[None], o_r[None], lse_r[None])
        torch.cuda.synchronize()
        step_ms.append((time.perf_counter() - t0) * 1e3)
        page_ms.append(a.elapsed_time(b))
        # Same run, the resident alternative: SDPA over every token.
        qs = q_dev.view(B, G * grp, 1, d).half()
        c, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        c.record()
        torch.nn.functional.scaled_dot_product_attention(qs, k_all, v_all, scale=scale,
                                                         enable_gqa=True)
        e.record()
        torch.cuda.synchronize()
        sdpa_ms.append(c.elapsed_time(e))
        if step in (0, args.steps - 1):  # check: recall and the output against float64
            for h in range(0, heads, max(1, heads // 8)):
                i = h // grp
                kk = keys_of[i].to(dev).float()
                s = kk[lo:hi] @ q_dev[h]
                exact = set((torch.topk(s, args.k).indices + lo).tolist())
                got = found.ids[h][valid[h]]
                recalls.append(len(exact & set(got.tolist())) / args.k)
                toks = torch.cat([win.to(dev), torch.from_numpy(got).to(dev)])
                vv = v_host[i * pages:(i + 1) * pages].view(n, d).to(dev).double()[toks]
                logits = scale * (kk.double()[toks] @ q_dev[h].double())
                want = torch.softmax(logits, 0) @ vv
                errors.append((o[0, h].double() - want).abs().max().item())
    res = {
        "args": vars(args), "build_s_per_index": build_s / pairs,
        "step_ms_median": statistics.median(step_ms[1:]),
        "cpu_search_ms_median": statistics.median(search_s[1:]) * 1e3,
        "paging_attention_ms_median": statistics.median(page_ms[1:]),
        "sdpa_resident_ms_median": statistics.median(sdpa_ms[1:]),
        "recall_at_k": statistics.mean(recalls), "max_abs_error": max(errors),
        "device_kv_bytes": {"offloaded": 2 * (pairs * args.slots + 1) * page * d * 2
                            + 2 * pairs * w * d * 2, "resident": 2 * pairs * n * d * 2},
    }
    walk = "a walk per KV head" if args.shared_walk else "a walk per query head"
    print(f"# {torch.cuda.get_device_name()}: {B} requests x {G} KV heads x {n} tokens, "
          f"{heads} query heads, d {d}, f16; top-{args.k} (L {args.L}, expand limit "
          f"{args.expand_limit or 'L'}, {walk}) on the CPU "
          f"({args.threads or 'all'} threads), window {args.sink} + {args.window}, "
          f"{args.slots} device pages of {page} per pair; median over steps 2..{args.steps}")
    print("| measure | value |\n|---|---|")
    for key, val in res.items():
        if key != "args":
            print(f"| {key} | {val if not isinstance(val, float) else f'{val:.4g}'} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
