"""kvsift.cuda.decode_step against torch SDPA over the same KV cache, alternated in one process:
the comparison behind the decode step's target (docs/decode_search.md: B requests x 32 query
heads on 8 KV heads, 131072 tokens, d 128, f16, recall@100 >= 0.95, >= 5x faster than full
attention).

One [B * G, n, d] f16 tensor holds every K and one every V. torch reads them as [B, G, n, d]
(scaled_dot_product_attention with enable_gqa, the faster of its flash and cuDNN backends in
each round); kvsift reads the same memory as head-wise pages through an identity page table
(page p of pair i is its tokens [p * page, (p + 1) * page)), so neither reads a copy the other
lacks. The data is the C++ bench kvsift-cuda-decode_search_bench's, array for array
(kvsift.make_ood is its generator, with gqa_heads.cuh's per-head settings: ood_data.gqa_key_set):
keys around a common mean, in 1024 topics, rounded to f16; each query head of a GQA group prefers
a topic with its own strength, its mean orthogonal to the keys'. `--distinct` key sets, each
indexed once on the GPU (build_index; training queries: kvsift.sample_gqa_queries, 10% of each of
the group's heads' n prefill queries, seed 7, as the C++ bench); pair i holds set i % distinct
and its graph, and its query heads take the set's held-out queries in the C++ bench's order.
V is random (the C++ bench aliases V to K, which hides what the step leaves out).

Per round (--rounds), CUDA events over --reps back-to-back calls of the step, then of SDPA: the
two times and their ratio. Once: recall@k of the step's search (the same search alone, window
excluded) against the exact top-k of the middle tokens; for a sample of heads, the step's output
against float64 attention over the tokens it attends (window + retrieved: the step's own error)
and the share of the full softmax mass those tokens hold; and the output against SDPA's.

    python3 bench/python/cuda_decode_step.py [--requests 16] [--n 131072] [--L 256]
        [--expand-width 16] [--max-hops 272] [--rounds 5] [--json FILE]
"""

import argparse
import json
import statistics
import time

import numpy as np
import torch

