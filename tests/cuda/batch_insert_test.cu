// The GPU batched insert against the CPU `insertable_graph` it mirrors.
//
// Keys and queries are small integers, so every score is exact in f32 (and in f16) whatever
// the summation order: after every launch each graph's rows, its sizes and its training
// queries' kNN lists must equal the CPU's after the same inserts, id for id and in order, tie
// rules included. Two graphs of different data in one set check the per-graph offsets; the
// caps on gathered queries (C) and on key -> query lists (H) bind in most inserts.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#pragma nv_diagnostic push
#pragma nv_diag_suppress 554
#include <kvsift/core/metric.hpp>
#include <kvsift/core/vector_store.hpp>
#include <kvsift/cuda/batch_insert.cuh>
#include <kvsift/index/insertable_graph.hpp>
#include <kvsift/index/roargraph_builder.hpp>
#pragma nv_diagnostic pop

#include "cuda_test.cuh"
#include "test_util.cuh"

namespace {

using namespace kvsift::cuda_test;
using kvsift::id_t;
namespace kc = kvsift::cuda;

constexpr std::size_t m = 121, nq = 20;

/// One graph: integer keys and queries, its build on the first `base` keys, the CPU insertable
/// graph from that build, and the build's training kNN (the GPU state starts from the same).
struct one_graph {
  std::size_t n, d;
  std::vector<float> keys, queries;
  kvsift::knn_result knn;
  kvsift::graph_index<kvsift::view_store<float>> built;
  kvsift::insertable_graph<float> cpu;
  one_graph(std::size_t n_keys, std::size_t dim, std::size_t base, unsigned seed,
            const kvsift::graph_insert_params& ip)
      : n(n_keys), d(dim), keys(n * d), queries(m * d) {
    std::mt19937 gen(seed);
    std::uniform_int_distribution<int> u(-4, 4);
    for (float& v : keys) v = static_cast<float>(u(gen));
    for (float& v : queries) v = static_cast<float>(u(gen));
    kvsift::roargraph_params p;
    p.nq = nq;
    p.M = 6;
    p.L = 32;
    p.threads = 1;
    const kvsift::roargraph_builder<> b(p);
    const kvsift::matrix_view<const float> kv{keys.data(), base, d};
    const kvsift::matrix_view<const float> qv{queries.data(), m, d};
    knn = b.training_knn(kv, qv);
    built = b.build_from_knn(kvsift::view_store<float>(kv), knn);
    cpu = kvsift::insertable_graph<float>(built, qv, knn, ip);
  }
};

template <class T>
struct gpu_case {
  std::size_t G, n, d, R, H;
  std::vector<std::int64_t> offsets, qoffsets;
  device_buffer<T> keys;
  device_buffer<float> queries, knn_keys, worst, best_key;
  device_buffer<id_t> adj, entries, knn_ids, best_id, holders;
  device_buffer<std::uint32_t> sizes, holder_counts, layouts, status;
  device_buffer<std::int64_t> offsets_d, qoffsets_d;
  kc::graph_set_ref set;
  kc::batch_insert_state_ref st;

