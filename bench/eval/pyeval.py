#!/usr/bin/env python3
"""kvsift vs hnswlib and faiss on real attention dumps, through the Python module.

For each layer of a dump (bench/data/dump_qk.py: the committed SmolLM2 sample, or the Gemma-3
32K dump of docs/gemma3_data.md) and one KV head with its GQA query heads:

Retrieval. Keys = the prefill (first --train-fraction of positions). One index per method and
layer, shared by the group's query heads (RoarGraph is built from training queries of every
head of the group, kvsift.sample_gqa_queries); each held-out query head is evaluated on its own.
Recall@k is against kvsift.FlatIndex's exact top-k over the same keys. Keys scanned = distance
computations per query: kvsift and faiss-HNSW count them; faiss IVF-Flat = keys in the probed
lists + all centroids; hnswlib does not expose its count (n/a). Latency = one thread, mean per
query of a batch. RoarGraph DIPR rows: set recall of the graph's DIPR result against the exact
DIPR set (FlatIndex.dipr) at the same beta.

GQA groups (unless --no-gqa; layers with more than one query head). A decode step has all of a
KV head's query heads at once, so it can read a key row once for all of them. Two more indexes
count that way: roargraph-gqa (one walk per position for the group, search_heads(shared_walk=
True), sweeping L and the expand limit E = --expand-fractions x L) and faiss-ivf-gqa (every
head scans the union of the group's probed lists, search_preassigned). Their `scanned` is the
key rows read per query (the group's rows / H, centroids included for IVF), `scored` the keys
each query was scored against; for the per-head indexes the two are the same. The targets are
reported both ways: keys scored by one search per head, and rows read with the group variants.

Warm starts (unless --no-warm). An engine decodes positions in order and can seed each step's
search with the step before's results. roargraph-warm (a walk per head) and roargraph-gqa-warm
(the shared walk) search every held-out position from the first evaluated one to the last in
order, each seeded with the previous position's results (search_heads(entries=...); the first
position starts cold), sweeping L <= 4k and E = --warm-fractions x L; only the evaluated
positions are scored, the latency is the chain's mean per query. The targets report them apart
(the <= 5% lines and a third "decode order" count, against the same cold peers).

Routed cold starts (unless --no-route). A query with no previous step can start from routed
seeds: kvsift.make_route_set keeps --route-rows of the build's training queries with their exact
top-100 keys, clustered (--route-clusters); each query takes the lists of its best --route-top
rows among its --route-probe best clusters' (RouteSet.seeds) as entries, with an expand limit
E = --route-fractions x L. roargraph-routed walks per head, roargraph-gqa-routed is the shared
walk from the union of the group's routes. The routing vectors a query scores count as rows
read, as IVF's centroids do (per head: its centroids and probed rows; in a group, routed in one
pass as the GPU does: the centroids and the union of the heads' probed clusters, / H); `scored`
counts keys only.

Attention quality. For a held-out query at position p attending causally [0, p]: the static
window (first --sink + last --recent tokens) alone, window + exact top-k of the middle, and
window + exact DIPR of the middle (every middle token within beta logits of the best score),
against full attention with V: softmax-mass recovery and relative L2 error of the output. Top-k
is also run at DIPR's budget: k = the mean number of middle tokens DIPR attended at that beta.
And DIPR with a cap (--dipr-cap C, as the GPU decode step's max_results): a query whose middle
holds C or more tokens within beta of the best is capped and attends every token (full
attention, the decode step's dense_when_capped), or in the "best" rows its best C middle tokens;
the others attend their DIPR set. The rows give the share of queries capped.

Writes into --out (default: a new temporary directory, printed; inside the repository only when
--out says so): pyeval.json (every sweep point), pyeval.md (tables, targets), and with
matplotlib pyeval_L{layer}_frontier.png (Pareto frontiers: recall vs keys scanned and vs QPS)
and pyeval_quality.png. --from-json re-renders the tables and plots of an earlier run.

    PYTHONPATH=build/python python3 bench/eval/pyeval.py --dump bench/data/sample --quick
    PYTHONPATH=build/python nice python3 bench/eval/pyeval.py --dump /work/data/gemma32k --layers 11
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import datasets  # noqa: E402
from frontier import have_matplotlib, pareto, plot_frontiers  # noqa: E402

FULL = {"L": "10,16,32,64,100,128,160,200,300,400,600,800,1200",
        "nprobe": "1,2,4,8,16,32,64,128,256", "beta": "1,2,3,4,6,8",
        "attn_k": "16,32,64,128,256,512,1024,2048,4096"}
QUICK = {"L": "10,32,100,200", "nprobe": "1,4,16", "beta": "2,4", "attn_k": "16,64,256"}
METHODS = ("flat", "roargraph", "hnswlib", "faiss-hnsw", "faiss-ivf")
# Table order of the indexes, with the group variants (group_rows) after their method.
INDEXES = ("flat", "roargraph", "roargraph-gqa", "roargraph-warm", "roargraph-gqa-warm",
           "roargraph-routed", "roargraph-gqa-routed", "hnswlib", "faiss-hnsw", "faiss-ivf",
           "faiss-ivf-gqa")


def fail(msg):
    print(f"pyeval.py: {msg}", file=sys.stderr)
    sys.exit(1)


def ints(text, name, minimum=1):
    try:
        v = [int(x) for x in text.split(",")]
    except ValueError:
        fail(f"--{name}: expected comma-separated integers, got '{text}'")
    if any(x < minimum for x in v):
        fail(f"--{name}: expected values >= {minimum}, got '{text}'")
    return v


def floats(text, name):
    try:
        v = [float(x) for x in text.split(",")]
    except ValueError:
        fail(f"--{name}: expected comma-separated numbers, got '{text}'")
    if any(not x > 0 for x in v):
        fail(f"--{name}: expected values > 0, got '{text}'")
    return v


def recall(ids, truth, k):
    """Mean over queries of |ids[:, :k] & truth[:, :k]| / k."""
    hits = [len(np.intersect1d(a[:k], b[:k])) for a, b in zip(ids, truth)]
    return float(np.mean(hits)) / k


# --- methods: build(keys, train) -> (seconds, bytes); search(q, k, param) -> (ids, scanned) ---


class Flat:
    name, param_name = "flat", None

    def __init__(self, ks, args):
        self.ks = ks

    def build(self, keys, train):
        t = time.perf_counter()
        self.index = self.ks.FlatIndex(keys)
        return time.perf_counter() - t, keys.nbytes

    def params(self, k, args):
        return [None]

    def search(self, q, k, _):
        return self.index.topk(q, k, threads=1).ids, float(self.index.size)


class RoarGraph:
    name, param_name = "roargraph", "L"

    def __init__(self, ks, args):
        self.ks, self.args = ks, args

    def build(self, keys, train):
        a = self.args
        t = time.perf_counter()
        self.g = self.ks.RoarGraphIndex(keys, train, nq=a.nq, M=a.M, L=a.build_L,
                                        threads=a.threads)
        secs = time.perf_counter() - t
        n = keys.shape[0]
        # graph_index keeps a fixed-stride adjacency (n x max_degree ids) and a degree per node,
        # on top of the keys it reads.
        return secs, keys.nbytes + 4 * n * (self.g.max_degree + 1)

    def params(self, k, args):
        return [L for L in args.L if L >= k]

    def search(self, q, k, L):
        r = self.g.search(q, k, L=L, threads=1, degree_cap=self.args.degree_cap)
        return r.ids, float(np.mean(r.distance_computations))

    def group_params(self, k, args):
        # E = 0 is the plain pool (every entry expanded); smaller fractions stop the walk
        # earlier, which a shared walk affords because four heads feed its frontier.
        return [(L, 0 if f >= 1 else max(1, round(f * L))) for L in self.params(k, args)
                for f in args.expand_fractions]

    def group_search(self, qs, k, p):
        """One walk per position for the group's heads (search_heads(shared_walk=True)).

        qs: (positions, H, d). Returns ids (positions, H, k), the distinct key rows the walks
        read per query, and the keys scored per query (each head scores every row read)."""
        L, E = p
        ids, rows = [], 0.0
        for q in qs:
            r = self.ks.search_heads([self.g], q, k, L=L, threads=1, shared_walk=True,
                                     expand_limit=E, degree_cap=self.args.degree_cap)
            ids.append(r.ids)
            rows += float(r.distance_computations[0])  # every head reports its group's count
        H = qs.shape[1]
        return np.stack(ids), rows / (len(qs) * H), rows / len(qs)


class Hnswlib:
    name, param_name = "hnswlib", "ef"

    def __init__(self, ks, args):
        import hnswlib

        self.hnswlib, self.args = hnswlib, args

    def build(self, keys, train):
        n, d = keys.shape
        t = time.perf_counter()
        self.index = self.hnswlib.Index("ip", d)
        self.index.init_index(n, M=self.args.hnsw_M, ef_construction=self.args.ef_construction)
        self.index.add_items(keys, num_threads=self.args.threads)
        secs = time.perf_counter() - t
        with tempfile.TemporaryDirectory() as tmp:
            self.index.save_index(os.path.join(tmp, "h.bin"))
            size = os.path.getsize(os.path.join(tmp, "h.bin"))
        self.index.set_num_threads(1)
        return secs, size

    def params(self, k, args):
        return [L for L in args.L if L >= k]

    def search(self, q, k, ef):
        self.index.set_ef(ef)
        ids, _ = self.index.knn_query(q, k=k, num_threads=1)
        return ids, None  # hnswlib's Python API does not expose its distance count


class FaissHnsw:
    name, param_name = "faiss-hnsw", "efSearch"

    def __init__(self, ks, args):
        import faiss

        self.faiss, self.args = faiss, args

    def build(self, keys, train):
        f = self.faiss
        f.omp_set_num_threads(self.args.threads)
        t = time.perf_counter()
        self.index = f.IndexHNSWFlat(keys.shape[1], self.args.hnsw_M, f.METRIC_INNER_PRODUCT)
        self.index.hnsw.efConstruction = self.args.ef_construction
        self.index.add(keys)
        secs = time.perf_counter() - t
        f.omp_set_num_threads(1)
        return secs, len(f.serialize_index(self.index))

    def params(self, k, args):
        return [L for L in args.L if L >= k]

    def search(self, q, k, ef):
        f = self.faiss
        self.index.hnsw.efSearch = ef
        f.cvar.hnsw_stats.reset()
        _, ids = self.index.search(q, k)
        # Some faiss builds (faiss-cpu 1.8.0 from PyPI) never update the counter: no count
        # (None, as hnswlib) rather than a wrong 0.
        ndis = f.cvar.hnsw_stats.ndis
        return ids, ndis / len(q) if ndis > 0 else None


class FaissIvf:
    name, param_name = "faiss-ivf", "nprobe"

    def __init__(self, ks, args):
        import faiss

        self.faiss, self.args = faiss, args

    def build(self, keys, train):
        f = self.faiss
        n, d = keys.shape
        self.nlist = self.args.nlist or max(1, int(round(4 * np.sqrt(n))))
        f.omp_set_num_threads(self.args.threads)
        t = time.perf_counter()
        self.quantizer = f.IndexFlatIP(d)
        self.index = f.IndexIVFFlat(self.quantizer, d, self.nlist, f.METRIC_INNER_PRODUCT)
        self.index.train(keys)
        self.index.add(keys)
        secs = time.perf_counter() - t
        f.omp_set_num_threads(1)
        self.list_sizes = np.array([self.index.invlists.list_size(i) for i in range(self.nlist)])
        return secs, len(f.serialize_index(self.index))

    def params(self, k, args):
        return [p for p in args.nprobe if p <= self.nlist]

    def group_params(self, k, args):
        return self.params(k, args)

    def group_search(self, qs, k, nprobe):
        """IVF for a GQA group: every head scans the union of the group's probed lists.

        The fair peer of a shared walk: the group's heads probe their nprobe lists each, the
        union is read once and scored for every head (search_preassigned). Rows read per query =
        (keys in the union + the nlist centroids, also read once) / H."""
        P, H, d = qs.shape
        flat = np.ascontiguousarray(qs.reshape(P * H, d))
        _, probe = self.quantizer.search(flat, nprobe)
        width = min(H * nprobe, self.nlist)  # the widest union
        assign = np.full((P * H, width), -1, dtype=np.int64)
        rows = 0
        for p in range(P):
            union = np.unique(probe[p * H:(p + 1) * H])
            assign[p * H:(p + 1) * H, :len(union)] = union
            rows += int(self.list_sizes[union].sum())
        self.index.nprobe = width
        _, ids = self.index.search_preassigned(flat, k, assign, np.zeros(assign.shape, "float32"))
        rows_per_query = (rows / P + self.nlist) / H
        return ids.reshape(P, H, k), rows_per_query, rows_per_query * H

    def search(self, q, k, nprobe):
        f = self.faiss
        self.index.nprobe = nprobe
        f.cvar.indexIVF_stats.reset()
        _, ids = self.index.search(q, k)
        # keys scored in the probed lists, plus the nlist centroids every query is scored against
        return ids, f.cvar.indexIVF_stats.ndis / len(q) + self.nlist


CLASSES = {"flat": Flat, "roargraph": RoarGraph, "hnswlib": Hnswlib, "faiss-hnsw": FaissHnsw,
           "faiss-ivf": FaissIvf}


def make_methods(ks, args):
    out = []
    for name in args.methods:
        try:
            out.append(CLASSES[name](ks, args))
        except ImportError as exc:
            print(f"pyeval.py: skipping {name}: {exc} (pip install "
                  f"{'hnswlib' if name == 'hnswlib' else 'faiss-cpu'})", flush=True)
    return out


def retrieval(ks, ld, sp, args, methods, log):
    """Every sweep point of every method on one layer: rows (per head) and builds."""
    keys = np.ascontiguousarray(ld.keys[: sp.n_train])
    heads = sorted(ld.queries)
    prefill = [np.ascontiguousarray(ld.queries[h][: sp.n_train]) for h in heads]
    train = ks.sample_gqa_queries(prefill, ratio=args.train_ratio)
    evalq = {h: np.ascontiguousarray(ld.queries[h][sp.eval_positions]) for h in heads}
    oracle = ks.FlatIndex(keys)
    kmax = max(args.k)
    truth = {h: oracle.topk(evalq[h], kmax, threads=args.threads).ids for h in heads}
    builds, rows = [], []
    for m in methods:
        secs, size = m.build(keys, train)
        builds.append({"index": m.name, "build_s": round(secs, 3), "bytes": int(size),
                       "train_queries": int(train.shape[0]) if m.name == "roargraph" else 0})
        log(f"  layer {ld.layer}: built {m.name} in {secs:.1f} s ({size / 2**20:.1f} MiB)")
        for h in heads:
            for k in args.k:
                for p in m.params(k, args):
                    t = time.perf_counter()
                    ids, scanned = m.search(evalq[h], k, p)
                    us = (time.perf_counter() - t) / len(evalq[h]) * 1e6
                    rows.append(topk_row(m.name, m.param_name, p, None, h, k,
                                         recall(np.asarray(ids), truth[h], k), scanned,
                                         scanned, sp.n_train, us))
        if args.gqa and len(heads) > 1 and hasattr(m, "group_search"):
            rows += group_rows(m, heads, evalq, truth, sp.n_train, args)
        if m.name == "roargraph":
            if args.warm:
                rows += warm_rows(m, ld, sp, heads, truth, args)
            if args.route:
                rows += routed_rows(m, keys, train, heads, evalq, truth, sp.n_train, args, log)
            rows += dipr_rows(m.g, oracle, evalq, ld.scale, sp.n_train, args)
    return builds, rows, int(train.shape[0])


def topk_row(index, param_name, param, expand_limit, head, k, rec, read, scored, n, us):
    """One top-k sweep point of one head. read / scored: key rows read and keys scored per
    query (the same for a search per head; None where the index has no count)."""
    return {"index": index, "head": head, "query": f"top-{k}", "k": k,
            "param_name": param_name, "param": param, "expand_limit": expand_limit,
            "recall": rec, "scanned_keys": read,
            "scanned": None if read is None else read / n,
            "scored": None if scored is None else scored / n,
            "latency_us": us, "qps": 1e6 / us}


def group_rows(m, heads, evalq, truth, n, args):
    """The group variant of method m (index "<name>-gqa"): each eval position's query heads
    searched together, so a key row is read once per group. `scanned` is then the rows read per
    query (the group's rows / H), `scored` the keys each query was scored against (the group's
    rows); for the per-head rows the two are equal. One row per head per setting, so the tables'
    head averages and the targets treat them like any other index."""
    qs = np.ascontiguousarray(np.stack([evalq[h] for h in heads], axis=1))  # (P, H, d)
    out = []
    for k in args.k:
        for p in m.group_params(k, args):
            t = time.perf_counter()
            ids, read, scored = m.group_search(qs, k, p)
            us = (time.perf_counter() - t) / (qs.shape[0] * qs.shape[1]) * 1e6
            param, limit = p if isinstance(p, tuple) else (p, None)  # RoarGraph: (L, E)
            out += [topk_row(f"{m.name}-gqa", m.param_name, param, limit, h, k,
                             recall(ids[:, i], truth[h], k), read, scored, n, us)
                    for i, h in enumerate(heads)]
    return out


def warm_rows(m, ld, sp, heads, truth, args):
    """RoarGraph in decode order: every held-out position from the first evaluated one to the
    last, each seeded with the previous position's results (an engine's warm start), per head
    ("roargraph-warm") and, with more than one head, as the group's shared walk from the union
    of its heads' previous results ("roargraph-gqa-warm"). Rows only for the evaluated positions,
    counted as group_rows counts them; the latency is the whole chain's mean per query."""
    first, last = int(sp.eval_positions[0]), int(sp.eval_positions[-1])
    chain = np.ascontiguousarray(np.stack([ld.queries[h][first:last + 1] for h in heads], axis=1))
    evaluated = {int(p) - first: i for i, p in enumerate(sp.eval_positions)}
    H, out = len(heads), []
    for shared in (False, True) if args.gqa and H > 1 else (False,):
        name = "roargraph-gqa-warm" if shared else "roargraph-warm"
        for k in args.k:
            for L in [L for L in m.params(k, args) if L <= 4 * k]:
                for f in args.warm_fractions:
                    E = 0 if f >= 1 else max(1, round(f * L))
                    ids = np.empty((len(evaluated), H, k), np.int64)
                    read = scored = 0.0
                    prev = None
                    t = time.perf_counter()
                    for j, q in enumerate(chain):
                        r = m.ks.search_heads([m.g], q, k, L=L, threads=1, shared_walk=shared,
                                              expand_limit=E, entries=prev,
                                              degree_cap=args.degree_cap)
                        prev = r.ids
                        i = evaluated.get(j)
                        if i is not None:
                            ids[i] = r.ids
                            # A shared walk reports its group's rows on every head.
                            dc = r.distance_computations
                            group = float(dc[0]) if shared else float(np.mean(dc))
                            read += group / H if shared else group
                            scored += group
                    us = (time.perf_counter() - t) / (len(chain) * H) * 1e6
                    P = len(evaluated)
                    out += [topk_row(name, "L", L, E, h, k, recall(ids[:, i], truth[h], k),
                                     read / P, scored / P, sp.n_train, us)
                            for i, h in enumerate(heads)]
    return out


