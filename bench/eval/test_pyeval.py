"""Tests of bench/eval/pyeval.py, datasets.py and frontier.py.

The dataset, Pareto and recall helpers run everywhere (numpy only). The runs need the kvsift
module (PYTHONPATH=build/python, what `.ci/test.sh` builds) and skip with the reason without it;
hnswlib / faiss rows are checked only where those packages import (CI has neither: pyeval.py
then says it skips them).

    PYTHONPATH=build/python python3 -m pytest bench/eval/test_pyeval.py
"""
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SAMPLE = ROOT / "bench" / "data" / "sample"
sys.path.insert(0, str(HERE))
import datasets  # noqa: E402
import frontier  # noqa: E402
import pyeval  # noqa: E402

try:
    import kvsift  # noqa: F401

    HAVE_KVSIFT = True
except ImportError:
    HAVE_KVSIFT = False
needs_kvsift = pytest.mark.skipif(not HAVE_KVSIFT, reason="kvsift module not importable "
                                  "(build build/python, set PYTHONPATH=build/python)")


def write_fbin(path, a):
    a = np.ascontiguousarray(a, dtype="<f4")
    with open(path, "wb") as f:
        np.array(a.shape, dtype="<u4").tofile(f)
        a.tofile(f)


def test_pareto_keeps_only_non_dominated_points():
    pts = [(5, 0.9), (1, 0.5), (2, 0.4), (3, 0.7), (3, 0.8), (4, 0.8), (6, 0.95), (None, 1.0)]
    # (2, .4) is beaten by (1, .5); (3, .7) by (3, .8); (4, .8) by (3, .8); None is unmeasured.
    assert frontier.pareto(pts) == [(1, 0.5), (3, 0.8), (5, 0.9), (6, 0.95)]
    assert frontier.pareto([]) == []


