// The RoarGraph build's step-3 search on the GPU (`kvsift::cuda::graph_search`) alone: every
// key of a head searches the graph for its own neighbours (pool L = 500, the best 80% expanded,
// RNG-pruned to M = 35), which is most of a GPU build's time (docs/performance.md). Timing the
// kernel by itself, on a finished graph, separates its cost from the build's host phases and
// its rounds.
//
// Data: one GQA key set of the decode benchmarks (synthetic OOD keys, f16, the GPU-built index
// of gqa_heads.cuh). Per configuration: milliseconds per launch (CUDA events, median of --reps
// launches), microseconds per search amortised over the launch, vectors scored per search, and
// a hash of the pruned lists (equal hashes = the same results, for A/B runs of two builds).
// Baseline in the same run: the exact scan of every key by the same queries is what the search
// replaces; its floor, reading all keys once per query at the measured copy bandwidth, is
// printed next to it.
//
// Step 2 (the projection) alone, too: the lists of the key set's training queries (10% of four
// heads' queries, k = 100, from the CUDA kNN engine) projected at M = 35 by
// `connectivity_searcher::project` (wall time of the call, median of --reps) against the
// builder's CPU projection of the same lists on every host thread (`roargraph_builder` with an
// engine that returns the stored lists, step 3 off: its projection_seconds), in the same run;
// rows that differ between the two are counted (f16 keys: only summation order differs).
//
// Usage: kvsift-cuda-graph_search_bench [--n 131072] [--d 128] [--m 8192] [--reps 5]
//            [--L 500] [--limit 400] [--degree 35] [--project 1]

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <thread>
#include <vector>

#include "bench_util.cuh"
#include "gqa_heads.cuh"

#pragma nv_diagnostic push
#pragma nv_diag_suppress 554
#include <kvsift/cuda/graph_search.cuh>
#include <kvsift/cuda/knn.cuh>
#include <kvsift/index/gqa_sampling.hpp>
#include <kvsift/index/roargraph_builder.hpp>
#pragma nv_diagnostic pop

