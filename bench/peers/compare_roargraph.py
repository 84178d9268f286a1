#!/usr/bin/env python3
"""kvsift vs the RoarGraph reference (matchyc/RoarGraph) vs hnswlib, on the same inputs.

Per dataset, every method gets:
  * the same keys, training queries and evaluation queries (.fbin files on disk);
  * the same training-query -> key exact kNN: kvsift-bench computes it once, builds its graph
    from it and writes it (--save-train-knn); the reference builds from that file
    (--learn_base_nn_path). hnswlib builds from the keys alone (it does not use queries);
  * the same exact ground truth: written by kvsift-bench (--save-gt), read by the reference,
    and checked here against a numpy brute force (scores, so ties do not matter);
  * one search thread; the pool size L (hnswlib: ef) swept over the same list. kvsift's
    variants (--degree-caps, --entry-windows, --expand-limits: searches that expand only the
    best fraction of their pool) are more sweeps over L, and at each recall target the variant
    with the highest QPS is reported, tagged with its settings.

Reported per (dataset, method, k): build seconds (from the kNN; kvsift's kNN time is
subtracted), mean out-degree, maximum recall reached, and QPS (1 thread) and distance
computations per query at recall 0.95 and 0.99, linearly interpolated in recall between the
two sweep points around the target ("never" when the sweep does not reach it), and the
kvsift / reference ratios.

Counting: kvsift and hnswlib count every vector scored (entry point included, see
bench/peers/hnswlib_peer.hpp); the reference's test_search_roargraph counts the scored
neighbours and not its entry point, i.e. one less per query.
QPS: kvsift/hnswlib = 1e6 / mean per-query latency; reference = queries / wall time of its
one-thread loop (same meaning). With --repeat R each search sweep runs R times (kvsift from
its saved index) and the best QPS per point is kept: the recall does not change.
Build time: the two builds share one machine whose speed drifts between runs, so with
--build-rounds N both are built N times from the same kNN, alternated (the order swapped every
round), and the medians are reported and compared; every round's time is in the JSON.

The reference is not part of kvsift: build it outside the repository (see docs/peers.md)
and pass its directory with --ref-dir. Only python3 + numpy are needed here.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

DEFAULT_L = "10,12,15,20,25,30,40,50,60,80,100,130,160,200,250,300,400,500,700,1000"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("$ " + " ".join(str(c) for c in cmd))
    t0 = time.time()
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if p.returncode != 0:
        log(p.stdout[-4000:])
        log(p.stderr[-4000:])
        raise SystemExit(f"command failed with status {p.returncode}: {cmd[0]}")
    log(f"  ({time.time() - t0:.1f} s)")
    return p.stdout


# --- file formats --------------------------------------------------------------------------
def read_bin(path, dtype):
    hdr = np.fromfile(path, dtype=np.uint32, count=2)
    n, d = int(hdr[0]), int(hdr[1])
    data = np.fromfile(path, dtype=dtype, offset=8)
    if data.size != n * d:
        raise SystemExit(f"{path}: header says {n} x {d}, file holds {data.size} values")
    return data.reshape(n, d)


def write_fbin(path, a):
    a = np.ascontiguousarray(a, dtype=np.float32)
    with open(path, "wb") as f:
        np.array(a.shape, dtype=np.uint32).tofile(f)
        a.tofile(f)


def read_gt(path):
    hdr = np.fromfile(path, dtype=np.uint32, count=2)
    m, k = int(hdr[0]), int(hdr[1])
    raw = np.fromfile(path, dtype=np.uint32, offset=8)
    if raw.size != 2 * m * k:
        raise SystemExit(f"{path}: expected {2 * m * k} words after the header, got {raw.size}")
    return raw[: m * k].reshape(m, k), raw[m * k :].view(np.float32).reshape(m, k)


def read_roargraph_index(path):
    """Reference index file: uint32 entry, uint32 n, then per node uint32 size + ids."""
    raw = np.fromfile(path, dtype=np.uint32)
    n, pos, deg = int(raw[1]), 2, np.empty(int(raw[1]), dtype=np.int64)
    start = np.empty(n, dtype=np.int64)
    for i in range(n):
        deg[i] = raw[pos]
        start[i] = pos + 1
        pos += 1 + int(raw[pos])
    if pos != raw.size:
        raise SystemExit(f"{path}: {raw.size - pos} trailing words after {n} nodes")
    if int(raw[0]) >= n:
        raise SystemExit(f"{path}: entry point {int(raw[0])} >= {n} nodes")
    # Keys a search can ever return: those reachable from the entry point.
    seen = np.zeros(n, dtype=bool)
    seen[int(raw[0])] = True
    stack = [int(raw[0])]
    while stack:
        v = stack.pop()
        for u in raw[start[v] : start[v] + deg[v]].tolist():
            if not seen[u]:
                seen[u] = True
                stack.append(u)
    return {"entry": int(raw[0]), "n": n, "mean": float(deg.mean()), "min": int(deg.min()),
            "max": int(deg.max()), "zero_out_degree": int((deg == 0).sum()),
            "reachable_from_entry": int(seen.sum())}


def check_gt(keys, evalq, gt_path, metric):
    """The ground truth file against a numpy brute force (scores, not ids: ties are free)."""
    ids, dist = read_gt(gt_path)
    if ids.shape[0] != evalq.shape[0]:
        raise SystemExit(f"{gt_path}: {ids.shape[0]} rows, {evalq.shape[0]} evaluation queries")
    worst = 0.0
    for s in range(0, evalq.shape[0], 256):
        q = evalq[s : s + 256].astype(np.float64)
        if metric == "ip":
            sc = q @ keys.T.astype(np.float64)
            best = -np.sort(sc, axis=1)[:, ::-1][:, : ids.shape[1]]
        else:
            sc = ((q[:, None, :] - keys[None, :, :]) ** 2).sum(-1)
            best = np.sort(sc, axis=1)[:, : ids.shape[1]]
        worst = max(worst, float(np.abs(best - dist[s : s + 256]).max() /
                                 max(1e-12, float(np.abs(best).max()))))
    if worst > 1e-4:
        raise SystemExit(f"{gt_path}: distances differ from numpy's exact ones by {worst:.2e}")
    return ids.shape[1], worst


# --- datasets ------------------------------------------------------------------------------
def prepare_sample(args, out):
    """bench/data/sample: keys of one KV head, queries of its GQA group; the manifest's split
    (first 95% of positions train, last 5% evaluate) applied to every query head."""
    man = json.load(open(os.path.join(args.sample_dir, "manifest.json")))
    t0, t1 = man["rows"]["train"]
    e0, e1 = man["rows"]["eval"]
    keys = read_bin(os.path.join(args.sample_dir, f"L{args.layer}_k{args.kv_head}.fbin"),
                    np.float32)
    train, ev = [], []
    for h in [int(x) for x in args.heads.split(",")]:
        q = read_bin(os.path.join(args.sample_dir, f"L{args.layer}_q{h}.fbin"), np.float32)
        train.append(q[t0:t1])
        ev.append(q[e0:e1])
    os.makedirs(out, exist_ok=True)
    write_fbin(os.path.join(out, "keys.fbin"), keys)
    write_fbin(os.path.join(out, "train.fbin"), np.concatenate(train))
    write_fbin(os.path.join(out, "eval.fbin"), np.concatenate(ev))


def prepare_demo(args, n, out):
    os.makedirs(out, exist_ok=True)
    run([args.kvsift_bench, "--demo", "--n", n, "--dim", args.demo_dim, "--spread",
         args.demo_spread, "--eval", args.demo_eval, "--index", "flat", "--query", "topk",
         "--k", "1", "--threads", args.threads, "--save-data", out])


# --- measurement ---------------------------------------------------------------------------
def row_pool(r):
    """The pool size (L or ef) of a kvsift-bench JSON row: a number field, or the older
    "L=..." / "ef=..." string."""
    for src in (r.get("params") or {}, r):
        for key in ("L", "ef"):
            if isinstance(src.get(key), (int, float)):
                return int(src[key])
    return int(str(r["param"]).split(",")[0].split("=")[1])  # "L=20" or "L=20,E=10"


def kvsift_rows(js, method_index, n, cap=0, win=0, exp=1.0):
    """(k, L, recall, qps, dist_comps) per top-k row of one index in a kvsift-bench JSON;
    `cap` / `win` / `exp` = the --degree-cap / --entry-window / --expand-limits fraction the
    sweep ran with (0 / 0 / 1 = none)."""
    out = []
    for r in js["rows"]:
        if r["index"] != method_index or not r["query"].startswith("top-"):
            continue
        k = int(r["query"][4:])
        out.append({"k": k, "L": row_pool(r), "cap": cap, "win": win, "exp": exp,
                    "recall": r["recall"],
                    "qps": 1e6 / r["mean_us"], "p50_qps": 1e6 / r["p50_us"],
                    "dist": r["scanned"] * n})
    return out


# The plain search's variant: no degree cap, no entry window, every candidate expanded.
PLAIN = (0, 0, 1.0)


def variant(r):
    """A sweep point's search variant: (degree cap, entry window, expand fraction)."""
    return r.get("cap", 0), r.get("win", 0), r.get("exp", 1.0)


