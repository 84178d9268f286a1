#pragma once
// Step bodies of roargraph_builder (declared, with the reasons for each step, in
// <kvsift/index/roargraph_builder.hpp>, which includes this file at its end).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kvsift/core/detail/clock.hpp"
#include "kvsift/core/detail/mt19937_64.hpp"

namespace kvsift {

namespace detail {

/// Makes every key reachable from `entry`. Re-pruning full rows can drop a key's last in-edge,
/// and a key no path reaches is found by no query, so each unreachable key, in id order, is
/// attached to a reachable key that a beam search (pool L, l2 under M over `store`) for it
/// finds: the best found with fewer than R edges, else the best found, whose last edge gives
/// way (the entry if the search found no reachable key). A replaced edge can cut off another
/// key, so a pass that replaced one is followed by another (8 at most, each a traversal). A
/// pass that only appended edges cut nothing off: every key it marked stays reachable, so it
/// needs no second traversal to confirm (at 131072 keys a traversal is 20-40 ms on the H200
/// host, where a GPU-built head spends about 1 s in its builder). Returns the keys left
/// unreachable: 0 unless 8 passes did not settle it.
template <VectorStore S, Metric M>
std::size_t repair_reachability(const S& store, adjacency_lists& adj, id_t entry, std::size_t R,
                                std::size_t L) {
  const std::size_t n = store.size();
  const building_graph<S, M> g{store, adj, entry};
  search_workspace ws;
  std::vector<id_t> ids(L);
  std::vector<float> scores(L);
  std::vector<char> reached(n);
  std::vector<id_t> stack;
  auto mark_from = [&](id_t start) { return mark_reachable(adj, start, reached, stack); };
  for (int pass = 0; pass < 8; ++pass) {
    std::fill(reached.begin(), reached.end(), 0);
    if (mark_from(entry) == n) return 0;
    bool replaced = false;
    for (std::size_t x = 0; x < n; ++x) {
      if (reached[x]) continue;
      ws.query.resize(store.dim());
      widen(store.row(x), ws.query.data(), store.dim());
      const auto s = beam_search(g, std::span<const float>(ws.query), {L, L}, ws,
                                 std::span<id_t>(ids), std::span<float>(scores));
      id_t host = invalid_id;
      for (std::size_t j = 0; j < s.count && host == invalid_id; ++j) {
        if (reached[ids[j]] && adj.rows[ids[j]].size() < R) host = ids[j];
      }
      for (std::size_t j = 0; j < s.count && host == invalid_id; ++j) {
        if (reached[ids[j]]) host = ids[j];
      }
      if (host == invalid_id) host = entry;
      auto& row = adj.rows[host];
      if (row.size() >= R) {
        row.back() = static_cast<id_t>(x);
        replaced = true;
      } else {
        row.push_back(static_cast<id_t>(x));
      }
      (void)mark_from(static_cast<id_t>(x));
    }
    if (!replaced) return 0;  // every key is marked, through edges that are all still there
  }
  std::fill(reached.begin(), reached.end(), 0);
  return n - mark_from(entry);
}

}  // namespace detail

template <Metric M, KnnEngine Engine>
template <Element T>
void roargraph_builder<M, Engine>::validate_params(matrix_view<const T> keys) const {
  detail::require(params_.nq >= 2, "roargraph_builder: nq must be >= 2, got ", params_.nq);
  detail::require(params_.M > 0, "roargraph_builder: M must be > 0, got 0");
  detail::require(params_.M <= roargraph_max_M,
                  "roargraph_builder: expected M <= ", roargraph_max_M,
                  " (max degree 2M <= ", max_graph_degree, "), got M = ", params_.M);
  detail::require(params_.L >= params_.M, "roargraph_builder: expected L >= M = ", params_.M,
                  ", got L = ", params_.L);
  detail::require(
      params_.connectivity_expand_fraction > 0 && params_.connectivity_expand_fraction <= 1,
      "roargraph_builder: expected 0 < connectivity_expand_fraction <= 1, got ",
      params_.connectivity_expand_fraction);
  detail::require(params_.connectivity_knn <= max_index_size,
                  "roargraph_builder: expected connectivity_knn <= ", max_index_size, ", got ",
                  params_.connectivity_knn);
  detail::require(keys.rows() > 0, "roargraph_builder: expected a non-empty key set, got 0 keys");
  require_indexable(keys.rows(), "roargraph_builder: keys");
  require_vector_dim(keys.rows(), keys.cols(), "roargraph_builder: keys");
  (void)checked_bytes<id_t>(checked_mul(keys.rows(), 2 * params_.M, "roargraph_builder: n x 2M"),
                            "roargraph_builder: adjacency bytes");
  // Widened and augmented (d + 1) copies of the keys for l2 and the connectivity kNN.
  (void)checked_bytes<float>(
      checked_mul(keys.rows(), checked_add(keys.cols(), 1, "roargraph_builder: d + 1"),
                  "roargraph_builder: augmented keys"),
      "roargraph_builder: augmented key bytes");
}

template <Metric M, KnnEngine Engine>
template <Element T>
void roargraph_builder<M, Engine>::validate(matrix_view<const T> keys,
                                            matrix_view<const float> train_queries) const {
  validate_params(keys);
  detail::require(train_queries.rows() > 0,
                  "roargraph_builder: expected at least one training query, got 0");
  require_dim(keys.cols(), train_queries.cols(), "roargraph_builder: training query dimension");
  // The kNN lists (m x min(nq, n)) and the augmented queries (m x (d + 1)).
  const std::size_t m = train_queries.rows();
  (void)checked_bytes<float>(
      checked_mul(m, std::min(params_.nq, keys.rows()), "roargraph_builder: training kNN"),
      "roargraph_builder: training kNN bytes");
  (void)checked_bytes<float>(checked_mul(m, keys.cols() + 1, "roargraph_builder: queries"),
                             "roargraph_builder: query bytes");
  require_finite(keys, "roargraph_builder: keys");
  require_finite(train_queries, "roargraph_builder: training queries");
}

template <Metric M, KnnEngine Engine>
std::size_t roargraph_builder<M, Engine>::steps_after_knn(std::size_t n) const {
  if (!params_.connectivity) return 1;
  return 2 + connectivity_rounds(n);
}

template <Metric M, KnnEngine Engine>
std::size_t roargraph_builder<M, Engine>::max_batch(std::size_t n) const {
  return params_.connectivity_knn > 0 ? n : std::max<std::size_t>(1, params_.batch);
}

template <Metric M, KnnEngine Engine>
template <class F>
void roargraph_builder<M, Engine>::for_each_round(std::size_t n, F&& f) const {
  const std::size_t most = max_batch(n);
  std::size_t batch = params_.connectivity_knn > 0 ? most : std::min<std::size_t>(32, most);
  for (std::size_t b0 = 0; b0 < n; b0 += batch, batch = std::min(2 * batch, most)) {
    f(b0, std::min(batch, n - b0));
  }
}

template <Metric M, KnnEngine Engine>
std::size_t roargraph_builder<M, Engine>::expand_limit(std::size_t L) const {
  const auto e = static_cast<std::size_t>(
      std::llround(params_.connectivity_expand_fraction * static_cast<double>(L)));
  const std::size_t limit = std::clamp<std::size_t>(e, 1, std::max<std::size_t>(L, 1));
  return limit >= L ? 0 : limit;
}

template <Metric M, KnnEngine Engine>
std::size_t roargraph_builder<M, Engine>::connectivity_rounds(std::size_t n) const {
  std::size_t rounds = 0;
  for_each_round(n, [&](std::size_t, std::size_t) { ++rounds; });
  return rounds;
}

template <Metric M, KnnEngine Engine>
template <MatrixStore Store>
graph_index<Store, M> roargraph_builder<M, Engine>::finish(Store store, const knn_result& knn,
                                                           double t0, roargraph_build_stats st,
                                                           roargraph_build_stats* stats,
                                                           const build_progress_callback& progress,
                                                           std::size_t done,
                                                           std::size_t total) const {
  const auto keys = store.view();
  const std::size_t n = keys.rows();
  auto report = [&](std::string_view phase) {
    ++done;
    if (progress) progress({done, total, detail::seconds_since(t0), phase});
  };
  auto on_round = [&] { report("connectivity"); };
  detail::adjacency_lists adj;
  id_t entry = 0;
  double t1 = detail::monotonic_seconds();
  if (!engine_steps_2_3(
          store, knn, adj, entry, st, t1, [&] { report("projection"); }, on_round)) {
    adj = project(store, knn);
    st.projection_seconds = detail::seconds_since(t1);
    report("projection");
    // Without step 3 most keys have no out-edges (only pivots and their reverse edges do); an
    // entry without out-edges ends every search at one key, so it is chosen among keys with
    // edges there.
    entry = centroid_entry(keys, adj, /*with_edges_only=*/!params_.connectivity);
    t1 = detail::monotonic_seconds();
    if (params_.connectivity) enhance(store, adj, entry, st, on_round);
  }
  if (params_.connectivity) {
    const auto t2 = detail::monotonic_seconds();
    st.unreachable_keys = detail::repair_reachability<Store, key_metric>(
        store, adj, entry, degree_cap(), std::min(params_.L, n));
    st.repair_seconds = detail::seconds_since(t2);
    report("repair");
  }
  st.connectivity_seconds = detail::seconds_since(t1);
  if (!params_.connectivity) {  // (the repair counts them itself)
    std::vector<char> reached(n, 0);
    std::vector<id_t> stack;
    st.unreachable_keys = n - detail::mark_reachable(adj, entry, reached, stack);
  }

  const std::size_t R = degree_cap();
  std::vector<id_t> padded_adjacency(n * R, invalid_id);
  for (std::size_t i = 0; i < n; ++i) {
    std::copy_n(adj.rows[i].begin(), std::min(R, adj.rows[i].size()),
                padded_adjacency.begin() + i * R);
  }
  st.total_seconds = detail::seconds_since(t0);
  if (stats != nullptr) *stats = st;
  // A second entry: the key that is the best key of the most training queries. On real
  // attention data that is the attention sink (key 0 is the top-1 of 316 of 462 evaluation
  // queries of the committed sample), far in Euclidean terms from every other key, so few
  // pruned edges lead to it: seeding it took recall@10 at pool 10 from 0.91 to 0.99 there.
  std::vector<id_t> entries{entry};
  const id_t mode = pivot_mode(knn, n);
  if (mode != entry && !adj.rows[mode].empty()) entries.push_back(mode);
  return graph_index<Store, M>(std::move(store), R, std::move(padded_adjacency),
                               std::move(entries));
}

template <Metric M, KnnEngine Engine>
template <Element T>
knn_result roargraph_builder<M, Engine>::query_knn(matrix_view<const T> keys,
                                                   matrix_view<const float> q) const {
  const std::size_t k = std::min(params_.nq, keys.rows());
  if constexpr (std::is_same_v<M, inner_product>) {
    return engine_.search(q, keys, k);
  } else {
    return l2_knn(keys, q, k);
  }
}

template <Metric M, KnnEngine Engine>
template <Element T>
knn_result roargraph_builder<M, Engine>::key_knn(matrix_view<const T> keys, std::size_t k) const {
  const std::size_t n = keys.rows(), d = keys.cols();
  std::vector<float> xs(n * d);
  for (std::size_t i = 0; i < n; ++i) detail::widen(keys.row(i), &xs[i * d], d);
  return l2_knn(keys, matrix_view<const float>(xs.data(), n, d), k);
}

template <Metric M, KnnEngine Engine>
template <Element T>
knn_result roargraph_builder<M, Engine>::l2_knn(matrix_view<const T> keys,
                                                matrix_view<const float> q, std::size_t k) const {
  // argmin |q - x|^2 = argmax (q, 1) . (2x, -|x|^2): l2 through any inner-product engine.
  const std::size_t d = keys.cols();
  std::vector<float> qa(q.rows() * (d + 1)), xa(keys.rows() * (d + 1));
  for (std::size_t i = 0; i < q.rows(); ++i) {
    std::copy_n(q.row(i), d, &qa[i * (d + 1)]);
    qa[i * (d + 1) + d] = 1.0f;
  }
  for (std::size_t i = 0; i < keys.rows(); ++i) {
    float* r = &xa[i * (d + 1)];
    detail::widen(keys.row(i), r, d);
    r[d] = -detail::dot_f32(r, r, d);
    for (std::size_t j = 0; j < d; ++j) r[j] *= 2.0f;
  }
  return engine_.search(matrix_view<const float>(qa.data(), q.rows(), d + 1),
                        matrix_view<const float>(xa.data(), keys.rows(), d + 1), k);
}

template <Metric M, KnnEngine Engine>
template <MatrixStore Store>
detail::adjacency_lists roargraph_builder<M, Engine>::project(const Store& store,
                                                              const knn_result& knn) const {
  const std::size_t n = store.size(), M_ = params_.M;
  std::vector<std::vector<id_t>> pooled(n);  // candidates gathered per pivot, query order
  for (std::size_t qi = 0; qi < knn.rows; ++qi) {
    const auto ids = knn.row_ids(qi);
    const id_t pivot = ids[0];
    for (std::size_t j = 1; j < ids.size() && ids[j] != invalid_id; ++j) {
      pooled[pivot].push_back(ids[j]);
    }
  }
  detail::adjacency_lists adj;
  adj.rows.resize(n);
  std::vector<std::vector<float>> scratch(thread_count());
  parallel_for(
      n, scratch.size(),
      [&](std::size_t p, std::size_t t) {
        auto& c = pooled[p];
        if (c.empty()) return;
        std::sort(c.begin(), c.end());
        c.erase(std::unique(c.begin(), c.end()), c.end());
        std::erase(c, static_cast<id_t>(p));
        adj.rows[p] = prune_around(store, static_cast<id_t>(p), c, M_, true, scratch[t]);
      },
      64);
  // Reverse edges: requests collected in pivot order, then each target merges its own.
  std::vector<std::vector<id_t>> reverse(n);
  for (std::size_t p = 0; p < n; ++p) {
    for (id_t c : adj.rows[p]) reverse[c].push_back(static_cast<id_t>(p));
  }
  detail::adjacency_lists out;
  out.rows.resize(n);
  parallel_for(
      n, scratch.size(),
      [&](std::size_t x, std::size_t t) {
        std::vector<id_t> merged = adj.rows[x];
        for (id_t r : reverse[x]) {
          if (std::find(merged.begin(), merged.end(), r) == merged.end()) merged.push_back(r);
        }
        out.rows[x] = merged.size() <= M_
                          ? std::move(merged)
                          : prune_around(store, static_cast<id_t>(x), merged, M_, true, scratch[t]);
      },
      64);
  return out;
}

template <Metric M, KnnEngine Engine>
template <class S>
bool roargraph_builder<M, Engine>::engine_searches(std::size_t n) const {
  // An engine's searches fill their pruned lists (the `ConnectivitySearcher` contract), so a
  // build without fill searches on the CPU: it would otherwise get other edges.
  // So does a build with an expand limit on an engine whose searches cannot honour it.
  const bool limit_ok = expand_limit(std::min(params_.L, n)) == 0 || ExpandLimitingSearcher<S>;
  return params_.engine_connectivity && params_.connectivity_fill &&
         params_.connectivity_knn == 0 && limit_ok && n > 1;
}

template <Metric M, KnnEngine Engine>
template <MatrixStore Store, class OnProjected, class OnRound>
bool roargraph_builder<M, Engine>::engine_steps_2_3(const Store& store, const knn_result& knn,
                                                    detail::adjacency_lists& adj, id_t& entry,
                                                    roargraph_build_stats& st, double& t_connect,
                                                    OnProjected&& on_projected,
                                                    OnRound&& on_round) const {
  if constexpr (ConnectivityEngine<Engine, typename Store::value_type>) {
    using searcher_t = decltype(engine_.make_connectivity_searcher(store.view(), std::size_t{}));
    if constexpr (ProjectingConnectivitySearcher<searcher_t>) {
      // Only where the rows would stay on the engine through step 3 anyway (its merge path):
      // otherwise the CPU needs them between the rounds.
      if (!params_.connectivity || !params_.engine_projection || !params_.engine_merge ||
          params_.connectivity_degree_cap != 0 || !engine_searches<searcher_t>(store.size())) {
        return false;
      }
      const auto t0 = detail::monotonic_seconds();
      auto searcher = engine_.make_connectivity_searcher(store.view(), degree_cap());
      searcher.project(std::span<const id_t>(knn.ids), knn.k, params_.M);
      st.projection_seconds = detail::seconds_since(t0);
      on_projected();
      // With step 3 the entry is chosen among all keys (centroid_entry reads no row then).
      entry = centroid_entry(store.view(), adj, /*with_edges_only=*/false);
      t_connect = detail::monotonic_seconds();
      enhance_rounds(store, adj, entry, st, on_round, &searcher, /*rows_on_engine=*/true);
      return true;
    }
  }
  (void)store, (void)knn, (void)adj, (void)entry, (void)st, (void)t_connect, (void)on_projected,
      (void)on_round;
  return false;
}

template <Metric M, KnnEngine Engine>
template <MatrixStore Store, class OnRound>
void roargraph_builder<M, Engine>::enhance(const Store& store, detail::adjacency_lists& adj,
                                           id_t entry, roargraph_build_stats& st,
                                           OnRound&& on_round) const {
  if constexpr (ConnectivityEngine<Engine, typename Store::value_type>) {
    using searcher_t = decltype(engine_.make_connectivity_searcher(store.view(), std::size_t{}));
    if (engine_searches<searcher_t>(store.size())) {
      auto searcher = engine_.make_connectivity_searcher(store.view(), degree_cap());
      enhance_rounds(store, adj, entry, st, on_round, &searcher);
      return;
    }
  }
  enhance_rounds(store, adj, entry, st, on_round, static_cast<detail::no_searcher*>(nullptr));
}

template <Metric M, KnnEngine Engine>
template <MatrixStore Store, class OnRound, class Searcher>
void roargraph_builder<M, Engine>::enhance_rounds(const Store& store, detail::adjacency_lists& adj,
                                                  id_t entry, roargraph_build_stats& st,
                                                  OnRound& on_round, Searcher* searcher,
                                                  bool rows_on_engine) const {
  (void)rows_on_engine;  // read on the engine's path only
  constexpr bool on_engine = !std::is_same_v<Searcher, detail::no_searcher>;
  const std::size_t n = store.size(), R = degree_cap();
  const bool fill = params_.connectivity_fill;
  const std::size_t L = std::min(params_.L, n);
  const std::size_t E = expand_limit(L);
  knn_result key_neighbors;  // with connectivity_knn: each key's exact nearest keys (l2)
  if (params_.connectivity_knn > 0 && n > 1) {
    const auto t_knn = detail::monotonic_seconds();
    key_neighbors = key_knn(store.view(), std::min(params_.connectivity_knn + 1, n));
    st.connectivity_search_seconds += detail::seconds_since(t_knn);
  }
  const std::size_t threads = thread_count();
  std::vector<search_workspace> ws(threads);
  std::vector<std::vector<float>> scratch(threads);
  struct buffers {
    std::vector<id_t> ids;
    std::vector<float> scores;
    std::vector<scored_id> cands;
  };
  std::vector<buffers> buf(threads);
  std::vector<std::size_t> scored(threads, 0), pruned(threads, 0);

  std::vector<id_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<id_t>(i);
  detail::mt19937_64 rng(params_.seed);
  for (std::size_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng() % i]);

