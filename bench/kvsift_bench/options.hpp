#pragma once
// kvsift-bench's command line: the usage text, the options aggregate and their strict parsing
// (every number whole and in range, every combination checked before any file is read).

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "kvsift/decode/plan_executor.hpp"
#include "kvsift/kvsift.hpp"
#include "kvsift/search/planner.hpp"
#include "kvsift_bench/hdf5_dataset.hpp"

namespace kvsift_bench {

inline const char* const usage =
    R"(usage: kvsift-bench (--demo | --keys F --queries F | --hdf5 F) [--train F | --train-fraction X]
                    [options]

data (.fbin: uint32 n, uint32 d, f32 data; or .npy f4/f2):
  --keys F            keys (n x d)
  --queries F         evaluation queries (m x d)
  --train F           training queries for the RoarGraph build
  --train-fraction X  use the first X of --queries for training, the rest for evaluation
  --demo              synthetic out-of-distribution workload instead of files
  --n N --dim D       demo size (default 32768 x 128); training = 10% of n
  --spread X          demo key norm spread (default 0.2; 0.4 is harder, see ood_generator.hpp)
  --eval N            use at most N evaluation queries (default 200 for --demo, all for files)
  --hdf5 F            an ann-benchmarks file instead of --keys/--queries: train = keys, test =
                      queries, neighbors (and distances) = the ground truth, used as given (no
                      recomputation; top-k only); metric from its `distance` attribute:
                      euclidean (l2) or angular (ip on normalised vectors). Needs a build with
                      the HDF5 C library (libhdf5-dev)
  --gt F         ground truth of the evaluation queries instead of computing it (big-ann layout,
                 as --save-gt writes: uint32 m, uint32 K, m*K uint32 ids[, m*K f32 distances]);
                 m must equal the evaluation queries and K >= max(--k); top-k only
index (the flat scan always runs as the baseline):
  --index LIST   of roargraph, hnsw, ivf, or flat alone (default roargraph); hnsw / ivf are
                 peers (hnswlib, faiss IVF-Flat), present when built with them, metric ip only
  --metric ip|l2 (default ip)
  --nq N (100)  --M N (35)  --L-build N (500)  --threads N (0 = all cores; build and oracle)
  --expand-fraction F  step 3's searches expand the best F of their pool (0.8; 1 = all)
  --ef LIST (10,20,50,100,200,400)  --hnsw-M N (16)  --hnsw-ef-construction N (200)
  --nprobe LIST (1,2,4,8,16,32,64)  --nlist N (0 = 4 sqrt(n))
  --insert-fraction F  also build on the first (1-F) of the keys (and the training queries of
                 those positions), insert the rest one by one, and report insert time per key
                 and the top-k rows of that index as roargraph+insert, next to the full build;
                 with hnsw / ivf in --index, each peer likewise built on the same first keys
                 (IVF's centroids from them) and given the rest by its own insert, one by one
                 on one thread: rows hnsw+insert / ivf+insert
  --insert-query-lists T  inserted keys update only their T nearest training queries' kNN
                 lists (0 = every list they beat: exact; graph_insert_params::query_knn_lists)
  --insert-query-candidates C  inserted keys are scored against at most C training queries,
                 found through the key -> query lists of their nearest keys (default 512;
                 0 = all, the exact lists; graph_insert_params::query_candidates)
  --insert-holders H  record at most H training queries per key in the key -> query lists
                 (default 128; 0 = all; graph_insert_params::holder_capacity)
  --insert-query-stride S  also add the query of every S-th inserted position to the training
                 queries, after its key (insertable_graph::add_queries, its lists found by a
                 search of pool 200), as an engine adds decode queries; 0 = none (default).
                 Needs the positional split (--keys with --queries and --train-fraction)
  --insert-rule queries|graph  queries (default): the full rule; graph: candidates from the
                 graph search alone, no training query scored or list updated (the rule of
                 the GPU insert; graph_insert_params::query_neighbors 0, update_query_knn off)
  --save-index F / --load-index F   store / reuse the built graph
  --save-train-knn F  write the training-query->key exact kNN the build uses (.ibin: uint32 m,
                 uint32 nq, m*nq ids; the RoarGraph reference's --learn_base_nn_path)
  --load-train-knn F  build from this .ibin kNN instead of computing it (rows = training
                 queries, ids < n; the training queries themselves are then not needed)
reference interchange (feed another implementation the same inputs):
  --save-gt F    exact top-max(--k) of the evaluation queries, big-ann ground truth layout:
                 uint32 m, uint32 K, m*K uint32 ids, m*K f32 distances (-score for ip)
  --save-data DIR   write the workload as DIR/keys.fbin, train.fbin, eval.fbin (e.g. --demo)
query (latency is always measured on one thread):
  --query topk|dipr|both   (default: topk for files, both for --demo)
  --k LIST       top-k sizes (default 100)
  --degree-cap N roargraph searches expand at most the first N neighbours of a node (0 = all)
  --expand-limits LIST  roargraph top-k searches expand only the best round(F x L) entries of
                 their pool, for each fraction F in (0, 1] of the list (default 1: every entry;
                 beam_search_params::expand_limit); each F is its own row per k and L
  --entry-window W  roargraph searches are also seeded with the first and last W keys (what an
                 engine's static window holds: sink and recent tokens); 0 = the graph's entries
  --L LIST       pool sizes (default 10,20,40,80,100,200,400, each k taking those >= k); an
                 explicit L below every k is an error, one below some k is skipped for those
                 k and the run says so
  --beta X       DIPR range; default: chosen so the exact answer averages --dipr-target tokens
  --dipr-target N (default 100)                     --l0 LIST  DIPR capacities (default 50,100,200,400)
  --filter-prefix P   only ids < P are valid (partial prefix reuse, 2-hop filtered search)
attention quality (needs --values; queries and keys are the same positions 0..n-1):
  --values F     values of the keys' KV head; every evaluation query at position p attends
                 [0, p]: static window (first 128 + last 512) plus tokens retrieved from the
                 middle; reports tokens attended, recovery, relative L2 error vs full attention
  --attn-k LIST  top-k sizes (default 16,32,64,128,256,512)
  --attn-beta LIST  DIPR ranges in logit units, i.e. after the 1/sqrt(d) scale (4,5,6,7,8,9,10)
  --attn-L N     RoarGraph pool size for attention top-k: max(k, N) (default 200)
  --attn-l0 N    RoarGraph DIPR capacity (default 100)
output:
  --json FILE    also write the results as JSON: per row the parameters as numbers, single-
                 thread latency and batch QPS (all queries at once on --threads threads), the
                 index's build time and size; the kvsift version, git commit, CPU and threads
planner (instead of the above; the dump layout of bench/data/dump_qk.py):
  --plan auto|INDEX-QUERY   compare coarse-topk, flat-dipr, graph-dipr and the planner's choice
                 (auto) or a fixed plan, e.g. graph-dipr, per layer at equal GPU memory
  --plan-dump DIR   L{layer}_{k,v,q}{head}.fbin; held-out queries = last 5% of the tokens
  --plan-budget LIST  GPU budgets in tokens of f16 K+V per KV head (default 512,2048)
)";

[[noreturn]] inline void usage_error(const std::string& msg) {
  std::fprintf(stderr, "kvsift-bench: %s\n(see kvsift-bench --help)\n", msg.c_str());
  std::exit(2);
}

struct options {
  bool demo = false;
  std::string keys, queries, train, json, save_index, load_index;
  std::string save_train_knn, load_train_knn, save_gt, save_data, hdf5, gt;
  double train_fraction = 0, insert_fraction = 0;
  std::size_t insert_query_lists = 0;  // graph_insert_params::query_knn_lists
  // graph_insert_params::query_candidates; unset: the library's default
  std::optional<std::size_t> insert_query_candidates;
  std::optional<std::size_t> insert_holders;  // graph_insert_params::holder_capacity
  std::size_t insert_query_stride = 0;        // add_queries for every S-th inserted position
  std::string insert_rule = "queries";        // or "graph": no training query takes part
  std::size_t degree_cap = 0;    // graph searches expand at most this many neighbours (0 = all)
  std::size_t entry_window = 0;  // extra search entries: the first and last W keys (0 = none)
  // Fractions of L the roargraph top-k searches expand (beam_search_params::expand_limit).
  std::vector<double> expand_limits{1.0};
  std::size_t n = 32768, dim = 128, eval = 0;
  float spread = 0.2f;
  std::string index = "roargraph", metric = "ip", query;
  kvsift::roargraph_params build;
  // The default pools start small (L = k = 10 is the cheapest top-10 point of a recall curve);
  // each k sweeps the pools >= k.
  std::vector<std::size_t> k{100}, L{10, 20, 40, 80, 100, 200, 400}, l0{50, 100, 200, 400};
  bool L_given = false, metric_given = false;
  std::optional<float> beta;
  std::size_t dipr_target = 100;
  std::optional<std::size_t> filter_prefix;
  std::string plan, plan_dump;
  std::vector<std::size_t> plan_budget{512, 2048};
  // peers
  std::vector<std::size_t> ef{10, 20, 50, 100, 200, 400}, nprobe{1, 2, 4, 8, 16, 32, 64};
  std::size_t hnsw_M = 16, hnsw_ef_construction = 200, nlist = 0;
  // attention quality
  std::string values;
  std::vector<std::size_t> attn_k{16, 32, 64, 128, 256, 512};
  std::vector<double> attn_beta{4, 5, 6, 7, 8, 9, 10};
  std::size_t attn_L = 200, attn_l0 = 100;

  [[nodiscard]] bool uses(const std::string& name) const {
    std::stringstream ss(index);
    for (std::string item; std::getline(ss, item, ',');)
      if (item == name) return true;
    return false;
  }
};

// Numbers are parsed strictly with std::from_chars: the whole value must be one number, with no
// leading spaces, sign or trailing junk (strtoull accepted " 12", "12abc" and wrapped "-1" and
// overflowing values silently). Counts are bounded by the largest index (ids are 32-bit): any
// count beyond it is meaningless here and, passed on, sizes buffers (n x M adjacency, a pool of
// L) that overflow, so `--M 4611686018427387904` is refused up front.
inline constexpr std::size_t max_count = kvsift::max_index_size;

inline std::size_t parse_size(const std::string& opt, const std::string& v) {
  unsigned long long x = 0;
  const char* const last = v.data() + v.size();
  const auto [ptr, ec] = std::from_chars(v.data(), last, x, 10);
  if (ec == std::errc::result_out_of_range || (ec == std::errc{} && ptr == last && x > max_count))
    usage_error(opt + ": expected a count in [0, " + std::to_string(max_count) + "], got '" + v +
                "'");
  if (v.empty() || ec != std::errc{} || ptr != last)
    usage_error(opt + ": expected a count (decimal digits only), got '" + v + "'");
  return static_cast<std::size_t>(x);
}

inline double parse_real(const std::string& opt, const std::string& v) {
  double x = 0;
  const char* const last = v.data() + v.size();
  const auto [ptr, ec] = std::from_chars(v.data(), last, x);
  if (v.empty() || ec != std::errc{} || ptr != last || !std::isfinite(x)) {
    usage_error(opt + ": expected a finite number, got '" + v + "'");
  }
  return x;
}

/// A comma-separated list, each item read by `one(opt, item)`.
template <class One>
auto parse_list_of(const std::string& opt, const std::string& v, One one) {
  std::vector<decltype(one(opt, v))> out;
  std::stringstream ss(v);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(one(opt, item));
  if (out.empty()) usage_error(opt + ": expected a comma-separated list, got '" + v + "'");
  return out;
}

inline std::vector<std::size_t> parse_list(const std::string& opt, const std::string& v) {
  return parse_list_of(opt, v, parse_size);
}

inline options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(usage, stdout);
      std::exit(0);
    }
    if (a == "--demo") {
      o.demo = true;
      continue;
    }
    if (i + 1 >= argc) usage_error("unknown option or missing value: '" + a + "'");
    const std::string v = argv[++i];
    if (a == "--keys")
      o.keys = v;
    else if (a == "--queries")
      o.queries = v;
    else if (a == "--train")
      o.train = v;
    else if (a == "--train-fraction")
      o.train_fraction = parse_real(a, v);
    else if (a == "--n")
      o.n = parse_size(a, v);
    else if (a == "--dim")
      o.dim = parse_size(a, v);
    else if (a == "--spread")
      o.spread = static_cast<float>(parse_real(a, v));
    else if (a == "--eval")
      o.eval = parse_size(a, v);
    else if (a == "--index")
      o.index = v;
    else if (a == "--metric")
      o.metric = v, o.metric_given = true;
    else if (a == "--nq")
      o.build.nq = parse_size(a, v);
    else if (a == "--M")
      o.build.M = parse_size(a, v);
    else if (a == "--L-build")
      o.build.L = parse_size(a, v);
    else if (a == "--expand-fraction")
      o.build.connectivity_expand_fraction = parse_real(a, v);
    else if (a == "--insert-fraction")
      o.insert_fraction = parse_real(a, v);
    else if (a == "--insert-query-lists")
      o.insert_query_lists = parse_size(a, v);
    else if (a == "--insert-query-candidates")
      o.insert_query_candidates = parse_size(a, v);
    else if (a == "--insert-holders")
      o.insert_holders = parse_size(a, v);
    else if (a == "--insert-rule")
      o.insert_rule = v;
    else if (a == "--insert-query-stride")
      o.insert_query_stride = parse_size(a, v);
    else if (a == "--threads")
      o.build.threads = parse_size(a, v);
    else if (a == "--query")
      o.query = v;
    else if (a == "--k")
      o.k = parse_list(a, v);
    else if (a == "--L")
      o.L = parse_list(a, v), o.L_given = true;
    else if (a == "--l0")
      o.l0 = parse_list(a, v);
    else if (a == "--beta")
      o.beta = static_cast<float>(parse_real(a, v));
    else if (a == "--dipr-target")
      o.dipr_target = parse_size(a, v);
    else if (a == "--filter-prefix")
      o.filter_prefix = parse_size(a, v);
    else if (a == "--ef")
      o.ef = parse_list(a, v);
    else if (a == "--degree-cap")
      o.degree_cap = parse_size(a, v);
    else if (a == "--expand-limits")
      o.expand_limits = parse_list_of(a, v, [](const std::string& opt, const std::string& item) {
        const double f = parse_real(opt, item);
        if (!(f > 0 && f <= 1)) {
          usage_error(opt + ": expected fractions in (0, 1], got '" + item + "'");
        }
        return f;
      });
    else if (a == "--entry-window")
      o.entry_window = parse_size(a, v);
    else if (a == "--nprobe")
      o.nprobe = parse_list(a, v);
    else if (a == "--hnsw-M")
      o.hnsw_M = parse_size(a, v);
    else if (a == "--hnsw-ef-construction")
      o.hnsw_ef_construction = parse_size(a, v);
    else if (a == "--nlist")
      o.nlist = parse_size(a, v);
    else if (a == "--values")
      o.values = v;
    else if (a == "--attn-k")
      o.attn_k = parse_list(a, v);
    else if (a == "--attn-beta")
      o.attn_beta = parse_list_of(a, v, parse_real);
    else if (a == "--attn-L")
      o.attn_L = parse_size(a, v);
    else if (a == "--attn-l0")
      o.attn_l0 = parse_size(a, v);
    else if (a == "--json")
      o.json = v;
    else if (a == "--save-index")
      o.save_index = v;
    else if (a == "--load-index")
      o.load_index = v;
    else if (a == "--save-train-knn")
      o.save_train_knn = v;
    else if (a == "--load-train-knn")
      o.load_train_knn = v;
    else if (a == "--save-gt")
      o.save_gt = v;
    else if (a == "--gt")
      o.gt = v;
    else if (a == "--hdf5")
      o.hdf5 = v;
    else if (a == "--save-data")
      o.save_data = v;
    else if (a == "--plan")
      o.plan = v;
    else if (a == "--plan-dump")
      o.plan_dump = v;
    else if (a == "--plan-budget")
      o.plan_budget = parse_list(a, v);
    else
      usage_error("unknown option '" + a + "'");
  }
  {
    std::stringstream ss(o.index);
    std::size_t count = 0;
    for (std::string item; std::getline(ss, item, ','); ++count) {
      if (item != "flat" && item != "roargraph" && item != "hnsw" && item != "ivf") {
        usage_error("--index: expected a list of flat, roargraph, hnsw, ivf, got '" + item + "'");
      }
    }
    if (count == 0) usage_error("--index: expected a list, got ''");
  }
  if (o.metric != "ip" && o.metric != "l2")
    usage_error("--metric: expected ip or l2, got '" + o.metric + "'");
  const bool peers = o.uses("hnsw") || o.uses("ivf");
#ifndef KVSIFT_BENCH_HNSWLIB
  if (o.uses("hnsw")) usage_error("--index hnsw: this kvsift-bench was built without hnswlib");
#endif
#ifndef KVSIFT_BENCH_FAISS
  if (o.uses("ivf")) usage_error("--index ivf: this kvsift-bench was built without faiss");
#endif
  if (peers && o.metric != "ip") usage_error("--index hnsw/ivf: only --metric ip is supported");
  if (peers && o.filter_prefix) usage_error("--index hnsw/ivf: --filter-prefix is not supported");
  if (!o.values.empty() && (o.demo || o.metric != "ip" || o.filter_prefix)) {
    usage_error("--values: needs --keys/--queries files, --metric ip and no --filter-prefix");
  }
  if (o.demo && (o.n < 2 || o.dim == 0)) {
    usage_error("--demo: expected --n >= 2 and --dim >= 1, got " + std::to_string(o.n) + " and " +
                std::to_string(o.dim));
  }
  if (o.hnsw_M < 2) usage_error("--hnsw-M: expected >= 2, got " + std::to_string(o.hnsw_M));
  for (double b : o.attn_beta)
    if (b < 0) usage_error("--attn-beta: expected values >= 0, got " + std::to_string(b));
  if (o.attn_l0 == 0) usage_error("--attn-l0: expected > 0, got 0");
  // A given ground truth lists only the best K ids: top-k recall, nothing else.
  const bool given_gt = !o.gt.empty() || !o.hdf5.empty();
  if (o.query.empty()) o.query = o.demo && !given_gt ? "both" : "topk";
  if (o.query != "topk" && o.query != "dipr" && o.query != "both") {
    usage_error("--query: expected topk, dipr or both, got '" + o.query + "'");
  }
  if (!o.plan.empty()) {
    try {
      // A registered (index, query) pair the executor has no retrieval for (e.g. flat-full)
      // is refused here, not after the indexes are built.
      const auto kinds = kvsift::planner().parse_name(o.plan);
      const auto& exec = kvsift::default_plan_executor<kvsift::default_plan_resources>();
      if (kinds && !exec.can_run(kinds->first, kinds->second)) {
        usage_error("--plan: no executor for plan '" + o.plan + "'; runnable: " + exec.runnable());
      }
    } catch (const kvsift::invalid_argument& e) {
      usage_error(std::string("--plan: ") + e.what());
    }
    if (o.plan_dump.empty()) usage_error("--plan needs --plan-dump DIR");
    // --plan prints its table only; a --json file was silently never written.
    if (!o.json.empty()) usage_error("--json: --plan runs write no JSON (drop --json)");
    return o;
  }
  if (!o.hdf5.empty()) {
    if (!has_hdf5) {
      usage_error(
          "--hdf5: this kvsift-bench was built without HDF5 (install libhdf5-dev and "
          "re-run CMake)");
    }
    if (o.demo || !o.keys.empty() || !o.queries.empty() || !o.values.empty() || !o.gt.empty()) {
      usage_error(
          "--hdf5: the file holds the keys, queries and ground truth: drop --demo, "
          "--keys, --queries, --values and --gt");
    }
    if (o.metric_given) {
      usage_error("--metric: --hdf5 takes the metric from the file's distance attribute");
    }
  } else if (!o.demo && (o.keys.empty() || o.queries.empty())) {
    usage_error("expected --demo, --keys and --queries, or --hdf5");
  }
  if (given_gt) {
    const std::string opt = o.hdf5.empty() ? "--gt" : "--hdf5";
    if (o.query != "topk") {
      usage_error(opt +
                  ": the file's ground truth lists the best K ids only: DIPR needs every "
                  "key's score (use --query topk), got --query " +
                  o.query);
    }
    if (o.filter_prefix)
      usage_error(opt + ": the file's ground truth is unfiltered: drop --filter-prefix");
  }
  if (o.L_given) {
    // A pool smaller than k cannot hold k results: such an L gives no row for that k. One that
    // serves no k at all is a mistake; one that serves some k is skipped, visibly (run.hpp).
    const std::size_t k_min = *std::min_element(o.k.begin(), o.k.end());
    for (const std::size_t L : o.L) {
      if (L < k_min) {
        usage_error("--L: expected every L >= the smallest --k, got L=" + std::to_string(L) +
                    " < k=" + std::to_string(k_min) + " (a pool of L holds at most L results)");
      }
    }
  }
  if (o.insert_fraction != 0 &&
      (!(o.insert_fraction > 0 && o.insert_fraction < 1) || !o.uses("roargraph") ||
       !o.load_index.empty() || !o.load_train_knn.empty())) {
    usage_error(
        "--insert-fraction: expected a value in (0, 1) with --index roargraph and no "
        "--load-index / --load-train-knn, got " +
        std::to_string(o.insert_fraction));
  }
  if (o.insert_query_lists != 0 && o.insert_fraction == 0) {
    usage_error("--insert-query-lists: expected it with --insert-fraction, got " +
                std::to_string(o.insert_query_lists) + " without");
  }
  if (o.insert_query_candidates && o.insert_fraction == 0) {
    usage_error("--insert-query-candidates: expected it with --insert-fraction, got " +
                std::to_string(*o.insert_query_candidates) + " without");
  }
  if (o.insert_holders && o.insert_fraction == 0) {
    usage_error("--insert-holders: expected it with --insert-fraction, got " +
                std::to_string(*o.insert_holders) + " without");
  }
  if (o.insert_query_stride != 0 && (o.insert_fraction == 0 || o.demo || !o.train.empty() ||
                                     !o.hdf5.empty() || o.train_fraction == 0)) {
    usage_error(
        "--insert-query-stride: expected it with --insert-fraction over --keys/--queries "
        "split by --train-fraction (the queries must be per position), got " +
        std::to_string(o.insert_query_stride));
  }
  if (o.insert_rule != "queries" && o.insert_rule != "graph") {
    usage_error("--insert-rule: expected queries or graph, got " + o.insert_rule);
  }
  if (o.insert_rule != "queries" && o.insert_fraction == 0) {
    usage_error("--insert-rule: expected it with --insert-fraction, got " + o.insert_rule +
                " without");
  }
  if (o.train_fraction < 0 || o.train_fraction >= 1) {
    usage_error("--train-fraction: expected a value in [0, 1), got " +
                std::to_string(o.train_fraction));
  }
  return o;
}

}  // namespace kvsift_bench