  gpu_case(const std::vector<one_graph>& gs, std::size_t base, int holder_cap)
      : G(gs.size()),
        n(gs[0].n),
        d(gs[0].d),
        R(gs[0].built.max_degree()),
        H(static_cast<std::size_t>(holder_cap)) {
    std::vector<T> k;
    std::vector<float> q, kk, wk, bk;
    std::vector<id_t> a(G * n * R, kvsift::invalid_id), e, ki, bi, h;
    std::vector<std::uint32_t> sz, hc, lo;
    std::size_t max_entries = 0;
    for (const auto& g : gs) max_entries = std::max(max_entries, g.built.entry_points().size());
    for (std::size_t gi = 0; gi < G; ++gi) {
      const one_graph& g = gs[gi];
      offsets.push_back(static_cast<std::int64_t>(gi * n));
      qoffsets.push_back(static_cast<std::int64_t>(gi * m));
      for (const float v : g.keys) k.push_back(from_float<T>(v));
      q.insert(q.end(), g.queries.begin(), g.queries.end());
      std::copy(g.built.adjacency().begin(), g.built.adjacency().end(), a.begin() + gi * n * R);
      auto ep = g.built.entry_points();
      for (std::size_t j = 0; j < max_entries; ++j) {
        e.push_back(j < ep.size() ? ep[j] : kvsift::invalid_id);
      }
      const kc::insert_lists l =
          kc::make_insert_lists(g.knn.ids, g.knn.scores, m, nq, n, holder_cap);
      ki.insert(ki.end(), l.knn_ids.begin(), l.knn_ids.end());
      kk.insert(kk.end(), l.knn_keys.begin(), l.knn_keys.end());
      wk.insert(wk.end(), l.worst_key.begin(), l.worst_key.end());
      bk.insert(bk.end(), l.best_key.begin(), l.best_key.end());
      bi.insert(bi.end(), l.best_id.begin(), l.best_id.end());
      h.insert(h.end(), l.holders.begin(), l.holders.end());
      hc.insert(hc.end(), l.holder_counts.begin(), l.holder_counts.end());
      lo.insert(lo.end(), l.layouts.begin(), l.layouts.end());
      sz.push_back(static_cast<std::uint32_t>(base));
    }
    offsets.push_back(static_cast<std::int64_t>(G * n));
    qoffsets.push_back(static_cast<std::int64_t>(G * m));
    keys = device_buffer<T>(k);
    queries = device_buffer<float>(q);
    knn_keys = device_buffer<float>(kk);
    worst = device_buffer<float>(wk);
    best_key = device_buffer<float>(bk);
    adj = device_buffer<id_t>(a);
    entries = device_buffer<id_t>(e);
    knn_ids = device_buffer<id_t>(ki);
    best_id = device_buffer<id_t>(bi);
    holders = device_buffer<id_t>(h);
    sizes = device_buffer<std::uint32_t>(sz);
    holder_counts = device_buffer<std::uint32_t>(hc);
    layouts = device_buffer<std::uint32_t>(lo);
    status = device_buffer<std::uint32_t>(std::vector<std::uint32_t>{0});
    offsets_d = device_buffer<std::int64_t>(offsets);
    qoffsets_d = device_buffer<std::int64_t>(qoffsets);
    set.adjacency = adj.get();
    set.row_offset = offsets_d.get();
    set.entries = entries.get();
    set.num_graphs = static_cast<int>(G);
    set.width = static_cast<int>(R);
    set.max_entries = static_cast<int>(max_entries);
    set.max_keys = static_cast<std::int64_t>(n);
    set.sizes = sizes.get();
    st.adjacency = adj.get();
    st.sizes = sizes.get();
    st.queries = queries.get();
    st.query_ld = static_cast<std::int64_t>(d);
    st.query_offset = qoffsets_d.get();
    st.max_queries = static_cast<std::int64_t>(m);
    st.nq = static_cast<int>(nq);
    st.knn_ids = knn_ids.get();
    st.knn_keys = knn_keys.get();
    st.worst_key = worst.get();
    st.best_id = best_id.get();
    st.best_key = best_key.get();
    st.holders = holders.get();
    st.holder_counts = holder_counts.get();
    st.holder_capacity = holder_cap;
    st.layouts = layouts.get();
  }
  [[nodiscard]] kc::dense_keys_ref<T> key_ref() const {
    return {keys.get(), static_cast<std::int64_t>(d), static_cast<int>(d)};
  }

