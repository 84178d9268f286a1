"""Tests of bench/eval/evaluate.py.

The summary arithmetic and the manifest-driven defaults run everywhere (no binary needed).
The end-to-end run on the committed sample (bench/data/sample) needs a built kvsift-bench:
$KVSIFT_BENCH, else build/bin/kvsift-bench (what `.ci/test.sh` builds with
-DKVSIFT_BUILD_BENCH=ON); it skips with the reason when neither exists.

    python3 -m pytest bench/eval/test_evaluate.py
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SCRIPT = HERE / "evaluate.py"
SAMPLE = ROOT / "bench" / "data" / "sample"
BENCH = Path(os.environ.get("KVSIFT_BENCH", ROOT / "build" / "bin" / "kvsift-bench"))
sys.path.insert(0, str(HERE))
import evaluate as E  # noqa: E402


class Args:
    layers, heads, threads, dump = "0", "0:0", 1, str(SAMPLE)


def quality(window_err, topk, dipr):
    q = [{"method": "window", "param": "-", "attended": 10.0, "rel_l2_error": window_err, "recovery": 0.5}]
    q += [{"method": "exact top-k", "param": f"k={k}", "attended": a, "rel_l2_error": e, "recovery": 1.0}
          for k, a, e in topk]
    q += [{"method": "exact dipr", "param": f"beta={b}", "attended": a, "rel_l2_error": e, "recovery": 1.0}
          for b, a, e in dipr]
    return {"layer": 0, "q_head": 0, "kv_head": 0, "keys": 100, "dim": 4, "train_queries": 95,
            "eval_queries": 5, "rows": [], "quality": q}


def test_summary_when_topk_error_reaches_zero(tmp_path):
    # Top-k is exact (error 0) around DIPR's budget: the old code divided by it.
    r = quality(0.1, [(16, 20.0, 0.0), (32, 40.0, 0.0)], [(1, 30.0, 0.0), (2, 35.0, 0.01)])
    s = E.write_markdown(str(tmp_path / "x.md"), [r], ["roargraph"], Args, 1.0)
    assert s["settings"] == 2 and s["dipr_lower"] == 0 and s["equal"] == 1
    assert s["ratio_count"] == 0 and s["median_ratio"] is None
    assert "equal in 1" in (tmp_path / "x.md").read_text()


def test_summary_ratio_uses_interpolated_topk_error(tmp_path):
    # top-k error at 30 tokens, interpolated between (20, 0.1) and (40, 0.04): 0.07.
    r = quality(0.2, [(16, 20.0, 0.1), (32, 40.0, 0.04)], [(1, 30.0, 0.05), (2, 25.0, 0.1)])
    s = E.write_markdown(str(tmp_path / "x.md"), [r], ["roargraph"], Args, 1.0)
    assert s["settings"] == 2 and s["dipr_lower"] == 1 and s["ratio_count"] == 2
    assert s["min_ratio"] == pytest.approx(0.05 / 0.07)
    assert s["max_ratio"] == pytest.approx(0.1 / 0.085)


def test_defaults_come_from_the_dump_manifest():
    m = json.loads((SAMPLE / "manifest.json").read_text())
    layers, heads = E.defaults_from_manifest(str(SAMPLE))
    assert layers == ",".join(map(str, m["layers"]))
    assert heads == f"{m['query_heads_dumped'][0]}:{m['kv_heads_dumped'][0]}"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=1800)


def test_refuses_missing_bench_before_writing(tmp_path):
    out = tmp_path / "out"
    r = run("--bench", str(tmp_path / "nope"), "--dump", str(SAMPLE), "--out", str(out), "--no-plots")
    assert r.returncode != 0 and "no kvsift-bench at" in r.stderr
    assert not out.exists()


needs_bench = pytest.mark.skipif(not os.access(BENCH, os.X_OK),
                                 reason=f"no kvsift-bench at {BENCH} (build it with -DKVSIFT_BUILD_BENCH=ON "
                                        "or set KVSIFT_BENCH)")


@needs_bench
def test_end_to_end_on_the_sample(tmp_path):
    before = sorted(p.name for p in (ROOT / "docs").rglob("*")) if (ROOT / "docs").exists() else []
    # --quick: a few points of each sweep, so this stays well under 2 minutes on 2 cores.
    r = run("--bench", str(BENCH), "--dump", str(SAMPLE), "--quick", "--threads", "1")
    assert r.returncode == 0, r.stderr
    out = Path(next(line.split("writing to ", 1)[1] for line in r.stdout.splitlines() if "writing to " in line))
    try:
        assert ROOT not in out.parents  # default output is outside the repository
        after = sorted(p.name for p in (ROOT / "docs").rglob("*")) if (ROOT / "docs").exists() else []
        assert after == before
        summary = json.loads((out / "real_eval_summary.json").read_text())
        m = json.loads((SAMPLE / "manifest.json").read_text())
        assert summary["runs"] == len(m["layers"])
        for target in ("recall@10>=0.9", "recall@100>=0.9"):
            flat = summary["scanned"][f"{target}/flat"]
            assert flat["heads_reached"] == flat["heads"] and flat["max_scanned"] == pytest.approx(1.0)
            graph = summary["scanned"][f"{target}/roargraph"]
            assert graph["heads_reached"] == graph["heads"] and graph["max_scanned"] < 0.5
        for f in (out / "real_eval_json").glob("*.json"):
            rows = json.loads(f.read_text())["rows"]
            assert rows and all(0 <= x["recall"] <= 1 for x in rows)
            assert all(x["recall"] == 1 for x in rows if x["index"] == "flat")
            assert {x["index"] for x in rows} >= {"flat", "roargraph"}
        if "plots skipped" in r.stdout:  # no matplotlib: said so, tables still written
            assert not list(out.glob("*.png"))
        else:
            for name in ("real_pareto_recall10.png", "real_pareto_recall100.png",
                         "real_error_vs_attended.png"):
                assert (out / name).stat().st_size > 0
        d = summary["dipr_vs_topk"]
        assert 0 <= d["dipr_lower"] + d["equal"] <= d["settings"]
        for f in (out / "real_eval_json").glob("*.json"):
            res = json.loads(f.read_text())
            topk = sorted((x["attended"], x["rel_l2_error"]) for x in res["quality"] if x["method"] == "exact top-k")
            errors = [e for _, e in topk]
            # Not monotone on real data (window + top-k), but the largest budget covers almost every
            # causal key of the sample's 154 held-out queries: far below the smallest budget's error.
            assert min(errors) >= 0 and errors[-1] < 0.5 * errors[0]
    finally:
        import shutil
        shutil.rmtree(out, ignore_errors=True)