def routed_rows(m, keys, train, heads, evalq, truth, n, args, log):
    """RoarGraph cold but routed (see the module's docstring): per head ("roargraph-routed")
    and, with more than one head, the group's shared walk from the union of its heads' routes
    ("roargraph-gqa-routed"). `scanned` = key rows read + the routing vectors read (a group
    routes together: the centroids once and the union of its heads' probed clusters, / H);
    `scored` = keys scored (each head scores every row its group reads)."""
    t = time.perf_counter()
    rows = min(args.route_rows, train.shape[0])
    routes = m.ks.make_route_set(train, keys, rows, list_len=100)
    if args.route_clusters:
        routes.cluster(min(args.route_clusters, rows))
    probe = min(args.route_probe, routes.clusters) if routes.clusters else 0
    log(f"  routing set: {rows} rows, {routes.clusters} clusters, probe {probe}, made in "
        f"{time.perf_counter() - t:.1f} s")
    seeds, reads, probed = {}, {}, {}
    sizes = np.diff(routes.cluster_rows) if probe else None
    for h in heads:
        seeds[h], r = routes.seeds(evalq[h], top=args.route_top, probe=probe, reads=True)
        reads[h] = float(np.mean(r))
        if probe:
            # Each query's probed clusters (the centroids' ranking; checked against the
            # library's reads), for what a group routed together reads: the GPU routes a GQA
            # group in one block, reading the centroids once and the union of its clusters.
            order = np.argsort(-(evalq[h] @ routes.centroids.T), axis=1, kind="stable")
            probed[h] = order[:, :probe]
            assert np.array_equal(routes.clusters + sizes[probed[h]].sum(axis=1), r), \
                "pyeval: the probed clusters differ from route_seeds' (a tie at the cut)"
    H, P, out = len(heads), len(evalq[heads[0]]), []
    qs = np.ascontiguousarray(np.stack([evalq[h] for h in heads], axis=1))  # (P, H, d)
    if probe:  # routing vectors the group reads at each position, per query
        group_reads = np.mean([routes.clusters + sizes[np.unique(np.concatenate(
            [probed[h][p] for h in heads]))].sum() for p in range(P)]) / H
    else:
        group_reads = float(routes.rows) / H
    for k in args.k:
        for L in m.params(k, args):
            for f in args.route_fractions:
                E = 0 if f >= 1 else max(1, round(f * L))
                for h in heads:
                    ids, dc = [], 0.0
                    t = time.perf_counter()
                    for i, q in enumerate(evalq[h]):
                        r = m.g.search(q, k, L=L, threads=1, entries=seeds[h][i],
                                       expand_limit=E, degree_cap=args.degree_cap)
                        ids.append(np.asarray(r.ids).reshape(-1))
                        dc += float(np.mean(r.distance_computations))
                    us = (time.perf_counter() - t) / P * 1e6
                    out.append(topk_row("roargraph-routed", "L", L, E, h, k,
                                        recall(np.stack(ids), truth[h], k),
                                        dc / P + reads[h], dc / P, n, us))
                if not (args.gqa and H > 1):
                    continue
                ids = np.empty((P, H, k), np.int64)
                group = 0.0
                t = time.perf_counter()
                for p in range(P):
                    entries = np.stack([seeds[h][p] for h in heads])
                    r = m.ks.search_heads([m.g], qs[p], k, L=L, threads=1, shared_walk=True,
                                          expand_limit=E, entries=entries,
                                          degree_cap=args.degree_cap)
                    ids[p] = r.ids
                    group += float(r.distance_computations[0])  # the group's rows, every head
                us = (time.perf_counter() - t) / (P * H) * 1e6
                read = group / (P * H) + group_reads
                out += [topk_row("roargraph-gqa-routed", "L", L, E, h, k,
                                 recall(ids[:, i], truth[h], k), read, group / P, n, us)
                        for i, h in enumerate(heads)]
    return out