namespace {

using kvsift::id_t;
using kvsift::cuda_bench::dev;

struct options {
  std::size_t n = 131072, d = 128, m = 8192, reps = 5, L = 500, limit = 400, degree = 35;
  std::size_t project = 1;
};

// A kNN engine that returns lists computed before: the builder's step 1 without its cost, so
// that its step 2 runs on given lists.
struct stored_knn_engine {
  const kvsift::knn_result* lists = nullptr;
  template <class T>
  kvsift::knn_result search(kvsift::matrix_view<const float>, kvsift::matrix_view<const T>,
                            std::size_t) const {
    return *lists;
  }
};
static_assert(kvsift::KnnEngine<stored_knn_engine>);

// Step 2 on the GPU against the builder's CPU step 2, on the lists of the key set's training
// queries (see the file comment).
void project_part(const options& o, const kvsift::cuda_bench::gqa_key_set& ks) {
  namespace cb = kvsift::cuda_bench;
  const std::size_t n = o.n, d = o.d, k = 100, M = 35;
  std::vector<kvsift::testing::ood_data> heads;
  for (std::size_t h = 0; h < 4; ++h) heads.push_back(cb::make_head(n, n, d, h, 11));
  std::vector<kvsift::matrix_view<const float>> prefill;
  for (const auto& h : heads) prefill.push_back(h.query_view().row_range(0, n));
  const auto train = kvsift::sample_gqa_queries(
      std::span<const kvsift::matrix_view<const float>>(prefill), 0.1, 7);
  const kvsift::matrix_view<const kvsift::half> keys(ks.keys16.data(), n, d);
  const kvsift::knn_result lists = kvsift::cuda::knn_engine().search(train.view(), keys, k);

  kvsift::roargraph_params p;
  p.M = M;
  p.nq = k;
  p.connectivity = false;
  p.threads = std::thread::hardware_concurrency();
  const kvsift::roargraph_builder<kvsift::inner_product, stored_knn_engine> cpu(p, {&lists});
  std::vector<double> cpu_s, gpu_s;
  std::vector<std::vector<id_t>> rows;
  std::size_t differ = 0, edges = 0;
  for (std::size_t r = 0; r < o.reps; ++r) {  // alternated
    kvsift::roargraph_build_stats st;
    const auto g = cpu.build(kvsift::view_store<kvsift::half>(keys), train.view(), &st);
    cpu_s.push_back(st.projection_seconds);
    kvsift::cuda::connectivity_searcher<kvsift::half> s(keys, 2 * M);
    const auto t0 = std::chrono::steady_clock::now();
    s.project(lists.ids, lists.k, M);
    gpu_s.push_back(cb::seconds_since(t0));
    if (r > 0) continue;
    s.get_rows(rows);
    for (std::size_t x = 0; x < n; ++x) {
      const auto want = g.neighbors(static_cast<id_t>(x));
      differ += !std::ranges::equal(want, rows[x]);
      edges += want.size();
    }
  }
  std::ranges::sort(cpu_s);
  std::ranges::sort(gpu_s);
  const double c = cpu_s[cpu_s.size() / 2] * 1e3, gm = gpu_s[gpu_s.size() / 2] * 1e3;
  std::printf(
      "projection of %zu lists (k %zu) at M %zu: GPU %.2f ms per call against the CPU's %.2f ms "
      "on %u threads (x%.1f; medians of %zu, alternated); %zu of %zu rows differ, %zu edges\n",
      lists.rows, k, M, gm, c, std::thread::hardware_concurrency(), c / gm, o.reps, differ, n,
      edges);
}

std::uint64_t fnv(const std::vector<id_t>& a) {
  std::uint64_t h = 1469598103934665603ull;
  for (const id_t x : a) h = (h ^ x) * 1099511628211ull;
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  namespace cb = kvsift::cuda_bench;
  cb::parse_options(
      argc, argv,
      {cb::size_option("--n", o.n), cb::size_option("--d", o.d), cb::size_option("--m", o.m),
       cb::size_option("--reps", o.reps), cb::size_option("--L", o.L),
       cb::size_option("--limit", o.limit), cb::size_option("--degree", o.degree),
       cb::size_option("--project", o.project)});
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  cb::bench_setup setup;
  if (!cb::start_bench(setup)) return 0;
  const cudaStream_t stream = setup.stream;
  const auto t0 = std::chrono::steady_clock::now();
  const cb::gqa_key_set ks = cb::build_gqa_key_set(o.n, 0, o.d, 4, 11);
  std::printf(
      "data: %zu f16 keys x d=%zu, index width %zu, built in %.1f s (%.1f s with data), "
      "adjacency hash %016llx\n",
      o.n, o.d, ks.width, ks.build_seconds, cb::seconds_since(t0),
      static_cast<unsigned long long>(fnv(ks.adjacency)));

  dev<__half> keys(o.n * o.d);
  dev<id_t> adj(ks.adjacency.size());
  KVSIFT_CUDA_CHECK(
      cudaMemcpy(keys.p, ks.keys16.data(), o.n * o.d * sizeof(__half), cudaMemcpyHostToDevice));
  KVSIFT_CUDA_CHECK(cudaMemcpy(adj.p, ks.adjacency.data(), ks.adjacency.size() * sizeof(id_t),
                               cudaMemcpyHostToDevice));
  kvsift::cuda::graph_ref<__half> g;
  g.keys = keys.p;
  g.n = static_cast<std::int64_t>(o.n);
  g.d = g.ld = static_cast<std::int64_t>(o.d);
  g.adjacency = adj.p;
  g.width = static_cast<int>(ks.width);
  g.entry = ks.entries.empty() ? 0 : ks.entries[0];

  // Query rows spread over the keys (a build round's rows are a random subset).
  const std::size_t m = std::min(o.m, o.n);
  std::vector<id_t> rows(m);
  for (std::size_t i = 0; i < m; ++i) rows[i] = static_cast<id_t>(i * (o.n / m));
  dev<id_t> drows(m), kept(m * std::max<std::size_t>(o.degree, 1));
  dev<std::uint32_t> kept_counts(m), scored(m);
  KVSIFT_CUDA_CHECK(cudaMemcpy(drows.p, rows.data(), m * sizeof(id_t), cudaMemcpyHostToDevice));
  const std::size_t wb =
      kvsift::cuda::graph_search_workspace_size(g.n, static_cast<std::int64_t>(m));
  dev<char> ws(wb);

  auto run = [&](int L, int limit, int degree) {
    kvsift::cuda::graph_search_params p;
    p.L = L;
    p.expand_limit = limit;
    p.degree = degree;
    p.metric = kvsift::cuda::graph_metric::l2;  // as step 3
    kvsift::cuda::graph_search_outputs out;
    out.kept = degree > 0 ? kept.p : nullptr;
    out.kept_counts = degree > 0 ? kept_counts.p : nullptr;
    out.scored = scored.p;
    const float ms = cb::median_ms(
        [&](cudaStream_t s) {
          kvsift::cuda::graph_search(g, drows.p, static_cast<std::int64_t>(m), p, out, ws.p, wb, s);
        },
        stream, 1, static_cast<int>(o.reps));
    std::vector<std::uint32_t> sc(m);
    KVSIFT_CUDA_CHECK(
        cudaMemcpy(sc.data(), scored.p, m * sizeof(std::uint32_t), cudaMemcpyDeviceToHost));
    std::uint64_t h = 0;
    if (degree > 0) {
      std::vector<id_t> k(m * static_cast<std::size_t>(degree));
      KVSIFT_CUDA_CHECK(
          cudaMemcpy(k.data(), kept.p, k.size() * sizeof(id_t), cudaMemcpyDeviceToHost));
      h = fnv(k);
    }
    const double mean_scored = std::accumulate(sc.begin(), sc.end(), 0.0) / static_cast<double>(m);
    // Floor of the exact scan the search replaces: every key read once per query.
    const double scan_ms = static_cast<double>(m) * static_cast<double>(o.n * o.d * 2) /
                           (setup.copy_gbps * 1e9 / 2) * 1e3;
    std::printf(
        "search m=%zu L=%d limit=%d degree=%d: %8.3f ms per launch, %6.2f us per search, "
        "%6.0f scored per search, kept hash %016llx; exact-scan floor %.1f ms\n",
        m, L, limit, degree, ms, ms * 1e3 / static_cast<double>(m), mean_scored,
        static_cast<unsigned long long>(h), scan_ms);
  };
  const int L = static_cast<int>(o.L), limit = static_cast<int>(o.limit);
  const int degree = static_cast<int>(o.degree);
  run(L, limit, degree);  // as step 3 builds
  run(L, limit, 0);       // the search alone: the difference is the pruning
  run(100, 0, 0);         // a small pool
  if (o.project != 0) project_part(o, ks);
  return 0;
}
