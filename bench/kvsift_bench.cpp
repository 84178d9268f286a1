// kvsift-bench: measure an index/query combination on a Q/K dump (or a synthetic
// out-of-distribution workload) against the exact answer, with the flat scan measured in the
// same run as the baseline. See `kvsift-bench --help`.
#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <fcntl.h>     // open
#include <sys/stat.h>  // stat
#include <unistd.h>    // isatty, write, fsync, close, unlink

#include "insert_run.hpp"
#include "kvsift/attention/quality.hpp"
#include "kvsift/index/block_index.hpp"
#include "kvsift/kvsift.hpp"
#include "kvsift/search/planner.hpp"
#include "kvsift/testing/ood_generator.hpp"
#ifdef KVSIFT_BENCH_HNSWLIB
#include "peers/hnswlib_peer.hpp"
#endif
#ifdef KVSIFT_BENCH_FAISS
#include "peers/faiss_peer.hpp"
#endif

namespace {

using clock_type = std::chrono::steady_clock;

const char* const usage =
    R"(usage: kvsift-bench (--demo | --keys F --queries F [--train F | --train-fraction X]) [options]

data (.fbin: uint32 n, uint32 d, f32 data; or .npy f4/f2):
  --keys F            keys (n x d)
  --queries F         evaluation queries (m x d)
  --train F           training queries for the RoarGraph build
  --train-fraction X  use the first X of --queries for training, the rest for evaluation
  --demo              synthetic out-of-distribution workload instead of files
  --n N --dim D       demo size (default 32768 x 128); training = 10% of n
  --spread X          demo key norm spread (default 0.2; 0.4 is harder, see ood_generator.hpp)
  --eval N            use at most N evaluation queries (default 200 for --demo, all for files)
index (the flat scan always runs as the baseline):
  --index LIST   of roargraph, hnsw, ivf, or flat alone (default roargraph); hnsw / ivf are
                 peers (hnswlib, faiss IVF-Flat), present when built with them, metric ip only
  --metric ip|l2 (default ip)
  --nq N (100)  --M N (35)  --L-build N (500)  --threads N (0 = all cores; build and oracle)
  --ef LIST (10,20,50,100,200,400)  --hnsw-M N (16)  --hnsw-ef-construction N (200)
  --nprobe LIST (1,2,4,8,16,32,64)  --nlist N (0 = 4 sqrt(n))
  --insert-fraction F  also build on the first (1-F) of the keys (and the training queries of
                 those positions), insert the rest one by one, and report insert time per key
                 and the top-k rows of that index as roargraph+insert, next to the full build
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
  --k LIST       top-k sizes (default 100)          --L LIST   pool sizes (default 100,200,300,500)
  --degree-cap N roargraph searches expand at most the first N neighbours of a node (0 = all)
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
  --json FILE    also write the results as JSON
planner (instead of the above; the dump layout of bench/data/dump_qk.py):
  --plan auto|INDEX-QUERY   compare coarse-topk, flat-dipr, graph-dipr and the planner's choice
                 (auto) or a fixed plan, e.g. graph-dipr, per layer at equal GPU memory
  --plan-dump DIR   L{layer}_{k,v,q}{head}.fbin; held-out queries = last 5% of the tokens
  --plan-budget LIST  GPU budgets in tokens of f16 K+V per KV head (default 512,2048)
)";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "kvsift-bench: %s\n(see kvsift-bench --help)\n", msg.c_str());
  std::exit(2);
}