def test_plots_are_skipped_with_a_message_without_matplotlib(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    assert frontier.have_matplotlib() is False
    assert "plots skipped: matplotlib is not installed" in capsys.readouterr().out


def test_recall_counts_overlap_per_query():
    truth = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    ids = np.array([[4, 3, 9, 9], [5, 0, 0, 0]])
    assert pyeval.recall(ids, truth, 4) == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert pyeval.recall(ids, truth, 1) == pytest.approx(0.5)  # only 5 == 5 in the first column


def test_split_is_by_position():
    s = datasets.split(3072, 0.95, 4)
    assert s.n_train == 2918 and s.eval_positions[0] == 2918 and s.eval_positions[-1] < 3072
    assert np.all(np.diff(s.eval_positions) == 4)
    for bad in ((10, 0.0, 1), (10, 1.0, 1), (10, 0.5, 0), (1, 0.5, 1)):
        with pytest.raises(ValueError):
            datasets.split(*bad)


def test_read_fbin_rejects_a_truncated_file(tmp_path):
    write_fbin(tmp_path / "a.fbin", np.ones((3, 2)))
    assert datasets.read_fbin(tmp_path / "a.fbin").shape == (3, 2)
    data = (tmp_path / "a.fbin").read_bytes()
    (tmp_path / "b.fbin").write_bytes(data[:-4])
    with pytest.raises(ValueError, match="expected 32 bytes"):
        datasets.read_fbin(tmp_path / "b.fbin")


def test_sample_dump_reads_with_its_manifest():
    d = datasets.Dump(str(SAMPLE))
    m = json.loads((SAMPLE / "manifest.json").read_text())
    assert d.layers == m["layers"] and d.heads_of(0) == m["query_heads_dumped"]
    assert d.scale == pytest.approx(1 / math.sqrt(m["head_dim"]))  # llama: 1/sqrt(d)
    ld = d.layer(d.layers[0])
    assert ld.keys.shape == (m["token_count"], m["head_dim"]) and set(ld.queries) == {0, 1, 2}


def tiny_dump(tmp_path, n=900, d=16, heads=2):
    """A synthetic dump: random keys with a few heavy keys, queries near them."""
    tmp_path.mkdir()
    rng = np.random.default_rng(3)
    keys = rng.standard_normal((n, d)).astype(np.float32)
    write_fbin(tmp_path / "L3_k0.fbin", keys)
    write_fbin(tmp_path / "L3_v0.fbin", rng.standard_normal((n, d)))
    for h in range(heads):
        write_fbin(tmp_path / f"L3_q{h}.fbin", 2 * keys[rng.integers(0, n, n)] +
                   rng.standard_normal((n, d)))
    (tmp_path / "manifest.json").write_text(json.dumps({
        "model": "tiny", "layers": [3], "kv_heads_dumped": [0],
        "query_heads_dumped": list(range(heads)), "gqa_group": {str(h): 0 for h in range(heads)},
        "head_dim": d, "token_count": n}))
    return tmp_path


@needs_kvsift
def test_tiny_dump_exact_limits(tmp_path):
    dump = tiny_dump(tmp_path / "dump")
    res = pyeval.main(["--dump", str(dump), "--out", str(tmp_path / "out"), "--methods",
                       "flat,roargraph", "--eval-stride", "1", "--train-fraction", "0.9",
                       "--L", "10,100,400", "--beta", "0.5,1000", "--attn-k", "8,100000",
                       "--recent", "64", "--threads", "1", "--no-plots", "--dipr-cap", "1,100000",
                       "--dipr-hops", "1"])
    lay = res["layers"][0]
    rows = lay["rows"]
    assert {r["head"] for r in rows} == {0, 1}
    for r in rows:
        assert 0 <= r["recall"] <= 1
    assert all(r["recall"] == 1 and r["scanned"] == 1 for r in rows if r["index"] == "flat")
    big = [r for r in rows if r["index"] == "roargraph" and r["param"] == 400]
    assert big and all(r["recall"] >= 0.95 for r in big)
    # The sweep reaches the search: a wider beam scores more keys (same head and k).
    small = {(r["head"], r["k"]): r["scanned"] for r in rows
             if r["index"] == "roargraph" and r["param"] == 100}
    assert all(r["scanned"] > small[(r["head"], r["k"])] for r in big)
    # A hop cap of 1 stops every wide-range DIPR walk after one node: capped, fewer keys scanned.
    dipr = {(r["head"], r["query"], r["param"]): r for r in rows if r["query"].startswith("dipr")}
    for h in (0, 1):
        free, one = dipr[(h, "dipr", 1000.0)], dipr[(h, "dipr hops 1", 1000.0)]
        assert free["capped"] == 0 and one["capped"] == 1
        assert one["scanned"] < free["scanned"] and one["recall"] < free["recall"]
    q = {(r["head"], r["method"], r["param"]): r for r in lay["quality"]}
    for h in (0, 1):
        # A budget covering the whole middle, or a beta no logit gap reaches, is full attention.
        for key in (("top-k", 100000), ("dipr", 1000.0)):
            assert q[(h,) + key]["recovery"] == pytest.approx(1.0)
            assert q[(h,) + key]["rel_l2_error"] < 1e-9
        win = q[(h, "window", 0)]
        assert 0 < win["recovery"] < 1 and win["rel_l2_error"] > 1e-3
        # Top-k at DIPR's budget attends the same mean number of tokens (rounding only).
        tb = q[(h, "top-k at dipr budget", 0.5)]
        assert tb["attended"] == pytest.approx(q[(h, "dipr", 0.5)]["attended"], abs=1.0)
        # A cap no range reaches changes nothing; a cap of 1 with every middle token in range
        # caps every query: full attention, or the window and its best token.
        for method in ("dipr cap 100000", "dipr cap 100000 best"):
            never = q[(h, method, 0.5)]
            assert never["capped"] == 0
            assert never["attended"] == q[(h, "dipr", 0.5)]["attended"]
            assert never["rel_l2_error"] == q[(h, "dipr", 0.5)]["rel_l2_error"]
        full, best = q[(h, "dipr cap 1", 1000.0)], q[(h, "dipr cap 1 best", 1000.0)]
        assert full["capped"] == 1 and best["capped"] == 1
        assert full["recovery"] == pytest.approx(1.0) and full["rel_l2_error"] < 1e-9
        assert best["attended"] == pytest.approx(win["attended"] + 1)
        assert best["rel_l2_error"] > 1e-3  # one middle token is not the whole middle
    assert (tmp_path / "out" / "pyeval.md").exists() and (tmp_path / "out" / "pyeval.json").exists()


def check_shared_walk_rows(rows, H):
    """roargraph-gqa: one walk per position for the group, counted as rows read per query."""
    avg = pyeval.head_mean(rows)
    walk = {(r["query"], r["param"], r["expand_limit"]): r for r in avg
            if r["index"] == "roargraph-gqa"}
    per_head = {(r["query"], r["param"]): r for r in avg if r["index"] == "roargraph"}
    assert walk and {r["heads"] for r in walk.values()} == {H}
    for (query, L, E), r in walk.items():
        # Each query head is scored against every row its group's walk read.
        assert r["scored"] == pytest.approx(H * r["scanned"])
        if E == 0:
            # The group's walk reads more rows than one head's walk would (it serves H pools),
            # but far fewer than H separate walks: the rows the heads' top keys share.
            own = per_head[(query, L)]["scanned"]
            assert 1.3 * own < r["scored"] < H * own
            # Expanding only part of the pool stops the walk sooner.
            for (q2, L2, E2), cut in walk.items():
                if (q2, L2) == (query, L) and E2:
                    assert cut["scanned"] < r["scanned"]
    # Its largest pool finds the heads' top-100 as well as a walk per head does.
    best = max((r for r in walk.values() if r["query"] == "top-100"),
               key=lambda r: (r["param"], r["expand_limit"] == 0))
    assert best["expand_limit"] == 0 and best["recall"] >= 0.95


def check_warm_rows(rows, H):
    """roargraph-warm / roargraph-gqa-warm: decode order, each position seeded with the one
    before's results. At the same pool and expand limit a seeded walk starts among the answer,
    so it finds at least what its cold counterpart finds, and more on average."""
    avg = pyeval.head_mean(rows)

    def points(index):
        return {(r["query"], r["param"], r["expand_limit"] or 0): r for r in avg
                if r["index"] == index}

    for warm, cold in (("roargraph-warm", "roargraph"), ("roargraph-gqa-warm", "roargraph-gqa")):
        w, c = points(warm), points(cold)
        assert w and {r["heads"] for r in w.values()} == {H}
        common = sorted(set(w) & set(c))
        assert len(common) >= 4, (warm, common)
        gains = [w[p]["recall"] - c[p]["recall"] for p in common]
        assert min(gains) >= -0.005, (warm, list(zip(common, gains)))
        assert np.mean(gains) >= 0.002, (warm, list(zip(common, gains)))
        if warm.endswith("-gqa-warm"):
            for r in w.values():
                assert r["scored"] == pytest.approx(H * r["scanned"])


def check_routed_rows(rows, H):
    """roargraph-routed / roargraph-gqa-routed: cold searches entered at routed seeds. The
    seeds are extra entry points near the answer, so with every pool entry expandable (E = 0)
    a routed walk finds at least about what the cold walk finds, and more on average; the
    routing vectors a query scores are counted as rows read on top of the keys."""
    avg = pyeval.head_mean(rows)

    def points(index):
        return {(r["query"], r["param"], r["expand_limit"] or 0): r for r in avg
                if r["index"] == index}

    for routed, cold in (("roargraph-routed", "roargraph"),
                         ("roargraph-gqa-routed", "roargraph-gqa")):
        r, c = points(routed), points(cold)
        assert r and {x["heads"] for x in r.values()} == {H}
        common = sorted(p for p in set(r) & set(c) if p[2] == 0)
        assert len(common) >= 4, (routed, common)
        gains = [r[p]["recall"] - c[p]["recall"] for p in common]
        assert min(gains) >= -0.005, (routed, list(zip(common, gains)))
        assert np.mean(gains) >= 0.002, (routed, list(zip(common, gains)))
        share = H if routed.endswith("-gqa-routed") else 1  # a group's rows serve H queries
        for x in r.values():
            assert x["scanned"] > x["scored"] / share  # + the routing vectors read


@needs_kvsift
def test_quick_run_on_the_committed_sample(tmp_path, capsys):
    res = pyeval.main(["--dump", str(SAMPLE), "--quick", "--out", str(tmp_path), "--threads", "1"])
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "pyeval.json").read_text())
    assert saved["meta"]["kvsift_version"] and saved["meta"]["cpu"] and saved["meta"]["threads"] == 1
    m = json.loads((SAMPLE / "manifest.json").read_text())
    assert [lay["layer"] for lay in saved["layers"]] == m["layers"]
    for lay in saved["layers"]:
        rows = lay["rows"]
        assert {r["head"] for r in rows} == set(m["query_heads_dumped"])
        for r in rows:
            assert 0 <= r["recall"] <= 1 and r["latency_us"] > 0
            # None: hnswlib (no count); IVF may exceed 1 (centroids + probed lists)
            assert r["scanned"] is None or r["scanned"] > 0
        assert all(r["recall"] == 1 for r in rows if r["index"] == "flat")
        # RoarGraph at its largest swept L finds nearly all of the top-100, scanning < all keys.
        g = [r for r in pyeval.head_mean(rows) if r["index"] == "roargraph" and r["query"] == "top-100"]
        best = max(g, key=lambda r: r["param"])
        assert best["recall"] >= 0.95 and best["scanned"] < 0.6
        for r in lay["quality"]:
            assert 0 < r["recovery"] <= 1 + 1e-9 and r["rel_l2_error"] >= 0
        assert lay["targets"]["roargraph recall@100>=0.95 scanned"] is not None
        check_shared_walk_rows(rows, len(m["query_heads_dumped"]))
        check_warm_rows(rows, len(m["query_heads_dumped"]))
        check_routed_rows(rows, len(m["query_heads_dumped"]))
    for name in ("hnswlib", "faiss-hnsw", "faiss-ivf"):
        assert name in res["meta"]["methods"] or f"skipping {name}" in out
    if "plots skipped" not in out:
        assert (tmp_path / "pyeval_L0_frontier.png").exists()
        assert (tmp_path / "pyeval_quality.png").exists()
    text = (tmp_path / "pyeval.md").read_text()
    assert "Pareto points" in text and "Targets" in text and "top-k at dipr budget" in text
    assert "RoarGraph DIPR: set recall" in text
    # --from-json re-renders the same tables from the saved sweep, measuring nothing.
    again = pyeval.main(["--from-json", str(tmp_path / "pyeval.json"), "--out",
                         str(tmp_path / "again"), "--no-plots"])
    assert (tmp_path / "again" / "pyeval.md").read_text() == text
    assert again["layers"][0]["targets"] == saved["layers"][0]["targets"]


