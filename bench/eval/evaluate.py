#!/usr/bin/env python3
"""Real-data evaluation of kvsift against hnswlib and faiss, in one command.

Runs kvsift-bench on a Q/K/V dump of bench/data/dump_qk.py (SmolLM2-135M or Gemma-3-270M) for
several layers and (query head, KV head) pairs, and writes into --out (default: a fresh temporary
directory, printed; never inside the repository unless --out says so):
  real_eval.md                    markdown tables
  real_eval_summary.json          the figures of the summary tables, machine-readable
  real_pareto_recall{10,100}.png  Pareto frontiers per index: recall@k vs keys scanned and
                                  vs QPS (one thread); with matplotlib, else skipped (said so)
  real_error_vs_attended.png      attention-output error vs tokens attended
  real_eval_json/*.json           the raw kvsift-bench output

--layers / --heads default to what the dump's manifest.json says was dumped (every dumped layer,
the first query head of each dumped KV head), so the committed sample runs as is:

    python3 bench/eval/evaluate.py --dump bench/data/sample --no-plots
    python3 bench/eval/evaluate.py --dump bench/data/sample --quick    # small sweeps (CI)

Every run measures the flat scan, RoarGraph, DIPR and (when kvsift-bench was built with them)
hnswlib HNSW and faiss IVF-Flat on the same data in the same process; recall is against the
exact top-k of that run. Indexes are built from the prefill queries (first 95% of positions)
and evaluated on the held-out last 5%.

    python3 bench/eval/evaluate.py --bench build/bin/kvsift-bench --dump bench/data/dump
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from frontier import have_matplotlib, pareto, plot_frontiers  # noqa: E402

# The parameter sweeps, shared by all runs so the per-layer averages line up.
BENCH_ARGS = [
    "--train-fraction", "0.95", "--k", "10,100", "--L", "10,20,50,100,150,200,300,500",
    "--ef", "10,20,50,100,150,200,400,800", "--nprobe", "1,2,4,8,16,32,64,128",
    "--attn-k", "16,32,64,128,256,512,1024,2048,4096",
    "--attn-beta", "1,2,3,4,5,6,7,8,9,10,12",
]
# --quick (CI, < 1 min on 2 cores for the sample): a few points of each sweep.
QUICK_ARGS = [
    "--train-fraction", "0.95", "--k", "10,100", "--L", "10,50,100,200", "--ef", "10,50,100,200",
    "--nprobe", "1,8,64", "--attn-k", "16,128,4096", "--attn-beta", "2,5,10",
]


def fail(msg):
    print(f"evaluate.py: {msg}", file=sys.stderr)
    sys.exit(1)


def parse_pairs(text):
    pairs = []
    for item in text.split(","):
        try:
            q, k = item.split(":")
            pairs.append((int(q), int(k)))
        except ValueError:
            fail(f"--heads: expected q:kv pairs like 0:0,4:1, got '{item}'")
    return pairs


def peers_built(bench):
    """The peers this kvsift-bench was built with (it refuses --index hnsw/ivf otherwise)."""
    found = []
    for peer in ("hnsw", "ivf"):
        r = subprocess.run([bench, "--demo", "--n", "300", "--eval", "4", "--index", peer,
                            "--k", "10", "--ef", "10", "--nprobe", "1", "--query", "topk"],
                           capture_output=True, text=True)
        if r.returncode == 0:
            found.append(peer)
    return found


def run_one(args, layer, q, kv, indexes, json_path):
    if args.reuse:
        if not os.path.isfile(json_path):
            fail(f"--reuse: missing {json_path}")
        with open(json_path) as f:
            return json.load(f)
    d = args.dump
    files = [f"{d}/L{layer}_k{kv}.fbin", f"{d}/L{layer}_q{q}.fbin", f"{d}/L{layer}_v{kv}.fbin"]
    for f in files:
        if not os.path.isfile(f):
            fail(f"missing dump file {f} (generate it with bench/data/dump_qk.py)")
    cmd = [args.bench, "--keys", files[0], "--queries", files[1], "--values", files[2],
           "--index", ",".join(indexes), "--threads", str(args.threads), "--json", json_path]
    cmd += QUICK_ARGS if args.quick else BENCH_ARGS
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"kvsift-bench failed ({r.returncode}) on layer {layer} q{q}/k{kv}:\n{r.stderr}")
    wall = time.time() - t0
    print(f"  layer {layer:2d} q{q}/k{kv}: {wall:.1f} s", flush=True)
    with open(json_path) as f:
        res = json.load(f)
    res.update(layer=layer, q_head=q, kv_head=kv, wall_s=round(wall, 1),
               command=[os.path.relpath(c, ROOT) if os.path.exists(c) else c for c in cmd])
    with open(json_path, "w") as f:  # keep what --reuse needs next to kvsift-bench's output
        json.dump(res, f, indent=1)
    return res


def pval(row):
    return row["param"]


def min_scanned_at(rows, index, k, target):
    """Cheapest setting of `index` reaching recall >= target for top-k: (scanned, us, param)."""
    ok = [r for r in rows if r["index"] == index and r["query"] == f"top-{k}"
          and r["recall"] >= target]
    if not ok:
        return None
    best = min(ok, key=lambda r: r["scanned"])
    return best["scanned"], best["p50_us"], best["param"]


def interp(xs, ys, x):
    """Linear interpolation of y at x over sorted xs (None outside the range)."""
    pts = sorted(zip(xs, ys))
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None


def fmt_scan(v):
    return "-" if v is None else f"{100 * v[0]:.2f}% ({v[1]:.0f} us, {v[2]})"


def write_markdown(path, results, indexes, args, total_s):
    L = []
    meta = results[0]
    L.append("# kvsift on real attention data: recall, scanned keys, attention quality\n")
    L.append("Generated by `python3 bench/eval/evaluate.py` "
             f"(`--layers {args.layers} --heads {args.heads} --threads {args.threads}`) in "
             f"{total_s / 60:.1f} min of kvsift-bench runs on this machine (2 shared cores; median latencies on one "
             "thread, still noisy, compare ratios within a row only).\n")
    L.append(f"Data: {model_name(args.dump)} post-RoPE Q/K/V (`bench/data/dump_qk.py`, `{args.dump}`), "
             f"{meta['keys']} tokens, head dim {meta['dim']}. Indexes are built on the keys "
             f"(RoarGraph also from the {meta['train_queries']} prefill queries, the first 95% "
             f"of positions); the {meta['eval_queries']} held-out queries (last 5%) are "
             "evaluated. Recall@k is against the exact inner-product top-k over all keys, "
             "computed in the same run. Scanned = vectors scored / keys (hnswlib: counted "
             "distance calls; IVF: keys in probed lists + all centroids).\n")
    L.append("\n## Summary over all evaluated heads\n")
    L.append("Per index: heads (of the evaluated ones) that reach the recall target within the "
             "sweep, and the median / max over those heads of the cheapest scanned fraction.\n")
    L.append("| target | " + " | ".join(indexes) + " |")
    L.append("|---" * (1 + len(indexes)) + "|")
    for k, target in ((100, 0.95), (100, 0.9), (10, 0.95), (10, 0.9)):
        cells = []
        for i in indexes:
            got = sorted(v[0] for v in (min_scanned_at(r["rows"], i, k, target) for r in results)
                         if v is not None)
            cells.append(f"{len(got)}/{len(results)}" + (
                f": median {100 * got[len(got) // 2]:.1f}%, max {100 * got[-1]:.1f}%" if got else ""))
        L.append(f"| recall@{k} >= {target} | " + " | ".join(cells) + " |")
    for k in (100, 10):
        for target in (0.95, 0.9):
            L.append(f"\n## Keys scanned for recall@{k} >= {target}\n")
            L.append("Cheapest swept setting reaching the target: scanned fraction (median latency "
                     "per query, setting); `-` = not reached in the sweep.\n")
            L.append("| layer | q/kv | " + " | ".join(i for i in ["flat"] + indexes) + " |")
            L.append("|---" * (2 + 1 + len(indexes)) + "|")
            for r in results:
                cells = [fmt_scan(min_scanned_at(r["rows"], i, k, target))
                         for i in ["flat"] + indexes]
                L.append(f"| {r['layer']} | q{r['q_head']}/k{r['kv_head']} | " +
                         " | ".join(cells) + " |")
    L.append("\n## Attention quality: DIPR vs top-k at matched budget\n")
    L.append("Causal: the held-out query at position p attends [0, p]: the static window "
             "(first 128 + last 512 tokens) plus tokens retrieved from the middle. Recovery = "
             "share of the full softmax mass; error = relative L2 error of the attention "
             f"output vs full attention (scale 1/sqrt({meta['dim']})). DIPR is window-seeded (seed = best "
             "window score); beta is in logit units. The top-k error at DIPR's budget is "
             "interpolated linearly between the measured k.\n")
    L.append("| layer | q/kv | window-only err | beta | DIPR tokens attended | DIPR err | "
             "top-k err at same budget | RoarGraph DIPR err | RoarGraph DIPR scanned |")
    L.append("|---" * 9 + "|")
    wins = []  # (DIPR error, top-k error at the same budget)
    for r in results:
        qual = r["quality"]
        win = next(x for x in qual if x["method"] == "window")
        tk = [x for x in qual if x["method"] == "exact top-k"]
        for x in (x for x in qual if x["method"] == "exact dipr"):
            beta = x["param"].split("=")[1]
            g = next((y for y in qual if y["method"] == "roargraph dipr"
                      and y["param"].startswith(x["param"] + ",")), None)
            t = interp([y["attended"] for y in tk + [win]],
                       [y["rel_l2_error"] for y in tk + [win]], x["attended"])
            if t is not None and x["attended"] > win["attended"] + 1:
                wins.append((x["rel_l2_error"], t))
            L.append(f"| {r['layer']} | q{r['q_head']}/k{r['kv_head']} | "
                     f"{win['rel_l2_error']:.4f} | {beta} | {x['attended']:.0f} | "
                     f"{x['rel_l2_error']:.4f} | " + ("-" if t is None else f"{t:.4f}") + " | " +
                     ("-" if g is None else f"{g['rel_l2_error']:.4f} | {100 * g['scanned']:.1f}%")
                     + " |")
    summary = dipr_vs_topk(wins)
    if wins:
        ratio = ("" if summary["median_ratio"] is None else
                 f"; median ratio DIPR/top-k error {summary['median_ratio']:.3f} "
                 f"(min {summary['min_ratio']:.3f}, max {summary['max_ratio']:.3f}, over the "
                 f"{summary['ratio_count']} settings where top-k's error is not 0)")
        L.append(f"\nOver the {len(wins)} (head, beta) settings that retrieve more than one "
                 f"token on average and fall inside the top-k sweep, DIPR's error is lower than "
                 f"top-k's at the same average budget in {summary['dipr_lower']}, equal in "
                 f"{summary['equal']}{ratio}.\n")
    L.append("\n## Attention quality: top-k (exact vs RoarGraph)\n")
    L.append("| layer | q/kv | k | tokens attended | exact recovery | exact err | "
             "RoarGraph err | RoarGraph scanned |")
    L.append("|---" * 8 + "|")
    for r in results:
        qual = r["quality"]
        for x in (x for x in qual if x["method"] == "exact top-k"):
            g = next((y for y in qual if y["method"] == "roargraph top-k"
                      and y["param"].startswith(x["param"] + ",")), None)
            L.append(f"| {r['layer']} | q{r['q_head']}/k{r['kv_head']} | "
                     f"{x['param'].split('=')[1]} | {x['attended']:.0f} | {x['recovery']:.4f} | "
                     f"{x['rel_l2_error']:.4f} | " +
                     ("- | -" if g is None else
                      f"{g['rel_l2_error']:.4f} | {100 * g['scanned']:.1f}%") + " |")
    L.append("\nPlots (Pareto frontiers): `real_pareto_recall10.png`, `real_pareto_recall100.png`, "
             "`real_error_vs_attended.png` (per layer, averaged over the evaluated heads). "
             "Raw output: `real_eval_json/`.\n")
    with open(path, "w") as f:
        f.write("\n".join(L))
    return summary


def dipr_vs_topk(pairs):
    """Summary of (DIPR error, top-k error at the same budget) pairs.

    A ratio is only defined where top-k's error is not 0 (top-k can be exact when its budget
    covers every token with weight); those pairs still count as DIPR lower / equal / higher.
    """
    ratios = sorted(d / t for d, t in pairs if t > 0)
    return {"settings": len(pairs), "dipr_lower": sum(d < t for d, t in pairs),
            "equal": sum(d == t for d, t in pairs), "ratio_count": len(ratios),
            "median_ratio": ratios[len(ratios) // 2] if ratios else None,
            "min_ratio": ratios[0] if ratios else None, "max_ratio": ratios[-1] if ratios else None}


def scanned_summary(results, indexes):
    """Per (target, index): heads reaching it and the cheapest scanned fractions (the summary table)."""
    out = {}
    for k, target in ((100, 0.95), (100, 0.9), (10, 0.95), (10, 0.9)):
        for i in ["flat"] + indexes:
            got = sorted(v[0] for v in (min_scanned_at(r["rows"], i, k, target) for r in results)
                         if v is not None)
            out[f"recall@{k}>={target}/{i}"] = {
                "heads_reached": len(got), "heads": len(results),
                "median_scanned": got[len(got) // 2] if got else None, "max_scanned": got[-1] if got else None}
    return out


def averaged(results, layer, select, key_fields, value_fields):
    """Rows of `layer` passing `select`, averaged over heads per key_fields."""
    acc = {}
    for r in results:
        if r["layer"] != layer:
            continue
        for x in select(r):
            key = tuple(x[f] for f in key_fields)
            a = acc.setdefault(key, {f: [] for f in value_fields})
            for f in value_fields:
                a[f].append(x[f])
    return {k: {f: sum(v) / len(v) for f, v in a.items()} for k, a in acc.items()}


def model_name(dump):
    """The model named in the dump's manifest.json (older dumps: SmolLM2)."""
    try:
        with open(os.path.join(dump, "manifest.json")) as f:
            return json.load(f)["model"]
    except (OSError, ValueError, KeyError):
        return "SmolLM2-135M-Instruct"