def dipr_rows(graph, oracle, evalq, scale, n, args):
    """RoarGraph DIPR vs exact DIPR (FlatIndex.dipr) per head, beta (logit units) and hop cap
    (--dipr-hops; query "dipr hops H", whose rows also give the share of searches capped)."""
    rows = []
    for h, qs in evalq.items():
        for hops in [0] + args.dipr_hops:
            for beta in args.beta:
                raw = beta / scale  # kvsift's beta is in raw q.k units
                rec, scanned, attended, capped, secs = [], [], [], [], 0.0
                for q in qs:
                    exact = oracle.dipr(q, raw, l0=args.l0).ids
                    t = time.perf_counter()
                    r = graph.dipr(q, raw, l0=args.l0, max_hops=hops)
                    secs += time.perf_counter() - t
                    rec.append(len(np.intersect1d(r.ids, exact)) / max(1, len(exact)))
                    scanned.append(r.distance_computations)
                    attended.append(len(exact))
                    capped.append(float(r.capped))
                us = secs / len(qs) * 1e6
                rows.append({"index": "roargraph", "head": h,
                             "query": f"dipr hops {hops}" if hops else "dipr", "k": None,
                             "param_name": "beta", "param": beta, "recall": float(np.mean(rec)),
                             "scanned_keys": float(np.mean(scanned)),
                             "scanned": float(np.mean(scanned)) / n,
                             "exact_set_size": float(np.mean(attended)),
                             "capped": float(np.mean(capped)), "max_hops": hops,
                             "latency_us": us, "qps": 1e6 / us})
    return rows


