#!/usr/bin/env python3
"""Compile cost of kvsift's public headers: CPU seconds and peak memory of compiling a
one-line program that includes one header, with the compiler and flags a consumer would use
(default: g++ -O2 -std=c++20).

Each header is compiled alone (`#include <kvsift/...>` and an empty main), `--repeat` times;
the minimum CPU time (user + sys of the compiler and its children, from wait4) and the peak
resident memory of the largest compiler process are reported, with the preprocessed line count.

Targets: <kvsift/kvsift.hpp> <= 2 s CPU, every other public header <= 1 s. Over-target headers are listed as warnings; the exit status is 0 unless
--strict is given (timings on a shared machine are noisy, so ctest only warns).

    tools/compile_time.py                       # every public header + the umbrella
    tools/compile_time.py kvsift/kvsift.hpp     # just these
    tools/compile_time.py --include-dir /other/checkout/include   # measure another tree
    tools/compile_time.py --repeat 3 --compare-include-dir /old/checkout/include  # before/after

Timings on a shared machine drift by tens of percent over minutes, so --repeat passes go
round robin over the headers (each header's samples spread over the run) and the minimum is
kept; compare trees with --compare-include-dir, in one run, rather than across runs.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

UMBRELLA = "kvsift/kvsift.hpp"
# Headers that include an optional third-party library, with the -isystem dirs it may be in;
# measured (as the cost of the peer they wrap) when one is found, skipped otherwise.
OPTIONAL = {"kvsift/index/knn_eigen.hpp": ["/usr/include/eigen3", "/usr/local/include/eigen3"]}


def public_headers(include_dir: Path) -> list[str]:
    out = []
    for p in sorted((include_dir / "kvsift").rglob("*.hpp")):
        rel = p.relative_to(include_dir).as_posix()
        if "/detail/" in rel or rel == UMBRELLA:
            continue
        out.append(rel)
    return [UMBRELLA] + out


def measure(cmd: list[str]) -> tuple[float, float, int]:
    """(CPU seconds, peak RSS MiB, exit status) of one compiler run."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        sys.stderr.write(err)
    return ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024.0, rc


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("headers", nargs="*", help="headers relative to the include dir (default: all)")
    ap.add_argument("--include-dir", type=Path, default=root / "include")
    ap.add_argument("--cxx", default=os.environ.get("CXX_FOR_TIMING", "g++"))
    ap.add_argument("--flags", default="-O2 -std=c++20")
    ap.add_argument("--system-include", action="append", default=[],
                    help="extra -isystem dirs (the library itself needs none)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="round-robin passes over the headers; each header's minimum is kept")
    ap.add_argument("--compare-include-dir", type=Path,
                    help="another tree (e.g. an older checkout's include/) measured interleaved "
                         "with this one; its times and the ratio are printed beside")
    ap.add_argument("--umbrella-target", type=float, default=2.0)
    ap.add_argument("--header-target", type=float, default=1.0)
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args()

    headers = args.headers or public_headers(args.include_dir)
    sys_inc = [x for d in args.system_include for x in ("-isystem", d)]

    trees = [args.include_dir] + ([args.compare_include_dir] if args.compare_include_dir else [])
    jobs = []  # (header, tree index, command)
    skipped = []
    with tempfile.TemporaryDirectory() as tmp:
        for h in headers:
            extra = []
            if h in OPTIONAL:
                found = [d for d in OPTIONAL[h] if Path(d).is_dir()]
                if not found:
                    skipped.append(h)
                    continue
                extra = ["-isystem", found[0]]
            src = Path(tmp) / (h.replace("/", "_") + ".cpp")
            src.write_text(f"#include <{h}>\nint main() {{ return 0; }}\n")
            for t, tree in enumerate(trees):
                if t > 0 and not (tree / h).is_file():
                    continue  # a header the other tree does not have
                cmd = [args.cxx, *args.flags.split(), f"-I{tree}", *sys_inc, *extra]
                jobs.append((h, t, cmd, src))
        # Round robin: every header (and tree) once per pass, so the samples of one header are
        # spread over the whole run and a slow minute of a shared machine hits all alike.
        best: dict[tuple[str, int], tuple[float, float]] = {}
        for _ in range(max(1, args.repeat)):
            for h, t, cmd, src in jobs:
                cpu, mem, rc = measure([*cmd, "-c", str(src), "-o", os.devnull])
                if rc != 0:
                    print(f"{h}: compile failed", file=sys.stderr)
                    return 2
                if cpu < best.get((h, t), (float("inf"), 0.0))[0]:
                    best[(h, t)] = (cpu, mem)
        pp_lines = {}
        for h, t, cmd, src in jobs:
            if t == 0:
                pp_lines[h] = subprocess.run([*cmd, "-E", "-P", str(src)], capture_output=True,
                                             text=True, check=True).stdout.count("\n")

    compare = f" {'other s':>8} {'ratio':>6}" if len(trees) > 1 else ""
    print(f"{'header':<48} {'cpu s':>7} {'peak MiB':>9} {'pp lines':>9}{compare}  target")
    over = []
    total = 0.0
    for h in headers:
        if h in skipped:
            print(f"{h:<48} skipped: its optional dependency is not installed")
            continue
        cpu, mem = best[(h, 0)]
        target = args.umbrella_target if h == UMBRELLA else args.header_target
        if h in OPTIONAL:
            target = float("inf")  # the peer's own cost, not kvsift's
        mark = "ok" if cpu <= target else f"OVER {target:g} s"
        if cpu > target:
            over.append(h)
        total += cpu
        other = ""
        if len(trees) > 1:
            o = best.get((h, 1))
            other = f" {o[0]:8.2f} {cpu / o[0]:6.2f}" if o else f" {'-':>8} {'-':>6}"
        print(f"{h:<48} {cpu:7.2f} {mem:9.0f} {pp_lines[h]:9d}{other}  {mark}", flush=True)
    print(f"total {total:.1f} s over {len(headers) - len(skipped)} headers "
          f"({args.cxx} {args.flags}, minimum of {max(1, args.repeat)} round-robin passes, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.2f})")
    if len(trees) > 1:
        print(f"ratio = this tree / {args.compare_include_dir}, measured interleaved")
    if over:
        print(f"warning: {len(over)} header(s) over target: {' '.join(over)}")
        return 1 if args.strict else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