  const std::size_t most = max_batch(n);
  // The CPU searches' locality order: cluster of every key, and per round the positions of
  // its keys sorted by cluster (found_neighbors stays indexed by position, so the edges and
  // the graph do not depend on it).
  std::vector<std::uint32_t> cluster;
  std::vector<std::uint32_t> by_cluster;
  if (!on_engine && key_neighbors.rows == 0 && params_.step3_locality_clusters > 0 && n > 1) {
    const auto t_cluster = detail::monotonic_seconds();
    cluster = locality_clusters(store, order, params_.step3_locality_clusters, threads);
    st.connectivity_search_seconds += detail::seconds_since(t_cluster);
  }
  // found_neighbors[i]: the pruned neighbours found for the round's i-th key.
  std::vector<std::vector<id_t>> found_neighbors(std::min(most, n));
  // Per source key: how many of the round's new edges leave it, and where they end in `grouped`.
  std::vector<std::uint32_t> new_edge_count(n, 0), new_edge_end(n, 0);
  std::vector<id_t> touched, grouped;
  // The merge's grouping runs on `parts` ranges of source ids, one task each: the sources of
  // part r are [r * part_span, (r + 1) * part_span).
  const std::size_t parts = std::max<std::size_t>(1, std::min(threads, n));
  const std::size_t part_span = (n + parts - 1) / parts;
  std::vector<std::vector<id_t>> part_touched(parts);
  std::vector<std::size_t> part_base(parts + 1, 0);
  connectivity_batch engine_out;
  std::size_t engine_scored = 0;
  std::vector<id_t> padded_rows;  // rows sent to the engine's searcher, padded to R
  // Rows as the searches see them: cut to the degree cap (0 = none).
  const std::size_t cap = params_.connectivity_degree_cap;
  const std::size_t width = cap == 0 ? R : std::min(cap, R);
  if constexpr (on_engine) {
    if constexpr (ExpandLimitingSearcher<Searcher>) searcher->set_expand_limit(E);
    if (!rows_on_engine) {
      std::vector<id_t> all(n);
      for (std::size_t i = 0; i < n; ++i) all[i] = static_cast<id_t>(i);
      upload_rows(*searcher, adj, all, R, width, padded_rows, threads);
    }
    if constexpr (MergingConnectivitySearcher<Searcher>) {
      if (params_.engine_merge && cap == 0) {
        // The merge on the engine: the rounds are the same (order, batch sizes), the rows stay
        // on the engine between them, and they come back once at the end. The rounds' time is
        // counted as search time, the download as merge time.
        for_each_round(n, [&](std::size_t b0, std::size_t bn) {
          const auto t_round = detail::monotonic_seconds();
          engine_scored += searcher->search_and_merge(std::span<const id_t>(order).subspan(b0, bn),
                                                      entry, L, params_.M, fill);
          st.connectivity_search_seconds += detail::seconds_since(t_round);
          on_round();
        });
        const auto t_rows = detail::monotonic_seconds();
        searcher->get_rows(adj.rows);
        st.connectivity_merge_seconds += detail::seconds_since(t_rows);
        st.connectivity_distance_computations += engine_scored;
        return;
      }
    }
  }
  const detail::building_graph<Store, key_metric> g{store, adj, entry};
  for_each_round(n, [&](std::size_t b0, std::size_t bn) {
    const auto t_search = detail::monotonic_seconds();
    if constexpr (on_engine) {
      searcher->search(std::span<const id_t>(order).subspan(b0, bn), entry, L, params_.M,
                       engine_out);
      engine_scored += engine_out.scored;
      for (std::size_t i = 0; i < bn; ++i) {
        const id_t* row = engine_out.kept.data() + i * engine_out.degree;
        found_neighbors[i].assign(row, row + engine_out.counts[i]);
      }
    } else {
      by_cluster.resize(bn);
      for (std::size_t i = 0; i < bn; ++i) by_cluster[i] = static_cast<std::uint32_t>(i);
      if (!cluster.empty()) {
        std::sort(by_cluster.begin(), by_cluster.end(), [&](std::uint32_t a, std::uint32_t b) {
          const std::uint32_t ca = cluster[order[b0 + a]], cb = cluster[order[b0 + b]];
          return ca != cb ? ca < cb : a < b;
        });
      }
      parallel_for(
          bn, threads,
          [&](std::size_t task, std::size_t t) {
            const std::size_t i = by_cluster[task];
            const id_t x = order[b0 + i];
            auto& b = buf[t];
            b.cands.clear();
            if (key_neighbors.rows > 0) {
              // The engine's scores are shifted by |x|^2: rescore exactly for the RNG rule.
              detail::pair_scorer<Store, key_metric> ps(store);
              ps.set_pivot(x);
              for (const id_t y : key_neighbors.row_ids(x)) {
                if (y != x && y != invalid_id) b.cands.push_back({ps.key(y), y});
              }
              detail::rng_prune<Store, key_metric>(store, b.cands, params_.M, fill, scratch[t],
                                                   found_neighbors[i], &pruned[t]);
              return;
            }
            b.ids.resize(L);
            b.scores.resize(L);
            ws[t].query.resize(store.dim());
            detail::widen(store.row(x), ws[t].query.data(), store.dim());
            const auto s = beam_search(g, std::span<const float>(ws[t].query), {L, L, cap, E},
                                       ws[t], std::span<id_t>(b.ids), std::span<float>(b.scores));
            scored[t] += s.distance_computations;
            for (std::size_t j = 0; j < s.count; ++j) {
              if (b.ids[j] != x) b.cands.push_back({to_key<key_metric>(b.scores[j]), b.ids[j]});
            }
            detail::rng_prune<Store, key_metric>(store, b.cands, params_.M, fill, scratch[t],
                                                 found_neighbors[i], &pruned[t]);
          },
          // One key per grab: a search takes ~2 ms at L = 500, so grabbing 8 left threads idle
          // up to 8 searches at each of the ~130 round barriers, and the first rounds (32, 64
          // keys) used only 4 and 8 threads. The graph does not depend on it.
          1);
    }
    st.connectivity_search_seconds += detail::seconds_since(t_search);
    const auto t_merge = detail::monotonic_seconds();
    // The round's new edges, both ways, in generation order ((x, y) then (y, x) for the
    // round's i-th key x and each y it found, i ascending), grouped by source with a stable
    // counting sort. Each part owns a range of source ids and walks every found list twice:
    // to count its sources' new edges, then to place them. The serial counting sort this
    // replaces kept the other threads waiting: with it the merge took 1.3x as long on the
    // H200 host at 131072 keys and 16 threads (docs/algorithms.md, "CPU build speed"); a
    // vector per key cost more than the parallel re-pruning (misses on 131072 vector headers).
    auto for_each_edge = [&](auto&& f) {
      for (std::size_t i = 0; i < bn; ++i) {
        const id_t x = order[b0 + i];
        for (const id_t y : found_neighbors[i]) {
          f(x, y);
          f(y, x);
        }
      }
    };
    parallel_for(
        parts, threads,
        [&](std::size_t r, std::size_t) {
          const std::size_t lo = r * part_span, hi = std::min(n, lo + part_span);
          for_each_edge([&](id_t from, id_t) {
            if (from >= lo && from < hi) ++new_edge_count[from];
          });
          auto& mine = part_touched[r];
          mine.clear();
          std::size_t offset = 0;
          for (std::size_t x = lo; x < hi; ++x) {
            if (new_edge_count[x] == 0) continue;
            mine.push_back(static_cast<id_t>(x));
            new_edge_end[x] = static_cast<std::uint32_t>(offset);  // part-relative for now
            offset += new_edge_count[x];
          }
          part_base[r + 1] = offset;
        },
        1);
    for (std::size_t r = 0; r < parts; ++r) part_base[r + 1] += part_base[r];
    grouped.resize(part_base[parts]);
    parallel_for(
        parts, threads,
        [&](std::size_t r, std::size_t) {
          const std::size_t lo = r * part_span, hi = std::min(n, lo + part_span);
          for (const id_t x : part_touched[r]) {
            new_edge_end[x] += static_cast<std::uint32_t>(part_base[r]);
          }
          for_each_edge([&](id_t from, id_t to) {
            if (from >= lo && from < hi) grouped[new_edge_end[from]++] = to;
          });
        },
        1);
    touched.clear();
    for (const auto& mine : part_touched) touched.insert(touched.end(), mine.begin(), mine.end());
    parallel_for(
        touched.size(), threads,
        [&](std::size_t i, std::size_t t) {
          const id_t x = touched[i];
          auto& row = adj.rows[x];
          const std::uint32_t end = new_edge_end[x], begin = end - new_edge_count[x];
          for (std::uint32_t j = begin; j < end; ++j) {
            const id_t y = grouped[j];
            if (y != x && std::find(row.begin(), row.end(), y) == row.end()) row.push_back(y);
          }
          new_edge_count[x] = 0;
          if (row.size() > R) row = prune_around(store, x, row, R, fill, scratch[t]);
        },
        16);
    if constexpr (on_engine) upload_rows(*searcher, adj, touched, R, width, padded_rows, threads);
    st.connectivity_merge_seconds += detail::seconds_since(t_merge);
    on_round();
  });
  st.connectivity_distance_computations += engine_scored;
  for (const std::size_t c : scored) st.connectivity_distance_computations += c;
  for (const std::size_t c : pruned) st.connectivity_prune_distance_computations += c;
}

