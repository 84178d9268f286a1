#!/usr/bin/env python3
"""Full-attention decode baseline in PyTorch, for the decode-step benchmark's table.

The question a user asks of kvsift's decode step is "how much faster than what I run today",
and what they run today is torch's `scaled_dot_product_attention` (FlashAttention-2 or the
memory-efficient kernel) over the whole KV cache. This script times exactly that, on the same
shapes as `kvsift-cuda-decode_search_bench` (B requests x H query heads, one decode query
each, G KV heads of n tokens x d, f16, GQA), with CUDA events, per SDPA backend, next to the
device's copy bandwidth measured in the same process (the floor of any exact attention: K and V
read once).

Usage: torch_sdpa_baseline.py [--requests 16] [--n 131072] [--kv-heads 8] [--group 4] [--d 128]
                              [--json FILE]
Needs a CUDA device and torch >= 2.5 (enable_gqa); prints one line per backend.
"""

import argparse
import json
import sys

from cuda_timing import median_ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--n", type=int, default=131072)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not torch.cuda.is_available():
        print("torch_sdpa_baseline: no CUDA device", file=sys.stderr)
        return 2
    dev, dt = "cuda", torch.float16
    B, G, H, n, d = a.requests, a.kv_heads, a.kv_heads * a.group, a.n, a.d
    gen = torch.Generator(device=dev).manual_seed(7)
    k = torch.randn(B, G, n, d, device=dev, dtype=dt, generator=gen)
    v = torch.randn(B, G, n, d, device=dev, dtype=dt, generator=gen)
    q = torch.randn(B, H, 1, d, device=dev, dtype=dt, generator=gen)
    kv_bytes = 2 * k.numel() * k.element_size()

    # Copy bandwidth: a device-to-device copy of a buffer as large as K (read + write).
    dst = torch.empty_like(k)
    copy_ms = median_ms(lambda: dst.copy_(k), torch, warmup=3, reps=15)
    copy_gbps = 2 * k.numel() * k.element_size() / (copy_ms * 1e-3) / 1e9
    del dst
    rows = []
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}: B={B} H={H} G={G} n={n} "
          f"d={d} f16; K+V {kv_bytes / 2**30:.2f} GiB; copy bandwidth {copy_gbps:.0f} GB/s")
    ref = None
    import warnings

    warnings.filterwarnings("ignore", message=".*kernel not used.*|.*fused kernels.*|.*disabled.*")
    for name, backend in [("flash", SDPBackend.FLASH_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION)]:
        try:
            with sdpa_kernel([backend]):
                fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
                out = fn()
                ms = median_ms(fn, torch, warmup=3, reps=15)
        except RuntimeError as e:  # backend unavailable for these shapes/this build
            print(f"torch sdpa {name:<10} unavailable: {str(e).splitlines()[0][:100]}")
            continue
        if ref is None:
            ref = out.float()
        err = float(((out.float() - ref).norm() / ref.norm()).item())
        # Against the copy's throughput counting bytes read plus written: a kernel that only
        # reads K and V can approach (or pass) it, since reads alone stress DRAM less.
        share = kv_bytes / (ms * 1e-3) / (copy_gbps * 1e9)
        print(f"torch sdpa {name:<10} {ms:8.3f} ms  {100 * share:5.1f}% of copy bandwidth  "
              f"(rel. diff to first backend {err:.1e})")
        rows.append({"backend": name, "ms": ms, "copy_share": share})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"requests": B, "query_heads": H, "kv_heads": G, "n": n, "d": d,
                       "copy_gbps": copy_gbps, "torch": torch.__version__, "rows": rows}, f,
                      indent=1)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