  // The same keys in a head-wise paged pool (pages of 16 tokens in a scrambled order).
  static constexpr int page = 16;
  device_buffer<T> pages;
  device_buffer<std::int32_t> table;
  int num_pages = 0, max_pages = 0;
  void make_pages(const std::vector<one_graph>& gs) {
    max_pages = static_cast<int>((n + page - 1) / page);
    num_pages = static_cast<int>(G) * max_pages;
    std::vector<std::int32_t> t(static_cast<std::size_t>(num_pages));
    for (int i = 0; i < num_pages; ++i) t[static_cast<std::size_t>(i)] = (i * 7 + 3) % num_pages;
    std::vector<T> k(static_cast<std::size_t>(num_pages) * page * d, from_float<T>(0.0f));
    for (std::size_t g = 0; g < G; ++g) {
      for (std::size_t i = 0; i < n; ++i) {
        const auto pg = static_cast<std::size_t>(t[g * max_pages + i / page]);
        for (std::size_t j = 0; j < d; ++j) {
          k[(pg * page + i % page) * d + j] = from_float<T>(gs[g].keys[i * d + j]);
        }
      }
    }
    pages = device_buffer<T>(k);
    table = device_buffer<std::int32_t>(t);
  }
  [[nodiscard]] kc::paged_kv_ref<T> paged_ref() const {
    return {pages.get(),         pages.get(), num_pages,           page,
            static_cast<int>(d), table.get(), static_cast<int>(G), max_pages};
  }
};

kvsift::graph_insert_params cpu_params(const kc::batch_insert_params& p, int H) {
  kvsift::graph_insert_params ip;
  ip.degree = static_cast<std::size_t>(p.degree);
  ip.L = static_cast<std::size_t>(p.L);
  ip.query_neighbors = static_cast<std::size_t>(p.query_neighbors);
  ip.update_query_knn = p.update_query_knn;
  ip.query_candidates = static_cast<std::size_t>(p.query_candidates);
  ip.holder_capacity = static_cast<std::size_t>(H);
  ip.fill = p.fill;
  return ip;
}

/// Rows, sizes and kNN lists of every graph against the CPU's; returns the mismatches.
template <class T>
std::size_t mismatches(const gpu_case<T>& c, const std::vector<one_graph>& gs) {
  const auto adj = c.adj.download();
  const auto sz = c.sizes.download();
  const auto ids = c.knn_ids.download();
  const auto keys = c.knn_keys.download();
  std::size_t bad = 0;
  for (std::size_t g = 0; g < c.G; ++g) {
    const auto& cpu = gs[g].cpu;
    if (sz[g] != cpu.size()) ++bad;
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      const id_t* row = adj.data() + (g * c.n + i) * c.R;
      const auto nb = cpu.neighbors(static_cast<id_t>(i));
      std::size_t deg = 0;
      while (deg < c.R && row[deg] != kvsift::invalid_id) ++deg;
      if (deg != nb.size() || !std::equal(nb.begin(), nb.end(), row)) ++bad;
    }
    const kvsift::knn_result lists = cpu.query_knn();
    for (std::size_t q = 0; q < m; ++q) {
      std::vector<std::pair<float, id_t>> l;
      for (std::size_t j = 0; j < nq; ++j) {
        const std::size_t at = (g * m + q) * nq + j;
        l.push_back({-keys[at], ids[at]});
      }
      std::sort(l.begin(), l.end());
      for (std::size_t j = 0; j < nq; ++j) bad += l[j].second != lists.ids[q * nq + j] ? 1 : 0;
    }
  }
  return bad;
}

