"""kvsift.transformers on a CUDA device against the attention a transformers user has already:
SDPA with a DynamicCache, the same randomly initialised Llama, the same prompt, one run.

The model has Llama-3-8B's layer shape (hidden 4096, 32 query heads, 8 KV heads, head dim 128,
MLP 14336) with `--layers` layers and random weights (no real weights on the device machine: only
speed is measured here; quality is the CPU tests' and the e2e evaluation's). Reports, for
each attention: the prefill time (kvsift's includes building every layer's indexes on the GPU,
also reported alone), the median time per decoded token of the whole model (host synchronised
after each token; transformers' Python per layer is part of it, as for any user), and one
layer's attention call alone at the final context (CUDA events over `--reps` calls, and the
host's enqueue time), plus how many greedy tokens agree (a random model attends diffusely, so
this is a sanity figure, not a quality result).

    python3 bench/python/transformers_cuda.py [--prompt 32768] [--layers 2] [--new 32]
"""

import argparse
import json
import statistics
import time

import contextlib

import torch
import transformers
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import kvsift.cuda as kc
import kvsift.transformers as kt
from gpu_timing import per_call_us

# (row label, attention implementation, SDPA backends for the whole run: None = torch's choice).
# kvsift's prefill is SDPA too; it runs with the flash backend like the fastest SDPA row.
RUNS = [
    ("sdpa (torch's default backend)", "sdpa", None),
    ("sdpa (flash backend)", "sdpa", [SDPBackend.FLASH_ATTENTION]),
    ("sdpa (cuDNN backend)", "sdpa", [SDPBackend.CUDNN_ATTENTION]),
    ("kvsift", kt.NAME, [SDPBackend.FLASH_ATTENTION]),
]


