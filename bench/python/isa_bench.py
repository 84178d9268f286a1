"""The Python module's hot calls under each build of the extension, interleaved in one run:
sparse_attention_heads (32 query heads over 8 KV heads, d = 128, k retrieved tokens each) and
search_heads (top-100 on one RoarGraph per KV head), on the data and graphs of
bench/tools/decode_step_cpu.cpp, timed in one subprocess per build and round, builds
alternating, so every build sees the same machine state. A build is a PYTHONPATH plus a
KVSIFT_ISA value.

    python3 bench/python/isa_bench.py --dir /tmp/ds --tool build/bin/kvsift-decode_step_cpu \\
        --build dispatch=build/python: --build sse2=build/python:sse2 \\
        --build native=build/py-native: [--rounds 5]

(build/py-native: the module configured with -DCMAKE_CXX_FLAGS=-march=native
-DKVSIFT_PY_ISA_VARIANTS=OFF.) Prints per build each call's best time over the rounds and the
ratio to the reference build (--reference, default the last one).
"""

import argparse
import json
import os
import subprocess
import sys
import time

from cpu_timing import best_of

H, HKV, D = 32, 8, 128
HERE = os.path.dirname(os.path.abspath(__file__))


def worker(a):
    """One build: loads the data and graphs of decode_step_cpu's directory, times the calls,
    prints JSON."""
    import numpy as np

    sys.path.insert(0, HERE)
    import decode_step
    import kvsift as ks

    s = decode_step.load(a.dir)
    q, K, V, graphs = s["q"], s["K"], s["V"], s["graphs"]
    out = {"isa": ks.isa, "width": int(ks._kvsift._simd_width)}
    filt = ks.IdRange(s["sink"], s["n"] - s["recent"])
    r = ks.search_heads(graphs, q, s["k"], L=s["L"], filter=filt)
    out["search_heads"] = best_of(
        lambda: ks.search_heads(graphs, q, s["k"], L=s["L"], filter=filt), a.reps)
    rng = np.random.default_rng(3)
    for k in (100, 1000):
        ids = r.ids if k == 100 else np.sort(rng.choice(s["n"], (H, k), replace=True), axis=1)
        for name, Kt, Vt in (("f32", K, V), ("f16", K.astype(np.float16), V.astype(np.float16))):
            out[f"sparse_attention_heads k={k} {name}"] = best_of(
                lambda: ks.sparse_attention_heads(q, Kt, Vt, ids), a.reps)
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", action="append", required=False, default=[],
                    help="label=PYTHONPATH:KVSIFT_ISA (ISA empty = the package's own choice)")
    ap.add_argument("--tool", help="kvsift-decode_step_cpu, to make the data in --dir if absent")
    ap.add_argument("--dir", required=True, help="decode_step_cpu's data (prepare DIR)")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reference", default=None, help="label the ratios divide by (last build)")
    ap.add_argument("--worker", action="store_true")
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    builds = []
    for b in a.build:
        label, rest = b.split("=", 1)
        path, _, isa = rest.rpartition(":")
        env = dict(os.environ, PYTHONPATH=os.path.abspath(path), KVSIFT_ISA=isa)
        builds.append((label, env))
    ref = a.reference or builds[-1][0]
    if not os.path.exists(os.path.join(a.dir, "meta.txt")):
        subprocess.run([a.tool, "prepare", a.dir, str(a.tokens)], check=True)
    runs = {label: [] for label, _ in builds}
    info = {}
    for _ in range(a.rounds):
        for label, env in builds:
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", "--dir",
                                a.dir, "--reps", str(a.reps)], env=env, check=True,
                               capture_output=True, text=True)
            res = json.loads(r.stdout)
            info[label] = (res.pop("isa"), res.pop("width"))
            runs[label].append(res)
    calls = list(runs[builds[0][0]][0])
    # The best round: on a shared machine other load only ever adds time.
    med = {label: {c: min(r[c] for r in rs) for c in calls} for label, rs in runs.items()}
    print(f"{H} query heads / {HKV} KV heads, d {D}, {a.rounds} rounds "
          f"(thread CPU time, best of the rounds' best of 5 x {a.reps} calls); ratio = time / time({ref})")
    print(f"{'call':34s}" + "".join(f"{l + ' (' + info[l][0] + '/' + str(info[l][1]) + ')':>26s}"
                                   for l, _ in builds))
    for c in calls:
        row = f"{c:34s}"
        for label, _ in builds:
            t = med[label][c]
            row += f"{t * 1e6:14.1f} us {t / med[ref][c]:6.2f}x  "
        print(row)


if __name__ == "__main__":
    main()