def quality(ld, sp, args, log):
    """Window / top-k / DIPR attention quality per head (exact selections; see module doc)."""
    K, V = ld.keys.astype(np.float64), ld.values.astype(np.float64)
    out = []
    for h in sorted(ld.queries):
        Q = ld.queries[h][sp.eval_positions].astype(np.float64)
        S = (Q @ K.T) * ld.scale  # (m, n) logits; row i is valid up to eval_positions[i]
        # Pass 1: DIPR's middle counts per beta, for the matched top-k budget.
        counts = {b: [] for b in args.beta}
        for i, p in enumerate(sp.eval_positions):
            lo, hi = middle(p, args)
            best = S[i, : p + 1].max()
            for b in args.beta:
                counts[b].append(int(np.count_nonzero(S[i, lo:hi] >= best - b)))
        matched = {b: max(1, int(round(np.mean(c)))) for b, c in counts.items()}
        acc = {}  # (method, param) -> list of (attended, recovery, error, capped 0 or 1)
        for i, p in enumerate(sp.eval_positions):
            lo, hi = middle(p, args)
            logit = S[i, : p + 1]
            w = np.exp(logit - logit.max())
            o_full = w @ V[: p + 1]
            z = w.sum()
            win = np.r_[0:lo, hi : p + 1]
            base_w, base_o = w[win].sum(), w[win] @ V[win]

            def metrics(mass, o, n_mid):
                err = np.linalg.norm(o / mass - o_full / z) / np.linalg.norm(o_full / z)
                return (len(win) + n_mid, mass / z, err)

            acc.setdefault(("window", 0), []).append(metrics(base_w, base_o, 0) + (0.0,))
            capped_best = set()  # this query's "dipr cap c best" keys where it was capped
            # Top-k and DIPR of the middle are both prefixes of the middle sorted best first
            # (DIPR keeps every token >= best - beta): accumulate the prefix sums once.
            order = lo + np.argsort(-logit[lo:hi], kind="stable")
            lengths = {("top-k", k): min(k, hi - lo) for k in args.attn_k}
            for b in args.beta:
                lengths[("dipr", b)] = counts[b][i]
                # top-k at DIPR's budget: the same mean number of middle tokens, spread evenly
                lengths[("top-k at dipr budget", b)] = min(matched[b], hi - lo)
                # A query whose DIPR range holds c or more middle tokens is capped: it attends
                # everything (decode_step's dense_when_capped), or its best c ("best").
                for c in args.dipr_cap:
                    key, best_c = (f"dipr cap {c}", b), (f"dipr cap {c} best", b)
                    if counts[b][i] >= c:
                        acc.setdefault(key, []).append(metrics(z, o_full, hi - lo) + (1.0,))
                        capped_best.add(best_c)
                        lengths[best_c] = c
                    else:
                        lengths[key] = lengths[best_c] = counts[b][i]
            done, mass, o = 0, base_w, base_o.copy()
            for key, c in sorted(lengths.items(), key=lambda kv: kv[1]):
                if c > done:
                    seg = order[done:c]
                    mass, o, done = mass + w[seg].sum(), o + w[seg] @ V[seg], c
                acc.setdefault(key, []).append(metrics(mass, o, c) + (float(key in capped_best),))
        for (method, param), v in acc.items():
            a = np.array(v)
            row = {"head": h, "method": method, "param": param, "attended": float(a[:, 0].mean()),
                   "recovery": float(a[:, 1].mean()), "rel_l2_error": float(a[:, 2].mean())}
            if method.startswith("dipr cap"):
                row["capped"] = float(a[:, 3].mean())  # share of queries that attend everything
            if method == "top-k at dipr budget":
                row["k"] = matched[param]
            out.append(row)
        log(f"  layer {ld.layer} q{h}: quality done")
    return out


