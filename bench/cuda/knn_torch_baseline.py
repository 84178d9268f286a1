#!/usr/bin/env python3
"""kvsift.cuda.knn against what a PyTorch user writes instead: ``(q @ k.T).topk(k)``.

The training-query kNN of a RoarGraph build (step 1) is m queries x n keys, exact, top-k by
inner product. In PyTorch that is one GEMM that materialises the m x n score matrix, then
``topk``; kvsift's kernel streams the scores through a bounded workspace. Both are timed with
CUDA events in one process on the same tensors (median of 10 after 2 warm-ups), per dtype, and
checked to return the same k-th score. Torch's score matrix of m x n f32 must fit: at the
default shape it is 6.9 GB.

Usage: knn_torch_baseline.py [--m 13107] [--n 131072] [--d 128] [--k 100]
Needs a CUDA device and kvsift built with KVSIFT_PY_CUDA=ON.
"""

import argparse

from cuda_timing import median_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=13107)
    ap.add_argument("--n", type=int, default=131072)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--k", type=int, default=100)
    a = ap.parse_args()
    import torch
    import kvsift.cuda as kc

    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}: m={a.m} n={a.n} "
          f"d={a.d} k={a.k}, median of 10 (CUDA events)")
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        q = torch.randn(a.m, a.d, device="cuda", generator=g).to(dtype)
        x = torch.randn(a.n, a.d, device="cuda", generator=g).to(dtype)
        ours = median_ms(lambda: kc.knn(q, x, a.k), torch)
        theirs = median_ms(lambda: (q @ x.T).float().topk(a.k, dim=1), torch)
        s_ours, _ = kc.knn(q, x, a.k)
        s_theirs = (q @ x.T).float().topk(a.k, dim=1).values
        err = (s_ours[:, -1] - s_theirs[:, -1]).abs().max().item()
        print(f"{str(dtype):15s} kvsift.cuda.knn {ours:8.2f} ms   torch matmul+topk {theirs:8.2f} ms"
              f"   ratio torch/kvsift {theirs / ours:5.2f}x   max |k-th score diff| {err:.2e}")
        del q, x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