template <Metric M, KnnEngine Engine>
template <MatrixStore Store>
std::vector<std::uint32_t> roargraph_builder<M, Engine>::locality_clusters(
    const Store& store, const std::vector<id_t>& order, std::size_t clusters, std::size_t threads) {
  // Two levels, so that assigning n keys to about `clusters` regions costs n * (32 + fine)
  // scores instead of n * clusters. Centres are the first keys of the random `order`.
  const std::size_t n = store.size();
  const std::size_t coarse = std::min<std::size_t>(32, n);
  // A coarse cluster has at most n keys to draw centres from, so more fine centres than n
  // change nothing; the bound keeps coarse * fine (the centres' allocation) within 32 n for
  // any `clusters`, however large.
  const std::size_t fine = std::clamp<std::size_t>(clusters / coarse, 1, n);
  auto nearest = [&](id_t x, const id_t* centres, std::size_t count) {
    detail::pair_scorer<Store, key_metric> ps(store);
    ps.set_pivot(x);
    float best = -std::numeric_limits<float>::infinity();
    std::uint32_t at = 0;
    for (std::size_t c = 0; c < count; ++c) {
      const float k = ps.key(centres[c]);
      if (k > best) {
        best = k;
        at = static_cast<std::uint32_t>(c);
      }
    }
    return at;
  };
  std::vector<std::uint32_t> cluster(n);
  parallel_for(
      n, threads,
      [&](std::size_t x, std::size_t) {
        cluster[x] = nearest(static_cast<id_t>(x), order.data(), coarse);
      },
      256);
  std::vector<id_t> centres(coarse * fine);
  std::vector<std::size_t> have(coarse, 0);
  for (const id_t x : order) {
    const std::uint32_t c = cluster[x];
    if (have[c] < fine) centres[c * fine + have[c]++] = x;
  }
  parallel_for(
      n, threads,
      [&](std::size_t x, std::size_t) {
        const std::uint32_t c = cluster[x];
        cluster[x] = static_cast<std::uint32_t>(
            c * fine + nearest(static_cast<id_t>(x), centres.data() + c * fine, have[c]));
      },
      256);
  return cluster;
}

