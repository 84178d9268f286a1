"""CPU timing shared by the Python benchmarks in bench/python/ (imported by name: each script
runs as `python3 bench/python/<script>.py`, which puts this folder on sys.path)."""

import time


def best_of(fn, reps, repeats=5):
    """Best per-call time of `repeats` loops of `reps` calls, in the calling thread's CPU time:
    every call measured here runs on this thread (threads=1), and on a shared machine the wall
    clock also counts the time other processes hold the core (+-30% between runs on the 2-core
    build machine; thread CPU time: a few %). One warm-up call first."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.thread_time()
        for _ in range(reps):
            fn()
        best = min(best, (time.thread_time() - t) / reps)
    return best
