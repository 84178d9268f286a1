#!/usr/bin/env python3
"""Compile cost of kvsift's public headers: CPU seconds and peak memory of compiling a
one-line program that includes one header, with the compiler and flags a consumer would use
(default: g++ -O2 -std=c++20).

Each header is compiled alone (`#include <kvsift/...>` and an empty main), `--repeat` times;
the minimum CPU time (user + sys of the compiler and its children, from wait4) and the peak
resident memory of the largest compiler process are reported, with the preprocessed line count.

Targets (issue "a fast umbrella include"): <kvsift/kvsift.hpp> <= 2 s CPU, every other public
header <= 1 s. Over-target headers are listed as warnings; the exit status is 0 unless
--strict is given (timings on a shared machine are noisy, so ctest only warns).

    tools/compile_time.py                       # every public header + the umbrella
    tools/compile_time.py kvsift/kvsift.hpp     # just these
    tools/compile_time.py --include-dir /other/checkout/include   # measure another tree
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
    ap.add_argument("--repeat", type=int, default=1, help="runs per header; the minimum is kept")
    ap.add_argument("--umbrella-target", type=float, default=2.0)
    ap.add_argument("--header-target", type=float, default=1.0)
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args()

    headers = args.headers or public_headers(args.include_dir)
    base = [args.cxx, *args.flags.split(), f"-I{args.include_dir}"]
    for d in args.system_include:
        base += ["-isystem", d]

    over = []
    total = 0.0
    print(f"{'header':<48} {'cpu s':>7} {'peak MiB':>9} {'pp lines':>9}  target")
    with tempfile.TemporaryDirectory() as tmp:
        for h in headers:
            extra = []
            if h in OPTIONAL:
                found = [d for d in OPTIONAL[h] if Path(d).is_dir()]
                if not found:
                    print(f"{h:<48} skipped: its optional dependency is not installed")
                    continue
                extra = ["-isystem", found[0]]
            src = Path(tmp) / "one.cpp"
            src.write_text(f"#include <{h}>\nint main() {{ return 0; }}\n")
            best_cpu, best_mem = float("inf"), 0.0
            for _ in range(max(1, args.repeat)):
                cpu, mem, rc = measure([*base, *extra, "-c", str(src), "-o", os.devnull])
                if rc != 0:
                    print(f"{h}: compile failed", file=sys.stderr)
                    return 2
                if cpu < best_cpu:
                    best_cpu, best_mem = cpu, mem
            pp = subprocess.run([*base, *extra, "-E", "-P", str(src)], capture_output=True, text=True,
                                check=True).stdout.count("\n")
            target = args.umbrella_target if h == UMBRELLA else args.header_target
            if h in OPTIONAL:
                target = float("inf")  # the peer's own cost, not kvsift's
            mark = "ok" if best_cpu <= target else f"OVER {target:g} s"
            if best_cpu > target:
                over.append(h)
            total += best_cpu
            print(f"{h:<48} {best_cpu:7.2f} {best_mem:9.0f} {pp:9d}  {mark}", flush=True)
    print(f"total {total:.1f} s over {len(headers)} headers "
          f"({args.cxx} {args.flags}, {time.strftime('%Y-%m-%d %H:%M')})")
    if over:
        print(f"warning: {len(over)} header(s) over target: {' '.join(over)}")
        return 1 if args.strict else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