template <Metric M, KnnEngine Engine>
template <class Searcher>
void roargraph_builder<M, Engine>::upload_rows(Searcher& searcher,
                                               const detail::adjacency_lists& adj,
                                               const std::vector<id_t>& rows, std::size_t R,
                                               std::size_t width, std::vector<id_t>& padded_rows,
                                               std::size_t threads) {
  padded_rows.resize(rows.size() * R);
  parallel_for(
      rows.size(), threads,
      [&](std::size_t i, std::size_t) {
        const auto& row = adj.rows[rows[i]];
        const std::size_t k = std::min(width, row.size());
        std::copy_n(row.begin(), k, padded_rows.begin() + i * R);
        std::fill(padded_rows.begin() + i * R + k, padded_rows.begin() + (i + 1) * R, invalid_id);
      },
      1024);
  searcher.set_rows(std::span<const id_t>(rows), std::span<const id_t>(padded_rows));
}

template <Metric M, KnnEngine Engine>
template <MatrixStore Store>
std::vector<id_t> roargraph_builder<M, Engine>::prune_around(const Store& store, id_t pivot,
                                                             const std::vector<id_t>& ids,
                                                             std::size_t degree, bool fill,
                                                             std::vector<float>& scratch) const {
  detail::pair_scorer<Store, key_metric> ps(store);
  ps.set_pivot(pivot);
  std::vector<scored_id> cands;
  cands.reserve(ids.size());
  for (id_t c : ids) cands.push_back({ps.key(c), c});
  std::vector<id_t> kept;
  detail::rng_prune<Store, key_metric>(store, cands, degree, fill, scratch, kept);
  return kept;
}