import kvsift as ks
import kvsift.cuda as kc
from gpu_timing import per_call_us
from ood_data import gqa_key_set


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--n", type=int, default=131072)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--distinct", type=int, default=2, help="key sets (and index builds)")
    ap.add_argument("--sink", type=int, default=4)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--L", type=int, default=256)
    ap.add_argument("--expand-width", type=int, default=16)
    ap.add_argument("--max-hops", type=int, default=272)
    ap.add_argument("--walk-through", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    B, G, grp, n, d, page = args.requests, args.kv_heads, args.group, args.n, args.dim, args.page
    pairs, heads, pages, D = B * G, B * G * args.group, n // page, args.distinct
    if n % page != 0 or pairs % D != 0:
        raise SystemExit("--n must be a multiple of --page and --distinct divide B x kv-heads")
    lo, hi = args.sink, n - args.window
    dev = torch.device("cuda")

    # Key sets, their GPU-built indexes, and the cache: pair i holds key set i % D. Set s is the
    # C++ bench's (seed 100 + s), with its held-out queries: per_set rows past n of each head.
    per_set = -(-pairs // D)
    made = [gqa_key_set(n, per_set, d, grp, 100 + s) for s in range(D)]
    sets = [keys for keys, _ in made]
    t0 = time.perf_counter()
    indexes = [kc.build_index(keys, ks.sample_gqa_queries([q[:n] for q in qs], 0.1, 7))
               for keys, qs in made]
    build_s = (time.perf_counter() - t0) / D
    small = kc.graph_set(indexes)
    of_pair = torch.arange(pairs, device=dev) % D
    width = small.adjacency.shape[1]
    graphs = kc.GraphSet(
        torch.from_numpy(small.adjacency).to(dev).view(D, n, width)[of_pair].reshape(-1, width),
        torch.arange(pairs + 1, device=dev, dtype=torch.int64) * n,
        torch.from_numpy(small.entries).to(dev)[of_pair].contiguous(), n)
    k_sets = torch.stack([torch.from_numpy(s) for s in sets]).to(dev).half()
    k = k_sets[of_pair]  # [pairs, n, d], pair i's own memory
    del k_sets
    v = torch.randn(pairs, n, d, device=dev, dtype=torch.float16,
                    generator=torch.Generator(device=dev).manual_seed(5))
    k_pages, v_pages = k.view(pairs * pages, page, d), v.view(pairs * pages, page, d)
    table = torch.arange(pairs * pages, device=dev, dtype=torch.int32).view(pairs, pages)
    # Query head h (pair g = h // grp, member h % grp) takes held-out query g // D of its set's
    # member, as the C++ bench does.
    q = torch.from_numpy(np.stack([made[(h // grp) % D][1][h % grp][n + (h // grp) // D]
                                   for h in range(heads)])).to(dev)
    scale = d ** -0.5
    knobs = dict(k=args.k, L=args.L, expand_width=args.expand_width,
                 walk_through=bool(args.walk_through), max_hops=args.max_hops)

    def step():
        return kc.decode_step(graphs, q, k_pages, v_pages, table, sink=args.sink,
                              window=args.window, scale=scale, **knobs)

    qs = q.half().view(B, G * grp, 1, d)
    kt, vt = k.view(B, G, n, d), v.view(B, G, n, d)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa_with(backend):
        def run():
            with sdpa_kernel([backend]):
                return torch.nn.functional.scaled_dot_product_attention(qs, kt, vt, scale=scale,
                                                                         enable_gqa=True)
        return run

    backends = []
    for name, b in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        fn = sdpa_with(b)
        try:
            fn()
            backends.append((name, fn))
        except RuntimeError as e:
            print(f"torch sdpa {name} unavailable: {str(e).splitlines()[0][:100]}")

    # Quality, once: the search as the step runs it, and the output against SDPA's.
    first = torch.full((heads,), lo, device=dev, dtype=torch.int32)
    last = torch.full((heads,), hi, device=dev, dtype=torch.int32)
    r = kc.decode_search(graphs, q, pages=(k_pages, table), id_range=(first, last), **knobs)
    ids, counts = r.ids.cpu().numpy(), r.counts.cpu().numpy()
    hits = 0
    for i in range(pairs):
        s = q[i * grp:(i + 1) * grp] @ k[i, lo:hi].float().T
        exact = (torch.topk(s, args.k, dim=1).indices + lo).cpu().numpy()
        for j in range(grp):
            h = i * grp + j
            hits += len(np.intersect1d(ids[h, :counts[h]], exact[j]))
    recall = hits / (heads * args.k)
    o, _ = step()
    # The step against float64 attention over its own tokens, and those tokens' softmax mass.
    window = torch.cat([torch.arange(0, lo), torch.arange(hi, n)]).to(dev)
    own_err, mass = 0.0, []
    for h in range(0, heads, max(1, heads // 8)):
        i = h // grp
        got = torch.from_numpy(ids[h, :counts[h]].astype(np.int64)).to(dev)
        toks = torch.cat([window, got])
        logits = scale * (k[i].double() @ q[h].double())
        want = torch.softmax(logits[toks], 0) @ v[i].double()[toks]
        own_err = max(own_err, float((o[h].double() - want).abs().max()))
        mass.append(float(torch.softmax(logits, 0)[toks].sum()))
    ref = backends[0][1]().float().reshape(heads, d)
    rel_err = float((o - ref).norm() / ref.norm())

    rows = []
    for rnd in range(args.rounds):
        step_us, step_host = per_call_us(step, args.reps)
        best = None
        for name, fn in backends:
            us, _ = per_call_us(fn, args.reps)
            if best is None or us < best[1]:
                best = (name, us)
        rows.append({"round": rnd, "step_us": step_us, "step_host_us": step_host,
                     "sdpa_us": best[1], "sdpa_backend": best[0], "speedup": best[1] / step_us})
    ratios = [x["speedup"] for x in rows]
    res = {"args": vars(args), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "build_s_per_index": build_s, "recall_at_k": recall, "output_rel_l2_vs_sdpa": rel_err,
           "max_abs_error_vs_own_tokens": own_err, "softmax_mass_attended": statistics.mean(mass),
           "rounds": rows, "speedup_median": statistics.median(ratios),
           "speedup_min": min(ratios), "speedup_max": max(ratios)}
    print(f"# {res['device']}, torch {res['torch']}: {B} requests x {G * grp} query heads "
          f"({G} KV heads) x {n} tokens, d {d}, f16; window {args.sink} + {args.window} + top-"
          f"{args.k} (L {args.L}, expand_width {args.expand_width}, max_hops {args.max_hops}, "
          f"walk_through {bool(args.walk_through)}); {args.reps} calls per timing")
    print(f"recall@{args.k} of the middle tokens {recall:.4f}; softmax mass attended "
          f"{res['softmax_mass_attended']:.4f}; step output vs float64 attention over its own "
          f"tokens, max abs {own_err:.2e}; vs SDPA, relative L2 {rel_err:.2e}; GPU build "
          f"{build_s:.2f} s per index")
    print("| round | step us (host us) | torch SDPA us (backend) | speedup |\n|---|---|---|---|")
    for x in rows:
        print(f"| {x['round']} | {x['step_us']:.1f} ({x['step_host_us']:.1f}) | "
              f"{x['sdpa_us']:.1f} ({x['sdpa_backend']}) | {x['speedup']:.2f}x |")
    print(f"speedup median {res['speedup_median']:.2f}x, range {min(ratios):.2f}-"
          f"{max(ratios):.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
