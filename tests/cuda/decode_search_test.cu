// The GPU decode search against the CPU `beam_search` and `dipr_search` it mirrors.
//
// As in graph_search_test.cu, keys and queries are small integers: every score is exact in f32
// whatever the summation order (and exactly representable in f16/bf16), so the GPU sees the
// CPU's scores bit for bit and must return the same results, tie rule included, and score the
// same number of vectors (which checks that it walks the same way, not only that it lands on
// the same answer). Integer data has many tied scores, which exercises the tie rules.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#pragma nv_diagnostic push
#pragma nv_diag_suppress 554
#include <kvsift/core/metric.hpp>
#include <kvsift/cuda/decode_search.cuh>
#include <kvsift/search/beam_search.hpp>
#include <kvsift/search/dipr_search.hpp>
#pragma nv_diagnostic pop

#include "cuda_test.cuh"
#include "test_util.cuh"

namespace {

using namespace kvsift::cuda_test;
using kvsift::id_t;
namespace kc = kvsift::cuda;

/// CPU model of one graph of the set (keys as f32, exact for the integer data).
template <class M>
struct cpu_graph {
  using metric_type = M;
  const float* keys;
  std::size_t n, d, width;
  const id_t* adj;
  std::vector<id_t> entries;
  std::size_t size() const { return n; }
  std::size_t dim() const { return d; }
  id_t entry_point() const { return entries.empty() ? kvsift::invalid_id : entries[0]; }
  std::span<const id_t> entry_points() const { return entries; }
  std::span<const id_t> neighbors(id_t u) const {
    const id_t* b = adj + u * width;
    return {b, static_cast<std::size_t>(std::find(b, b + width, kvsift::invalid_id) - b)};
  }
  float score(const float* q, id_t i) const { return M::score(q, keys + i * d, d); }
};

/// A set of graphs over integer keys, in both layouts (dense and paged), on host and device.
struct graph_set {
  std::size_t d = 0, width = 0, max_entries = 0;
  std::vector<std::size_t> sizes;
  std::vector<std::int64_t> offsets;  // [G + 1]
  std::vector<float> keys;            // rows of all graphs
  std::vector<id_t> adj, entries;
};

graph_set make_set(const std::vector<std::size_t>& sizes, std::size_t d, std::size_t width,
                   std::size_t max_entries) {
  graph_set s;
  s.d = d;
  s.width = width;
  s.max_entries = max_entries;
  s.sizes = sizes;
  s.offsets.push_back(0);
  for (const std::size_t n : sizes) s.offsets.push_back(s.offsets.back() + std::int64_t(n));
  const auto total = static_cast<std::size_t>(s.offsets.back());
  s.keys = integer_matrix(total, d, 3);
  s.adj.assign(total * width, kvsift::invalid_id);
  s.entries.assign(sizes.size() * max_entries, kvsift::invalid_id);
  for (std::size_t g = 0; g < sizes.size(); ++g) {
    const std::size_t n = sizes[g];
    for (std::size_t i = 0; i < n; ++i) {
      // Most rows full (a real graph), some short, a few empty (dead ends).
      const int r = uniform_int(0, 9);
      const std::size_t deg = std::min(n - 1, r == 0 ? 0 : r == 1 ? width / 3 : width);
      std::vector<id_t> row;
      while (row.size() < deg) {
        const auto v = static_cast<id_t>(uniform_int(0, static_cast<int>(n) - 1));
        if (v != i && std::find(row.begin(), row.end(), v) == row.end()) row.push_back(v);
      }
      std::copy(row.begin(), row.end(), s.adj.begin() + (s.offsets[g] + i) * width);
    }
    if (n == 0) continue;
    const std::size_t ne = std::min<std::size_t>(n, uniform_int(1, int(max_entries)));
    std::vector<id_t> e;
    while (e.size() < ne) {
      const auto v = static_cast<id_t>(uniform_int(0, static_cast<int>(n) - 1));
      if (std::find(e.begin(), e.end(), v) == e.end()) e.push_back(v);
    }
    std::copy(e.begin(), e.end(), s.entries.begin() + g * max_entries);
  }
  return s;
}

template <class M>
cpu_graph<M> cpu_view(const graph_set& s, std::size_t g) {
  cpu_graph<M> c{s.keys.data() + s.offsets[g] * s.d,    s.sizes[g], s.d, s.width,
                 s.adj.data() + s.offsets[g] * s.width, {}};
  for (std::size_t e = 0; e < s.max_entries; ++e) {
    const id_t v = s.entries[g * s.max_entries + e];
    if (v != kvsift::invalid_id) c.entries.push_back(v);
  }
  return c;
}

struct query_batch {
  std::vector<float> q;  // m x d
  std::vector<std::int32_t> graph;
  std::vector<float> seed;                 // NaN = none
  std::vector<std::uint32_t> first, last;  // empty = no filter
  std::vector<id_t> seeds;                 // m x seeds_ld own entry points (empty = none)
  int seeds_ld = 0;
  std::vector<id_t> extra_seeds;  // m x extra_ld, visited after `seeds` (empty = none)
  int extra_ld = 0;
};

struct gpu_result {
  std::vector<id_t> ids;
  std::vector<float> scores, best;
  std::vector<std::uint32_t> counts, scored;
  std::vector<std::uint32_t> capped;  // per query (7 where the kernel did not write it)
  std::uint32_t status = 0;
  int capacity = 0;
};

/// Runs decode_search on the device over dense or paged keys (element type T).
/// `declared_keys` raises the set's max_keys above the largest graph: above 2^18 keys the
/// kernel keeps its visited bitsets in the workspace instead of shared memory.
/// `page_of_graph0`, where given (paged keys), replaces the page-table entry of graph 0's
/// second page (a bad entry: negative, or past the pool).
template <class T>
gpu_result run_gpu(const graph_set& s, const query_batch& qb, const kc::decode_search_params& p,
                   bool paged, int page_size = 16, std::int64_t declared_keys = 0,
                   std::optional<std::int32_t> page_of_graph0 = std::nullopt) {
  const std::size_t m = qb.graph.size();
  const std::size_t total = s.keys.size() / s.d;
  const int G = static_cast<int>(s.sizes.size());
  device_buffer<id_t> adj(s.adj), ent(s.entries);
  device_buffer<std::int64_t> off(s.offsets);
  kc::graph_set_ref set;
  set.adjacency = adj.get();
  set.row_offset = off.get();
  set.entries = ent.get();
  set.num_graphs = G;
  set.width = static_cast<int>(s.width);
  set.max_entries = static_cast<int>(s.max_entries);
  set.max_keys = std::max<std::int64_t>(
      {1, declared_keys, std::int64_t(*std::max_element(s.sizes.begin(), s.sizes.end()))});

  device_buffer<float> dq(qb.q), dseed(qb.seed);
  device_buffer<std::int32_t> dg(qb.graph);
  device_buffer<std::uint32_t> dfirst(qb.first), dlast(qb.last);
  device_buffer<id_t> dseeds(qb.seeds), dextra(qb.extra_seeds);
  kc::decode_queries qs;
  qs.q = dq.get();
  qs.ld = static_cast<std::int64_t>(s.d);
  qs.graph = dg.get();
  qs.seed_score = qb.seed.empty() ? nullptr : dseed.get();
  qs.filter_first = qb.first.empty() ? nullptr : dfirst.get();
  qs.filter_last = qb.last.empty() ? nullptr : dlast.get();
  qs.seeds = qb.seeds.empty() ? nullptr : dseeds.get();
  qs.seeds_ld = qb.seeds_ld;
  qs.extra_seeds = qb.extra_seeds.empty() ? nullptr : dextra.get();
  qs.extra_seeds_ld = qb.extra_ld;

  gpu_result r;
  r.capacity = kc::decode_search_capacity(p);
  const auto cap = static_cast<std::size_t>(r.capacity);
  device_buffer<id_t> ids(m * cap);
  device_buffer<float> scores(m * cap), best(m);
  device_buffer<std::uint32_t> counts(m), scored(m), status(std::vector<std::uint32_t>{0});
  device_buffer<std::uint32_t> capped(std::vector<std::uint32_t>(m, 7u));
  kc::decode_search_outputs out{ids.get(),  scores.get(), counts.get(),
                                best.get(), scored.get(), status.get()};
  out.capped = capped.get();
  const std::size_t wb = kc::decode_search_workspace_size(set, std::int64_t(m), p);
  device_buffer<char> ws(wb);

  if (!paged) {
    std::vector<T> kt(total * s.d);
    for (std::size_t i = 0; i < kt.size(); ++i) kt[i] = from_float<T>(s.keys[i]);
    device_buffer<T> dk(kt);
    kc::dense_keys_ref<T> keys{dk.get(), std::int64_t(s.d), int(s.d)};
    kc::decode_search(set, keys, qs, std::int64_t(m), p, out, ws.get(), wb, nullptr);
    KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  } else {
    // Pages of each graph scattered over the pool in a random order; unused slots hold 1e30
    // so a stray read shows.
    const int max_pages = static_cast<int>((set.max_keys + page_size - 1) / page_size);
    std::vector<std::int32_t> table(std::size_t(G) * max_pages, -1);
    std::vector<std::int32_t> order;
    int pages = 0;
    for (int g = 0; g < G; ++g) {
      for (int pg = 0; pg < int((s.sizes[g] + page_size - 1) / page_size); ++pg) pages++;
    }
    for (int i = 0; i < pages + 3; ++i) order.push_back(i);
    std::shuffle(order.begin(), order.end(), rng());
    std::vector<T> pool(std::size_t(pages + 3) * page_size * s.d, from_float<T>(1e30f));
    int next = 0;
    for (int g = 0; g < G; ++g) {
      for (std::size_t t = 0; t < s.sizes[g]; ++t) {
        if (t % page_size == 0) table[std::size_t(g) * max_pages + t / page_size] = order[next++];
        const std::int32_t page = table[std::size_t(g) * max_pages + t / page_size];
        for (std::size_t j = 0; j < s.d; ++j) {
          pool[(std::size_t(page) * page_size + t % page_size) * s.d + j] =
              from_float<T>(s.keys[(s.offsets[g] + t) * s.d + j]);
        }
      }
    }
    if (page_of_graph0) table[1] = *page_of_graph0;
    device_buffer<T> dk(pool);
    device_buffer<std::int32_t> dt(table);
    kc::paged_kv_ref<T> kv;
    kv.k_pages = dk.get();
    kv.v_pages = dk.get();
    kv.num_pages = pages + 3;
    kv.page_size = page_size;
    kv.head_dim = int(s.d);
    kv.page_table = dt.get();
    kv.num_kv_heads = G;
    kv.max_pages_per_head = max_pages;
    kc::decode_search(set, kv, qs, std::int64_t(m), p, out, ws.get(), wb, nullptr);
    KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  r.ids = ids.download();
  r.scores = scores.download();
  r.best = best.download();
  r.counts = counts.download();
  r.scored = scored.download();
  r.capped = capped.download();
  r.status = status.download()[0];
  return r;
}

query_batch make_queries(const graph_set& s, std::size_t m, bool seeds, bool filters) {
  query_batch qb;
  qb.q = integer_matrix(m, s.d, 3);
  for (std::size_t i = 0; i < m; ++i) {
    int g = 0;
    do {
      g = uniform_int(0, int(s.sizes.size()) - 1);
    } while (s.sizes[g] == 0 && filters);
    qb.graph.push_back(g);
    if (seeds) {
      // A third without a seed, the rest with a seed at or above typical best scores.
      qb.seed.push_back(uniform_int(0, 2) == 0 ? std::numeric_limits<float>::quiet_NaN()
                                               : float(uniform_int(5, 25)));
    }
    if (filters) {
      const auto n = static_cast<std::uint32_t>(s.sizes[g]);
      const int kind = uniform_int(0, 3);
      std::uint32_t a = 0, b = n;
      if (kind == 0) b = std::max<std::uint32_t>(1, n - std::min<std::uint32_t>(n - 1, 64));
      if (kind == 1) b = std::max<std::uint32_t>(1, n / 10);  // selective: 2-hop + fallback
      if (kind == 2) {
        a = std::uint32_t(uniform_int(0, int(n) - 1));
        b = std::uint32_t(uniform_int(int(a) + 1, int(n)));
      }
      qb.first.push_back(a);
      qb.last.push_back(b);
    }
  }
  return qb;
}

/// Gives every query of `qb` `ld` seeds: ids of its graph (some the entry points, some
/// repeated), a third of the slots invalid_id padding.
void add_seeds(const graph_set& s, query_batch& qb, int ld) {
  qb.seeds_ld = ld;
  qb.seeds.clear();
  for (const std::int32_t g : qb.graph) {
    const auto n = static_cast<int>(s.sizes[std::size_t(g)]);
    for (int j = 0; j < ld; ++j) {
      const int kind = uniform_int(0, 5);
      id_t e = kvsift::invalid_id;
      if (n > 0 && kind >= 2) e = id_t(uniform_int(0, n - 1));
      if (n > 0 && kind == 1) e = s.entries[std::size_t(g) * s.max_entries];
      qb.seeds.push_back(e);
    }
  }
}

/// The first `m` queries of `qb` (d floats each).
query_batch first_queries(const query_batch& qb, std::size_t m, std::size_t d) {
  query_batch r;
  r.q.assign(qb.q.begin(), qb.q.begin() + static_cast<std::ptrdiff_t>(m * d));
  r.graph.assign(qb.graph.begin(), qb.graph.begin() + static_cast<std::ptrdiff_t>(m));
  auto head = [m](const auto& v) {
    return std::remove_cvref_t<decltype(v)>(
        v.begin(), v.begin() + static_cast<std::ptrdiff_t>(std::min(m, v.size())));
  };
  r.seed = head(qb.seed);
  r.first = head(qb.first);
  r.last = head(qb.last);
  r.seeds_ld = qb.seeds_ld;
  r.seeds.assign(qb.seeds.begin(), qb.seeds.begin() + static_cast<std::ptrdiff_t>(
                                                          qb.seeds.empty() ? 0 : m * qb.seeds_ld));
  return r;
}

/// Counts queries where the GPU differs from the CPU search (ids, scores, count, vectors
/// scored, the per-query capped flag; DIPR also best score and capping).
template <class M, class T>
int compare(const graph_set& s, const query_batch& qb, const kc::decode_search_params& p,
            bool paged, std::int64_t declared_keys = 0, int page_size = 16) {
  const gpu_result r = run_gpu<T>(s, qb, p, paged, page_size, declared_keys);
  const bool dipr = p.mode == kc::decode_search_mode::dipr;
  const auto cap = static_cast<std::size_t>(r.capacity);
  kvsift::search_workspace ws;
  int bad = 0;
  bool any_capped = false;
  for (std::size_t i = 0; i < qb.graph.size(); ++i) {
    const auto g = cpu_view<M>(s, std::size_t(qb.graph[i]));
    const std::span<const float> q(qb.q.data() + i * s.d, s.d);
    std::vector<id_t> want_ids;
    std::vector<float> want_scores;
    std::size_t want_scored = 0;
    float want_best = 0;
    bool want_capped = false;
    std::vector<id_t> extra;  // the query's seeds without the padding
    for (int j = 0; j < qb.seeds_ld; ++j) {
      const id_t e = qb.seeds[i * std::size_t(qb.seeds_ld) + std::size_t(j)];
      if (e != kvsift::invalid_id) extra.push_back(e);
    }
    for (int j = 0; j < qb.extra_ld; ++j) {  // the second array follows the first
      const id_t e = qb.extra_seeds[i * std::size_t(qb.extra_ld) + std::size_t(j)];
      if (e != kvsift::invalid_id) extra.push_back(e);
    }
    auto run = [&](const auto& pred) {
      if (dipr) {
        kvsift::dipr_params dp;
        dp.beta = p.beta;
        dp.l0 = std::size_t(p.l0);
        dp.max_candidates = cap;
        dp.seed_score = qb.seed.empty() ? std::numeric_limits<float>::quiet_NaN() : qb.seed[i];
        dp.degree_cap = std::size_t(p.degree_cap);
        dp.max_hops = std::size_t(p.max_hops);
        dp.walk_through = p.walk_through;
        dp.entry_prefix = std::size_t(p.entry_prefix);
        kvsift::dipr_result res;
        kvsift::dipr_search(g, q, dp, ws, res, pred, extra);
        want_ids = res.ids;
        want_scores = res.scores;
        want_scored = res.stats.distance_computations;
        want_best = res.best_score;
        want_capped = res.capped;
        any_capped |= res.capped;
      } else {
        std::vector<id_t> ids(std::size_t(p.k));
        std::vector<float> sc(std::size_t(p.k));
        kvsift::beam_search_params bp;
        bp.k = std::size_t(p.k);
        bp.L = std::size_t(p.L);
        bp.degree_cap = std::size_t(p.degree_cap);
        bp.expand_limit = std::size_t(p.expand_limit);
        bp.max_hops = std::size_t(p.max_hops);
        bp.walk_through = p.walk_through;
        bp.entry_prefix = std::size_t(p.entry_prefix);
        const auto st = kvsift::beam_search(g, q, bp, ws, ids, sc, pred, extra);
        ids.resize(st.count);
        sc.resize(st.count);
        want_ids = ids;
        want_scores = sc;
        want_scored = st.distance_computations;
      }
    };
    if (qb.first.empty()) {
      run(kvsift::no_filter{});
    } else {
      run(kvsift::id_range{qb.first[i], qb.last[i]});
    }
    const std::uint32_t count = r.counts[i];
    std::vector<std::pair<float, id_t>> got;
    for (std::size_t j = 0; j < count && j < cap; ++j) {
      got.push_back({r.scores[i * cap + j], r.ids[i * cap + j]});
    }
    if (dipr) {  // discovery order on the GPU: sort as the CPU does (best first, ties by id)
      const bool l2 = p.metric == kc::graph_metric::l2;
      std::sort(got.begin(), got.end(), [&](const auto& a, const auto& b) {
        return (l2 ? a.first < b.first : a.first > b.first) ||
               (a.first == b.first && a.second < b.second);
      });
    }
    bool same = count == want_ids.size() && r.scored[i] == want_scored &&
                r.capped[i] == (want_capped ? 1u : 0u);
    for (std::size_t j = 0; same && j < want_ids.size(); ++j) {
      same = got[j].second == want_ids[j] && got[j].first == want_scores[j];
    }
    for (std::size_t j = count; same && j < cap; ++j)
      same = r.ids[i * cap + j] == kvsift::invalid_id;
    if (dipr) same = same && r.best[i] == want_best;
    if (!same) {
      if (bad < 3) {
        std::printf(
            "    query %zu (graph %d, n %zu): gpu count %u scored %u best %g, cpu %zu / %zu / %g\n",
            i, qb.graph[i], g.size(), count, r.scored[i], dipr ? r.best[i] : 0.0, want_ids.size(),
            want_scored, dipr ? want_best : 0.0);
      }
      ++bad;
    }
  }
  const bool gpu_capped = (r.status & kc::decode_status_capped) != 0u;
  if (gpu_capped != any_capped) ++bad;
  if ((r.status & ~kc::decode_status_capped) != 0u) ++bad;
  return bad;
}

struct wide_result {
  std::vector<id_t> ids;
  std::vector<float> scores;
  std::size_t scored = 0;
  std::size_t rejected = 0;  // filtered-out ids met by expansions
};

/// CPU model of the GPU's wider top-k walk (expand_width = width): a step takes the best
/// `width` unexpanded pool entries, expands them one after another with the CPU's rule
/// (detail::expand: visited set, 2-hop walk-through of failing ids unless walk_through is
/// false, gather cap, degree cap), and only then scores and inserts every id they gathered.
/// width = 1 is beam_search with the same walk_through.
template <class M, class P>
wide_result cpu_wide_walk(const cpu_graph<M>& g, const float* q, std::size_t k, std::size_t L,
                          int width, int degree_cap, const P& pred, kvsift::search_workspace& ws,
                          bool walk_through = true) {
  wide_result r;
  ws.visited.reset(g.size());
  ws.pool.reset(std::min(L, g.size()));
  auto insert = [&](id_t id) {
    ++r.scored;
    ws.pool.insert(kvsift::to_key<M>(g.score(q, id)), id);
  };
  const auto cap = static_cast<std::size_t>(degree_cap);
  kvsift::detail::seed(g, std::span<const id_t>{}, pred, L, cap, ws, insert);
  std::vector<id_t> gathered;
  while (ws.pool.has_unexpanded()) {
    std::vector<id_t> nodes;
    while (int(nodes.size()) < width && ws.pool.has_unexpanded()) {
      nodes.push_back(ws.pool.pop_unexpanded().id);
    }
    gathered.clear();
    for (const id_t u : nodes) {
      if constexpr (!std::is_same_v<P, kvsift::no_filter>) {
        for (const id_t v : kvsift::detail::capped_neighbors(g, u, cap)) {
          r.rejected += !pred(v) && !ws.visited.contains(v) ? 1 : 0;
        }
      }
      kvsift::detail::expand(g, u, pred, cap, walk_through, ws,
                             [&](id_t v) { gathered.push_back(v); });
    }
    for (const id_t v : gathered) insert(v);
  }
  for (std::size_t i = 0; i < std::min(k, ws.pool.size()); ++i) {
    r.ids.push_back(ws.pool[i].id);
    r.scores.push_back(kvsift::from_key<M>(ws.pool[i].key));
  }
  return r;
}

constexpr bool kDense = false, kPaged = true;

kc::decode_search_params topk(int k, int L, kc::graph_metric metric) {
  kc::decode_search_params p;
  p.k = k;
  p.L = L;
  p.metric = metric;
  return p;
}

kc::decode_search_params dipr(float beta, int l0, int max_results,
                              kc::graph_metric metric = kc::graph_metric::inner_product) {
  kc::decode_search_params p;
  p.metric = metric;
  p.mode = kc::decode_search_mode::dipr;
  p.beta = beta;
  p.l0 = l0;
  p.max_results = max_results;
  return p;
}

/// A kernel to set attributes on (never launched).
__global__ void carveout_probe_kernel(int* p) {
  if (p != nullptr) *p = 1;
}

int carveout_of_probe() {
  cudaFuncAttributes a{};
  KVSIFT_CUDA_CHECK(cudaFuncGetAttributes(&a, carveout_probe_kernel));
  return a.preferredShmemCarveout;
}

}  // namespace

// The decode search's block kernel asks, per launch, for the shared memory of the blocks an SM
// must hold (detail::prefer_resident_blocks), so that the rest stays L1. The percent is the
// smallest that holds them (rounded up), at least one block's, at most all.
TEST_CASE("prefer_resident_blocks_asks_for_the_blocks_shared_memory", "[cuda][decode_search]") {
  using kvsift::cuda::detail::prefer_resident_blocks;
  int dev = 0;
  KVSIFT_CUDA_CHECK(cudaGetDevice(&dev));
  const int sm = 228 * 1024;
  const std::size_t block = 28 * 1024;
  prefer_resident_blocks<carveout_probe_kernel>(dev, 4, block, sm);  // 112 of 228 KiB: 49.1%
  CHECK(carveout_of_probe() == 50);
  prefer_resident_blocks<carveout_probe_kernel>(dev, 8, block, sm);  // 224 KiB: 98.2%
  CHECK(carveout_of_probe() == 99);
  prefer_resident_blocks<carveout_probe_kernel>(dev, 9, block, sm);  // more than an SM has
  CHECK(carveout_of_probe() == 100);
  prefer_resident_blocks<carveout_probe_kernel>(dev, 0, block, sm);  // one block at least: 12.3%
  CHECK(carveout_of_probe() == 13);
  prefer_resident_blocks<carveout_probe_kernel>(dev, 4, block, sm);  // back: set again
  CHECK(carveout_of_probe() == 50);
}

TEST_CASE("decode_search_topk_matches_cpu", "[cuda][decode_search]") {
  // Sizes across a 1-key graph, graphs below and above L, and one past the 8192-slot batch.
  const graph_set s = make_set({1, 40, 700, 3000, 5000}, 32, 24, 3);
  const query_batch qb = make_queries(s, 9000, false, false);
  CHECK((compare<kvsift::inner_product, float>(s, qb, topk(10, 32, kc::graph_metric::inner_product),
                                               kDense) == 0));
  CHECK((compare<kvsift::inner_product, __half>(
             s, qb, topk(100, 128, kc::graph_metric::inner_product), kPaged) == 0));
  CHECK(
      (compare<kvsift::l2, __nv_bfloat16>(s, qb, topk(16, 16, kc::graph_metric::l2), kDense) == 0));
  CHECK((compare<kvsift::l2, float>(s, qb, topk(5, 300, kc::graph_metric::l2), kPaged) == 0));
}

TEST_CASE("decode_search_topk_wide_rows_match_cpu", "[cuda][decode_search]") {
  // Width above 32 (several ballot chunks per row), d not a multiple of the vector width.
  const graph_set s = make_set({900, 2500}, 20, 70, 2);
  const query_batch qb = make_queries(s, 500, false, false);
  CHECK((compare<kvsift::inner_product, float>(s, qb, topk(50, 64, kc::graph_metric::inner_product),
                                               kDense) == 0));
  CHECK((compare<kvsift::inner_product, float>(s, qb, topk(50, 64, kc::graph_metric::inner_product),
                                               kPaged) == 0));
}

TEST_CASE("decode_search_seeds_and_expand_limit_match_cpu", "[cuda][decode_search]") {
  // The query's own seeds (the previous decode step's results, in an engine) are visited after
  // the entry points, as beam_search's / dipr_search's extra_entries; expand_limit expands only
  // the pool's best entries. Both against the CPU id for id and vectors scored: plain and
  // filtered, dense and paged, the warp kernel and the block kernel at four and eight warps.
  const graph_set s = make_set({50, 1200, 4000}, 32, 24, 2);
  query_batch plain = make_queries(s, 1200, false, false);
  query_batch ranged = make_queries(s, 1200, false, true);
  add_seeds(s, plain, 40);
  add_seeds(s, ranged, 7);
  for (const int limit : {0, 1, 6, 20, 40}) {
    auto p = topk(20, 40, kc::graph_metric::inner_product);
    p.expand_limit = limit;
    for (const int warps : {1, 4, 8}) {
      p.warps_per_search = warps;
      INFO("expand_limit " << limit << ", warps " << warps);
      CHECK((compare<kvsift::inner_product, float>(s, plain, p, kDense) == 0));
      CHECK((compare<kvsift::inner_product, __half>(s, ranged, p, kPaged) == 0));
    }
  }
  auto l2 = topk(10, 64, kc::graph_metric::l2);
  l2.expand_limit = 8;
  CHECK((compare<kvsift::l2, __nv_bfloat16>(s, plain, l2, kPaged) == 0));
  CHECK((compare<kvsift::inner_product, float>(s, plain, dipr(3.0f, 16, 0), kDense) == 0));
  CHECK((compare<kvsift::inner_product, float>(s, ranged, dipr(4.0f, 16, 0), kPaged) == 0));
  // The seeds change the walk, so the comparison above is not vacuous: fewer vectors are
  // scored with a small limit and seeds than without seeds.
  auto small = topk(20, 40, kc::graph_metric::inner_product);
  small.expand_limit = 6;
  query_batch bare = plain;
  bare.seeds.clear();
  bare.seeds_ld = 0;
  const gpu_result with = run_gpu<float>(s, plain, small, kDense);
  const gpu_result without = run_gpu<float>(s, bare, small, kDense);
  CHECK(with.scored != without.scored);
}

TEST_CASE("decode_search_extra_seeds_follow_the_seeds", "[cuda][decode_search]") {
  // Two seed arrays (decode_step passes its carry and the routed lists) are one list, the
  // second after the first: each query's 60 seeds split 25 + 35 give the CPU's walk from the 60
  // id for id, and the single-array search's results bit for bit; with the second array alone
  // too. Warp and block kernels, filtered and not, with an expand limit (where seeds matter).
  const graph_set s = make_set({50, 1200, 4000}, 32, 24, 2);
  for (const bool filtered : {false, true}) {
    query_batch whole = make_queries(s, 600, false, filtered);
    add_seeds(s, whole, 60);
    query_batch split = whole, second_only = whole;
    split.seeds_ld = 25;
    split.extra_ld = 35;
    split.seeds.clear();
    second_only.seeds.clear();
    second_only.seeds_ld = 0;
    second_only.extra_ld = 60;
    second_only.extra_seeds = whole.seeds;
    for (std::size_t i = 0; i < whole.graph.size(); ++i) {
      const auto row = whole.seeds.begin() + static_cast<std::ptrdiff_t>(i * 60);
      split.seeds.insert(split.seeds.end(), row, row + 25);
      split.extra_seeds.insert(split.extra_seeds.end(), row + 25, row + 60);
    }
    for (const int warps : {1, 4, 8}) {
      auto p = topk(20, 40, kc::graph_metric::inner_product);
      p.expand_limit = 4;
      p.warps_per_search = warps;
      INFO("filtered " << filtered << ", warps " << warps);
      CHECK((compare<kvsift::inner_product, float>(s, split, p, kDense) == 0));
      CHECK((compare<kvsift::inner_product, __half>(s, second_only, p, kPaged) == 0));
      const gpu_result a = run_gpu<float>(s, whole, p, kDense);
      const gpu_result b = run_gpu<float>(s, split, p, kDense);
      CHECK(a.ids == b.ids);
      CHECK(a.scores == b.scores);
      CHECK(a.scored == b.scored);
    }
  }
}

TEST_CASE("decode_search_many_seeds_match_cpu", "[cuda][decode_search]") {
  // Hundreds of seeds per query (route_seeds writes top * list_len), repeated ids and padding
  // among them: the block kernel takes them 32 at a time while none fails the filter, one by one
  // in a chunk with a failing one (walked through), and must still be the CPU's walk id for id.
  // Rows of 24 ids leave room for one chunk per batch of candidates, rows of 100 for three.
  for (const std::size_t width : {24, 100}) {
    const graph_set s = make_set({50, 1200, 4000}, 32, width, 2);
    query_batch plain = make_queries(s, 400, false, false);
    query_batch ranged = make_queries(s, 400, false, true);
    add_seeds(s, plain, 300);
    add_seeds(s, ranged, 130);
    for (const int limit : {0, 12}) {
      auto p = topk(20, 40, kc::graph_metric::inner_product);
      p.expand_limit = limit;
      for (const int warps : {4, 8}) {
        p.warps_per_search = warps;
        for (const bool through : {true, false}) {
          p.walk_through = through;
          INFO("width " << width << ", expand_limit " << limit << ", warps " << warps
                        << ", walk_through " << through);
          CHECK((compare<kvsift::inner_product, float>(s, plain, p, kDense) == 0));
          CHECK((compare<kvsift::inner_product, __half>(s, ranged, p, kPaged) == 0));
        }
      }
    }
  }
}

TEST_CASE("decode_search_entry_prefix_matches_cpu", "[cuda][decode_search]") {
  // entry_prefix enters each search at its graph's ids [0, entry_prefix) after the entry points
  // and the query's seeds (a decode step's sinks), as the CPU's beam_search_params /
  // dipr_params::entry_prefix: id for id and vectors scored, with and without seeds and a
  // filter (the prefix's ids then fail it and are walked through), with and without the
  // walk-through, warp and block kernels; a prefix beyond a graph's size (the graph of 60 keys)
  // enters its ids only.
  const graph_set s = make_set({60, 1200, 4000}, 32, 24, 2);
  query_batch ranged = make_queries(s, 1200, true, true);
  query_batch plain = make_queries(s, 1200, false, false);
  add_seeds(s, plain, 9);
  for (const int prefix : {3, 64}) {
    for (const bool through : {true, false}) {
      auto p = topk(20, 40, kc::graph_metric::inner_product);
      p.entry_prefix = prefix;
      p.walk_through = through;
      for (const int warps : {1, 8}) {
        p.warps_per_search = warps;
        INFO("entry_prefix " << prefix << ", walk_through " << through << ", warps " << warps);
        CHECK((compare<kvsift::inner_product, float>(s, ranged, p, kDense) == 0));
        CHECK((compare<kvsift::inner_product, __half>(s, plain, p, kPaged) == 0));
      }
      auto d = dipr(4.0f, 16, 0);
      d.entry_prefix = prefix;
      d.walk_through = through;
      CHECK((compare<kvsift::inner_product, __half>(s, ranged, d, kPaged) == 0));
      CHECK((compare<kvsift::inner_product, float>(s, plain, d, kDense) == 0));
    }
  }
  // The prefix changes the walks, so the comparisons above are not vacuous.
  auto p = topk(20, 40, kc::graph_metric::inner_product);
  const gpu_result without = run_gpu<float>(s, ranged, p, kDense);
  p.entry_prefix = 3;
  const gpu_result with = run_gpu<float>(s, ranged, p, kDense);
  CHECK(with.scored != without.scored);
}

TEST_CASE("decode_search_max_hops_matches_cpu", "[cuda][decode_search]") {
  // max_hops stops a top-k walk after that many expanded nodes: with expand_width 1 the CPU's
  // beam_search with the same cap, id for id and vectors scored (warp kernel, block kernel at
  // four and eight warps; plain and filtered, dense and paged, seeds too).
  const graph_set s = make_set({50, 1200, 4000}, 32, 24, 2);
  query_batch plain = make_queries(s, 1200, false, false);
  query_batch ranged = make_queries(s, 1200, false, true);
  add_seeds(s, ranged, 7);
  for (const int hops : {1, 3, 10, 25}) {
    auto p = topk(20, 40, kc::graph_metric::inner_product);
    p.max_hops = hops;
    for (const int warps : {1, 4, 8}) {
      p.warps_per_search = warps;
      INFO("max_hops " << hops << ", warps " << warps);
      CHECK((compare<kvsift::inner_product, float>(s, plain, p, kDense) == 0));
      CHECK((compare<kvsift::inner_product, __half>(s, ranged, p, kPaged) == 0));
    }
  }
  // The cap binds: a search capped at 10 hops scores fewer vectors than one without a cap,
  // and a wide walk (16 nodes a step) capped at 24 hops takes two steps, the second of 8.
  auto p = topk(20, 40, kc::graph_metric::inner_product);
  const gpu_result free_walk = run_gpu<float>(s, plain, p, kDense);
  p.max_hops = 10;
  const gpu_result capped = run_gpu<float>(s, plain, p, kDense);
  std::uint64_t a = 0, b = 0;
  for (std::size_t i = 0; i < capped.scored.size(); ++i) {
    a += capped.scored[i];
    b += free_walk.scored[i];
  }
  CHECK(a < b);
  p.expand_width = 16;
  p.max_hops = 24;
  const gpu_result two_steps = run_gpu<float>(s, plain, p, kDense);
  p.max_hops = 32;
  const gpu_result full_steps = run_gpu<float>(s, plain, p, kDense);
  CHECK(two_steps.scored != full_steps.scored);
}

TEST_CASE("decode_search_filtered_matches_cpu", "[cuda][decode_search]") {
  // id ranges: the static window excluded, a selective prefix (2-hop walk and the fallback
  // seeding), random ranges.
  const graph_set s = make_set({60, 1200, 4000}, 32, 24, 2);
  const query_batch qb = make_queries(s, 2000, false, true);
  CHECK((compare<kvsift::inner_product, float>(s, qb, topk(20, 40, kc::graph_metric::inner_product),
                                               kDense) == 0));
  CHECK((compare<kvsift::l2, __half>(s, qb, topk(20, 40, kc::graph_metric::l2), kPaged) == 0));
  CHECK((compare<kvsift::inner_product, float>(s, qb, dipr(4.0f, 16, 0), kDense) == 0));
  // Without the walk-through (a failing neighbour dropped), as the CPU's walk_through = false.
  auto t = topk(20, 40, kc::graph_metric::inner_product);
  t.walk_through = false;
  CHECK((compare<kvsift::inner_product, float>(s, qb, t, kDense) == 0));
  auto d = dipr(4.0f, 16, 0);
  d.walk_through = false;
  CHECK((compare<kvsift::inner_product, __half>(s, qb, d, kPaged) == 0));
}

TEST_CASE("decode_search_dipr_matches_cpu", "[cuda][decode_search]") {
  const graph_set s = make_set({1, 50, 900, 4000}, 32, 24, 3);
  const query_batch plain = make_queries(s, 3000, false, false);
  const query_batch seeded = make_queries(s, 3000, true, false);
  CHECK((compare<kvsift::inner_product, float>(s, plain, dipr(3.0f, 16, 0), kDense) == 0));
  CHECK((compare<kvsift::inner_product, __half>(s, seeded, dipr(5.0f, 32, 0), kPaged) == 0));
  CHECK((compare<kvsift::inner_product, float>(s, seeded, dipr(0.0f, 8, 0), kDense) == 0));
  CHECK(
      (compare<kvsift::l2, float>(s, plain, dipr(6.0f, 16, 0, kc::graph_metric::l2), kDense) == 0));
  // A cap the wide range reaches: the stop must happen at the same visit as on the CPU.
  CHECK((compare<kvsift::inner_product, float>(s, plain, dipr(12.0f, 8, 40), kDense) == 0));
}

TEST_CASE("decode_search_dipr_max_hops_matches_cpu", "[cuda][decode_search]") {
  // A DIPR walk about to expand one node more than max_hops stops and is capped: with
  // expand_width 1 the CPU's dipr_search with the same cap, id for id, vectors scored and the
  // per-query capped flag (plain and filtered, dense and paged, seeds too).
  const graph_set s = make_set({50, 1200, 4000}, 32, 24, 2);
  const query_batch plain = make_queries(s, 1200, false, false);
  query_batch ranged = make_queries(s, 1200, true, true);
  add_seeds(s, ranged, 5);
  for (const int hops : {1, 3, 10, 40}) {
    auto p = dipr(6.0f, 16, 0);
    p.max_hops = hops;
    INFO("max_hops " << hops);
    CHECK((compare<kvsift::inner_product, float>(s, plain, p, kDense) == 0));
    CHECK((compare<kvsift::inner_product, __half>(s, ranged, p, kPaged) == 0));
  }
  // The wider walk: a step takes the nodes the cap leaves. With 8 hops and 8 nodes a step the
  // searches that need more are capped and score fewer vectors; a cap no search reaches
  // changes nothing, bit for bit.
  auto p = dipr(6.0f, 16, 0);
  p.expand_width = 8;
  const gpu_result free_walk = run_gpu<float>(s, plain, p, kDense);
  p.max_hops = 1 << 20;
  const gpu_result loose = run_gpu<float>(s, plain, p, kDense);
  CHECK(loose.ids == free_walk.ids);
  CHECK(loose.scored == free_walk.scored);
  CHECK(loose.capped == free_walk.capped);
  p.max_hops = 8;
  const gpu_result tight = run_gpu<float>(s, plain, p, kDense);
  std::size_t capped = 0, fewer = 0, bad = 0;
  for (std::size_t i = 0; i < tight.scored.size(); ++i) {
    capped += tight.capped[i];
    fewer += tight.scored[i] < free_walk.scored[i] ? 1 : 0;
    bad += tight.scored[i] > free_walk.scored[i] ? 1 : 0;
    bad += tight.capped[i] == 0u && tight.scored[i] != free_walk.scored[i] ? 1 : 0;
  }
  CHECK(bad == 0);
  CHECK(capped > 0);
  CHECK(fewer > 0);  // (a capped walk may rarely miss only steps that find nothing new)
  CHECK((tight.status & kc::decode_status_capped) != 0u);
}

TEST_CASE("decode_search_degree_cap_matches_cpu", "[cuda][decode_search]") {
  // Caps below the row width (one chunk, several chunks) and at it, filtered and not, top-k and
  // DIPR: the CPU search with the same cap is the oracle.
  const graph_set s = make_set({700, 3000}, 32, 70, 2);
  const query_batch plain = make_queries(s, 1500, false, false);
  const query_batch ranged = make_queries(s, 1500, false, true);
  for (const int cap : {5, 40, 70}) {
    auto t = topk(20, 40, kc::graph_metric::inner_product);
    t.degree_cap = cap;
    CHECK((compare<kvsift::inner_product, float>(s, plain, t, kDense) == 0));
    CHECK((compare<kvsift::inner_product, __half>(s, ranged, t, kPaged) == 0));
    auto d = dipr(4.0f, 16, 0);
    d.degree_cap = cap;
    CHECK((compare<kvsift::inner_product, float>(s, ranged, d, kDense) == 0));
  }
}

TEST_CASE("decode_search_model_head_dims_match_cpu", "[cuda][decode_search]") {
  // The head dims of real models (64, 128), f32/f16/bf16, dense and paged: rows of 16 and 32
  // vectors, so the row-load loop runs whole chunks (the other tests use d = 32).
  const graph_set s64 = make_set({1500, 900, 1}, 64, 40, 2);
  const query_batch q64 = make_queries(s64, 300, false, false);
  CHECK((compare<kvsift::inner_product, float>(
             s64, q64, topk(20, 64, kc::graph_metric::inner_product), kDense) == 0));
  CHECK((compare<kvsift::l2, float>(s64, q64, topk(10, 40, kc::graph_metric::l2), kPaged) == 0));
  const graph_set s128 = make_set({1200, 700}, 128, 36, 2);
  const query_batch q128 = make_queries(s128, 300, true, true);
  CHECK((compare<kvsift::inner_product, __half>(
             s128, q128, topk(16, 48, kc::graph_metric::inner_product), kPaged) == 0));
  CHECK((compare<kvsift::l2, __nv_bfloat16>(s128, q128, topk(16, 48, kc::graph_metric::l2),
                                            kDense) == 0));
  CHECK((compare<kvsift::inner_product, __half>(s128, q128, dipr(6.0f, 16, 0), kPaged) == 0));
}

TEST_CASE("decode_search_page_sizes_match_cpu", "[cuda][decode_search]") {
  // A key's page and slot come from a shift for power-of-two page sizes and from a division
  // for the others: one token per page, a page size that is not a power of two, and one past
  // the graphs' sizes; the pages are scattered (run_gpu), so a wrong slot reads another key.
  const graph_set s = make_set({700, 1300}, 32, 24, 2);
  const query_batch plain = make_queries(s, 400, false, false);
  const query_batch ranged = make_queries(s, 400, true, true);
  for (const int page : {1, 12, 64, 2048}) {
    CAPTURE(page);
    CHECK((compare<kvsift::inner_product, __half>(
               s, plain, topk(20, 40, kc::graph_metric::inner_product), kPaged, 0, page) == 0));
    CHECK((compare<kvsift::l2, float>(s, ranged, topk(10, 32, kc::graph_metric::l2), kPaged, 0,
                                      page) == 0));
    CHECK((compare<kvsift::inner_product, __half>(s, ranged, dipr(4.0f, 16, 0), kPaged, 0, page) ==
           0));
  }
}

TEST_CASE("decode_search_visited_in_workspace_matches_cpu", "[cuda][decode_search]") {
  // Graphs declared larger than 2^18 keys keep their visited bitsets in the workspace, not in
  // shared memory: the same walks, filtered and not, top-k and DIPR.
  const graph_set s = make_set({50, 1200, 4000}, 32, 24, 2);
  // More queries than the 8192 concurrent slots: a slot's bitset is reused and must be cleared.
  const query_batch plain = make_queries(s, 9000, false, false);
  const query_batch ranged = make_queries(s, 600, false, true);
  constexpr std::int64_t big = (std::int64_t{1} << 18) + 1;
  const auto t = topk(20, 40, kc::graph_metric::inner_product);
  CHECK((compare<kvsift::inner_product, float>(s, plain, t, kDense, big) == 0));
  CHECK((compare<kvsift::inner_product, __half>(s, ranged, t, kPaged, big) == 0));
  CHECK((compare<kvsift::inner_product, float>(s, ranged, dipr(4.0f, 16, 0), kDense, big) == 0));
}

TEST_CASE("decode_search_wide_walk_matches_cpu_model", "[cuda][decode_search]") {
  // expand_width > 1 expands a step's nodes as one batch (all row ids loaded, then all visited
  // updates); with a filter it must fall back to one-by-one expansion whenever a fresh id
  // fails it, unless walk_through is off (failing ids then marked and dropped). cpu_wide_walk is
  // the walk both must equal, id for id and vectors scored, with and without filters (selective
  // ones cross filtered-out regions through 2-hop walks), over dense and paged keys, with the
  // visited sets in shared memory and in the workspace.
  const graph_set s = make_set({700, 3000}, 32, 70, 2);
  const query_batch plain = make_queries(s, 600, false, false);
  const query_batch filtered = make_queries(s, 600, false, true);
  {
    // The model itself: width 1 must be beam_search (the CPU walk the GPU equals at width 1).
    kvsift::search_workspace ws;
    int differ = 0;
    for (std::size_t i = 0; i < filtered.graph.size(); ++i) {
      const auto g = cpu_view<kvsift::inner_product>(s, std::size_t(filtered.graph[i]));
      const kvsift::id_range pred{filtered.first[i], filtered.last[i]};
      const wide_result w = cpu_wide_walk(g, filtered.q.data() + i * s.d, 20, 48, 1, 0, pred, ws);
      std::vector<id_t> ids(20);
      std::vector<float> sc(20);
      kvsift::beam_search_params bp;
      bp.k = 20;
      bp.L = 48;
      const auto st = kvsift::beam_search(
          g, std::span<const float>(filtered.q.data() + i * s.d, s.d), bp, ws, ids, sc, pred);
      ids.resize(st.count);
      differ += ids == w.ids && st.distance_computations == w.scored ? 0 : 1;
    }
    CHECK(differ == 0);
  }
  struct setting {
    int width;
    bool use_filter, walk_through;
  };
  for (const setting st :
       {setting{2, false, true}, setting{8, false, true}, setting{2, true, true},
        setting{8, true, true}, setting{1, true, false}, setting{8, true, false},
        setting{32, false, true}, setting{16, true, true}, setting{32, true, false}}) {
    const int width = st.width;
    const bool use_filter = st.use_filter;
    const query_batch& qb = use_filter ? filtered : plain;
    auto p = topk(20, 48, kc::graph_metric::inner_product);
    p.expand_width = width;
    p.degree_cap = width == 8 ? 50 : 0;
    p.walk_through = st.walk_through;
    int differ[3] = {0, 0, 0};
    const gpu_result runs[3] = {run_gpu<float>(s, qb, p, kDense), run_gpu<__half>(s, qb, p, kPaged),
                                run_gpu<float>(s, qb, p, kDense, 16, std::int64_t(1) << 19)};
    kvsift::search_workspace ws;
    std::size_t rejected = 0;  // queries whose walk met a filtered-out id
    for (std::size_t i = 0; i < qb.graph.size(); ++i) {
      const auto g = cpu_view<kvsift::inner_product>(s, std::size_t(qb.graph[i]));
      const float* q = qb.q.data() + i * s.d;
      const wide_result w =
          use_filter ? cpu_wide_walk(g, q, 20, 48, width, p.degree_cap,
                                     kvsift::id_range{qb.first[i], qb.last[i]}, ws, st.walk_through)
                     : cpu_wide_walk(g, q, 20, 48, width, p.degree_cap, kvsift::no_filter{}, ws);
      rejected += w.rejected > 0 ? 1 : 0;
      for (int r = 0; r < 3; ++r) {
        const gpu_result& got = runs[r];
        bool same = got.counts[i] == w.ids.size() && got.scored[i] == w.scored;
        for (std::size_t j = 0; same && j < w.ids.size(); ++j) {
          same = got.ids[i * 20 + j] == w.ids[j] && got.scores[i * 20 + j] == w.scores[j];
        }
        differ[r] += same ? 0 : 1;
      }
    }
    INFO("expand_width " << width << ", filter " << use_filter << ", walk_through "
                         << st.walk_through);
    CHECK(differ[0] == 0);
    CHECK(differ[1] == 0);
    CHECK(differ[2] == 0);
    for (const gpu_result& got : runs) CHECK(got.status == 0u);
    // The filtered batch must meet filtered-out ids often, or the fallback is not exercised.
    if (use_filter) CHECK(rejected > qb.graph.size() / 4);
  }
}

TEST_CASE("decode_search_block_kernel_equals_warp_kernel", "[cuda][decode_search]") {
  // Top-k runs on the block kernel (four or eight warps per search) unless warps_per_search =
  // 1. All walk the same way and sum each dot product in the same order, so on real-valued keys,
  // where near-ties make any difference in scoring or candidates visible, they must agree bit
  // for bit: ids, scores, counts and vectors scored. The CPU tests above hold the block kernel
  // to beam_search on integer data; this holds the warp kernel's top-k walk to it.
  graph_set s = make_set({900, 3000, 5000}, 64, 48, 3);
  for (auto& x : s.keys) x = uniform(-1.0f, 1.0f);
  query_batch plain = make_queries(s, 700, false, false);
  query_batch ranged = make_queries(s, 700, false, true);
  for (auto* qb : {&plain, &ranged}) {
    for (auto& x : qb->q) x = uniform(-1.0f, 1.0f);
  }
  struct setting {
    int expand, degree_cap;
    bool filtered, walk_through, paged;
    std::int64_t declared_keys;  // above 2^18: visited sets in the workspace
  };
  for (const setting st :
       {setting{1, 0, false, true, false, 0}, setting{8, 0, false, true, true, 0},
        setting{4, 20, true, true, true, 0}, setting{8, 0, true, false, false, 0},
        setting{2, 0, true, true, false, std::int64_t(1) << 19},
        setting{16, 0, true, true, true, 0}, setting{32, 0, false, true, false, 0},
        setting{32, 10, true, false, true, std::int64_t(1) << 19}}) {
    auto p = topk(32, 96, kc::graph_metric::inner_product);
    p.expand_width = st.expand;
    // A hop cap that ends most searches mid-step (not a multiple of the width) for the wide
    // settings: the last step takes fewer nodes in both kernels.
    p.max_hops = st.expand >= 8 ? 3 * st.expand + 5 : 0;
    p.degree_cap = st.degree_cap;
    p.walk_through = st.walk_through;
    const query_batch& qb = st.filtered ? ranged : plain;
    p.warps_per_search = 1;
    const gpu_result warp = run_gpu<__half>(s, qb, p, st.paged, 16, st.declared_keys);
    p.warps_per_search = 0;
    const gpu_result block = run_gpu<__half>(s, qb, p, st.paged, 16, st.declared_keys);
    p.warps_per_search = 4;
    const gpu_result block4 = run_gpu<__half>(s, qb, p, st.paged, 16, st.declared_keys);
    p.warps_per_search = 8;
    const gpu_result block8 = run_gpu<__half>(s, qb, p, st.paged, 16, st.declared_keys);
    // A batch small enough for eight-warp blocks at once (the default's other choice).
    const query_batch few = first_queries(qb, 100, s.d);
    p.warps_per_search = 1;
    const gpu_result warp_few = run_gpu<__half>(s, few, p, st.paged, 16, st.declared_keys);
    p.warps_per_search = 0;
    const gpu_result block_few = run_gpu<__half>(s, few, p, st.paged, 16, st.declared_keys);
    INFO("expand " << st.expand << ", degree_cap " << st.degree_cap << ", filtered " << st.filtered
                   << ", walk_through " << st.walk_through << ", paged " << st.paged);
    CHECK(block.ids == warp.ids);
    CHECK(block.scores == warp.scores);
    CHECK(block.counts == warp.counts);
    CHECK(block.scored == warp.scored);
    CHECK(block4.ids == block.ids);
    CHECK(block4.scored == block.scored);
    CHECK(block8.ids == warp.ids);
    CHECK(block8.scores == warp.scores);
    CHECK(block8.counts == warp.counts);
    CHECK(block8.scored == warp.scored);
    CHECK(block8.status == 0u);
    CHECK(block_few.ids == warp_few.ids);
    CHECK(block_few.scores == warp_few.scores);
    CHECK(block_few.scored == warp_few.scored);
    CHECK(warp.status == 0u);
    CHECK(block.status == 0u);
    std::size_t full = 0;  // rows that filled: the walks found something to agree on
    for (const auto c : block.counts) full += c == 32u ? 1 : 0;
    CHECK(full > qb.graph.size() / 2);
  }
}

TEST_CASE("decode_search_wider_expansion_returns_true_scores", "[cuda][decode_search]") {
  // expand_width > 1 walks differently from the CPU: check what must still hold (distinct
  // ids of the query's graph, true scores, best first) and that it finds as much of the exact
  // top-k as the CPU walk (within a small margin) on this data. The data is seeded here: a
  // graph whose entries are dead ends (make_set makes some rows empty) returns padding, so the
  // test must not depend on how many random numbers the tests before it drew.
  rng().seed(20261123);
  const graph_set s = make_set({2000, 3000}, 32, 24, 2);
  const query_batch qb = make_queries(s, 400, false, false);
  auto p = topk(20, 64, kc::graph_metric::inner_product);
  const gpu_result one = run_gpu<float>(s, qb, p, kDense);
  p.expand_width = 4;
  const gpu_result four = run_gpu<float>(s, qb, p, kDense);
  std::size_t hit1 = 0, hit4 = 0, bad = 0;
  for (std::size_t i = 0; i < qb.graph.size(); ++i) {
    const auto g = cpu_view<kvsift::inner_product>(s, std::size_t(qb.graph[i]));
    const float* q = qb.q.data() + i * s.d;
    std::vector<std::pair<float, id_t>> all;
    for (id_t k = 0; k < g.size(); ++k) all.push_back({g.score(q, k), k});
    std::sort(all.begin(), all.end(), [](auto a, auto b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    const float kth = all[19].first;
    for (std::size_t j = 0; j < 20; ++j) {
      const id_t a = one.ids[i * 20 + j], b = four.ids[i * 20 + j];
      if (b >= g.size() || four.scores[i * 20 + j] != g.score(q, b)) ++bad;
      if (j > 0 && four.scores[i * 20 + j] > four.scores[i * 20 + j - 1]) ++bad;
      hit1 += a < g.size() && g.score(q, a) >= kth;
      hit4 += b < g.size() && g.score(q, b) >= kth;
    }
  }
  CHECK(bad == 0);
  CHECK(four.status == 0u);
  CHECK(hit4 + hit1 / 50 >= hit1);
}

namespace {

/// Two launches over the same queries returned the same results: counts, keys scored, best
/// scores, status, and each row's ids and scores in order.
void check_same_results(const gpu_result& a, const gpu_result& b) {
  REQUIRE(a.capacity == b.capacity);
  CHECK(a.counts == b.counts);
  CHECK(a.scored == b.scored);
  CHECK(a.best == b.best);
  CHECK(a.status == b.status);
  std::size_t diff = 0;
  for (std::size_t i = 0; i < a.counts.size() && i < b.counts.size(); ++i) {
    for (std::size_t j = 0; j < a.counts[i] && j < std::size_t(a.capacity); ++j) {
      const std::size_t at = i * std::size_t(a.capacity) + j;
      diff += a.ids[at] != b.ids[at] || a.scores[at] != b.scores[at];
    }
  }
  CHECK(diff == 0);
}

}  // namespace

TEST_CASE("decode_search_dipr_wider_walk_equals_its_filtered_walk_under_an_all_pass_filter",
          "[cuda][decode_search]") {
  // The wider DIPR walk expands a step's nodes with ds_expand_one, whose unfiltered and
  // filtered versions are separate code. A filter every id passes walks the same graph the
  // same way, so both must return the same ids, scores, counts, keys scored and best score.
  // Seeded and unseeded queries, seeds given as scores and as entry points, a cap that ends
  // some searches, dense and paged keys. Mutants that fail it: the unfiltered expansion
  // dropping each row's last neighbour; a variant that expanded an unfiltered step's nodes
  // together (docs/decode_search.md, not on main) reading the step's rows in reverse order.
  const graph_set s = make_set({2000, 3000, 700}, 32, 24, 2);
  query_batch qb = make_queries(s, 600, true, false);
  add_seeds(s, qb, 3);
  query_batch all_pass = qb;
  for (const std::int32_t g : qb.graph) {
    all_pass.first.push_back(0);
    all_pass.last.push_back(static_cast<std::uint32_t>(s.sizes[std::size_t(g)]));
  }
  std::size_t compared = 0, capped_runs = 0;
  for (const int width : {2, 4, 8}) {
    for (const auto& [beta, cap] : {std::pair{6.0f, 0}, std::pair{40.0f, 16}}) {
      for (const bool paged : {false, true}) {
        auto p = dipr(beta, 16, cap);
        p.expand_width = width;
        const gpu_result a = run_gpu<float>(s, qb, p, paged);
        const gpu_result b = run_gpu<float>(s, all_pass, p, paged);
        check_same_results(a, b);
        compared += qb.graph.size();
        capped_runs += (a.status & kc::decode_status_capped) != 0u;
      }
    }
  }
  INFO("queries compared: " << compared);
  CHECK(capped_runs >= 1u);  // beta 40 with a cap of 16 ends some searches
}

TEST_CASE("decode_search_dipr_without_walk_through_walks_the_rows_without_filtered_ids",
          "[cuda][decode_search]") {
  // DIPR with walk_through = false (as in a decode step that leaves its window out): a
  // neighbour outside the filter is marked visited and dropped, not walked through. That is
  // the walk-through walk over the same graph with those ids deleted from every row (a failing
  // seed is still walked through, over its passing neighbours, on both): ids, scores, counts,
  // keys scored and best score must agree, at every expand width, seeded and not.
  const graph_set s = make_set({2000, 3000, 700}, 32, 24, 2);
  query_batch qb = make_queries(s, 600, true, false);
  // One filter per graph, a decode step's: everything but a few sinks and a recent window.
  for (const std::int32_t g : qb.graph) {
    const auto n = static_cast<std::uint32_t>(s.sizes[std::size_t(g)]);
    qb.first.push_back(3);
    qb.last.push_back(n - 60);
  }
  graph_set dropped = s;
  for (std::size_t g = 0; g < s.sizes.size(); ++g) {
    const auto n = static_cast<id_t>(s.sizes[g]);
    for (std::size_t i = 0; i < s.sizes[g]; ++i) {
      id_t* row = dropped.adj.data() + (std::size_t(s.offsets[g]) + i) * s.width;
      id_t* end = std::remove_if(row, row + s.width, [&](id_t v) {
        return v != kvsift::invalid_id && (v < 3 || v >= n - 60);
      });
      std::fill(end, row + s.width, kvsift::invalid_id);
    }
  }
  std::size_t compared = 0, differs_from_walk_through = 0;
  for (const int width : {1, 4, 8}) {
    for (const bool paged : {false, true}) {
      auto p = dipr(6.0f, 16, 0);
      p.expand_width = width;
      const gpu_result through = run_gpu<float>(s, qb, p, paged);
      const gpu_result b = run_gpu<float>(dropped, qb, p, paged);
      p.walk_through = false;
      const gpu_result a = run_gpu<float>(s, qb, p, paged);
      check_same_results(a, b);
      std::size_t outside = 0;
      for (std::size_t i = 0; i < qb.graph.size(); ++i) {
        for (std::size_t j = 0; j < a.counts[i] && j < std::size_t(a.capacity); ++j) {
          const id_t v = a.ids[i * std::size_t(a.capacity) + j];
          outside += v < qb.first[i] || v >= qb.last[i];
        }
      }
      CHECK(outside == 0);
      compared += qb.graph.size();
      differs_from_walk_through += a.scored != through.scored;
    }
  }
  INFO("queries compared: " << compared);
  CHECK(differs_from_walk_through == 6u);  // the filter changes every walk's course
}

TEST_CASE("decode_search_dipr_wider_walk_keeps_the_range_contract", "[cuda][decode_search]") {
  // DIPR with expand_width > 1 floods the in-range region in discovery order, several nodes per
  // step: check what must hold (distinct ids of the graph, true scores, every result within
  // beta of the reported best, that best a true score) and that it finds as much of the exact
  // DIPR set (every key within beta of the query's true best) as the CPU-order walk.
  const graph_set s = make_set({2000, 3000}, 32, 24, 2);
  const query_batch qb = make_queries(s, 400, false, false);
  auto p = dipr(6.0f, 16, 0);
  const gpu_result one = run_gpu<float>(s, qb, p, kDense);
  p.expand_width = 4;
  const gpu_result four = run_gpu<float>(s, qb, p, kDense);
  const auto cap = static_cast<std::size_t>(four.capacity);
  std::size_t hit1 = 0, hit4 = 0, exact_total = 0, bad = 0;
  for (std::size_t i = 0; i < qb.graph.size(); ++i) {
    const auto g = cpu_view<kvsift::inner_product>(s, std::size_t(qb.graph[i]));
    const float* q = qb.q.data() + i * s.d;
    float top = -std::numeric_limits<float>::infinity();
    for (id_t k = 0; k < g.size(); ++k) top = std::max(top, g.score(q, k));
    std::vector<char> in_exact(g.size(), 0);
    for (id_t k = 0; k < g.size(); ++k) {
      in_exact[k] = g.score(q, k) >= top - p.beta;
      exact_total += in_exact[k];
    }
    std::vector<char> seen(g.size(), 0);
    bool best_found = false;
    for (std::size_t j = 0; j < four.counts[i] && j < cap; ++j) {
      const id_t b = four.ids[i * cap + j];
      if (b >= g.size() || seen[b] || four.scores[i * cap + j] != g.score(q, b)) {
        ++bad;
        continue;
      }
      seen[b] = 1;
      if (g.score(q, b) < four.best[i] - p.beta) ++bad;
      best_found |= g.score(q, b) == four.best[i];
      hit4 += in_exact[b];
    }
    if (four.counts[i] > 0 && !best_found) ++bad;
    for (std::size_t j = 0; j < one.counts[i] && j < cap; ++j) {
      const id_t a = one.ids[i * cap + j];
      hit1 += a < g.size() && in_exact[a];
    }
  }
  CHECK(bad == 0);
  CHECK(four.status == 0u);
  std::printf("    exact DIPR keys %zu, found by the CPU-order walk %zu, by the wider walk %zu\n",
              exact_total, hit1, hit4);
  CHECK(hit1 > 0);  // the data gives the walks something to find
  CHECK(hit4 + hit1 / 50 >= hit1);
}

TEST_CASE("decode_search_nonfinite_query_returns_nothing", "[cuda][decode_search]") {
  const graph_set s = make_set({500}, 16, 16, 1);
  query_batch qb = make_queries(s, 4, true, false);
  qb.q[1] = std::numeric_limits<float>::quiet_NaN();
  qb.q[16 + 3] = std::numeric_limits<float>::infinity();
  // Query 3's seed is far below any score, so its best comes from the data.
  qb.seed = {std::numeric_limits<float>::quiet_NaN(), 7.0f, std::numeric_limits<float>::quiet_NaN(),
             -1000.0f};
  const gpu_result t = run_gpu<float>(s, qb, topk(10, 10, kc::graph_metric::inner_product), kDense);
  std::printf("    top-k counts %u %u %u %u\n", t.counts[0], t.counts[1], t.counts[2], t.counts[3]);
  CHECK(t.counts[0] == 0);
  CHECK(t.counts[1] == 0);
  CHECK(t.counts[2] > 0);  // (as many as the random graph's walk finds: the CPU's count)
  CHECK((compare<kvsift::inner_product, float>(s, qb, topk(10, 10, kc::graph_metric::inner_product),
                                               kDense) == 0));
  CHECK((t.ids[0] == kvsift::invalid_id && t.scores[0] == -std::numeric_limits<float>::infinity()));
  const gpu_result d = run_gpu<float>(s, qb, dipr(2.0f, 8, 0), kDense);
  std::printf("    DIPR counts %u %u %u %u\n", d.counts[0], d.counts[1], d.counts[2], d.counts[3]);
  CHECK(d.counts[0] == 0);
  CHECK(d.counts[1] == 0);
  CHECK(d.counts[3] > 0);
  CHECK(d.best[0] == -std::numeric_limits<float>::infinity());  // no seed: the worst score
  CHECK(d.best[1] == 7.0f);                                     // the seed, as on the CPU
  CHECK((compare<kvsift::inner_product, float>(s, qb, dipr(2.0f, 8, 0), kDense) == 0));
}

TEST_CASE("decode_search_device_errors_set_status", "[cuda][decode_search]") {
  graph_set s = make_set({300, 200}, 16, 16, 1);
  query_batch qb = make_queries(s, 4, false, false);
  qb.graph[1] = 7;                                              // no such graph
  s.adj[(s.offsets[0] + s.entries[0]) * s.width] = 299 + 1000;  // neighbour past the graph
  const gpu_result r = run_gpu<float>(s, qb, topk(10, 10, kc::graph_metric::inner_product), kDense);
  CHECK((r.status & kc::decode_status_bad_graph) != 0u);
  CHECK((r.counts[1] == 0 && r.ids[10] == kvsift::invalid_id));
  qb.graph = {0, 0, 0, 0};
  const gpu_result r2 =
      run_gpu<float>(s, qb, topk(10, 10, kc::graph_metric::inner_product), kDense);
  CHECK((r2.status & kc::decode_status_bad_id) != 0u);
  CHECK((r2.status & kc::decode_status_bad_graph) == 0u);
  // A reversed filter range is a query error, not an empty answer by accident.
  query_batch qf = make_queries(s, 2, false, true);
  qf.first[0] = 6;
  qf.last[0] = 5;
  const gpu_result r3 = run_gpu<float>(make_set({300, 200}, 16, 16, 1), qf,
                                       topk(10, 10, kc::graph_metric::inner_product), kDense);
  CHECK(((r3.status & kc::decode_status_bad_query) != 0u && r3.counts[0] == 0));
}

TEST_CASE("decode_search_bad_page_table_entry_sets_status", "[cuda][decode_search]") {
  // Graph 0's tokens 16-31 point at no page (-1) or past the pool: every kernel that scores
  // one of them flags decode_status_bad_id and reads nothing there (memcheck); graph 1's
  // searches are untouched. Top-k runs the block kernel, DIPR the warp kernel.
  const graph_set s = make_set({300, 200}, 16, 16, 1);
  query_batch qb = make_queries(s, 64, false, false);
  for (std::size_t i = 0; i < qb.graph.size(); ++i) qb.graph[i] = int(i % 2);
  for (const auto& p : {topk(10, 64, kc::graph_metric::inner_product), dipr(3.0f, 16, 0)}) {
    const gpu_result clean = run_gpu<float>(s, qb, p, kPaged);
    CHECK(clean.status == 0u);
    for (const std::int32_t bad : {-1, 1 << 20}) {
      const gpu_result r = run_gpu<float>(s, qb, p, kPaged, 16, 0, bad);
      CHECK((r.status & kc::decode_status_bad_id) != 0u);
      const auto cap = std::size_t(r.capacity);
      for (std::size_t i = 1; i < qb.graph.size(); i += 2) {
        CHECK(r.counts[i] == clean.counts[i]);
        CHECK(std::equal(r.ids.begin() + i * cap, r.ids.begin() + (i + 1) * cap,
                         clean.ids.begin() + i * cap));
      }
    }
  }
}

TEST_CASE("decode_results_to_csr_compacts_rows", "[cuda][decode_search]") {
  const std::vector<id_t> ids = {
      1, 2, 3, kvsift::invalid_id, 9, 8, kvsift::invalid_id, kvsift::invalid_id, 4, 5, 6, 7};
  const std::vector<std::uint32_t> counts = {3, 0, 4};
  device_buffer<id_t> di(ids);
  device_buffer<std::uint32_t> dc(counts);
  device_buffer<std::int64_t> indptr(4);
  device_buffer<std::int32_t> indices(12);
  kc::decode_results_to_csr(di.get(), dc.get(), 3, 4, indptr.get(), indices.get(), nullptr);
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  const auto ip = indptr.download();
  const auto ix = indices.download();
  CHECK(ip == (std::vector<std::int64_t>{0, 3, 3, 7}));
  CHECK((std::vector<std::int32_t>(ix.begin(), ix.begin() + 7) ==
         std::vector<std::int32_t>{1, 2, 3, 4, 5, 6, 7}));
  // Many rows: the one-block scan's per-thread segments.
  const std::size_t m = 5000;
  std::vector<std::uint32_t> c2(m);
  std::vector<id_t> i2(m * 2);
  std::vector<std::int64_t> want(m + 1, 0);
  for (std::size_t i = 0; i < m; ++i) {
    c2[i] = std::uint32_t(uniform_int(0, 2));
    i2[2 * i] = id_t(i);
    i2[2 * i + 1] = id_t(i + 1);
    want[i + 1] = want[i] + c2[i];
  }
  device_buffer<id_t> d2(i2);
  device_buffer<std::uint32_t> dc2(c2);
  device_buffer<std::int64_t> ip2(m + 1);
  device_buffer<std::int32_t> ix2(m * 2);
  kc::decode_results_to_csr(d2.get(), dc2.get(), std::int64_t(m), 2, ip2.get(), ix2.get(), nullptr);
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(ip2.download() == want);
}

TEST_CASE("decode_search_rejects_bad_input", "[cuda][decode_search]") {
  const graph_set s = make_set({100}, 16, 16, 1);
  device_buffer<id_t> adj(s.adj), ent(s.entries);
  device_buffer<std::int64_t> off(s.offsets);
  device_buffer<float> keys(s.keys), q(std::size_t(16));
  device_buffer<std::int32_t> graph(std::vector<std::int32_t>{0});
  device_buffer<id_t> ids(std::size_t(100));
  device_buffer<std::uint32_t> counts(std::size_t(1));
  kc::graph_set_ref set{adj.get(), off.get(), ent.get(), 1, 16, 1, 100};
  kc::dense_keys_ref<float> k{keys.get(), 16, 16};
  kc::decode_queries qs{q.get(), 16, graph.get()};
  kc::decode_search_outputs out{ids.get(), nullptr, counts.get()};
  kc::decode_search_params p = topk(10, 20, kc::graph_metric::inner_product);
  const std::size_t wb = kc::decode_search_workspace_size(set, 1, p);
  device_buffer<char> ws(wb);
  auto msg = [&](kc::graph_set_ref st, kc::dense_keys_ref<float> keys_in,
                 kc::decode_queries queries_in, std::int64_t m, kc::decode_search_params pp,
                 kc::decode_search_outputs oo, std::size_t bytes) {
    return message_of(
        [&] { kc::decode_search(st, keys_in, queries_in, m, pp, oo, ws.get(), bytes, nullptr); });
  };
  CHECK(msg(set, k, qs, 1, p, out, wb) == "(no exception)");
  auto bad = p;
  bad.L = 5;
  CHECK(contains(msg(set, k, qs, 1, bad, out, wb), "k = 10 <= L"));
  bad = p;
  bad.L = 5000;
  CHECK(contains(msg(set, k, qs, 1, bad, out, wb), "got L = 5000"));
  bad = dipr(-1.0f, 8, 0);
  CHECK(contains(msg(set, k, qs, 1, bad, out, wb), "beta >= 0"));
  bad = p;
  bad.degree_cap = -1;
  CHECK(contains(msg(set, k, qs, 1, bad, out, wb), "degree_cap >= 0 (0 = all), got -1"));
  for (const int e : {-1, kc::max_decode_search_seeds + 1}) {
    bad = p;
    bad.entry_prefix = e;
    CHECK(contains(msg(set, k, qs, 1, bad, out, wb),
                   ("0 <= entry_prefix <= " + std::to_string(kc::max_decode_search_seeds) +
                    ", got " + std::to_string(e))
                       .c_str()));
  }
  bad = dipr(1.0f, 8, 4);
  CHECK(contains(msg(set, k, qs, 1, bad, out, wb), "max_results"));
  bad = dipr(1.0f, 8, 0);
  bad.warps_per_search = 4;
  CHECK(contains(msg(set, k, qs, 1, bad, out, wb), "warps_per_search 0 or 1 for DIPR, got 4"));
  for (const int w : {-1, 2, 16}) {
    bad = p;
    bad.warps_per_search = w;
    CHECK(contains(msg(set, k, qs, 1, bad, out, wb),
                   ("warps_per_search 0, 1, 4 or 8, got " + std::to_string(w)).c_str()));
  }
  bad = dipr(1.0f, 8, 0);
  bad.warps_per_search = 8;
  CHECK(contains(msg(set, k, qs, 1, bad, out, wb), "warps_per_search 0 or 1 for DIPR, got 8"));
  for (const int w : {0, 33}) {
    bad = p;
    bad.expand_width = w;
    CHECK(contains(msg(set, k, qs, 1, bad, out, wb),
                   ("1 <= expand_width <= 32, got " + std::to_string(w)).c_str()));
  }
  bad = p;
  bad.expand_width = 32;
  CHECK(msg(set, k, qs, 1, bad, out, wb) == "(no exception)");
  bad = p;
  bad.expand_limit = 21;
  CHECK(contains(msg(set, k, qs, 1, bad, out, wb), "0 <= expand_limit <= L = 20 (0 = L), got 21"));
  bad.expand_limit = -1;
  CHECK(contains(msg(set, k, qs, 1, bad, out, wb), "got -1"));
  bad = dipr(1.0f, 8, 0);
  bad.expand_limit = 4;
  CHECK(contains(msg(set, k, qs, 1, bad, out, wb), "expected 0 for DIPR, got 4"));
  bad = dipr(1.0f, 8, 0);
  bad.max_hops = -2;
  CHECK(contains(msg(set, k, qs, 1, bad, out, wb), "expected max_hops >= 0 (0 = no cap), got -2"));
  bad = p;
  bad.max_hops = -1;
  CHECK(contains(msg(set, k, qs, 1, bad, out, wb), "expected max_hops >= 0 (0 = no cap), got -1"));
  // The two seed arrays take the same checks, each under its own name.
  auto check_seed_array = [&](const id_t* kc::decode_queries::*array, int kc::decode_queries::*ld,
                              const std::string& name, const std::string& none) {
    INFO(name);
    device_buffer<id_t> seeds(std::size_t(4));
    auto qx = qs;
    qx.*array = seeds.get();
    CHECK(contains(msg(set, k, qx, 1, p, out, wb),
                   (name + " with " + name + "_ld >= 1, or neither").c_str()));
    qx.*ld = 4;
    CHECK(msg(set, k, qx, 1, p, out, wb) == "(no exception)");
    qx.*ld = kc::max_decode_search_seeds + 1;
    CHECK(contains(msg(set, k, qx, 1, p, out, wb), (name + "_ld <= 65536, got 65537").c_str()));
    qx.*array = nullptr;
    qx.*ld = 3;
    CHECK(contains(msg(set, k, qx, 1, p, out, wb), (none + " and " + name + "_ld = 3").c_str()));
    id_t host_seed = 0;
    qx.*array = &host_seed;
    qx.*ld = 1;
    CHECK(contains(msg(set, k, qx, 1, p, out, wb), "optional input or output"));
  };
  check_seed_array(&kc::decode_queries::seeds, &kc::decode_queries::seeds_ld, "seeds", "no seeds");
  check_seed_array(&kc::decode_queries::extra_seeds, &kc::decode_queries::extra_seeds_ld,
                   "extra_seeds", "no extra seeds");
  bad = dipr(1.0f, 8, 0);
  bad.expand_width = 9;
  CHECK(contains(msg(set, k, qs, 1, bad, out, wb), "1 <= expand_width <= 8 for DIPR, got 9"));
  CHECK(contains(msg(set, k, qs, 0, p, out, wb), "1 <= queries"));
  CHECK(contains(msg(set, k, qs, 1, p, out, wb - 4), "too small"));
  auto q2 = qs;
  q2.ld = 8;
  CHECK(contains(msg(set, k, q2, 1, p, out, wb), "stride >= dim = 16"));
  q2 = qs;
  std::uint32_t host_first = 0;
  q2.filter_first = &host_first;
  CHECK(contains(msg(set, k, q2, 1, p, out, wb), "both filter_first and filter_last"));
  auto o2 = out;
  o2.counts = nullptr;
  CHECK(contains(msg(set, k, qs, 1, p, o2, wb), "required"));
  auto s2 = set;
  s2.width = 0;
  CHECK(contains(msg(s2, k, qs, 1, p, out, wb), "adjacency width"));
  s2 = set;
  s2.max_keys = 0;
  CHECK(contains(msg(s2, k, qs, 1, p, out, wb), "max_keys"));
  s2 = set;
  std::vector<id_t> host_adj(s.adj);
  s2.adjacency = host_adj.data();
  CHECK(contains(msg(s2, k, qs, 1, p, out, wb), "adjacency"));
}