def best_of(runs):
    """Per (k, L, variant): the fastest of repeated sweeps (recall and counts are
    deterministic)."""
    best = {}
    for rows in runs:
        for r in rows:
            key = (r["k"], r["L"], *variant(r))
            if key not in best or r["qps"] > best[key]["qps"]:
                best[key] = r
    return sorted(best.values(), key=lambda r: (*variant(r), r["k"], r["L"]))


def parse_kvsift_build(info):
    """kvsift-bench's build line: total and kNN seconds, and the build from the kNN."""
    m = re.search(r"build: ([0-9.e+-]+) s \(kNN ([0-9.e+-]+) s", info)
    build = {"total_s": float(m.group(1)), "knn_s": float(m.group(2))}
    build["from_knn_s"] = build["total_s"] - build["knn_s"]
    return build


def kvsift_build_flags(args, d):
    """kvsift-bench's build settings, the same for the first build and the later rounds."""
    return ["--train", d["train"], "--nq", args.nq, "--M", args.M, "--L-build", args.L_build,
            *(["--expand-fraction", args.expand_fraction] if args.expand_fraction else [])]


def build_kvsift(args, d):
    """One more kvsift build from the saved kNN (the first run's settings; one evaluation
    query, so the searches after it cost nothing): seconds from the kNN."""
    js_path = os.path.join(d["dir"], "kvsift_build.json")
    run([args.kvsift_bench, "--keys", d["keys"], "--queries", d["eval"], "--metric", args.metric,
         *kvsift_build_flags(args, d), "--load-train-knn", d["knn"], "--index", "roargraph",
         "--query", "topk", "--k", "1", "--L", "1", "--eval", "1", "--threads", args.threads,
         "--json", js_path])
    return parse_kvsift_build(json.load(open(js_path))["info"])["from_knn_s"]


