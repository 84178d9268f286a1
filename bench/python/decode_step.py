"""A 32-head decode step (window + top-100 + merge, CPU) from Python against the same step in C++
(bench/tools/decode_step_cpu.cpp), on the same data and graphs, timed in one run.

    PYTHONPATH=build/python python3 bench/python/decode_step.py \\
        --tool build/bin/kvsift-decode_step_cpu [--tokens 8192] [--reps 100] [--rounds 5]

The tool makes the data (synthetic OOD keys per KV head, 8 KV heads x 32 query heads, d = 128)
and one RoarGraph per KV head, saved to a directory; Python loads the same arrays and graphs
(RoarGraphIndex.load), checks that its step's output equals the C++ one (bit for bit when both
are built for the same ISA: the module's KVSIFT_ISA vs the tool's build flags; else to
rounding), then the two are timed in alternating rounds. --profile adds the time of each call
of the Python step on its own.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

import kvsift as ks

from cpu_timing import best_of

H, HKV, D = 32, 8, 128


def load(dirname):
    n, sink, recent, k, L = (int(x) for x in open(os.path.join(dirname, "meta.txt")).read().split())
    K = np.fromfile(os.path.join(dirname, "K.f32"), np.float32).reshape(n, HKV, D)
    V = np.fromfile(os.path.join(dirname, "V.f32"), np.float32).reshape(n, HKV, D)
    q = np.fromfile(os.path.join(dirname, "q.f32"), np.float32).reshape(H, D)
    graphs = [ks.RoarGraphIndex.load(os.path.join(dirname, f"g{g}.kvsg"), K[:, g, :])
              for g in range(HKV)]
    return dict(n=n, sink=sink, recent=recent, k=k, L=L, K=K, V=V, q=q, graphs=graphs)


def step(s):
    """The batched step of examples/python/decode_step.py: what decode_step_cpu.cpp mirrors."""
    q, K, V, n = s["q"], s["K"], s["V"], s["n"]
    o, lse = ks.dense_attention_heads(q, K, V, 0, s["sink"])
    o, lse = ks.merge_states(o, lse, *ks.dense_attention_heads(q, K, V, n - s["recent"], n))
    r = ks.search_heads(s["graphs"], q, s["k"], L=s["L"], filter=s["filter"])
    return ks.merge_states(o, lse, *ks.sparse_attention_heads(q, K, V, r.ids))[0]


def profile(s, reps, repeats):
    """Each call of the step alone, and the step's Python-side glue (argument parsing, result
    arrays) as the step minus the calls' kernels is not separable here: reported per call."""
    q, K, V, n = s["q"], s["K"], s["V"], s["n"]
    o, lse = ks.dense_attention_heads(q, K, V, 0, s["sink"])
    o2, lse2 = ks.dense_attention_heads(q, K, V, n - s["recent"], n)
    r = ks.search_heads(s["graphs"], q, s["k"], L=s["L"], filter=s["filter"])
    calls = {
        "dense_attention_heads (sinks)": lambda: ks.dense_attention_heads(q, K, V, 0, s["sink"]),
        "dense_attention_heads (window)":
            lambda: ks.dense_attention_heads(q, K, V, n - s["recent"], n),
        "merge_states": lambda: ks.merge_states(o, lse, o2, lse2),
        "search_heads": lambda: ks.search_heads(s["graphs"], q, s["k"], L=s["L"],
                                                filter=s["filter"]),
        "sparse_attention_heads": lambda: ks.sparse_attention_heads(q, K, V, r.ids),
    }
    return {name: best_of(fn, reps, repeats) for name, fn in calls.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True, help="the kvsift-decode_step_cpu executable")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--dir", help="reuse (or keep) the tool's data here instead of a temp dir")
    a = ap.parse_args()
    tmp = None
    if a.dir is None:
        tmp = tempfile.TemporaryDirectory()
        a.dir = tmp.name
    if not os.path.exists(os.path.join(a.dir, "meta.txt")):
        subprocess.run([a.tool, "prepare", a.dir, str(a.tokens)], check=True)
    s = load(a.dir)
    s["filter"] = ks.IdRange(s["sink"], s["n"] - s["recent"])
    cpp_runs, py_runs = [], []
    width = None
    for _ in range(a.rounds):
        r = subprocess.run([a.tool, "time", a.dir, str(a.reps), str(a.repeats)], check=True,
                           capture_output=True, text=True)
        res = json.loads(r.stdout)
        cpp_runs.append(res["step_cpu_us"] * 1e-6)
        width = res["simd_width"]
        py_runs.append(best_of(lambda: step(s), a.reps, a.repeats))
    ours = step(s)
    theirs = np.fromfile(os.path.join(a.dir, "out_cpp.f32"), np.float32).reshape(H, D)
    same_isa = width == ks._kvsift._simd_width
    if same_isa:
        np.testing.assert_array_equal(ours, theirs)
    else:
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    cpp, py = statistics.median(cpp_runs), statistics.median(py_runs)
    print(f"decode step: {s['n']} tokens, {H} query heads / {HKV} KV heads, d {D}, sinks "
          f"{s['sink']} + window {s['recent']}, top-{s['k']} (L {s['L']}), 1 thread; "
          f"{a.rounds} rounds, median of each round's best of {a.repeats} x {a.reps} steps, thread CPU "
          f"time")
    print(f"C++    (simd width {width:2d})      {cpp * 1e6:10.1f} us")
    print(f"Python (kvsift.isa {ks.isa:>6s}, width {ks._kvsift._simd_width:2d}) "
          f"{py * 1e6:10.1f} us  ratio {py / cpp:.3f}x  "
          f"(outputs {'bit-identical' if same_isa else 'equal to rounding'})")
    if a.profile:
        for name, t in profile(s, a.reps, a.repeats).items():
            print(f"  {name:32s} {t * 1e6:10.1f} us")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