template <Metric M, KnnEngine Engine>
id_t roargraph_builder<M, Engine>::pivot_mode(const knn_result& knn, std::size_t n) {
  std::vector<std::uint32_t> count(n, 0);
  for (std::size_t qi = 0; qi < knn.rows; ++qi) {
    const id_t p = knn.row_ids(qi)[0];
    if (p != invalid_id) ++count[p];
  }
  return static_cast<id_t>(std::max_element(count.begin(), count.end()) - count.begin());
}

template <Metric M, KnnEngine Engine>
template <Element T>
id_t roargraph_builder<M, Engine>::centroid_entry(matrix_view<const T> keys,
                                                  const detail::adjacency_lists& adj,
                                                  bool with_edges_only) {
  const std::size_t n = keys.rows(), d = keys.cols();
  std::vector<double> acc(d, 0.0);
  std::vector<float> row(d);
  for (std::size_t i = 0; i < n; ++i) {
    detail::widen(keys.row(i), row.data(), d);
    for (std::size_t j = 0; j < d; ++j) acc[j] += row[j];
  }
  std::vector<float> centroid(d);
  for (std::size_t j = 0; j < d; ++j) centroid[j] = static_cast<float>(acc[j] / n);
  id_t best = 0;
  float best_dist = std::numeric_limits<float>::infinity();
  bool any_edges = false;
  for (std::size_t i = 0; i < n && with_edges_only; ++i) any_edges |= !adj.rows[i].empty();
  for (std::size_t i = 0; i < n; ++i) {
    if (any_edges && adj.rows[i].empty()) continue;
    const float dist = l2::score(centroid.data(), keys.row(i), d);
    if (dist < best_dist) {
      best_dist = dist;
      best = static_cast<id_t>(i);
    }
  }
  return best;
}

template <Metric M, KnnEngine Engine>
Engine roargraph_builder<M, Engine>::default_engine(const roargraph_params& p) {
  if constexpr (std::is_same_v<Engine, cpu_knn_engine>) {
    cpu_knn_params kp;
    kp.threads = p.threads;
    return cpu_knn_engine(kp);
  } else {
    return Engine{};
  }
}

template <Metric M, KnnEngine Engine>
std::size_t roargraph_builder<M, Engine>::thread_count() const {
  return params_.threads == 0 ? default_thread_count() : params_.threads;
}

}  // namespace kvsift
