"""CUDA-event timing shared by the Python GPU baselines in bench/cuda/ (imported by name: each
script runs as `python3 bench/cuda/<script>.py`, which puts this folder on sys.path)."""


def median_ms(fn, torch, warmup=2, reps=10):
    """Median milliseconds of `fn()` on the current stream over `reps` runs after `warmup`,
    each between two CUDA events (host work `fn` does before enqueuing counts too)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]