def median(xs):
    xs = sorted(xs)
    h = len(xs) // 2
    return xs[h] if len(xs) % 2 else 0.5 * (xs[h - 1] + xs[h])


def build_rounds(rounds, first_kvsift, first_reference, kvsift_build, reference_build):
    """Build times of `rounds` rounds: the first given (the runs that also searched), then
    rounds - 1 more from the callables, alternated with the order swapped every round (round
    1: reference first) so that neither build always runs on a machine the other warmed."""
    kv, ref = [first_kvsift], [first_reference]
    for r in range(1, rounds):
        if r % 2:
            ref.append(reference_build())
            kv.append(kvsift_build())
        else:
            kv.append(kvsift_build())
            ref.append(reference_build())
    return {"kvsift": kv, "reference": ref, "kvsift_median": median(kv),
            "reference_median": median(ref), "ratio": median(kv) / median(ref)}


def run_kvsift(args, d, ks, Ls):
    common = [args.kvsift_bench, "--keys", d["keys"], "--queries", d["eval"], "--metric",
              args.metric, "--k", ",".join(map(str, ks)), "--L", ",".join(map(str, Ls)),
              "--query", "topk", "--threads", args.threads]
    idx = os.path.join(d["dir"], "kvsift.graph")
    js_path = os.path.join(d["dir"], "kvsift.json")
    first = [*kvsift_build_flags(args, d),
             "--index", "roargraph,hnsw" if args.hnsw else "roargraph",
             "--ef", ",".join(map(str, Ls)), "--save-index", idx, "--save-train-knn", d["knn"],
             "--save-gt", d["gt"], "--json", js_path]
    stdout = run(common + first)
    js = json.load(open(js_path))
    info = js["info"]
    build = parse_kvsift_build(info)
    deg = re.search(r"degree: min (\d+), mean ([0-9.]+), max (\d+)", info)
    n = js["keys"]
    res = {"kvsift": {"build_s": build["from_knn_s"], "build_detail": build,
                      "degree": {"min": int(deg.group(1)), "mean": float(deg.group(2)),
                                 "max": int(deg.group(3))},
                      "sweep": kvsift_rows(js, "roargraph", n)}}
    if args.hnsw:
        hb = re.search(r"hnswlib: build ([0-9.e+-]+) s", info)
        res["hnswlib"] = {"build_s": float(hb.group(1)), "degree": None,
                          "sweep": kvsift_rows(js, "hnsw", n)}
    runs = [res["kvsift"]["sweep"]]
    caps = [int(c) for c in args.degree_caps.split(",")]
    wins = [int(w) for w in args.entry_windows.split(",")]
    exps = [float(f) for f in args.expand_limits.split(",")]
    for cap in caps:
        for win in wins:
            for exp in exps:
                plain = (cap, win, min(exp, 1.0)) == PLAIN
                for rep in range(args.repeat - (1 if plain else 0)):
                    p = os.path.join(d["dir"], "kvsift_repeat.json")
                    extra = ["--degree-cap", str(cap)] if cap else []
                    extra += ["--entry-window", str(win)] if win else []
                    extra += ["--expand-limits", str(exp)] if exp < 1 else []
                    run(common + ["--index", "roargraph", "--load-index", idx, "--json", p] +
                        extra)
                    runs.append(kvsift_rows(json.load(open(p)), "roargraph", n, cap, win, exp))
    res["kvsift"]["sweep"] = best_of(runs)
    if len(caps) * len(wins) * len(exps) > 1:  # the plain search too: what the knobs buy
        plain = [r for r in res["kvsift"]["sweep"] if variant(r) == PLAIN]
        res["kvsift plain"] = dict(res["kvsift"], sweep=plain)
    res["_stdout"] = stdout
    return res, js