def middle(p, args):
    """[lo, hi): the positions of query p's causal range outside the static window."""
    lo = min(args.sink, p + 1)
    return lo, max(lo, p + 1 - args.recent)


# --- aggregation and report ---


def head_mean(rows, keys=("index", "query", "param", "expand_limit")):
    """Rows averaged over heads per (index, query, param, expand limit)."""
    acc = {}
    for r in rows:
        acc.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    out = []
    for key, rs in acc.items():
        m = dict(zip(keys, key))
        for f in ("recall", "scanned", "scored", "scanned_keys", "latency_us", "exact_set_size",
                  "capped"):
            vals = [r.get(f) for r in rs]
            m[f] = None if any(v is None for v in vals) else float(np.mean(vals))
        m["param_name"] = rs[0]["param_name"]
        m["max_hops"] = rs[0].get("max_hops")  # the same in a group (its query says it)
        m["heads"] = len(rs)
        out.append(m)
    return out


def cheapest(rows, index, query, target):
    """Least scanned fraction of `index` reaching recall >= target (head-averaged rows)."""
    ok = [r for r in rows if r["index"] == index and r["query"] == query
          and r["recall"] >= target and r["scanned"] is not None]
    return min(ok, key=lambda r: r["scanned"]) if ok else None


# The <= 5% target's two counts: (index, its name for `scanned`), with their report lines.
FIVE_PERCENT = (("roargraph", "scanned"), ("roargraph-gqa", "rows read"),
                ("roargraph-warm", "scanned"), ("roargraph-gqa-warm", "rows read"),
                ("roargraph-routed", "scanned"), ("roargraph-gqa-routed", "rows read"))
FIVE_PERCENT_TEXT = {"roargraph": "RoarGraph recall@100 >= 0.95 at <= 5% scanned",
                     "roargraph-gqa": "RoarGraph shared walk recall@100 >= 0.95 at <= 5% of the "
                                      "key rows read",
                     "roargraph-warm": "RoarGraph in decode order, warm-started, recall@100 >= "
                                       "0.95 at <= 5% scanned",
                     "roargraph-gqa-warm": "RoarGraph shared walk in decode order, warm-started, "
                                           "recall@100 >= 0.95 at <= 5% of the key rows read",
                     "roargraph-routed": "RoarGraph cold, routed seeds, recall@100 >= 0.95 at "
                                         "<= 5% scanned (routing vectors included)",
                     "roargraph-gqa-routed": "RoarGraph shared walk, cold, routed seeds, "
                                             "recall@100 >= 0.95 at <= 5% of the rows read "
                                             "(routing vectors included)"}