def plot(results, indexes, layers, out_dir, args_dump):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    # Pareto frontiers only: per index, the swept settings no other setting of the same index
    # beats on both recall and cost (keys scanned; latency, drawn as QPS = 1e6 / latency).
    for k in (10, 100):
        panels = []
        for layer in layers:
            avg = averaged(results, layer,
                           lambda r: [x for x in r["rows"] if x["query"] == f"top-{k}"],
                           ("index", "param"), ("recall", "scanned", "p50_us"))
            scan, qps = {}, {}
            for index in ["flat"] + indexes:
                pts = [v for (i, _), v in avg.items() if i == index]
                scan[index] = pareto([(v["scanned"], v["recall"]) for v in pts])
                qps[index] = [(1e6 / x, y) for x, y in
                              pareto([(v["p50_us"], v["recall"]) for v in pts]) if x > 0]
            panels.append((f"layer {layer}, recall@{k} vs keys scanned", "fraction of keys scored",
                           "log", scan))
            panels.append((f"layer {layer}, recall@{k} vs QPS", "queries per second (one thread, "
                           "1e6 / median latency)", "log", qps))
        plot_frontiers(os.path.join(out_dir, f"real_pareto_recall{k}.png"),
                       f"{model_name(args_dump)} real Q->K, held-out queries: Pareto frontiers "
                       "(averaged over heads)", panels)

    fig, axes = plt.subplots(1, len(layers), figsize=(4 * len(layers), 3.8), squeeze=False)
    mstyle = {"exact top-k": "C0o-", "roargraph top-k": "C0x--", "exact dipr": "C3s-",
              "roargraph dipr": "C3+--", "window": "k*"}
    for col, layer in enumerate(layers):
        ax = axes[0][col]
        avg = averaged(results, layer, lambda r: r["quality"], ("method", "param"),
                       ("attended", "rel_l2_error"))
        for method, st in mstyle.items():
            pts = sorted((v["attended"], v["rel_l2_error"]) for (m, _), v in avg.items()
                         if m == method)
            if pts:
                ax.plot(*zip(*pts), st, label=method, ms=4)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(f"layer {layer}")
        ax.set_xlabel("tokens attended (window 640 + retrieved)")
        ax.set_ylabel("relative L2 error of output")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Attention output error vs full causal attention (averaged over heads)")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "real_error_vs_attended.png"), dpi=90)
    plt.close(fig)