def build_reference(args, d):
    """The reference's build from the saved kNN: its own "indexing time" in seconds."""
    b = os.path.join(args.ref_dir, "test_build_roargraph")
    idx = os.path.join(d["dir"], "reference.index")
    out = run([b, "--data_type", "float", "--dist", args.metric, "--base_data_path", d["keys"],
               "--sampled_query_data_path", d["train"], "--projection_index_save_path", idx,
               "--learn_base_nn_path", d["knn"], "--M_sq", args.nq, "--M_pjbp", args.M,
               "--L_pjpq", args.L_build, "-T", args.threads])
    return float(re.search(r"indexing time: ([0-9.e+-]+)", out).group(1))


def run_reference(args, d, ks, Ls):
    s = os.path.join(args.ref_dir, "test_search_roargraph")
    idx = os.path.join(d["dir"], "reference.index")
    build_s = build_reference(args, d)
    deg = read_roargraph_index(idx)
    sweep = []
    for k in ks:
        Lk = [L for L in Ls if L >= k]
        runs = []
        for _ in range(args.repeat):
            csv = os.path.join(d["dir"], f"reference_k{k}.csv")
            run([s, "--data_type", "float", "--dist", args.metric, "--base_data_path", d["keys"],
                 "--projection_index_save_path", idx, "--gt_path", d["gt"], "--query_path",
                 d["eval"], "--L_pq"] + Lk + ["--k", k, "-T", "1", "--evaluation_save_path", csv])
            rows = []
            for line in open(csv):
                L, qps, cmps, _lat, rec, _hops = line.strip().split(",")
                rows.append({"k": k, "L": int(L), "recall": float(rec), "qps": float(qps),
                             "dist": float(cmps)})
            runs.append(rows)
        sweep += best_of(runs)
    return {"reference": {"build_s": build_s, "degree": deg, "sweep": sweep}}