def targets(avg):
    """The brief's two targets on head-averaged rows of one layer.

    Counted twice: keys scored per query with one search per head (the tables' historical
    count), and key rows read per query where the group's heads may search together (the shared
    walk and IVF over the union of the group's lists: what a decode step pays for)."""
    t = {}
    for index, count in FIVE_PERCENT:
        if index == "roargraph" or any(r["index"] == index for r in avg):
            best = cheapest(avg, index, "top-100", 0.95)
            t[f"{index} recall@100>=0.95 {count}"] = None if best is None else best["scanned"]
            t[f"{index} recall@100>=0.95 at <=5% {count}"] = (best is not None
                                                              and best["scanned"] <= 0.05)
    # The third count lets RoarGraph start from the previous position's results; the peers have
    # no such start (an IVF probe does not depend on where the last query landed).
    counts = [("", ("roargraph",), ("faiss-ivf", "faiss-hnsw")),
              (" (rows read, GQA groups)", ("roargraph", "roargraph-gqa"),
               ("faiss-ivf", "faiss-hnsw", "faiss-ivf-gqa")),
              (" (rows read, decode order, warm starts)",
               ("roargraph", "roargraph-gqa", "roargraph-warm", "roargraph-gqa-warm"),
               ("faiss-ivf", "faiss-hnsw", "faiss-ivf-gqa")),
              # Cold like the peers, but entered at routed seeds (their reads counted).
              (" (rows read, cold, routed seeds)",
               ("roargraph", "roargraph-gqa", "roargraph-routed", "roargraph-gqa-routed"),
               ("faiss-ivf", "faiss-hnsw", "faiss-ivf-gqa"))]
    for suffix, ours, theirs in counts:
        if suffix and not any(r["index"] in ours[1:] for r in avg):
            continue
        for query in ("top-10", "top-100"):
            for target in (0.9, 0.95, 0.99):
                mine = [g for g in (cheapest(avg, i, query, target) for i in ours) if g]
                peers = [p for p in (cheapest(avg, i, query, target) for i in theirs) if p]
                key = f"{query} recall>={target}{suffix}"
                g = min(mine, key=lambda r: r["scanned"]) if mine else None
                bp = min(peers, key=lambda r: r["scanned"]) if peers else None
                t[key] = {"roargraph": None if g is None else g["scanned"],
                          "roargraph_index": None if g is None else g["index"],
                          "best_peer": None if bp is None else bp["scanned"],
                          "best_peer_index": None if bp is None else bp["index"],
                          "ratio": None if g is None or bp is None
                          else bp["scanned"] / g["scanned"]}
    return t


def param_text(r):
    if r["param"] is None:
        return "-"
    text = f"{r['param_name']}={r['param']:g}"
    return text if r.get("expand_limit") is None else f"{text} E={r['expand_limit'] or r['param']}"


def pct(x):
    return "n/a" if x is None else f"{100 * x:.2f}%"