template <class T>
void check_against_cpu(std::size_t d, const kc::batch_insert_params& p, int H, bool paged = false,
                       bool layouts = true) {
  constexpr std::size_t n = 620, base = 500;
  const auto ip = cpu_params(p, H);
  std::vector<one_graph> gs;
  gs.emplace_back(n, d, base, 3u, ip);
  gs.emplace_back(n, d, base, 5u, ip);
  gpu_case<T> c(gs, base, H);
  if (paged) c.make_pages(gs);
  if (!layouts) c.st.layouts = nullptr;  // every full row re-pruned
  const std::size_t bytes = kc::batch_insert_workspace_size(c.set, static_cast<int>(d), c.st, p);
  device_buffer<unsigned char> ws(bytes);
  std::size_t total = 0, checks = 0;
  for (std::size_t i = base; i < n; ++i) {
    if (paged) {
      kc::batch_insert(c.set, c.paged_ref(), c.st, p, ws.get(), bytes, nullptr, c.status.get());
    } else {
      kc::batch_insert(c.set, c.key_ref(), c.st, p, ws.get(), bytes, nullptr, c.status.get());
    }
    for (auto& g : gs) g.cpu.insert(kvsift::matrix_view<const float>{g.keys.data() + i * d, 1, d});
    if ((i - base) % 10 == 9 || i + 1 == n) {
      KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
      total += mismatches(c, gs);
      ++checks;
    }
  }
  INFO("d " << d << ", H " << H << ", C " << p.query_candidates << ", lists " << p.update_query_knn
            << ", t " << p.query_neighbors << ", paged " << paged << ", layouts " << layouts);
  CHECK(checks == 12);
  CHECK(total == 0);
  CHECK(c.status.download()[0] == 0u);
}

kc::batch_insert_params small_params() {
  kc::batch_insert_params p;
  p.L = 24;
  p.query_candidates = 48;  // binds: the found keys' lists hold more queries
  return p;
}

}  // namespace

TEST_CASE("batch_insert_matches_cpu_insert", "[cuda][batch_insert]") {
  const kc::batch_insert_params p = small_params();
  check_against_cpu<float>(24, p, 8);         // 16-byte row loads
  check_against_cpu<float>(18, p, 8);         // scalar row loads
  check_against_cpu<__half>(24, p, 8);        // f16 keys (integers are exact)
  check_against_cpu<float>(24, p, 64);        // the cap on key -> query lists rarely binds
  check_against_cpu<__half>(24, p, 8, true);  // keys in a paged pool, as a KV cache holds them
  check_against_cpu<float>(24, p, 8, false, false);  // no row layouts: every full row re-pruned
}

TEST_CASE("batch_insert_matches_cpu_rule_variants", "[cuda][batch_insert]") {
  kc::batch_insert_params graph_only = small_params();
  graph_only.query_neighbors = 0;
  graph_only.update_query_knn = false;
  check_against_cpu<float>(24, graph_only, 8);
  kc::batch_insert_params no_fill = small_params();
  no_fill.fill = false;
  no_fill.degree = 4;
  check_against_cpu<float>(24, no_fill, 8);
}

