#!/usr/bin/env python3
"""Tests of compare_roargraph.py and of the kvsift-bench flags it relies on.

    python3 bench/peers/test_compare_roargraph.py            # the driver's own logic
    KVSIFT_BENCH=build/bin/kvsift-bench python3 bench/peers/test_compare_roargraph.py
                                                             # + the --save-*/--load-* flags
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_roargraph as cr  # noqa: E402


def pt(L, recall, qps, dist, k=10):
    return {"k": k, "L": L, "recall": recall, "qps": qps, "dist": dist}


class AtRecall(unittest.TestCase):
    def test_interpolates_between_the_points_around_the_target(self):
        sweep = [pt(20, 0.96, 5000, 300), pt(10, 0.90, 9000, 100), pt(40, 0.995, 2000, 700)]
        a = cr.at_recall(sweep, 0.95)
        # between L=10 (0.90) and L=20 (0.96): 5/6 of the way
        self.assertAlmostEqual(a["qps"], 9000 + (5 / 6) * (5000 - 9000))
        self.assertAlmostEqual(a["dist"], 100 + (5 / 6) * 200)
        self.assertTrue(a["interpolated"])
        b = cr.at_recall(sweep, 0.99)
        self.assertAlmostEqual(b["dist"], 300 + (0.03 / 0.035) * 400)

    def test_never_when_the_sweep_does_not_reach_it(self):
        self.assertIsNone(cr.at_recall([pt(10, 0.5, 1, 1), pt(20, 0.94, 1, 1)], 0.95))

    def test_first_point_already_above_is_taken_as_is(self):
        a = cr.at_recall([pt(10, 0.97, 8000, 90), pt(20, 0.99, 6000, 150)], 0.95)
        self.assertEqual((a["qps"], a["dist"], a["interpolated"]), (8000, 90, False))

    def test_several_degree_caps_give_the_fastest_cap_at_the_target(self):
        full = [pt(10, 0.99, 8000, 250), pt(20, 0.995, 6000, 330)]
        capped = [dict(p, cap=16) for p in (pt(10, 0.94, 15000, 110), pt(15, 0.97, 12000, 130))]
        a = cr.at_recall(full + capped, 0.95)
        self.assertEqual(a["cap"], 16)
        self.assertAlmostEqual(a["qps"], 15000 + (1 / 3) * (12000 - 15000))
        # at 0.99 only the full graph gets there
        b = cr.at_recall(full + capped, 0.99)
        self.assertEqual((b["cap"], b["qps"]), (0, 8000))

    def test_entry_windows_and_caps_are_separate_variants(self):
        plain = [pt(10, 0.90, 9000, 200), pt(20, 0.96, 6000, 300)]
        windowed = [dict(p, win=4) for p in (pt(10, 0.97, 8000, 260), pt(20, 0.99, 5000, 330))]
        a = cr.at_recall(plain + windowed, 0.95)
        self.assertEqual((a["win"], a["qps"], a["interpolated"]), (4, 8000, False))
        b = cr.at_recall(plain, 0.95)
        self.assertEqual(b["win"], 0)

    def test_expand_fractions_are_variants_tagged_in_the_table(self):
        plain = [pt(10, 0.99, 8000, 250), pt(20, 0.995, 6000, 330)]
        half = [dict(p, exp=0.4) for p in (pt(10, 0.94, 12000, 160), pt(20, 0.97, 9000, 190))]
        a = cr.at_recall(plain + half, 0.95)
        self.assertEqual(a["exp"], 0.4)
        self.assertAlmostEqual(a["qps"], 12000 + (1 / 3) * (9000 - 12000))
        self.assertEqual(cr.at_recall(plain + half, 0.99)["exp"], 1.0)
        # best_of keeps a point per variant, and the table says which variant won.
        self.assertEqual(len(cr.best_of([plain + half])), 4)
        s = cr.summarize({"kvsift": {"build_s": 1.0, "degree": None, "sweep": plain + half}},
                         [10], [0.95])
        meta = {"keys": 1, "dim": 1, "train": 1, "eval": 1, "metric": "ip", "gt_k": 10,
                "threads": 1}
        self.assertIn("(expand 0.4 L)", cr.markdown("x", meta, s, [0.95]))

    def test_row_pool_reads_limited_rows(self):
        self.assertEqual(cr.row_pool({"param": "L=20,E=10"}), 20)
        self.assertEqual(cr.row_pool({"param": "x", "params": {"k": 10, "L": 30, "E": 9}}), 30)
        self.assertEqual(cr.row_pool({"param": "ef=40"}), 40)

    def test_summary_ratios(self):
        res = {"kvsift": {"build_s": 4.0, "degree": {"mean": 50.0},
                          "sweep": [pt(10, 0.9, 100, 1000), pt(20, 1.0, 50, 2000)]},
               "reference": {"build_s": 2.0, "degree": {"mean": 20.0},
                             "sweep": [pt(10, 0.9, 200, 500), pt(20, 1.0, 100, 1000)]}}
        s = cr.summarize(res, [10], [0.95])
        r = s["ratio kvsift/reference k=10"]
        self.assertAlmostEqual(r["build_s"], 2.0)
        self.assertAlmostEqual(r["qps_at_0.95"], 75 / 150)
        self.assertAlmostEqual(r["dist_at_0.95"], 1500 / 750)


class BuildRounds(unittest.TestCase):
    def test_alternates_the_order_and_reports_medians(self):
        calls = []
        times = {"kvsift": iter([5.0, 7.0, 6.0, 9.0]), "reference": iter([4.0, 5.5, 6.5, 5.0])}

        def build(method):
            calls.append(method)
            return next(times[method])
        r = cr.build_rounds(5, 8.0, 6.0, lambda: build("kvsift"), lambda: build("reference"))
        # round 1 reference first, round 2 kvsift first, and so on
        self.assertEqual(calls, ["reference", "kvsift", "kvsift", "reference", "reference",
                                 "kvsift", "kvsift", "reference"])
        self.assertEqual(r["kvsift"], [8.0, 5.0, 7.0, 6.0, 9.0])
        self.assertEqual(r["reference"], [6.0, 4.0, 5.5, 6.5, 5.0])
        # medians, not the first rounds' times
        self.assertEqual((r["kvsift_median"], r["reference_median"]), (7.0, 5.5))
        self.assertAlmostEqual(r["ratio"], 7.0 / 5.5)
        self.assertEqual(cr.median([3.0, 1.0, 2.0, 10.0]), 2.5)

    def test_one_round_builds_nothing_more(self):
        r = cr.build_rounds(1, 2.0, 4.0, lambda: self.fail("built"), lambda: self.fail("built"))
        self.assertEqual((r["kvsift"], r["reference"], r["ratio"]), ([2.0], [4.0], 0.5))

    def test_markdown_lists_the_rounds(self):
        res = {"kvsift": {"build_s": 6.5, "degree": {"mean": 50.0},
                          "sweep": [pt(10, 0.96, 100, 1000)]},
               "reference": {"build_s": 5.5, "degree": {"mean": 20.0},
                             "sweep": [pt(10, 0.9, 200, 500)]}}
        meta = {"keys": 10, "dim": 4, "train": 2, "eval": 3, "metric": "ip", "gt_k": 10,
                "threads": 2,
                "build_rounds": cr.build_rounds(3, 6.5, 6.0, iter([7.0, 6.0]).__next__,
                                                iter([5.0, 5.5]).__next__)}
        md = cr.markdown("d", meta, cr.summarize(res, [10], [0.95]), [0.95])
        self.assertIn("3 rounds alternated", md)
        self.assertIn("kvsift 6.50 / 7.00 / 6.00 s, reference 6.00 / 5.00 / 5.50 s", md)
        self.assertIn("median ratio 1.182", md)


class Formats(unittest.TestCase):
    def test_reference_index_degrees(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "g.index")
            # entry 0; 0 -> 1 2, 1 -> (none), 2 -> 0 1 2, 3 -> 0 (nothing reaches 3)
            words = [0, 4, 2, 1, 2, 0, 3, 0, 1, 2, 1, 0]
            np.array(words, dtype=np.uint32).tofile(p)
            g = cr.read_roargraph_index(p)
            self.assertEqual((g["entry"], g["n"], g["min"], g["max"]), (0, 4, 0, 3))
            self.assertAlmostEqual(g["mean"], 6 / 4)
            self.assertEqual((g["zero_out_degree"], g["reachable_from_entry"]), (1, 3))
            np.array(words + [9], dtype=np.uint32).tofile(p)
            with self.assertRaises(SystemExit):
                cr.read_roargraph_index(p)

    def test_check_gt_rejects_a_wrong_distance(self):
        rng = np.random.default_rng(1)
        keys = rng.standard_normal((50, 8)).astype(np.float32)
        q = rng.standard_normal((5, 8)).astype(np.float32)
        s = q @ keys.T
        ids = np.argsort(-s, axis=1)[:, :4].astype(np.uint32)
        dist = -np.take_along_axis(s, ids.astype(np.int64), 1).astype(np.float32)
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "gt.bin")

            def write(dd):
                with open(p, "wb") as f:
                    np.array([5, 4], dtype=np.uint32).tofile(f)
                    ids.tofile(f)
                    dd.tofile(f)
            write(dist)
            self.assertEqual(cr.check_gt(keys, q, p, "ip")[0], 4)
            bad = dist.copy()
            bad[2, 3] += 0.5
            write(bad)
            with self.assertRaises(SystemExit):
                cr.check_gt(keys, q, p, "ip")


@unittest.skipUnless(os.environ.get("KVSIFT_BENCH"), "set KVSIFT_BENCH to a kvsift-bench binary")
class BenchFlags(unittest.TestCase):
    """kvsift-bench --save-data / --save-train-knn / --save-gt / --load-train-knn."""

    @classmethod
    def setUpClass(cls):
        cls.bench = os.environ["KVSIFT_BENCH"]
        cls.tmp = tempfile.TemporaryDirectory()
        cls.d = cls.tmp.name
        j = os.path.join(cls.d, "a.json")
        subprocess.run([cls.bench, "--demo", "--n", "1500", "--eval", "60", "--k", "10,20",
                        "--L", "20,40", "--query", "topk", "--threads", "2", "--save-data", cls.d,
                        "--save-train-knn", os.path.join(cls.d, "knn.ibin"), "--save-gt",
                        os.path.join(cls.d, "gt.bin"), "--json", j],
                       check=True, capture_output=True)
        cls.js = json.load(open(j))
        cls.keys = cr.read_bin(os.path.join(cls.d, "keys.fbin"), np.float32)
        cls.train = cr.read_bin(os.path.join(cls.d, "train.fbin"), np.float32)
        cls.eval = cr.read_bin(os.path.join(cls.d, "eval.fbin"), np.float32)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_data_files_are_the_workload(self):
        self.assertEqual(self.keys.shape, (1500, 128))
        self.assertEqual(self.train.shape, (150, 128))
        self.assertEqual(self.eval.shape, (60, 128))

    def test_train_knn_is_exact(self):
        knn = cr.read_bin(os.path.join(self.d, "knn.ibin"), np.uint32)
        self.assertEqual(knn.shape, (150, 100))  # nq defaults to 100
        s = self.train.astype(np.float64) @ self.keys.T.astype(np.float64)
        got = np.take_along_axis(s, knn.astype(np.int64), 1)
        best = -np.sort(-s, axis=1)[:, :100]
        self.assertLess(np.abs(got - best).max(), 1e-3)

    def test_gt_is_exact_top_max_k(self):
        k, _ = cr.check_gt(self.keys, self.eval, os.path.join(self.d, "gt.bin"), "ip")
        self.assertEqual(k, 20)

    def test_build_from_the_saved_knn_is_the_same_graph(self):
        j = os.path.join(self.d, "b.json")
        subprocess.run([self.bench, "--keys", os.path.join(self.d, "keys.fbin"), "--queries",
                        os.path.join(self.d, "eval.fbin"), "--load-train-knn",
                        os.path.join(self.d, "knn.ibin"), "--k", "10,20", "--L", "20,40",
                        "--threads", "2", "--json", j], check=True, capture_output=True)
        b = json.load(open(j))

        def graph_rows(js):
            return [(r["query"], r["param"], r["recall"], r["scanned"]) for r in js["rows"]
                    if r["index"] == "roargraph"]
        self.assertEqual(graph_rows(b), graph_rows(self.js))
        self.assertIn("train kNN: loaded from", b["info"])
        deg = lambda js: js["info"].split("degree:")[1].split("recall")[0]
        self.assertEqual(deg(b), deg(self.js))


if __name__ == "__main__":
    unittest.main()