def write_markdown(path, res):
    meta = res["meta"]
    L = ["# kvsift vs hnswlib / faiss on real attention data (pyeval.py)\n",
         f"Model {meta['model']} (`{meta['dump']}`), {meta['tokens']} tokens, head dim "
         f"{meta['head_dim']}; train (prefill) = first {meta['n_train']} positions, "
         f"{meta['eval_queries']} held-out queries per head (every {meta['eval_stride']}th of the "
         f"last {meta['tokens'] - meta['n_train']}). kvsift {meta['kvsift_version']} "
         f"({meta['commit']}), {meta['cpu']}, build threads {meta['threads']}, search on 1 "
         f"thread. Command: `{meta['command']}`.\n"]
    for lay in res["layers"]:
        avg = head_mean(lay["rows"])
        L.append(f"\n## Layer {lay['layer']} (KV head {lay['kv_head']}, query heads "
                 f"{lay['heads']}, averaged over heads)\n")
        L.append("| index | build s | size MiB |\n|---|---|---|")
        for b in lay["builds"]:
            L.append(f"| {b['index']} | {b['build_s']:.1f} | {b['bytes'] / 2**20:.1f} |")
        for query in sorted({r["query"] for r in avg if not r["query"].startswith("dipr")},
                            key=len):
            L.append(f"\n### {query}: Pareto points (recall vs keys scanned)\n")
            L.append("| index | param | recall | scanned (rows read) | scored | latency us | "
                     "QPS |\n|---|---|---|---|---|---|---|")
            present = {r["index"] for r in avg if r["query"] == query}
            for index in [m for m in INDEXES if m in present]:
                pts = [r for r in avg if r["index"] == index and r["query"] == query]
                # Indexes without a scanned count (hnswlib) get their latency frontier instead.
                has_scan = all(r["scanned"] is not None for r in pts)
                cost = "scanned" if has_scan else "latency_us"
                for _, _, r in pareto([(r[cost], r["recall"], r) for r in pts]):
                    L.append(f"| {index} | {param_text(r)} | "
                             f"{r['recall']:.4f} | {pct(r['scanned'])} | {pct(r.get('scored'))} | "
                             f"{r['latency_us']:.0f} | "
                             f"{1e6 / r['latency_us']:.0f} |")
        dipr = sorted((r for r in avg if r["query"].startswith("dipr")),
                      key=lambda r: (r.get("max_hops", 0), r["param"]))
        if dipr:
            # Every beta is its own query (its own exact set), so no frontier across betas.
            L.append("\n### RoarGraph DIPR: set recall vs the exact DIPR set, per beta\n")
            L.append("| beta (logits) | max hops | exact set size | set recall | scanned | capped | "
                     "latency us |\n|---|---|---|---|---|---|---|")
            for r in dipr:
                L.append(f"| {r['param']:g} | {r.get('max_hops', 0) or '-'} | "
                         f"{r['exact_set_size']:.0f} | {r['recall']:.4f} | {pct(r['scanned'])} | "
                         f"{pct(r.get('capped'))} | {r['latency_us']:.0f} |")
        t = lay["targets"]
        L.append("\n### Targets\n")
        for index, count in FIVE_PERCENT:
            if f"{index} recall@100>=0.95 {count}" in t:
                met = t[f"{index} recall@100>=0.95 at <=5% {count}"]
                L.append(f"- {FIVE_PERCENT_TEXT[index]}: {'met' if met else 'NOT met'} "
                         f"(cheapest: {pct(t[f'{index} recall@100>=0.95 {count}'])})")
        for key, v in t.items():
            if not isinstance(v, dict):
                continue
            if v["roargraph"] is None:
                L.append(f"- {key}: RoarGraph does not reach it in the sweep")
            elif v["ratio"] is None:
                L.append(f"- {key}: {v.get('roargraph_index') or 'roargraph'} "
                         f"{pct(v['roargraph'])}; faiss IVF / HNSW do not reach it in the sweep")
            else:
                verdict = "met" if v["ratio"] >= 10 else "not met"
                L.append(f"- {key}: {v.get('roargraph_index') or 'roargraph'} "
                         f"{pct(v['roargraph'])}, best peer "
                         f"{v['best_peer_index']} {pct(v['best_peer'])}: {v['ratio']:.1f}x fewer "
                         f"keys (>= 10x: {verdict})")
        L.append("\n### Attention quality (exact selections, averaged over heads)\n")
        L.append("| method | param | tokens attended | mass recovery | output rel. L2 error |\n"
                 "|---|---|---|---|---|")
        qa = {}
        for r in lay["quality"]:
            qa.setdefault((r["method"], r["param"]), []).append(r)
        for (method, param), rs in sorted(qa.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            name = {"dipr": "beta", "top-k": "k", "top-k at dipr budget": "beta"}.get(method)
            name = "beta" if method.startswith("dipr cap") else name
            tag = f"{name}={param}" if name else "-"
            if method == "top-k at dipr budget":
                tag += " (k=" + "/".join(str(r["k"]) for r in rs) + " per head)"
            if method.startswith("dipr cap"):
                what = "best c" if method.endswith("best") else "full attention"
                tag += f" (capped, {what}: " + "/".join(
                    f"{100 * r['capped']:.0f}%" for r in rs) + " of queries per head)"
            L.append(f"| {method} | {tag} | {np.mean([r['attended'] for r in rs]):.0f} | "
                     f"{np.mean([r['recovery'] for r in rs]):.4f} | "
                     f"{np.mean([r['rel_l2_error'] for r in rs]):.4f} |")
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


def plots(res, out):
    written = []
    for lay in res["layers"]:
        avg = head_mean(lay["rows"])
        panels = []
        for query in ("top-10", "top-100"):
            rows = [r for r in avg if r["query"] == query]
            idx = sorted({r["index"] for r in rows})
            scan = {i: [(x, y) for x, y in pareto([(r["scanned"], r["recall"]) for r in rows
                                                   if r["index"] == i])] for i in idx}
            qps = {i: [(1e6 / x, y) for x, y in pareto([(r["latency_us"], r["recall"])
                                                         for r in rows if r["index"] == i])]
                   for i in idx}
            panels.append((f"layer {lay['layer']} recall@{query[4:]} vs keys scanned",
                           "fraction of keys scanned", "log", scan))
            panels.append((f"layer {lay['layer']} recall@{query[4:]} vs QPS (1 thread)",
                           "queries per second", "log", qps))
        written.append(plot_frontiers(os.path.join(out, f"pyeval_L{lay['layer']}_frontier.png"),
                                      f"{res['meta']['model']}: Pareto frontiers (hnswlib has no "
                                      "scanned count)", panels))
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(res["layers"]), figsize=(4.5 * len(res["layers"]), 3.8),
                             squeeze=False)
    for ax, lay in zip(axes[0], res["layers"]):
        qa = {}
        for r in lay["quality"]:
            qa.setdefault((r["method"], r["param"]), []).append(r)
        for method, st in (("top-k", "C0o-"), ("dipr", "C3s-"), ("top-k at dipr budget", "C2x"),
                           ("window", "k*")):
            pts = sorted((np.mean([r["attended"] for r in rs]), np.mean([r["rel_l2_error"] for r in rs]))
                         for (m, _), rs in qa.items() if m == method)
            ax.plot(*zip(*pts), st, label=method, ms=4)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"layer {lay['layer']}", fontsize=9)
        ax.set_xlabel("tokens attended (window + middle)")
        ax.set_ylabel("output rel. L2 error")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "pyeval_quality.png"), dpi=90)
    plt.close(fig)
    return written + ["pyeval_quality.png"]