TEST_CASE("batch_insert_skips_bad_keys_and_full_graphs", "[cuda][batch_insert][bad-input]") {
  constexpr std::size_t n = 520, base = 500, d = 24;
  const kc::batch_insert_params p = small_params();
  std::vector<one_graph> gs;
  gs.emplace_back(n, d, base, 3u, cpu_params(p, 8));
  gs.emplace_back(n, d, base, 5u, cpu_params(p, 8));
  gs[0].keys[base * d + 3] = std::nanf("");  // graph 0's next key holds NaN
  gpu_case<float> c(gs, base, 8);
  const auto adj0 = c.adj.download();
  const std::size_t bytes = kc::batch_insert_workspace_size(c.set, static_cast<int>(d), c.st, p);
  device_buffer<unsigned char> ws(bytes);
  kc::batch_insert(c.set, c.key_ref(), c.st, p, ws.get(), bytes, nullptr, c.status.get());
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  auto sz = c.sizes.download();
  CHECK(sz[0] == base);  // skipped, unchanged
  CHECK(sz[1] == base + 1);
  CHECK((c.status.download()[0] & kc::insert_status_bad_key) != 0u);
  const auto adj1 = c.adj.download();
  CHECK(std::equal(adj0.begin(), adj0.begin() + n * c.R, adj1.begin()));

  // A full graph (sizes == rows) is left alone and says so.
  c.sizes.upload({static_cast<std::uint32_t>(n), static_cast<std::uint32_t>(base + 1)});
  c.status.upload({0});
  kc::batch_insert(c.set, c.key_ref(), c.st, p, ws.get(), bytes, nullptr, c.status.get());
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  sz = c.sizes.download();
  CHECK(sz[0] == n);
  CHECK(sz[1] == base + 2);
  CHECK((c.status.download()[0] & kc::insert_status_no_room) != 0u);

  // Host-side errors, before any launch.
  CHECK(contains(message_of([&] {
                   kc::batch_insert(c.set, c.key_ref(), c.st, p, ws.get(), bytes - 16, nullptr);
                 }),
                 "too small"));
  kc::graph_set_ref other = c.set;
  other.sizes = nullptr;
  CHECK(contains(
      message_of([&] { kc::batch_insert(other, c.key_ref(), c.st, p, ws.get(), bytes, nullptr); }),
      "sizes"));
  kc::batch_insert_params bad = p;
  bad.degree = static_cast<int>(c.R) + 1;
  CHECK(contains(message_of([&] {
                   (void)kc::batch_insert_workspace_size(c.set, static_cast<int>(d), c.st, bad);
                 }),
                 "degree"));
  bad = p;
  bad.expand_width = 0;
  CHECK(contains(message_of([&] {
                   (void)kc::batch_insert_workspace_size(c.set, static_cast<int>(d), c.st, bad);
                 }),
                 "expand_width"));
  bad = p;
  bad.query_candidates = 0;
  CHECK(contains(message_of([&] {
                   (void)kc::batch_insert_workspace_size(c.set, static_cast<int>(d), c.st, bad);
                 }),
                 "query_candidates"));
  kc::batch_insert_state_ref bst = c.st;
  bst.holder_capacity = 0;
  CHECK(contains(message_of([&] {
                   (void)kc::batch_insert_workspace_size(c.set, static_cast<int>(d), bst, p);
                 }),
                 "holder_capacity"));
  bst = c.st;
  bst.query_ld = static_cast<std::int64_t>(d) - 1;
  CHECK(contains(
      message_of([&] { kc::batch_insert(c.set, c.key_ref(), bst, p, ws.get(), bytes, nullptr); }),
      "query row stride"));
  std::vector<float> host(4);
  bst = c.st;
  bst.queries = host.data();
  CHECK(contains(
      message_of([&] { kc::batch_insert(c.set, c.key_ref(), bst, p, ws.get(), bytes, nullptr); }),
      "queries"));
  CHECK(contains(message_of([] {
                   (void)kc::make_insert_lists({0, 1}, {1.0f}, 1, 2, 4, 8);
                 }),
                 "expected 2 ids and scores"));
  CHECK(contains(message_of([] {
                   (void)kc::make_insert_lists({0, 9}, {1.0f, 0.0f}, 1, 2, 4, 8);
                 }),
                 "not below 4"));
  // Two GPUs: a stream of device 1, and this graph set (device 0's) while device 1 is current.
  const bool two = with_foreign_stream([&](cudaStream_t foreign) {
    CHECK(contains(message_of([&] {
                     kc::batch_insert(c.set, c.key_ref(), c.st, p, ws.get(), bytes, foreign);
                   }),
                   "the stream belongs to device 1, expected the current device 0"));
  });
  if (two) {
    KVSIFT_CUDA_CHECK(cudaSetDevice(1));
    const std::string m = message_of(
        [&] { kc::batch_insert(c.set, c.key_ref(), c.st, p, ws.get(), bytes, nullptr); });
    KVSIFT_CUDA_CHECK(cudaSetDevice(0));
    INFO(m);
    CHECK(contains(m, "lives on device 0, expected the current device 1"));
  }
}