def defaults_from_manifest(dump):
    """(layers, heads) text defaults from the dump's manifest.json: every dumped layer, and the
    first dumped query head of each dumped KV head."""
    path = os.path.join(dump, "manifest.json")
    try:
        with open(path) as f:
            m = json.load(f)
        group = {int(q): int(kv) for q, kv in m["gqa_group"].items()}
        pairs = {}
        for q in m["query_heads_dumped"]:
            pairs.setdefault(group[int(q)], int(q))
        layers = ",".join(str(int(x)) for x in m["layers"])
        heads = ",".join(f"{q}:{kv}" for kv, q in sorted(pairs.items()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        fail(f"give --layers and --heads, or a dump with a readable manifest.json ({path}: {exc})")
    return layers, heads


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", default=os.path.join(ROOT, "build/bin/kvsift-bench"))
    ap.add_argument("--dump", default=os.path.join(ROOT, "bench/data/sample"))
    ap.add_argument("--layers", help="layers (default: all in the dump's manifest.json)")
    ap.add_argument("--heads", help="query:kv head pairs (default: first query head of each dumped KV head)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="output directory (default: a new temporary directory, printed)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--quick", action="store_true", help="a few points of each sweep (CI)")
    ap.add_argument("--reuse", action="store_true",
                    help="rebuild the tables and plots from the JSON of an earlier run")
    args = ap.parse_args()
    if args.reuse and not args.out:
        fail("--reuse needs --out (the directory of the earlier run)")
    if not args.layers or not args.heads:
        layers_d, heads_d = defaults_from_manifest(args.dump)
        args.layers = args.layers or layers_d
        args.heads = args.heads or heads_d
    if not args.reuse and not os.access(args.bench, os.X_OK):
        fail(f"no kvsift-bench at {args.bench} (build it: cmake --build build "
             "--target kvsift-bench)")
    if not args.out:
        args.out = tempfile.mkdtemp(prefix="kvsift-eval-")
        print(f"evaluate.py: writing to {args.out}", flush=True)
    try:
        layers = [int(x) for x in args.layers.split(",")]
    except ValueError:
        fail(f"--layers: expected a list of integers, got '{args.layers}'")
    pairs = parse_pairs(args.heads)
    # Say so before the long run, not after; the tables and JSON are written either way.
    want_plots = not args.no_plots and have_matplotlib()
    json_dir = os.path.join(args.out, "real_eval_json")
    if args.reuse:
        rows = [r["index"] for f in os.listdir(json_dir) if f.endswith(".json")
                for r in json.load(open(os.path.join(json_dir, f)))["rows"]]
        indexes = [i for i in ("roargraph", "hnsw", "ivf") if i in rows]
    else:
        indexes = ["roargraph"] + peers_built(args.bench)
    print(f"evaluate.py: indexes {indexes}; layers {layers}; heads {pairs}", flush=True)
    os.makedirs(json_dir, exist_ok=True)
    results = [run_one(args, layer, q, kv, indexes, os.path.join(json_dir, f"L{layer}_q{q}_k{kv}.json"))
               for layer in layers for q, kv in pairs]
    total = sum(r.get("wall_s", 0) for r in results)
    dipr = write_markdown(os.path.join(args.out, "real_eval.md"), results, indexes, args, total)
    with open(os.path.join(args.out, "real_eval_summary.json"), "w") as f:
        json.dump({"dump": args.dump, "layers": layers, "heads": pairs, "indexes": indexes,
                   "runs": len(results), "dipr_vs_topk": dipr,
                   "scanned": scanned_summary(results, indexes)}, f, indent=1)
    if want_plots:
        plot(results, indexes, layers, args.out, args.dump)
    print(f"evaluate.py: wrote {args.out}/real_eval.md" + (" and plots" if want_plots else "") +
          f" in {total / 60:.1f} min")


if __name__ == "__main__":
    main()