def at_recall(sweep, target):
    """QPS and distance computations at `target` recall: the first sweep point (in L order)
    reaching it, interpolated linearly in recall with the point before it; None if never.
    A sweep over several variants (degree caps, entry windows, expand fractions): that per
    variant, and the variant with the highest QPS."""
    variants = sorted({variant(r) for r in sweep})
    if len(variants) > 1:
        best = None
        for v in variants:
            a = at_recall([r for r in sweep if variant(r) == v], target)
            if a and (best is None or a["qps"] > best["qps"]):
                best = a
        return best
    pts = sorted(sweep, key=lambda r: r["L"])
    cap, win, exp = variants[0] if variants else PLAIN
    for i, p in enumerate(pts):
        if p["recall"] >= target:
            if i == 0 or pts[i - 1]["recall"] >= p["recall"]:
                return {"qps": p["qps"], "dist": p["dist"], "L": p["L"], "cap": cap,
                        "win": win, "exp": exp, "interpolated": False}
            a = pts[i - 1]
            t = (target - a["recall"]) / (p["recall"] - a["recall"])
            return {"qps": a["qps"] + t * (p["qps"] - a["qps"]),
                    "dist": a["dist"] + t * (p["dist"] - a["dist"]),
                    "L": a["L"] + t * (p["L"] - a["L"]), "cap": cap, "win": win, "exp": exp,
                    "interpolated": True}
    return None


def summarize(results, ks, targets):
    summary = {}
    for method, r in results.items():
        for k in ks:
            sw = [p for p in r["sweep"] if p["k"] == k]
            if not sw:
                continue
            uncapped = [p for p in sw if variant(p) == PLAIN] or sw
            e = {"build_s": r["build_s"],
                 "mean_degree": r["degree"]["mean"] if r.get("degree") else None,
                 "reachable": (r.get("degree") or {}).get("reachable_from_entry"),
                 "max_recall": max(p["recall"] for p in sw),
                 "recall_at_min_L": sorted(uncapped, key=lambda p: p["L"])[0]["recall"],
                 "min_L": sorted(uncapped, key=lambda p: p["L"])[0]["L"]}
            for t in targets:
                e[f"at_{t}"] = at_recall(sw, t)
            summary[f"{method}/k={k}"] = e
    for k in ks:
        a, b = summary.get(f"kvsift/k={k}"), summary.get(f"reference/k={k}")
        if not a or not b:
            continue
        ratio = {"build_s": a["build_s"] / b["build_s"] if b["build_s"] else None}
        for t in targets:
            x, y = a[f"at_{t}"], b[f"at_{t}"]
            ratio[f"qps_at_{t}"] = x["qps"] / y["qps"] if x and y else None
            ratio[f"dist_at_{t}"] = x["dist"] / y["dist"] if x and y else None
        summary[f"ratio kvsift/reference k={k}"] = ratio
    return summary


def fmt(x, spec, missing="never"):
    return missing if x is None else format(x, spec)