def machine():
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        commit = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"],
                                capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return cpu, commit


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dump", default=os.path.join(ROOT, "bench", "data", "sample"))
    ap.add_argument("--layers", help="layers (default: every layer of the dump)")
    ap.add_argument("--kv-head", type=int, default=0)
    ap.add_argument("--out", help="output directory (default: a new temporary directory)")
    ap.add_argument("--quick", action="store_true", help="small sweeps and builds (CI)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--train-fraction", type=float, default=0.95)
    ap.add_argument("--eval-stride", type=int, default=4, help="evaluate every n-th held-out query")
    ap.add_argument("--train-ratio", type=float, default=0.25,
                    help="share of each head's prefill queries used to build RoarGraph")
    ap.add_argument("--threads", type=int, default=2, help="build threads (search: always 1)")
    ap.add_argument("--k", default="10,100")
    ap.add_argument("--L", help="RoarGraph L / HNSW ef sweep")
    ap.add_argument("--nprobe", help="IVF nprobe sweep")
    ap.add_argument("--beta", help="DIPR beta sweep, logit units")
    ap.add_argument("--attn-k", help="top-k budgets of the attention-quality sweep")
    ap.add_argument("--dipr-hops", default="",
                    help="RoarGraph DIPR rows also with these hop caps (max_hops)")
    ap.add_argument("--dipr-cap", default="512,2048",
                    help="DIPR caps of the attention-quality sweep: a query with this many "
                         "middle tokens within beta attends everything")
    ap.add_argument("--nq", type=int, default=100)
    ap.add_argument("--M", type=int, default=35)
    ap.add_argument("--build-L", type=int, default=500)
    ap.add_argument("--degree-cap", type=int, default=0,
                    help="RoarGraph searches expand at most a node's first N neighbours (0 = all)")
    ap.add_argument("--hnsw-M", type=int, default=32)
    ap.add_argument("--ef-construction", type=int, default=200)
    ap.add_argument("--nlist", type=int, default=0, help="IVF lists (0: 4 sqrt(n))")
    ap.add_argument("--l0", type=int, default=64)
    ap.add_argument("--sink", type=int, default=4)
    ap.add_argument("--recent", type=int, default=512)
    ap.add_argument("--expand-fractions", default="1,0.6,0.5",
                    help="shared walk (roargraph-gqa): expand limits as fractions of L")
    ap.add_argument("--no-gqa", dest="gqa", action="store_false",
                    help="skip the group variants (roargraph-gqa, faiss-ivf-gqa)")
    ap.add_argument("--warm-fractions", default="1,0.7,0.5,0.3",
                    help="warm starts (roargraph-warm, roargraph-gqa-warm): expand limits as "
                         "fractions of L")
    ap.add_argument("--no-warm", dest="warm", action="store_false",
                    help="skip the decode-order warm-started RoarGraph rows")
    ap.add_argument("--no-route", dest="route", action="store_false",
                    help="skip the routed cold starts (roargraph-routed, roargraph-gqa-routed)")
    ap.add_argument("--route-rows", type=int, default=8192,
                    help="training queries kept as routing rows (at most the training queries)")
    ap.add_argument("--route-clusters", type=int, default=128, help="0: flat routing set")
    ap.add_argument("--route-probe", type=int, default=2)
    ap.add_argument("--route-top", type=int, default=4)
    ap.add_argument("--route-fractions", default="1,0.6,0.45,0.3,0.2",
                    help="expand limits of the routed searches, fractions of L")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--from-json", help="re-render pyeval.md and the plots of an earlier run's "
                    "pyeval.json into --out (default: its directory); nothing is measured")
    args = ap.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            res = json.load(f)
        out = args.out or os.path.dirname(os.path.abspath(args.from_json))
        os.makedirs(out, exist_ok=True)
        for lay in res["layers"]:
            lay["targets"] = targets(head_mean(lay["rows"]))  # from the rows, by this code
        write_markdown(os.path.join(out, "pyeval.md"), res)
        if not args.no_plots and have_matplotlib():
            plots(res, out)
        print(f"pyeval.py: wrote {out}/pyeval.md from {args.from_json}", flush=True)
        return res
    sweep = QUICK if args.quick else FULL
    args.k = ints(args.k, "k")
    args.L = ints(args.L or sweep["L"], "L")
    args.nprobe = ints(args.nprobe or sweep["nprobe"], "nprobe")
    args.beta = floats(args.beta or sweep["beta"], "beta")
    args.attn_k = ints(args.attn_k or sweep["attn_k"], "attn-k")
    args.dipr_cap = ints(args.dipr_cap, "dipr-cap")
    args.dipr_hops = ints(args.dipr_hops, "dipr-hops") if args.dipr_hops else []
    args.expand_fractions = floats(args.expand_fractions, "expand-fractions")
    args.warm_fractions = floats(args.warm_fractions, "warm-fractions")
    args.route_fractions = floats(args.route_fractions, "route-fractions")
    if args.route_rows < 1 or args.route_top < 1 or args.route_probe < 0 or args.route_clusters < 0:
        fail(f"--route-rows / --route-top: expected >= 1, --route-probe / --route-clusters >= 0; "
             f"got {args.route_rows} / {args.route_top}, {args.route_probe} / "
             f"{args.route_clusters}")
    for name in ("expand_fractions", "warm_fractions", "route_fractions"):
        if any(not 0 < f <= 1 for f in getattr(args, name)):
            fail(f"--{name.replace('_', '-')}: expected fractions in (0, 1], got "
                 f"{getattr(args, name)}")
    if args.quick:
        args.build_L, args.M, args.ef_construction = min(args.build_L, 200), min(args.M, 24), 100
    args.methods = args.methods.split(",")
    for m in args.methods:
        if m not in CLASSES:
            fail(f"--methods: unknown '{m}' (known: {','.join(METHODS)})")
    try:
        dump = datasets.Dump(args.dump)
        layers = dump.layers if not args.layers else ints(args.layers, "layers", 0)
        for layer in layers:
            if layer not in dump.layers:
                fail(f"--layers: {layer} is not in the dump (has {dump.layers})")
    except ValueError as exc:
        fail(str(exc))
    try:
        import kvsift as ks
    except ImportError as exc:
        fail(f"the kvsift module is not importable ({exc}); build it (cmake -S python -B "
             "build/python && cmake --build build/python) and set PYTHONPATH=build/python")
    want_plots = not args.no_plots and have_matplotlib()
    if not args.out:
        args.out = tempfile.mkdtemp(prefix="kvsift-pyeval-")
    os.makedirs(args.out, exist_ok=True)
    print(f"pyeval.py: writing to {args.out}", flush=True)

    def log(msg):
        print(msg, flush=True)

    methods = make_methods(ks, args)
    cpu, commit = machine()
    t0 = time.time()
    res = {"meta": {"model": dump.model, "dump": args.dump, "kvsift_version": ks.__version__,
                    "commit": commit, "cpu": cpu, "threads": args.threads, "search_threads": 1,
                    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "command": "python3 bench/eval/pyeval.py " + " ".join(sys.argv[1:] if argv is None else argv),
                    "load_average_start": os.getloadavg()[0], "head_dim": dump.head_dim,
                    "scale": dump.scale, "args": {k: v for k, v in vars(args).items()},
                    "methods": [m.name for m in methods]},
           "layers": []}
    for layer in layers:
        ld = dump.layer(layer, args.kv_head)
        try:
            sp = datasets.split(ld.keys.shape[0], args.train_fraction, args.eval_stride)
        except ValueError as exc:
            fail(str(exc))
        res["meta"].update(tokens=sp.n, n_train=sp.n_train, eval_queries=len(sp.eval_positions),
                           eval_stride=args.eval_stride)
        builds, rows, n_train_q = retrieval(ks, ld, sp, args, methods, log)
        lay = {"layer": layer, "kv_head": args.kv_head, "heads": sorted(ld.queries),
               "train_queries": n_train_q, "builds": builds, "rows": rows,
               "quality": quality(ld, sp, args, log)}
        lay["targets"] = targets(head_mean(rows))
        res["layers"].append(lay)
        log(f"  layer {layer}: {time.time() - t0:.0f} s so far")
    res["meta"]["total_s"] = round(time.time() - t0, 1)
    res["meta"]["load_average_end"] = os.getloadavg()[0]
    with open(os.path.join(args.out, "pyeval.json"), "w") as f:
        json.dump(res, f, indent=1)
    write_markdown(os.path.join(args.out, "pyeval.md"), res)
    if want_plots:
        plots(res, args.out)
    print(f"pyeval.py: wrote {args.out}/pyeval.md in {res['meta']['total_s']} s", flush=True)
    return res


if __name__ == "__main__":
    main()