@needs_kvsift
def test_default_output_is_outside_the_repository(capsys):
    res = pyeval.main(["--dump", str(SAMPLE), "--quick", "--methods", "flat", "--no-plots",
                       "--layers", "0", "--beta", "2", "--attn-k", "16", "--eval-stride", "16"])
    line = next(x for x in capsys.readouterr().out.splitlines() if "writing to " in x)
    out = Path(line.split("writing to ", 1)[1])
    try:
        assert ROOT not in out.parents and (out / "pyeval.json").exists()
        assert res["layers"][0]["layer"] == 0
    finally:
        import shutil

        shutil.rmtree(out, ignore_errors=True)


def test_bad_arguments_fail_before_writing(tmp_path):
    for argv in (["--methods", "flat,annoy"], ["--L", "0"], ["--beta", "-1"], ["--layers", "7"],
                 ["--route-rows", "0"], ["--route-probe", "-1"], ["--route-fractions", "0"]):
        with pytest.raises(SystemExit):
            pyeval.main(["--dump", str(SAMPLE), "--out", str(tmp_path / "o")] + argv)
        assert not (tmp_path / "o").exists()


@needs_kvsift
def test_ivf_over_the_groups_union_of_lists(tmp_path):
    pytest.importorskip("faiss")
    dump = tiny_dump(tmp_path / "dump", heads=3)
    res = pyeval.main(["--dump", str(dump), "--out", str(tmp_path / "out"), "--methods",
                       "faiss-ivf", "--eval-stride", "1", "--train-fraction", "0.9", "--nlist",
                       "16", "--nprobe", "1,2,4,16", "--attn-k", "8", "--beta", "1",
                       "--threads", "1", "--no-plots"])
    avg = pyeval.head_mean(res["layers"][0]["rows"])
    one = {(r["query"], r["param"]): r for r in avg if r["index"] == "faiss-ivf"}
    group = {(r["query"], r["param"]): r for r in avg if r["index"] == "faiss-ivf-gqa"}
    assert set(one) == set(group)
    for key, g in group.items():
        # Every head scans the union of the group's lists, a superset of its own: the exact
        # top-k over more keys finds at least as many of the true top-k.
        assert g["recall"] >= one[key]["recall"]
        # Scored per query: the union + the 16 centroids; read once for the 3 heads.
        assert g["scored"] == pytest.approx(3 * g["scanned"])
        assert one[key]["scanned"] <= g["scored"] <= 3 * one[key]["scanned"] + 1e-9
    assert all(group[(q, 16)]["recall"] == 1 for q in ("top-10", "top-100"))
    assert group[("top-10", 1)]["recall"] > one[("top-10", 1)]["recall"]