def sync_time(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    r = fn()
    torch.cuda.synchronize()
    return r, time.perf_counter() - t0


def decode(model, cache, tok, new):
    """Greedy tokens and per-token seconds, one token per forward."""
    toks, times = [], []
    with torch.no_grad():
        for _ in range(new):
            out, dt = sync_time(lambda: model(tok, past_key_values=cache, logits_to_keep=1))
            tok = out.logits[:, -1:].argmax(-1)
            toks.append(int(tok))
            times.append(dt)
    return toks, times


def host_breakdown(cache, q, key, value, scaling, reps):
    """Host microseconds of each stage of kvsift's GPU attention call, each repeated alone on
    the inputs of one call (the cache's layer 0 at the final context)."""
    state = cache.kvsift_layers[0]
    k_pages, v_pages = key[0], value[0]
    heads, kv_heads, n = q.shape[1], k_pages.shape[0], k_pages.shape[1]
    lo, hi = cache.sink, state.prompt - cache.window
    qf = q[0, :, 0, :].float().contiguous()
    pt = cache._gpu_page_table(kv_heads, q.device)
    k = min(cache.k, hi - lo)
    carry = torch.full((heads, k), -1, dtype=torch.int32, device=q.device)

    def step():
        return kc.decode_step(state.gpu, qf, k_pages, v_pages, pt, k=k, L=max(cache.L, k),
                              expand_width=cache.expand_width, walk_through=cache.walk_through,
                              sink=cache.sink, window=cache.window, unindexed=n - state.prompt,
                              scale=scaling, carry=carry)

    o, _ = step()
    stages = {
        "q to f32": lambda: q[0, :, 0, :].float().contiguous(),
        "decode_step": step,
        "carry fill + count + cast": lambda: (carry.fill_(-1), (carry >= 0).sum(),
                                              o.to(q.dtype).view(1, 1, heads, -1)),
    }
    return {name: per_call_us(fn, reps)[1] for name, fn in stages.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=32768)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--L", type=int, default=128)
    ap.add_argument("--sink", type=int, default=4)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--expand-width", type=int, default=8)
    ap.add_argument("--warm-start", type=int, default=0,
                    help="KvsiftCache(warm_start=): seed each step from the last one's ids")
    ap.add_argument("--walk-through", type=int, default=1, choices=[0, 1])
    ap.add_argument("--train-ratio", type=float, default=0.1)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)

    config = transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=args.layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=args.prompt + args.new + 16,
        rope_theta=500000.0,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    ids = torch.randint(0, config.vocab_size, (1, args.prompt), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(1))
    build_s = []
    real_build = kt.KvsiftCache._build_cuda

    def timed_build(self, *a):
        _, dt = sync_time(lambda: real_build(self, *a))
        build_s.append(dt)

    kt.KvsiftCache._build_cuda = timed_build
    rows, tokens, breakdown = {}, {}, {}
    for label, impl, backends in RUNS:
        model.set_attn_implementation(impl)
        if impl == "sdpa":
            cache = transformers.DynamicCache(config=config)
        else:
            cache = kt.KvsiftCache(config, sink=args.sink, window=args.window, k=args.k, L=args.L,
                                   expand_width=args.expand_width, train_ratio=args.train_ratio,
                                   warm_start=args.warm_start,
                                   walk_through=bool(args.walk_through))
        def backend():
            return contextlib.nullcontext() if backends is None else sdpa_kernel(backends)

        with backend():
            with torch.no_grad():
                out, prefill = sync_time(
                    lambda: model(ids, past_key_values=cache, logits_to_keep=1))
            toks, times = decode(model, cache, out.logits[:, -1:].argmax(-1), args.new)
        tokens[label] = toks
        # One layer's attention alone at the final context, on a decode query of the model's
        # scale (the cache's own key and value tensors).
        layer = model.model.layers[0].self_attn
        key, value = cache.layers[0].keys, cache.layers[0].values
        q = torch.randn(1, 32, 1, 128, device="cuda", dtype=dtype)
        scaling = 128 ** -0.5
        if impl == "sdpa":
            fn = lambda: sdpa_attention_forward(layer, q, key, value, None, scaling=scaling)  # noqa
        else:
            kt._active_cache.set(cache)
            fn = lambda: kt.kvsift_attention(layer, q, key, value, None, scaling=scaling)  # noqa
            breakdown = host_breakdown(cache, q, key, value, scaling, args.reps)
        with backend():
            gpu_us, host_us = per_call_us(fn, args.reps)
        rows[label] = {
            "prefill_s": prefill,
            "build_s": sum(build_s) if impl != "sdpa" else 0.0,
            "token_ms_median": statistics.median(times) * 1e3,
            "token_ms_min": min(times) * 1e3,
            "attention_gpu_us": gpu_us,
            "attention_host_us": host_us,
        }
        del cache
        torch.cuda.empty_cache()
    flash = RUNS[1][0]
    agree = sum(a == b for a, b in zip(tokens[flash], tokens["kvsift"]))
    ratio = rows["kvsift"]["token_ms_median"] / rows[flash]["token_ms_median"]
    layer_ratio = rows["kvsift"]["attention_gpu_us"] / rows[flash]["attention_gpu_us"]
    print(f"# {torch.cuda.get_device_name()}, Llama-3-8B layer shape x {args.layers} layers, random "
          f"weights, {args.dtype}, prompt {args.prompt}, {args.new} tokens; kvsift top-{args.k} "
          f"L {args.L} sink {args.sink} window {args.window} expand_width {args.expand_width} "
          f"warm_start {args.warm_start} walk_through {args.walk_through}")
    print("| attention | prefill s | of it: index build s | per token ms (median / min) | "
          "one layer's attention: GPU us / host us |")
    print("|---|---|---|---|---|")
    for impl, r in rows.items():
        print(f"| {impl} | {r['prefill_s']:.3f} | {r['build_s']:.3f} | "
              f"{r['token_ms_median']:.3f} / {r['token_ms_min']:.3f} | "
              f"{r['attention_gpu_us']:.1f} / {r['attention_host_us']:.1f} |")
    print(f"kvsift / sdpa (flash): per token {ratio:.2f}x, one layer's attention {layer_ratio:.2f}x; "
          f"greedy tokens equal: {agree} of {args.new}")
    print("kvsift's attention call, host time per stage (us, each alone over the reps): "
          + ", ".join(f"{k} {v:.1f}" for k, v in breakdown.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "tokens_equal": agree,
                       "kvsift_host_us": breakdown}, f, indent=1)


if __name__ == "__main__":
    main()
