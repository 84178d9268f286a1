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
// Usage: kvsift-cuda-graph_search_bench [--n 131072] [--d 128] [--m 8192] [--reps 5]
//            [--L 500] [--limit 400] [--degree 35]

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <vector>

#include "bench_util.cuh"
#include "gqa_heads.cuh"

#pragma nv_diagnostic push
#pragma nv_diag_suppress 554
#include <kvsift/cuda/graph_search.cuh>
#pragma nv_diagnostic pop

namespace {

using kvsift::id_t;
using kvsift::cuda_bench::dev;

struct options {
  std::size_t n = 131072, d = 128, m = 8192, reps = 5, L = 500, limit = 400, degree = 35;
};

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
       cb::size_option("--limit", o.limit), cb::size_option("--degree", o.degree)});
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
  return 0;
}
