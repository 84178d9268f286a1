#!/usr/bin/env python3
"""Per-call cost of a small GPU merge from Python (kvsift.cuda.merge_state on torch tensors),
the Python half of the comparison whose C++ half is kvsift-cuda-merge_overhead_bench: same
shapes, same number of calls, host time of the loop (synchronised once at the end) and stream
time (CUDA events). Reports the high-level call (allocates its outputs, as FlashInfer's does)
and the low-level one (outputs passed in).

With --breakdown it also times the pieces of the high-level call one by one (the stream
lookup, the two output allocations, the DLPack exports, the extension call itself), so the
overhead can be attributed.

Usage: merge_overhead.py [--rows 1] [--heads 32] [--dim 128] [--calls 5000] [--breakdown]
"""
import argparse
import math
import time

import torch

import kvsift.cuda as kc
from kvsift import _kvsift_cuda as ext


def measure(fn, calls):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    best_host, best_dev = 1e30, 1e30
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        b.record()
        b.synchronize()
        best_host = min(best_host, (t1 - t0) * 1e6 / calls)
        best_dev = min(best_dev, a.elapsed_time(b) * 1e3 / calls)
    return best_host, best_dev


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--breakdown", action="store_true", help="also time the pieces of the call")
    a = ap.parse_args()
    v = [torch.zeros(a.rows, a.heads, a.dim, dtype=torch.float16, device="cuda") for _ in range(3)]
    s = [torch.zeros(a.rows, a.heads, dtype=torch.float32, device="cuda") for _ in range(3)]
    st = torch.cuda.current_stream().cuda_stream
    direct = kc._load_torch_ext()  # None unless built with KVSIFT_PY_TORCH=ON
    rows = [("kvsift.cuda.merge_state (allocates outputs; kvsift._kvsift_torch when built)",
             lambda: kc.merge_state(v[0], s[0], v[1], s[1])),
            # lse_base=math.e is the default's value but not its spelling: the DLPack route
            ("kvsift.cuda.merge_state, DLPack route (allocates outputs)",
             lambda: kc.merge_state(v[0], s[0], v[1], s[1], lse_base=math.e)),
            ("kvsift._kvsift_cuda.merge_state (outputs passed in, C DLPack export)",
             lambda: ext.merge_state(*kc._dl(v[0], s[0], v[1], s[1], v[2], s[2]), st)),
            ("kvsift._kvsift_cuda.merge_state (outputs passed in, Tensor.__dlpack__)",
             lambda: ext.merge_state(v[0], s[0], v[1], s[1], v[2], s[2], st)),
            ("torch.logaddexp on the lse (one torch op, for scale)",
             lambda: torch.logaddexp(s[0], s[1]))]
    if direct is not None:
        op = torch.ops.kvsift.merge_state.default  # registered by importing kvsift._kvsift_torch
        rows[1:1] = [("kvsift.cuda.merge_state(..., out=) (outputs passed in)",
                      lambda: kc.merge_state(v[0], s[0], v[1], s[1], out=(v[2], s[2]))),
                     ("kvsift._kvsift_torch.merge_state_out (outputs passed in, alone)",
                      lambda: direct.merge_state_out(v[0], s[0], v[1], s[1], v[2], s[2])),
                     ("kvsift._kvsift_torch.merge_state (the at::Tensor function alone)",
                      lambda: direct.merge_state(v[0], s[0], v[1], s[1])),
                     ("torch.ops.kvsift.merge_state.default (the custom operator alone)",
                      lambda: op(v[0], s[0], v[1], s[1]))]
    if a.breakdown:
        from torch.utils.dlpack import to_dlpack

        dev = v[0].device
        rows += [("piece: torch.cuda.current_stream(device).cuda_stream",
                  lambda: torch.cuda.current_stream(dev).cuda_stream),
                 ("piece: torch._C._cuda_getCurrentRawStream(index)",
                  lambda: torch._C._cuda_getCurrentRawStream(dev.index)),
                 ("piece: kvsift.cuda._stream(v, None)", lambda: kc._stream(v[0], None)),
                 ("piece: two torch.empty outputs", lambda: (torch.empty(tuple(v[0].shape), dtype=v[0].dtype,
                                                                          device=dev),
                                                              torch.empty(tuple(s[0].shape), dtype=s[0].dtype,
                                                                          device=dev))),
                 ("piece: two torch.empty_like outputs", lambda: (torch.empty_like(v[0]), torch.empty_like(s[0]))),
                 ("piece: six to_dlpack exports", lambda: [to_dlpack(t) for t in (v[0], s[0], v[1], s[1], v[2], s[2])]),
                 ("piece: kvsift.cuda._dl of six tensors", lambda: kc._dl(v[0], s[0], v[1], s[1], v[2], s[2])),
                 ("piece: _on_stream context (not explicit)", lambda: kc._on_stream(v[0], st, False).__enter__())]
    for name, fn in rows:
        h, d = measure(fn, a.calls)
        print(f"Python {name} [{a.rows}, {a.heads}, {a.dim}] f16: host {h:.2f} us/call "
              f"(enqueue), stream {d:.2f} us/call (events)")


if __name__ == "__main__":
    main()