def markdown(name, meta, summary, targets):
    lines = [f"### {name}", "",
             f"{meta['keys']} keys x {meta['dim']}, {meta['train']} training queries, "
             f"{meta['eval']} evaluation queries, metric {meta['metric']}, ground truth top-"
             f"{meta['gt_k']}, build threads {meta['threads']}, search 1 thread", ""]
    hdr = "| method | k | build s | mean deg | reachable | recall@minL (L) | max recall |"
    sep = "|---|---|---|---|---|---|---|"
    for t in targets:
        hdr += f" QPS@{t} | dist@{t} |"
        sep += "---|---|"
    lines += [hdr, sep]
    for key, e in summary.items():
        if key.startswith("ratio"):
            continue
        method, k = key.split("/k=")
        row = (f"| {method} | {k} | {e['build_s']:.2f} | {fmt(e['mean_degree'], '.1f', '-')} | "
               f"{fmt(e['reachable'], 'd', '-')} | "
               f"{e['recall_at_min_L']:.4f} ({e['min_L']}) | {e['max_recall']:.4f} |")
        for t in targets:
            a = e[f"at_{t}"]
            tag = [f"cap {a['cap']}"] if a and a.get("cap") else []
            tag += [f"window {a['win']}"] if a and a.get("win") else []
            tag += [f"expand {a['exp']:g} L"] if a and a.get("exp", 1.0) < 1 else []
            cap = f" ({', '.join(tag)})" if tag else ""
            row += f" {fmt(a and a['qps'], '.0f')}{cap} | {fmt(a and a['dist'], '.0f')} |"
        lines.append(row)
    for key, r in summary.items():
        if not key.startswith("ratio"):
            continue
        row = f"| {key} | | {fmt(r['build_s'], '.2f', '-')} | | | | |"
        for t in targets:
            row += f" {fmt(r[f'qps_at_{t}'], '.2f')} | {fmt(r[f'dist_at_{t}'], '.2f')} |"
        lines.append(row)
    rounds = meta.get("build_rounds")
    if rounds and len(rounds["kvsift"]) > 1:
        lines += ["", f"Build from the same kNN, {len(rounds['kvsift'])} rounds alternated (the "
                  f"table's build s are the medians): kvsift "
                  f"{' / '.join(f'{x:.2f}' for x in rounds['kvsift'])} s, reference "
                  f"{' / '.join(f'{x:.2f}' for x in rounds['reference'])} s; median ratio "
                  f"{rounds['ratio']:.3f}."]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvsift-bench", required=True, help="kvsift-bench binary")
    ap.add_argument("--ref-dir", required=True,
                    help="directory with the reference's test_build_roargraph, test_search_roargraph")
    ap.add_argument("--hnsw", action="store_true", help="also hnswlib (kvsift-bench --index hnsw)")
    ap.add_argument("--work", default="/work/data/compare", help="data and outputs (big files)")
    ap.add_argument("--sample", action="store_true", help="dataset: bench/data/sample")
    ap.add_argument("--sample-dir", default=os.path.join(os.path.dirname(__file__), "..", "data",
                                                         "sample"))
    ap.add_argument("--layer", type=int, default=15)
    ap.add_argument("--kv-head", type=int, default=0)
    ap.add_argument("--heads", default="0,1,2", help="query heads of the KV head's GQA group")
    ap.add_argument("--demo", default="", help="datasets: kvsift-bench --demo sizes, e.g. 32768")
    ap.add_argument("--demo-dim", default="128")
    ap.add_argument("--demo-spread", default="0.2")
    ap.add_argument("--demo-eval", default="1000", help="evaluation queries of --demo")
    ap.add_argument("--dataset", action="append", default=[],
                    help="NAME:KEYS:TRAIN:EVAL (.fbin files), repeatable")
    ap.add_argument("--metric", default="ip", choices=["ip", "l2"])
    ap.add_argument("--k", default="10,100")
    ap.add_argument("--L", default=DEFAULT_L)
    ap.add_argument("--nq", default="100")
    ap.add_argument("--M", default="35")
    ap.add_argument("--L-build", dest="L_build", default="500")
    ap.add_argument("--expand-fraction", dest="expand_fraction", default="",
                    help="kvsift's roargraph_params::connectivity_expand_fraction (default: the "
                         "library's)")
    ap.add_argument("--threads", default=str(os.cpu_count()), help="build threads (all methods)")
    ap.add_argument("--repeat", type=int, default=1, help="search sweeps per method, best QPS kept")
    ap.add_argument("--build-rounds", dest="build_rounds", type=int, default=1,
                    help="kvsift and reference builds per dataset from the same kNN, alternated; "
                         "the medians are reported (the machine's speed drifts between runs)")
    ap.add_argument("--targets", default="0.95,0.99")
    ap.add_argument("--entry-windows", dest="entry_windows", default="0",
                    help="kvsift: also sweep these entry windows (kvsift-bench --entry-window W: "
                         "the first and last W keys seed every search, as an engine's static "
                         "window would); combined with every --degree-caps value")
    ap.add_argument("--degree-caps", dest="degree_caps", default="0",
                    help="kvsift: also sweep these per-call degree caps (0 = none); at each "
                         "target the cap with the highest QPS is reported")
    ap.add_argument("--expand-limits", dest="expand_limits", default="1",
                    help="kvsift: also sweep searches that expand only this fraction of their "
                         "pool (kvsift-bench --expand-limits F; 1 = every entry); combined with "
                         "every cap and window")
    ap.add_argument("--json", default="", help="write all results here")
    ap.add_argument("--markdown", default="", help="write the tables here")
    args = ap.parse_args()
    try:
        bad = [f for f in args.expand_limits.split(",") if not 0 < float(f) <= 1]
    except ValueError:
        bad = [args.expand_limits]
    if bad:
        ap.error(f"--expand-limits: expected fractions in (0, 1], got {args.expand_limits}")
    if args.hnsw and args.metric != "ip":
        ap.error("--hnsw: kvsift-bench runs hnswlib for --metric ip only")
    if args.build_rounds < 1:
        ap.error(f"--build-rounds: expected >= 1, got {args.build_rounds}")
    ks = [int(x) for x in args.k.split(",")]
    Ls = sorted({int(x) for x in args.L.split(",")})
    targets = [float(x) for x in args.targets.split(",")]

    datasets = []
    if args.sample:
        d = os.path.join(args.work, f"sample_L{args.layer}_kv{args.kv_head}")
        prepare_sample(args, d)
        datasets.append((f"sample L{args.layer} KV head {args.kv_head} (q heads {args.heads})", d))
    for n in [x for x in args.demo.split(",") if x]:
        d = os.path.join(args.work, f"ood{n}")
        prepare_demo(args, n, d)
        datasets.append((f"synthetic OOD {n} x {args.demo_dim} (spread {args.demo_spread})", d))
    for spec in args.dataset:
        name, keys, train, ev = spec.split(":")
        d = os.path.join(args.work, name)
        os.makedirs(d, exist_ok=True)
        for src, dst in ((keys, "keys.fbin"), (train, "train.fbin"), (ev, "eval.fbin")):
            dst = os.path.join(d, dst)
            if os.path.lexists(dst):
                os.remove(dst)
            os.symlink(os.path.abspath(src), dst)
        datasets.append((name, d))
    if not datasets:
        ap.error("no dataset: give --sample, --demo N and/or --dataset")

    report, md = {"args": vars(args), "datasets": {}}, []
    for name, d in datasets:
        files = {k: os.path.join(d, f) for k, f in (("keys", "keys.fbin"), ("train", "train.fbin"),
                                                   ("eval", "eval.fbin"),
                                                   ("knn", "train_knn.ibin"), ("gt", "gt.bin"))}
        files["dir"] = d
        kres, js = run_kvsift(args, files, ks, Ls)
        keys = read_bin(files["keys"], np.float32)
        evalq = read_bin(files["eval"], np.float32)
        gt_k, gt_err = check_gt(keys, evalq, files["gt"], args.metric)
        knn = read_bin(files["knn"], np.uint32)
        results = {m: v for m, v in kres.items() if not m.startswith("_")}
        results.update(run_reference(args, files, ks, Ls))
        rounds = build_rounds(args.build_rounds, results["kvsift"]["build_s"],
                              results["reference"]["build_s"],
                              lambda: build_kvsift(args, files),
                              lambda: build_reference(args, files))
        for m in ("kvsift", "kvsift plain"):
            if m in results:
                results[m] = dict(results[m], build_s=rounds["kvsift_median"])
        results["reference"]["build_s"] = rounds["reference_median"]
        meta = {"build_rounds": rounds,
                "keys": keys.shape[0], "dim": keys.shape[1],
                "train": read_bin(files["train"], np.float32).shape[0], "eval": evalq.shape[0],
                "metric": args.metric, "gt_k": gt_k, "gt_rel_err_vs_numpy": gt_err,
                "train_knn": list(knn.shape), "threads": args.threads, "files": files}
        summary = summarize(results, ks, targets)
        report["datasets"][name] = {"meta": meta, "summary": summary, "results": results}
        md.append(markdown(name, meta, summary, targets))
        print(md[-1], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(md))


if __name__ == "__main__":
    main()
