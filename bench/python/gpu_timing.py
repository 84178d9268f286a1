"""GPU timing shared by the Python benchmarks in bench/python/ (imported by name: each script
runs as `python3 bench/python/<script>.py`, which puts this folder on sys.path)."""

import time


def per_call_us(fn, reps):
    """(GPU us, host us) per call of `fn`: CUDA events around `reps` back-to-back calls after one
    warm-up, and the host's time to enqueue them. When the host is slower than the GPU the
    event time is the host's pace too (what a caller sees)."""
    import torch

    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    host = (time.perf_counter() - t0) / reps
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1e3, host * 1e6