struct options {
  bool demo = false;
  std::string keys, queries, train, json, save_index, load_index;
  std::string save_train_knn, load_train_knn, save_gt, save_data;
  double train_fraction = 0, insert_fraction = 0;
  std::size_t degree_cap = 0;  // graph searches expand at most this many neighbours (0 = all)
  std::size_t n = 32768, dim = 128, eval = 0;
  float spread = 0.2f;
  std::string index = "roargraph", metric = "ip", query;
  kvsift::roargraph_params build;
  std::vector<std::size_t> k{100}, L{100, 200, 300, 500}, l0{50, 100, 200, 400};
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

/// A progress bar on stderr for long builds, only when stderr is a terminal (logs and the CTest
/// regexes, which read stdout, stay clean).
kvsift::build_progress_callback progress_bar() {
  if (!isatty(fileno(stderr))) return {};
  return [](const kvsift::build_progress& p) {
    constexpr std::size_t width = 30;
    const std::size_t filled = p.total ? width * p.done / p.total : width;
    std::fprintf(stderr, "\r[%s%s] %zu/%zu %-12.*s %6.1f s", std::string(filled, '#').c_str(),
                 std::string(width - filled, ' ').c_str(), p.done, p.total,
                 static_cast<int>(p.phase.size()), p.phase.data(), p.elapsed_seconds);
    if (p.done == p.total) std::fputc('\n', stderr);
    std::fflush(stderr);
  };
}

// Numbers are parsed strictly with std::from_chars: the whole value must be one number, with no
// leading spaces, sign or trailing junk (strtoull accepted " 12", "12abc" and wrapped "-1" and
// overflowing values silently). Counts are bounded by the largest index (ids are 32-bit): any
// count beyond it is meaningless here and, passed on, sizes buffers (n x M adjacency, a pool of
// L) that overflow, so `--M 4611686018427387904` is refused up front.
constexpr std::size_t max_count = kvsift::max_index_size;

std::size_t parse_size(const std::string& opt, const std::string& v) {
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

double parse_real(const std::string& opt, const std::string& v) {
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

std::vector<std::size_t> parse_list(const std::string& opt, const std::string& v) {
  return parse_list_of(opt, v, parse_size);
}

options parse(int argc, char** argv) {
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
      o.metric = v;
    else if (a == "--nq")
      o.build.nq = parse_size(a, v);
    else if (a == "--M")
      o.build.M = parse_size(a, v);
    else if (a == "--L-build")
      o.build.L = parse_size(a, v);
    else if (a == "--insert-fraction")
      o.insert_fraction = parse_real(a, v);
    else if (a == "--threads")
      o.build.threads = parse_size(a, v);
    else if (a == "--query")
      o.query = v;
    else if (a == "--k")
      o.k = parse_list(a, v);
    else if (a == "--L")
      o.L = parse_list(a, v);
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
  if (o.query.empty()) o.query = o.demo ? "both" : "topk";
  if (o.query != "topk" && o.query != "dipr" && o.query != "both") {
    usage_error("--query: expected topk, dipr or both, got '" + o.query + "'");
  }
  if (!o.plan.empty()) {
    try {
      (void)kvsift::planner().parse_name(o.plan);
    } catch (const kvsift::invalid_argument& e) {
      usage_error(std::string("--plan: ") + e.what());
    }
    if (o.plan_dump.empty()) usage_error("--plan needs --plan-dump DIR");
    // --plan prints its table only; a --json file was silently never written.
    if (!o.json.empty()) usage_error("--json: --plan runs write no JSON (drop --json)");
    return o;
  }
  if (!o.demo && (o.keys.empty() || o.queries.empty())) {
    usage_error("expected --demo, or --keys and --queries");
  }
  if (o.insert_fraction != 0 &&
      (!(o.insert_fraction > 0 && o.insert_fraction < 1) || !o.uses("roargraph") ||
       !o.load_index.empty() || !o.load_train_knn.empty())) {
    usage_error(
        "--insert-fraction: expected a value in (0, 1) with --index roargraph and no "
        "--load-index / --load-train-knn, got " +
        std::to_string(o.insert_fraction));
  }
  if (o.train_fraction < 0 || o.train_fraction >= 1) {
    usage_error("--train-fraction: expected a value in [0, 1), got " +
                std::to_string(o.train_fraction));
  }
  return o;
}

/// Keys, training queries and evaluation queries, all owned here.
struct workload {
  kvsift::dense_matrix<float> keys, train, eval, values;
  std::size_t eval_first = 0;  ///< position (row of --queries) of the first evaluation query
  std::string source;
};

kvsift::dense_matrix<float> copy_rows(kvsift::matrix_view<const float> m, std::size_t first,
                                      std::size_t count) {
  return kvsift::convert<float>(m.row_range(first, count));
}

workload load(const options& o) {
  workload w;
  if (o.demo) {
    kvsift::testing::ood_params p;
    p.keys = o.n;
    p.dim = o.dim;
    p.norm_spread = o.spread;
    const std::size_t train = std::max<std::size_t>(1, o.n / 10), eval = o.eval ? o.eval : 200;
    p.queries = train + eval;
    const auto d = kvsift::testing::make_ood(p);
    w.keys = copy_rows(d.key_view(), 0, o.n);
    w.train = copy_rows(d.query_view(), 0, train);
    w.eval = copy_rows(d.query_view(), train, eval);
    std::ostringstream src;
    src << "synthetic OOD (key norm spread " << o.spread << ")";
    w.source = src.str();
    return w;
  }
  w.keys = kvsift::read_vectors(o.keys);
  auto q = kvsift::read_vectors(o.queries);
  kvsift::require_dim(w.keys.cols(), q.cols(), "kvsift-bench: --queries dimension vs --keys");
  std::size_t first_eval = 0;
  if (!o.train.empty()) {
    w.train = kvsift::read_vectors(o.train);
    kvsift::require_dim(w.keys.cols(), w.train.cols(), "kvsift-bench: --train dimension vs --keys");
  } else if (o.train_fraction > 0) {
    first_eval = static_cast<std::size_t>(o.train_fraction * static_cast<double>(q.rows()));
    w.train = copy_rows(q.cview(), 0, first_eval);
  }
  const std::size_t eval = std::min(q.rows() - first_eval, o.eval ? o.eval : q.rows());
  // Every table row is a mean over evaluation queries; with none there is nothing to measure
  // (the timing read element 0 of an empty vector before this check).
  if (eval == 0) {
    kvsift::detail::fail("kvsift-bench: no evaluation queries: --queries '", o.queries, "' has ",
                         q.rows(), " rows", first_eval ? " and all of them train the index" : "",
                         "; expected at least 1");
  }
  w.eval = copy_rows(q.cview(), first_eval, eval);
  w.eval_first = first_eval;
  if (!o.values.empty()) {
    w.values = kvsift::read_vectors(o.values);
    kvsift::detail::require<kvsift::dimension_mismatch>(
        w.values.rows() == w.keys.rows() && w.values.cols() == w.keys.cols(),
        "kvsift-bench: expected --values of ", w.keys.rows(), " x ", w.keys.cols(),
        " (as --keys), got ", w.values.rows(), " x ", w.values.cols());
    // Causal attention needs each query's position: row p of --queries is token p.
    kvsift::detail::require<kvsift::dimension_mismatch>(
        q.rows() == w.keys.rows(), "kvsift-bench: --values expects one query per key position (",
        w.keys.rows(), " rows), got ", q.rows(), " queries");
  }
  w.source = o.keys + " / " + o.queries;
  return w;
}

/// One result row of the table.
struct row {
  std::string index, query, param;
  double recall = 0, scanned = 0, mean_us = 0, p50_us = 0, p99_us = 0, size = 0, exact_size = 0;
};

struct timing {
  std::vector<double> us;
  void add(clock_type::time_point t0) {
    us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
  }
  void into(row& r) {
    // load() refuses an empty evaluation set; this keeps an empty timing defined anyway.
    if (us.empty()) return;
    r.mean_us = std::accumulate(us.begin(), us.end(), 0.0) / static_cast<double>(us.size());
    std::sort(us.begin(), us.end());
    // The median resists the scheduling spikes of a shared machine; the mean and p99 do not.
    r.p50_us = us[us.size() / 2];
    r.p99_us = us[std::min(us.size() - 1,
                           static_cast<std::size_t>(0.99 * static_cast<double>(us.size())))];
  }
};

/// Exact answers per evaluation query: every passing key's score, best first (ties: lower id).
template <class M, class P>
std::vector<std::vector<kvsift::scored_id>> exact_rankings(const kvsift::dense_matrix<float>& keys,
                                                           const kvsift::dense_matrix<float>& eval,
                                                           const P& pred, std::size_t threads) {
  std::vector<std::vector<kvsift::scored_id>> out(eval.rows());
  kvsift::parallel_for(eval.rows(), threads, [&](std::size_t i, std::size_t) {
    auto& r = out[i];
    for (std::size_t j = 0; j < keys.rows(); ++j) {
      const auto id = static_cast<kvsift::id_t>(j);
      if (!pred(id)) continue;
      r.push_back({kvsift::to_key<M>(M::score(eval.row(i), keys.row(j), keys.cols())), id});
    }
    std::sort(r.begin(), r.end(), kvsift::ranks_before);
  });
  return out;
}

std::size_t range_size(const std::vector<kvsift::scored_id>& r, float beta) {
  if (r.empty()) return 0;
  const float t = r.front().key - beta;
  return static_cast<std::size_t>(
      std::partition_point(r.begin(), r.end(),
                           [&](const kvsift::scored_id& s) { return s.key >= t; }) -
      r.begin());
}

/// Beta whose exact DIPR answer averages `target` keys over the evaluation queries.
float choose_beta(const std::vector<std::vector<kvsift::scored_id>>& ex, std::size_t target) {
  auto mean = [&](float b) {
    double s = 0;
    for (const auto& r : ex) s += static_cast<double>(range_size(r, b));
    return s / static_cast<double>(ex.size());
  };
  float lo = 0, hi = 1;
  while (mean(hi) < static_cast<double>(target) && hi < 1e6f) hi *= 2;
  for (int it = 0; it < 40; ++it) {
    const float mid = 0.5f * (lo + hi);
    (mean(mid) < static_cast<double>(target) ? lo : hi) = mid;
  }
  return hi;
}

double overlap(const std::vector<kvsift::id_t>& found, const std::vector<kvsift::scored_id>& truth,
               std::size_t count) {
  if (count == 0) return 1.0;
  std::vector<kvsift::id_t> t;
  for (std::size_t i = 0; i < count; ++i) t.push_back(truth[i].id);
  std::sort(t.begin(), t.end());
  std::size_t hits = 0;
  for (auto id : found)
    hits += (id != kvsift::invalid_id && std::binary_search(t.begin(), t.end(), id)) ? 1 : 0;
  return static_cast<double>(hits) / static_cast<double>(count);
}

/// --save-gt: the first K exact answers per query in the big-ann ground-truth layout the
/// RoarGraph reference reads (ids, then distances = -key: -inner product, or the l2 distance).
/// K = min(max(--k), shortest exact list) so every row is complete.
void write_gt(const std::string& path, const std::vector<std::vector<kvsift::scored_id>>& exact,
              std::size_t want) {
  std::size_t K = want;
  for (const auto& r : exact) K = std::min(K, r.size());
  std::ofstream f(path, std::ios::binary);
  if (!f) throw kvsift::io_error("cannot write --save-gt file '" + path + "'");
  const std::uint32_t hdr[2] = {static_cast<std::uint32_t>(exact.size()),
                                static_cast<std::uint32_t>(K)};
  f.write(reinterpret_cast<const char*>(hdr), sizeof hdr);
  for (const auto& r : exact)
    for (std::size_t j = 0; j < K; ++j) f.write(reinterpret_cast<const char*>(&r[j].id), 4);
  for (const auto& r : exact)
    for (std::size_t j = 0; j < K; ++j) {
      const float dist = -r[j].key;
      f.write(reinterpret_cast<const char*>(&dist), 4);
    }
  if (!f) throw kvsift::io_error("cannot write --save-gt file '" + path + "'");
}

/// One top-k row: `search(query, ids, scores)` returns search_stats; timed per query.
template <class Search>
row measure_topk(row r, std::size_t k, const kvsift::dense_matrix<float>& eval,
                 const std::vector<std::vector<kvsift::scored_id>>& exact, double n,
                 Search&& search) {
  timing t;
  std::vector<kvsift::id_t> ids(k);
  std::vector<float> scores(k);
  for (std::size_t i = 0; i < eval.rows(); ++i) {
    const auto t0 = clock_type::now();
    const auto s = search(eval.cview().row_span(i), std::span(ids), std::span(scores));
    t.add(t0);
    r.recall += overlap(ids, exact[i], std::min(k, exact[i].size()));
    r.scanned += static_cast<double>(s.distance_computations) / n;
  }
  t.into(r);
  return r;
}

/// One DIPR row: `search(query, result)` fills a dipr_result; timed per query.
template <class Search>
row measure_dipr(row r, float beta, const kvsift::dense_matrix<float>& eval,
                 const std::vector<std::vector<kvsift::scored_id>>& exact, double n,
                 Search&& search) {
  timing t;
  kvsift::dipr_result res;
  for (std::size_t i = 0; i < eval.rows(); ++i) {
    const auto t0 = clock_type::now();
    search(eval.cview().row_span(i), res);
    t.add(t0);
    const std::size_t want = range_size(exact[i], beta);
    r.recall += overlap(res.ids, exact[i], want);
    r.scanned += static_cast<double>(res.stats.distance_computations) / n;
    r.size += static_cast<double>(res.ids.size());
    r.exact_size += static_cast<double>(want);
  }
  t.into(r);
  return r;
}

/// One attention-quality row: a retrieval method at one setting, averaged over the queries.
struct quality_row {
  std::string method, param;
  double retrieved = 0, attended = 0, recovery = 0, error = 0, scanned = 0;
};

/// Retrieval from the middle of a causal context: fills `ids` (valid ids only) and returns the
/// vectors scored. `seed` is the best raw score of the static window.
using retrieve_fn =
    std::function<std::size_t(std::span<const float> q, kvsift::id_range middle, float seed,
                              kvsift::search_workspace& ws, std::vector<kvsift::id_t>& ids)>;

/// Attention quality of window + retrieval against full causal attention, per method, over the
/// evaluation queries (query i sits at position eval_first + i and attends [0, position]).
/// Multithreaded over queries (o.build.threads); graph and flat searches are const.
template <class Flat, class Graph>
std::vector<quality_row> run_quality(const options& o, const workload& w, const Flat& flat,
                                     const Graph* g) {
  const kvsift::static_window window{};
  const std::size_t d = w.keys.cols();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const kvsift::kv_view<float> kv(w.keys.cview(), w.values.cview());
  const kvsift::attention_params params{.scale = scale};

  std::vector<std::pair<quality_row, retrieve_fn>> methods;
  auto topk_into = [](std::vector<kvsift::id_t>& ids, std::size_t k, auto&& search) {
    ids.assign(k, kvsift::invalid_id);
    std::vector<float> scores(k);
    const auto st = search(std::span(ids), std::span(scores));
    std::erase(ids, kvsift::invalid_id);
    return st.distance_computations;
  };
  methods.push_back({{"window", "-"}, [](auto, auto, float, auto&, auto& ids) {
                       ids.clear();
                       return std::size_t{0};
                     }});
  for (std::size_t k : o.attn_k) {
    methods.push_back({{"exact top-k", "k=" + std::to_string(k)},
                       [&, k](auto q, auto mid, float, auto& ws, auto& ids) {
                         return topk_into(ids, k, [&](auto out, auto sc) {
                           return flat.topk(q, k, ws, out, sc, mid);
                         });
                       }});
    if (g) {
      const std::size_t L = std::max(k, o.attn_L);
      methods.push_back({{"roargraph top-k", "k=" + std::to_string(k) + ",L=" + std::to_string(L)},
                         [&, k, L](auto q, auto mid, float, auto& ws, auto& ids) {
                           return topk_into(ids, k, [&](auto out, auto sc) {
                             return kvsift::beam_search(*g, q, {k, L}, ws, out, sc, mid);
                           });
                         }});
    }
  }
  for (double b : o.attn_beta) {
    // beta is given in logit units (the softmax weight ratio to the best is >= e^-beta);
    // the searches compare raw scores, hence / scale.
    const float raw = static_cast<float>(b) / scale;
    std::ostringstream name;
    name << "beta=" << b;
    methods.push_back(
        {{"exact dipr", name.str()}, [&, raw](auto q, auto mid, float seed, auto& ws, auto& ids) {
           kvsift::dipr_result res;
           flat.dipr(q, {.beta = raw, .seed_score = seed}, ws, res, mid);
           ids = res.ids;
           return res.stats.distance_computations;
         }});
    if (g) {
      methods.push_back({{"roargraph dipr", name.str() + ",l0=" + std::to_string(o.attn_l0)},
                         [&, raw](auto q, auto mid, float seed, auto& ws, auto& ids) {
                           kvsift::dipr_result res;
                           kvsift::dipr_search(*g, q,
                                               {.beta = raw, .l0 = o.attn_l0, .seed_score = seed},
                                               ws, res, mid);
                           ids = res.ids;
                           return res.stats.distance_computations;
                         }});
    }
  }

  const std::size_t m = w.eval.rows(), nm = methods.size();
  std::vector<quality_row> per(m * nm);  // [query][method]
  std::vector<kvsift::search_workspace> wss(o.build.threads ? o.build.threads
                                                            : kvsift::default_thread_count());
  kvsift::parallel_for(m, wss.size(), [&](std::size_t i, std::size_t t) {
    const auto q = w.eval.cview().row_span(i);
    const std::size_t context = w.eval_first + i + 1;
    const auto full = kvsift::dense_attention(q, 0, 0, context, kv, params);
    const auto win = kvsift::attended_tokens(context, {}, window);
    float seed = -std::numeric_limits<float>::infinity();
    for (auto id : win)
      seed = std::max(seed, kvsift::inner_product::score(q.data(), w.keys.row(id), d));
    const std::size_t mid_first = window.initial;
    const std::size_t mid_last = context > window.recent ? context - window.recent : 0;
    std::vector<kvsift::id_t> ids;
    for (std::size_t j = 0; j < nm; ++j) {
      auto& r = per[i * nm + j];
      ids.clear();
      std::size_t scanned = 0;
      if (mid_last > mid_first) {
        scanned = methods[j].second(q, kvsift::id_range{mid_first, mid_last}, seed, wss[t], ids);
      }
      const auto attended = kvsift::attended_tokens(context, ids, window);
      const auto approx = kvsift::sparse_attention(q, 0, attended, kv, params);
      const auto qual = kvsift::compare_states(full, approx);
      r.retrieved = static_cast<double>(ids.size());
      r.attended = static_cast<double>(attended.size());
      r.recovery = qual.recovery;
      r.error = qual.rel_l2_error;
      r.scanned = static_cast<double>(scanned) / static_cast<double>(context);
    }
  });
  std::vector<quality_row> out;
  for (std::size_t j = 0; j < nm; ++j) {
    quality_row r = methods[j].first;
    for (std::size_t i = 0; i < m; ++i) {
      const auto& x = per[i * nm + j];
      r.retrieved += x.retrieved / static_cast<double>(m);
      r.attended += x.attended / static_cast<double>(m);
      r.recovery += x.recovery / static_cast<double>(m);
      r.error += x.error / static_cast<double>(m);
      r.scanned += x.scanned / static_cast<double>(m);
    }
    out.push_back(r);
  }
  return out;
}

/// hnswlib / faiss top-k rows, swept over ef / nprobe (only for --metric ip, no filter).
void run_peers(const options& o, const workload& w,
               const std::vector<std::vector<kvsift::scored_id>>& exact, double n,
               std::vector<row>& rows, std::ostream& info) {
  const auto& E = w.eval;
#ifdef KVSIFT_BENCH_HNSWLIB
  if (o.uses("hnsw")) {
    std::fprintf(stderr, "building hnswlib HNSW over %zu keys...\n", w.keys.rows());
    const auto t0 = clock_type::now();
    kvsift_bench::hnsw_peer h(w.keys.cview(), o.hnsw_M, o.hnsw_ef_construction, o.build.threads);
    info << "hnswlib: build " << std::chrono::duration<double>(clock_type::now() - t0).count()
         << " s, M " << o.hnsw_M << ", ef_construction " << o.hnsw_ef_construction
         << ", inner-product space\n";
    for (std::size_t k : o.k) {
      for (std::size_t ef : o.ef) {
        if (ef < k) continue;
        rows.push_back(measure_topk(
            {"hnsw", "top-" + std::to_string(k), "ef=" + std::to_string(ef)}, k, E, exact, n,
            [&](auto q, auto ids, auto scores) { return h.search(q, ef, ids, scores); }));
      }
    }
  }
#endif
#ifdef KVSIFT_BENCH_FAISS
  if (o.uses("ivf")) {
    const std::size_t nlist =
        o.nlist ? o.nlist : kvsift_bench::ivf_flat_peer::default_nlist(w.keys.rows());
    std::fprintf(stderr, "training faiss IVF-Flat (%zu lists) over %zu keys...\n", nlist,
                 w.keys.rows());
    const auto t0 = clock_type::now();
    kvsift_bench::ivf_flat_peer f(w.keys, nlist, o.build.threads);
    info << "faiss IVF-Flat: build "
         << std::chrono::duration<double>(clock_type::now() - t0).count() << " s, nlist " << nlist
         << ", inner product; scanned includes the " << nlist << " centroids\n";
    for (std::size_t k : o.k) {
      for (std::size_t np : o.nprobe) {
        if (np > nlist) continue;
        rows.push_back(measure_topk(
            {"ivf", "top-" + std::to_string(k), "nprobe=" + std::to_string(np)}, k, E, exact, n,
            [&](auto q, auto ids, auto scores) { return f.search(q, np, ids, scores); }));
      }
    }
  }
#endif
  (void)o, (void)w, (void)exact, (void)n, (void)rows, (void)info, (void)E;
}

template <class M, class P>
std::vector<row> run(const options& o, const workload& w, const P& pred, std::ostream& info,
                     std::vector<quality_row>& quality) {
  using store_t = kvsift::view_store<float>;
  const store_t store(w.keys.cview());
  const double n = static_cast<double>(w.keys.rows());
  const auto& E = w.eval;
  std::vector<row> rows;

  std::fprintf(stderr, "computing exact answers for %zu queries...\n", E.rows());
  const auto exact = exact_rankings<M>(w.keys, E, pred, o.build.threads);
  if (!o.save_gt.empty()) write_gt(o.save_gt, exact, *std::max_element(o.k.begin(), o.k.end()));
  const bool topk = o.query != "dipr", dipr = o.query != "topk";
  const float beta = dipr ? (o.beta ? *o.beta : choose_beta(exact, o.dipr_target)) : 0.0f;

  kvsift::search_workspace ws;
  const kvsift::flat_index<store_t, M> flat(store);
  for (std::size_t k : topk ? o.k : std::vector<std::size_t>{}) {
    rows.push_back(measure_topk(
        {"flat", "top-" + std::to_string(k), "-"}, k, E, exact, n,
        [&](auto q, auto ids, auto scores) { return flat.topk(q, k, ws, ids, scores, pred); }));
  }
  if (dipr) {
    rows.push_back(measure_dipr(
        {"flat", "dipr", "beta=" + std::to_string(beta)}, beta, E, exact, n,
        [&](auto q, kvsift::dipr_result& res) { flat.dipr(q, {.beta = beta}, ws, res, pred); }));
  }

  std::optional<kvsift::graph_index<store_t, M>> graph;
  if (o.uses("roargraph")) {
    auto& g = graph.emplace();
    if (!o.load_index.empty()) {
      g = kvsift::load_graph<M>(o.load_index, store);
      info << "index: loaded from " << o.load_index << "\n";
    } else {
      std::fprintf(stderr, "building RoarGraph over %zu keys from %zu training queries...\n",
                   w.keys.rows(), w.train.rows());
      kvsift::roargraph_build_stats bs;
      const kvsift::roargraph_builder<M> builder(o.build);
      if (o.save_train_knn.empty() && o.load_train_knn.empty()) {
        g = builder.build(store, w.train.cview(), &bs, progress_bar());
      } else {
        // Step 1 apart, so that the kNN lists can be written for (or read from) another
        // builder: the RoarGraph reference then builds from exactly the same input.
        const auto t0 = clock_type::now();
        kvsift::knn_result knn;
        if (!o.load_train_knn.empty()) {
          auto ids = kvsift::read_ibin(o.load_train_knn);
          knn.rows = ids.rows;
          knn.k = ids.cols;
          knn.ids = std::move(ids.data);
          info << "train kNN: loaded from " << o.load_train_knn << " (" << knn.rows << " x "
               << knn.k << ")\n";
        } else {
          knn = builder.training_knn(w.keys.cview(), w.train.cview());
        }
        const double knn_s = std::chrono::duration<double>(clock_type::now() - t0).count();
        if (!o.save_train_knn.empty()) {
          kvsift::write_ibin(o.save_train_knn, {knn.ids, knn.rows, knn.k});
        }
        g = builder.build_from_knn(store, knn, &bs, progress_bar());
        bs.knn_seconds = knn_s;
        bs.total_seconds += knn_s;
      }
      info << "build: " << bs.total_seconds << " s (kNN " << bs.knn_seconds << " s, projection "
           << bs.projection_seconds << " s, connectivity " << bs.connectivity_seconds << " s), nq "
           << o.build.nq << ", M " << o.build.M << ", L " << o.build.L << ", threads "
           << (o.build.threads ? o.build.threads : kvsift::default_thread_count()) << "\n";
      if (!o.save_index.empty()) kvsift::save_graph(g, o.save_index);
    }
    const auto deg = g.degrees();
    info << "degree: min " << deg.min << ", mean " << deg.mean << ", max " << deg.max << "\n";
    for (std::size_t k : topk ? o.k : std::vector<std::size_t>{}) {
      for (std::size_t L : o.L) {
        if (L < k) continue;
        rows.push_back(measure_topk(
            {"roargraph", "top-" + std::to_string(k), "L=" + std::to_string(L)}, k, E, exact, n,
            [&](auto q, auto ids, auto scores) {
              return kvsift::beam_search(g, q, {k, L, o.degree_cap}, ws, ids, scores, pred);
            }));
      }
    }
    if (o.insert_fraction > 0) {
      // Rows positional when --train-fraction split --queries: row i is position i's query.
      const bool positional = !o.demo && o.train.empty();
      std::fprintf(stderr, "building on the first %.0f%% of the keys, inserting the rest...\n",
                   100 * (1 - o.insert_fraction));
      const auto ins = kvsift_bench::build_then_insert<M>(w.keys.cview(), w.train.cview(),
                                                          o.insert_fraction, positional, o.build);
      info << "insert: built on " << ins.base_keys << " keys / " << ins.base_train
           << " training queries in " << ins.build_seconds << " s, inserted " << ins.inserted
           << " keys one by one: mean " << ins.mean_us << " us/key, p50 " << ins.p50_us << ", p99 "
           << ins.p99_us << " (one thread); degree mean " << ins.graph.degrees().mean << "\n";
      for (std::size_t k : topk ? o.k : std::vector<std::size_t>{}) {
        for (std::size_t L : o.L) {
          if (L < k) continue;
          rows.push_back(measure_topk(
              {"roargraph+insert", "top-" + std::to_string(k), "L=" + std::to_string(L)}, k, E,
              exact, n, [&](auto q, auto ids, auto scores) {
                return kvsift::beam_search(ins.graph, q, {k, L}, ws, ids, scores, pred);
              }));
        }
      }
    }
    for (std::size_t l0 : dipr ? o.l0 : std::vector<std::size_t>{}) {
      rows.push_back(measure_dipr({"roargraph", "dipr", "l0=" + std::to_string(l0)}, beta, E, exact,
                                  n, [&](auto q, kvsift::dipr_result& res) {
                                    kvsift::dipr_search(g, q, {.beta = beta, .l0 = l0}, ws, res,
                                                        pred);
                                  }));
    }
  }
  if constexpr (std::is_same_v<M, kvsift::inner_product> && std::is_same_v<P, kvsift::no_filter>) {
    run_peers(o, w, exact, n, rows, info);
    if (!o.values.empty()) {
      std::fprintf(stderr, "attention quality over %zu causal queries...\n", E.rows());
      quality = run_quality(o, w, flat, graph ? &*graph : nullptr);
    }
  }
  const double m = static_cast<double>(E.rows());
  for (auto& r : rows) {
    r.recall /= m;
    r.scanned /= m;
    r.size /= m;
    r.exact_size /= m;
  }
  if (dipr)
    info << "dipr: beta " << beta << (o.beta ? " (given)" : " (chosen for the target size)")
         << "\n";
  return rows;
}

void print_table(const std::vector<row>& rows) {
  std::printf("%-10s %-9s %-16s %8s %9s %10s %10s %10s %9s %9s\n", "index", "query", "param",
              "recall", "scanned", "mean_us", "p50_us", "p99_us", "size", "exact");
  for (const auto& r : rows) {
    const bool d = r.query == "dipr";
    std::printf("%-10s %-9s %-16s %8.4f %9.5f %10.1f %10.1f %10.1f ", r.index.c_str(),
                r.query.c_str(), r.param.c_str(), r.recall, r.scanned, r.mean_us, r.p50_us,
                r.p99_us);
    if (d)
      std::printf("%9.1f %9.1f\n", r.size, r.exact_size);
    else
      std::printf("%9s %9s\n", "-", "-");
  }
}

void print_quality(const std::vector<quality_row>& rows, const workload& w) {
  std::printf(
      "\nattention quality: %zu causal queries at positions %zu..%zu, window 128 + 512, "
      "retrieval from the middle; vs full attention (scale 1/sqrt(%zu))\n",
      w.eval.rows(), w.eval_first, w.eval_first + w.eval.rows() - 1, w.keys.cols());
  std::printf("%-16s %-20s %9s %9s %9s %9s %9s\n", "method", "param", "retrieved", "attended",
              "recovery", "rel_err", "scanned");
  for (const auto& r : rows) {
    std::printf("%-16s %-20s %9.1f %9.1f %9.4f %9.4f %9.4f\n", r.method.c_str(), r.param.c_str(),
                r.retrieved, r.attended, r.recovery, r.error, r.scanned);
  }
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c == '\n' ? ' ' : c;
  }
  return out;
}

/// The --json output file. Opened before the run (a typo'd directory or a read-only target
/// fails in a second, not after an hour of building), written whole at the end and checked for
/// write errors (a full disk is an error, not exit 0). A regular file (or a new path) is written
/// to a temporary in the same directory and renamed over the target, so a reader never sees a
/// half-written file and a failed run leaves the old one intact; a device or FIFO (/dev/stdout,
/// /dev/full) is written in place, since renaming over it would replace the device node.
class json_output {
 public:
  explicit json_output(std::string path) : path_(std::move(path)) {
    struct stat st {};
    const bool exists = ::stat(path_.c_str(), &st) == 0;
    if (exists && S_ISDIR(st.st_mode)) fail("is a directory");
    if (exists && !S_ISREG(st.st_mode)) {
      fd_ = ::open(path_.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
      if (fd_ < 0) fail(std::strerror(errno));
      return;
    }
    const std::filesystem::path target(path_);
    const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : ".";
    tmp_ = (dir / ("." + target.filename().string() + ".tmp-XXXXXX")).string();
    fd_ = ::mkstemp(tmp_.data());
    if (fd_ < 0) {
      const std::string why = std::strerror(errno);
      tmp_.clear();
      fail("cannot create a temporary file in '" + dir.string() + "': " + why);
    }
    pending_tmp() = tmp_;
  }
  json_output(const json_output&) = delete;
  json_output& operator=(const json_output&) = delete;
  ~json_output() {
    if (fd_ >= 0) ::close(fd_);
    discard();
  }

  /// Writes `text`, flushes it to disk and renames the temporary over the target.
  /// @throw kvsift::io_error on any write, sync, close or rename failure (the target untouched).
  void commit(const std::string& text) {
    for (std::size_t done = 0; done < text.size();) {
      const ssize_t r = ::write(fd_, text.data() + done, text.size() - done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) fail(std::string("write failed: ") + std::strerror(errno));
      done += static_cast<std::size_t>(r);
    }
    if (!tmp_.empty() && ::fsync(fd_) != 0) fail(std::string("fsync: ") + std::strerror(errno));
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) fail(std::string("close: ") + std::strerror(errno));
    if (!tmp_.empty()) {
      if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
        fail(std::string("rename from '") + tmp_ + "': " + std::strerror(errno));
      }
      tmp_.clear();
      pending_tmp().clear();
    }
  }

  /// The temporary of a run that never commits, removed at exit: usage_error() and the other
  /// std::exit paths skip destructors.
  static std::string& pending_tmp() {
    static std::string path;
    return path;
  }
  static void remove_pending_tmp() {
    if (!pending_tmp().empty()) ::unlink(pending_tmp().c_str());
  }

 private:
  [[noreturn]] void fail(const std::string& why) {
    discard();
    throw kvsift::io_error("--json '" + path_ + "': " + why);
  }
  void discard() {
    if (!tmp_.empty()) ::unlink(tmp_.c_str());
    tmp_.clear();
    pending_tmp().clear();
  }

  std::string path_, tmp_;
  int fd_ = -1;
};

std::string json_text(const options& o, const workload& w, const std::string& info,
                      const std::vector<row>& rows, const std::vector<quality_row>& quality) {
  std::ostringstream f;
  f << "{\n  \"source\": \"" << json_escape(w.source) << "\",\n  \"keys\": " << w.keys.rows()
    << ",\n  \"dim\": " << w.keys.cols() << ",\n  \"train_queries\": " << w.train.rows()
    << ",\n  \"eval_queries\": " << w.eval.rows() << ",\n  \"metric\": \"" << o.metric
    << "\",\n  \"info\": \"" << json_escape(info) << "\",\n  \"rows\": [\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    f << "    {\"index\": \"" << r.index << "\", \"query\": \"" << r.query << "\", \"param\": \""
      << r.param << "\", \"recall\": " << r.recall << ", \"scanned\": " << r.scanned
      << ", \"mean_us\": " << r.mean_us << ", \"p50_us\": " << r.p50_us
      << ", \"p99_us\": " << r.p99_us << ", \"size\": " << r.size
      << ", \"exact_size\": " << r.exact_size << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  f << "  ],\n  \"eval_first\": " << w.eval_first << ",\n  \"quality\": [\n";
  for (std::size_t i = 0; i < quality.size(); ++i) {
    const auto& r = quality[i];
    f << "    {\"method\": \"" << r.method << "\", \"param\": \"" << r.param
      << "\", \"retrieved\": " << r.retrieved << ", \"attended\": " << r.attended
      << ", \"recovery\": " << r.recovery << ", \"rel_l2_error\": " << r.error
      << ", \"scanned\": " << r.scanned << "}" << (i + 1 < quality.size() ? "," : "") << "\n";
  }
  f << "  ]\n}\n";
  return f.str();
}

/// --plan: tokens attended and attention-output error of coarse top-k, DIPR-flat, DIPR-graph
/// and the planner's plan on real dumps, per layer and GPU budget, at equal GPU memory: the
/// static window (128 + 512) is resident for all; on top of it a budget of B tokens of f16 K+V
/// holds the retrieved tokens, and for the coarse index also its summaries (3 * d f32 per
/// block, 3 tokens' worth), so coarse top-k fetches (B - summaries) / block_size blocks. DIPR
/// answers are cut to their best B tokens. Query t attends causally to tokens [0, t].
int run_plan(const options& o) {
  namespace fs = std::filesystem;
  using store_t = kvsift::view_store<float>;
  const fs::path dir = o.plan_dump;
  auto file = [&](std::size_t l, char kind, std::size_t h) {
    return dir / ("L" + std::to_string(l) + "_" + kind + std::to_string(h) + ".fbin");
  };
  std::vector<std::size_t> layers;
  for (std::size_t l = 0; l < 512; ++l)
    if (fs::exists(file(l, 'k', 0))) layers.push_back(l);
  if (layers.empty()) throw kvsift::io_error("--plan-dump: no L<layer>_k0.fbin in " + dir.string());
  std::size_t kv_heads = 0, q_heads = 0;
  while (fs::exists(file(layers[0], 'k', kv_heads))) ++kv_heads;
  while (fs::exists(file(layers[0], 'q', q_heads))) ++q_heads;
  const std::size_t group = std::max<std::size_t>(1, q_heads / kv_heads), bs = 64;
  const auto forced = kvsift::planner().parse_name(o.plan);
  const std::vector<std::string> methods{"coarse-topk", "flat-dipr", "graph-dipr", o.plan};
  struct acc {
    double tokens = 0, recovery = 0, error = 0, n = 0;
    std::set<std::string> plans;
  };
  std::map<std::tuple<std::size_t, std::size_t, std::size_t>, acc> table;  // layer, budget, m
  std::printf("kvsift-bench --plan %s: %s, layers", o.plan.c_str(), dir.c_str());
  for (auto l : layers) std::printf(" %zu", l);
  std::printf(", %zu KV heads (KV head h: query head %zu h, the first of its group)\n", kv_heads,
              group);
  for (std::size_t l : layers) {
    for (std::size_t h = 0; h < kv_heads; ++h) {
      const auto K = kvsift::read_vectors(file(l, 'k', h)),
                 V = kvsift::read_vectors(file(l, 'v', h));
      const auto Q = kvsift::read_vectors(file(l, 'q', h * group));
      // Query t is row t of Q (token t attends to [0, t]), V is read beside K, and the
      // training/held-out split needs two rows: check all of that before any row is read (a Q
      // shorter than K was read past its end).
      auto where = [&](char kind, std::size_t head) { return file(l, kind, head).string(); };
      kvsift::detail::require<kvsift::dimension_mismatch>(
          K.rows() >= 2, "--plan-dump: expected at least 2 keys in ", where('k', h), ", got ",
          K.rows());
      kvsift::detail::require<kvsift::dimension_mismatch>(
          V.rows() == K.rows() && V.cols() == K.cols(), "--plan-dump: expected ", where('v', h),
          " of ", K.rows(), " x ", K.cols(), " (as ", where('k', h), "), got ", V.rows(), " x ",
          V.cols());
      kvsift::detail::require<kvsift::dimension_mismatch>(
          Q.rows() >= K.rows() && Q.cols() == K.cols(), "--plan-dump: expected ",
          where('q', h * group), " of at least ", K.rows(), " rows x ", K.cols(),
          " (one query per key position of ", where('k', h), "), got ", Q.rows(), " x ", Q.cols());
      const std::size_t n = K.rows(), d = K.cols(), first = n - std::max<std::size_t>(1, n / 20);
      const std::size_t evals = o.eval ? std::min(o.eval, n - first) : n - first;
      const kvsift::kv_view<float> kv(K.cview(), V.cview());
      const store_t store(K.cview());
      const kvsift::flat_index<store_t> flat(store);
      const kvsift::block_index<> coarse(K.cview(), bs);
      std::fprintf(stderr, "layer %zu head %zu: building RoarGraph from %zu queries...\n", l, h,
                   first);
      const auto graph =
          kvsift::roargraph_builder<>(o.build).build(store, Q.cview().row_range(0, first));
      kvsift::planner_params pp;
      pp.head_dim = d;
      pp.block_size = bs;
      pp.dipr_beta = 5.0 * std::sqrt(static_cast<double>(d));  // weights down to e^-5 of the best
      const kvsift::planner pl(pp);
      const double token_bytes = pp.kv_bytes_per_token();
      const double summary_tokens = static_cast<double>(coarse.summary_bytes()) / token_bytes;
      const float beta = static_cast<float>(pp.dipr_beta);
      std::vector<kvsift::search_workspace> ws(o.build.threads ? o.build.threads
                                                               : kvsift::default_thread_count());
      const std::size_t cells = o.plan_budget.size() * methods.size();
      std::vector<std::array<double, 3>> res(evals * cells);
      std::vector<std::string> chosen(evals * cells);
      kvsift::parallel_for(evals, ws.size(), [&](std::size_t e, std::size_t th) {
        const std::size_t t = first + e * (n - first) / evals, context = t + 1;
        const auto q = Q.cview().row_span(t);
        const kvsift::id_below pred{context};
        // Full attention over the causal context is the baseline of every (budget, method)
        // cell of this query: computed once here, not once per cell.
        const auto full = kvsift::dense_attention(q, 0, 0, context, kv);
        kvsift::block_result br;
        kvsift::dipr_result dr;
        for (std::size_t b = 0; b < o.plan_budget.size(); ++b) {
          const std::size_t budget = o.plan_budget[b];
          const auto equal_blocks = static_cast<std::size_t>(std::max(
              1.0, (static_cast<double>(budget) - summary_tokens) / static_cast<double>(bs)));
          for (std::size_t m = 0; m < methods.size(); ++m) {
            kvsift::plan p;
            const auto dash = methods[m].find('-');
            p.index = methods[m].substr(0, dash);
            p.query = methods[m].substr(dash + 1);
            p.params["k_blocks"] = static_cast<double>(equal_blocks);
            if (m + 1 == methods.size() && !forced) {
              p = pl.choose({.context = context,
                             .reused_prefix = 0,
                             .layer = l,
                             .gpu_budget_bytes = static_cast<double>(budget) * token_bytes,
                             .latency_budget_us = std::nullopt});
            }
            std::vector<kvsift::id_t> ids;
            if (p.index == "full") {
              for (std::size_t i = 0; i < context; ++i) ids.push_back(static_cast<kvsift::id_t>(i));
            } else if (p.index == "coarse") {
              const auto kb = static_cast<std::size_t>(
                  p.params.count("k_blocks") ? p.params.at("k_blocks") : equal_blocks);
              if (p.query == "dipr")
                coarse.dipr(q, beta, ws[th], br, pred);
              else
                coarse.topk(q, kb, ws[th], br, pred);
              coarse.tokens(br.blocks, ids, pred);
            } else if (p.query == "dipr") {
              if (p.index == "flat")
                flat.dipr(q, {.beta = beta}, ws[th], dr, pred);
              else
                kvsift::dipr_search(graph, q, {.beta = beta, .l0 = pp.dipr_l0}, ws[th], dr, pred);
              ids = dr.ids;
            } else {  // top-k of the budget on the flat or graph index
              std::vector<kvsift::id_t> out(budget);
              std::vector<float> sc(budget);
              if (p.index == "flat")
                flat.topk(q, budget, ws[th], out, sc, pred);
              else
                kvsift::beam_search(graph, q, {budget, std::max<std::size_t>(budget, 100)}, ws[th],
                                    out, sc, pred);
              std::erase(out, kvsift::invalid_id);
              ids = out;
            }
            // Retrieved ids are best-first (blocks best-first): keep the best B. Full attention
            // is not a retrieval and is never cut.
            if (p.index != "full" && ids.size() > budget) ids.resize(budget);
            const auto att = kvsift::attended_tokens(context, ids);
            const auto qual = kvsift::compare_states(full, kvsift::sparse_attention(q, 0, att, kv));
            res[e * cells + b * methods.size() + m] = {static_cast<double>(att.size()),
                                                       qual.recovery, qual.rel_l2_error};
            chosen[e * cells + b * methods.size() + m] = p.name();
            if (m + 1 == methods.size() && e == 0 && h == 0 && !forced) {
              std::printf("  layer %zu, budget %zu tokens: %s\n", l, budget, p.explain().c_str());
            }
          }
        }
      });
      for (std::size_t e = 0; e < evals; ++e)
        for (std::size_t b = 0; b < o.plan_budget.size(); ++b)
          for (std::size_t m = 0; m < methods.size(); ++m) {
            const std::size_t c = e * cells + b * methods.size() + m;
            auto& a = table[{l, b, m}];
            a.tokens += res[c][0];
            a.recovery += res[c][1];
            a.error += res[c][2];
            a.n += 1;
            a.plans.insert(chosen[c]);
          }
    }
  }
  std::printf(
      "\nmean over held-out queries and KV heads; tokens = attended (window + retrieved)\n");
  std::printf("%-6s %-7s %-12s %-28s %9s %9s %10s\n", "layer", "budget", "method", "plan", "tokens",
              "recovery", "rel_l2_err");
  for (const auto& [key, a] : table) {
    const auto [l, b, m] = key;
    std::string plans;
    for (const auto& p : a.plans) plans += (plans.empty() ? "" : ",") + p;
    std::printf("%-6zu %-7zu %-12s %-28s %9.1f %9.4f %10.4f\n", l, o.plan_budget[b],
                methods[m].c_str(), plans.c_str(), a.tokens / a.n, a.recovery / a.n, a.error / a.n);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  std::atexit(json_output::remove_pending_tmp);
  try {
    // Opened first: an unwritable --json target fails before the run, not after it.
    std::optional<json_output> json;
    if (!o.json.empty()) json.emplace(o.json);
    if (!o.plan.empty()) return run_plan(o);
    const workload w = load(o);
    if (!o.save_data.empty()) {
      std::filesystem::create_directories(o.save_data);
      kvsift::write_fbin(std::filesystem::path(o.save_data) / "keys.fbin", w.keys.cview());
      kvsift::write_fbin(std::filesystem::path(o.save_data) / "train.fbin", w.train.cview());
      kvsift::write_fbin(std::filesystem::path(o.save_data) / "eval.fbin", w.eval.cview());
    }
    if (o.uses("roargraph") && o.load_index.empty() && o.load_train_knn.empty() &&
        w.train.rows() == 0) {
      usage_error("--index roargraph needs training queries: --train or --train-fraction");
    }
    std::printf(
        "kvsift-bench: %s\n  keys %zu x %zu (f32), training queries %zu, evaluation queries %zu, "
        "metric %s%s\n",
        w.source.c_str(), w.keys.rows(), w.keys.cols(), w.train.rows(), w.eval.rows(),
        o.metric.c_str(),
        o.filter_prefix ? (", filter id < " + std::to_string(*o.filter_prefix)).c_str() : "");
    std::ostringstream info;
    std::vector<row> rows;
    std::vector<quality_row> quality;
    auto go = [&](auto metric) {
      using M = decltype(metric);
      if (o.filter_prefix) {
        rows = run<M>(o, w, kvsift::id_below{*o.filter_prefix}, info, quality);
      } else {
        rows = run<M>(o, w, kvsift::no_filter{}, info, quality);
      }
    };
    if (o.metric == "ip")
      go(kvsift::inner_product{});
    else
      go(kvsift::l2{});
    std::istringstream lines(info.str());
    for (std::string line; std::getline(lines, line);) std::printf("  %s\n", line.c_str());
    std::printf(
        "  recall vs exact answer; scanned = keys scored / keys; latency on one thread\n\n");
    print_table(rows);
    if (!quality.empty()) print_quality(quality, w);
    if (json) json->commit(json_text(o, w, info.str(), rows, quality));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvsift-bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
