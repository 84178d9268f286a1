"""Smoke runs of the Python benchmarks (bench/python/) at tiny sizes: decode_step.py against the C++
tool kvsift-decode_step_cpu (its output must equal the C++ step's, which the script checks; the
figures must be there and positive) and isa_bench.py over two builds of the module. Skipped where
the tool is not built (CI builds it: bench/tools/*.cpp with KVSIFT_BUILD_BENCH=ON)."""

import json
import os
import pathlib
import re
import subprocess

import pytest

from bench_scripts import PACKAGE_DIR, ROOT
from bench_scripts import run_bench as run
from kvsift import _isa

TOOL = pathlib.Path(os.environ.get("KVSIFT_DECODE_STEP_TOOL",
                                   ROOT / "build" / "bin" / "kvsift-decode_step_cpu"))
needs_tool = pytest.mark.skipif(not TOOL.exists(), reason=f"{TOOL} not built")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("decode_step")
    subprocess.run([str(TOOL), "prepare", str(d), "600"], check=True, timeout=300)
    return d


@needs_tool
def test_decode_step_python_equals_and_is_timed_against_cpp(data):
    out = run("decode_step.py", "--tool", str(TOOL), "--dir", str(data), "--reps", "2",
              "--repeats", "1", "--rounds", "1", "--profile")
    cpp = float(re.search(r"C\+\+ .*?([0-9.]+) us", out).group(1))
    py, ratio = (float(x) for x in re.search(r"Python .*?([0-9.]+) us  ratio ([0-9.]+)x",
                                             out).groups())
    assert cpp > 0 and py > 0 and ratio == pytest.approx(py / cpp, rel=0.01)
    assert "sparse_attention_heads" in out and "search_heads" in out


@needs_tool
def test_decode_step_is_bit_identical_to_cpp_on_the_same_isa(data):
    # Same kernels, same calls, same flags: same bits. The tool is built like the rest of the C++:
    # for the baseline ISA unless KVSIFT_NATIVE=ON (then FMA contraction may differ from any
    # module build, which only the rounding check of the other test covers).
    r = subprocess.run([str(TOOL), "time", str(data), "1", "1"], check=True, capture_output=True,
                       text=True, timeout=300)
    width = json.loads(r.stdout)["simd_width"]
    if width != 4 or _isa.BASELINE != "sse2":
        pytest.skip(f"the tool is not an x86-64 baseline build (vector width {width})")
    out = run("decode_step.py", "--tool", str(TOOL), "--dir", str(data), "--reps", "1",
              "--repeats", "1", "--rounds", "1", KVSIFT_ISA="sse2")
    assert "bit-identical" in out


@needs_tool
def test_isa_bench_runs_each_build(data):
    out = run("isa_bench.py", "--dir", str(data), "--build", f"base={PACKAGE_DIR}:sse2",
              "--build", f"auto={PACKAGE_DIR}:", "--rounds", "1", "--reps", "1")
    rows = [l for l in out.splitlines() if l.startswith(("search_heads", "sparse_attention"))]
    assert len(rows) == 5
    for row in rows:
        times = [float(t) for t in re.findall(r"([0-9.]+) us", row)]
        assert len(times) == 2 and all(t > 0 for t in times)
        assert row.rstrip().endswith("1.00x")  # the reference is the last build


def test_shared_walk_script_on_the_sample(tmp_path):
    # One walk per GQA group through search_heads on the committed sample: every row present,
    # and the group's walk scores fewer keys per query than a walk per head at the same pool.
    out = tmp_path / "shared.json"
    run("shared_walk.py", str(ROOT / "bench" / "data" / "sample"), "15", "--L", "100",
        "--E", "60", "--json", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [(r["walk"], r["L"], r["E"]) for r in rows] == [
        ("per head", 100, 0), ("group", 100, 0), ("group", 100, 60)]
    assert all(0.5 < r["recall_at_100"] <= 1 and r["us_per_position"] > 0 for r in rows)
    assert rows[1]["keys_per_query"] < rows[0]["keys_per_query"]
