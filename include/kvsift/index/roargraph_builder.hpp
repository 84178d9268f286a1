#pragma once
// RoarGraph construction (Chen et al., VLDB'24), the index RetrievalAttention builds over
// attention keys. Attention queries are out-of-distribution for the keys: a graph built from
// key-key proximity routes a query poorly. RoarGraph instead links keys that the *queries*
// consider close:
//   1. exact kNN of every training query over the keys (Nq neighbours);
//   2. projection: each query's nearest key (the pivot) links to the query's other kNN keys,
//      RNG-pruned around the pivot and filled up to M; reverse edges, re-pruned when full;
//   3. connectivity enhancement: every key searches the projection graph (pool L) for its own
//      neighbours; RNG-pruned results become extra edges plus reverse edges, degree <= 2M;
//   4. entry points: the key nearest the key centroid, and the key that is the best key of the
//      most training queries (an attention sink on real data).
// Step 3 dominates a build; with an engine that offers connectivity searches
// (<kvsift/index/connectivity.hpp>, e.g. the CUDA engine) its searches and pruning run there.
// Unlike the reference implementation the result does not depend on thread scheduling: every
// parallel phase reads a frozen graph and writes only its own rows, and the merging steps run
// in id order.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/detail/simd_kernels.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/core/metric.hpp"
#include "kvsift/core/parallel_for.hpp"
#include "kvsift/core/topk.hpp"
#include "kvsift/core/vector_store.hpp"
#include "kvsift/index/connectivity.hpp"
#include "kvsift/index/graph_index.hpp"
#include "kvsift/index/knn.hpp"
#include "kvsift/search/beam_search.hpp"
#include "kvsift/search/search_workspace.hpp"

namespace kvsift {

/// RoarGraph build parameters (defaults as in the paper's reference settings).
struct roargraph_params {
  std::size_t nq = 100;  ///< kNN per training query (step 1), >= 2
  /// Projection degree; final max degree is 2 * M. 1 <= M <= `roargraph_max_M`.
  std::size_t M = 35;
  /// Beam pool of the connectivity searches (step 3) and of the reachability repair, >= M.
  /// Step 3 costs about linearly in it, and graph quality depends on it at scale: on 131072
  /// OOD keys L = 300 (with batch 8192) built x2.25 faster but lost 0.0175 / 0.0147 / 0.0060
  /// recall@100 at search pools 100 / 200 / 400 (docs/algorithms.md).
  std::size_t L = 500;
  std::size_t threads = 0;   ///< 0 = hardware concurrency
  bool connectivity = true;  ///< run step 3 (off only for ablations)
  /// Largest connectivity round. Rounds start at 32 keys and double up to this size, so the
  /// graph grows from few keys as incremental insertion does. The graph depends on this
  /// value and on `seed`, never on the thread count. Each round ends with a merge whose cost
  /// does not shrink with the round size, so larger rounds build faster: on 131072 OOD keys
  /// (H100 host, 16 threads, step 3 on the GPU) 8192 built in 2.07 s against 3.92 s with 1024,
  /// at recall@100 +0.0011 / +0.0004 / -0.0003 at search pools 100 / 200 / 400.
  std::size_t batch = 8192;
  std::uint64_t seed = 2024;  ///< order of the connectivity rounds
  /// Step 3 candidates from the exact kNN among the keys (this many per key, computed by the
  /// engine, so on the GPU with the CUDA engine) instead of a beam search of pool L over the
  /// growing graph; one round, `batch` ignored. 0 = beam searches. At most n - 1 are used.
  /// Much faster with a GPU engine, but the graph routes worse (exact neighbours merged in one
  /// round serve the queries less well than searched ones): on 131072 OOD keys
  /// with the CUDA engine k = 300 built the index in 2.06 s instead of 18.75 s but lost 0.052 /
  /// 0.029 / 0.014 recall@100 at search pools 100 / 200 / 400, and k = 100 collapsed to 0.08
  /// at pool 100. A speed/quality trade-off, not a default.
  std::size_t connectivity_knn = 0;
  /// Run step 3's searches and pruning on the engine when it offers them
  /// (`ConnectivityEngine`, e.g. `cuda::knn_engine`); the merging stays on the CPU. The graph
  /// equals the CPU-built one up to floating-point summation order in the scores. The engine
  /// may limit L and M (the CUDA engine: L <= 1024, M <= 64) and throws beyond them.
  bool engine_connectivity = true;
  /// Fill step 3's RNG-pruned lists (and re-pruned rows) up to their degree with pruned
  /// candidates, as step 2 does. Without fill the graph is about 2.7x sparser (mean degree 19
  /// instead of 52 at M = 35): fewer keys scored per query at top-10 (-28% at recall@10 0.95
  /// on 32768 OOD keys, -10% on the real sample) but more at top-100 (+17% at recall@100 0.95
  /// on OOD). A trade-off by k, so the default keeps the denser graph (docs/algorithms.md).
  bool connectivity_fill = true;
};

/// Largest `roargraph_params::M`: the final degree 2M stays within `max_graph_degree`, which
/// `graph_index` and `load_graph` accept, so every graph the builder makes can be saved and
/// loaded, and n * 2M cannot wrap for any indexable n (< 2^32).
inline constexpr std::size_t roargraph_max_M = max_graph_degree / 2;

/// Wall-clock seconds per phase of the last build.
struct roargraph_build_stats {
  double knn_seconds = 0;
  double projection_seconds = 0;
  double connectivity_seconds = 0;  ///< step 3 including the reachability repair
  double total_seconds = 0;
  // Where step 3 spends its time (wall-clock, summed over rounds) and how much it scores.
  double connectivity_search_seconds = 0;  ///< the parallel searches and RNG pruning
  double connectivity_merge_seconds = 0;   ///< edge merging and re-pruning of full lists
  double repair_seconds = 0;               ///< reachability repair
  std::size_t connectivity_distance_computations = 0;  ///< vectors scored by the searches
  /// Pairs scored by their pruning; counted by the CPU searches only (0 when the engine runs
  /// them: the GPU scores a warp of kept ids at once, which is not the same count).
  std::size_t connectivity_prune_distance_computations = 0;
  /// Keys not reachable from the first entry point in the returned graph, so that only a
  /// search seeded elsewhere can find them. 0 after a build with connectivity (the repair
  /// attaches every key; it gives up after 8 passes, which no measured build needed, and this
  /// count is how that would show); most keys without connectivity.
  std::size_t unreachable_keys = 0;
};

/// Where a long build stands, passed to a progress callback after every step. For one build
/// the steps are: kNN, projection, each connectivity round (rounds grow from 32 keys to
/// `roargraph_params::batch`, so early rounds are quick), reachability repair. Multi-head
/// pipelines (<kvsift/index/build_pipeline.hpp>) count heads instead.
struct build_progress {
  std::size_t done = 0;        ///< steps finished, 1..total
  std::size_t total = 0;       ///< steps of the whole job, constant during it
  double elapsed_seconds = 0;  ///< since the job started
  std::string_view phase;      ///< the step just finished: "knn", "projection", ...
};

/// Called on the building thread, never concurrently; an exception thrown from it abandons
/// the build and propagates to the caller.
using build_progress_callback = std::function<void(const build_progress&)>;

namespace detail {

/// Keys of candidates relative to a pivot, widened once per pivot.
template <VectorStore S, Metric M>
class pair_scorer {
 public:
  explicit pair_scorer(const S& s) : s_(s), buf_(s.dim()) {}
  void set_pivot(id_t p) { widen(s_.row(p), buf_.data(), s_.dim()); }
  /// Rank key of (pivot, x).
  float key(id_t x) const { return to_key<M>(M::score(buf_.data(), s_.row(x), s_.dim())); }

 private:
  const S& s_;
  std::vector<float> buf_;
};

/// RNG pruning around `pivot`: candidates sorted best-first by key to the pivot; keep c unless
/// an already-kept r is closer to c than the pivot is. If fewer than `degree` survive and
/// `fill` is set, pruned candidates are appended in rank order (RoarGraph's fill rule).
template <VectorStore S, Metric M>
void rng_prune(const S& s, std::vector<scored_id>& cands, std::size_t degree, bool fill,
               std::vector<float>& scratch, std::vector<id_t>& kept,
               std::size_t* scored = nullptr) {
  std::sort(cands.begin(), cands.end(), ranks_before);
  kept.clear();
  std::vector<id_t> pruned;
  scratch.resize(s.dim());
  for (const scored_id& c : cands) {
    if (kept.size() >= degree) break;
    widen(s.row(c.id), scratch.data(), s.dim());
    bool keep = true;
    for (id_t r : kept) {
      if (scored != nullptr) ++*scored;
      if (to_key<M>(M::score(scratch.data(), s.row(r), s.dim())) > c.key) {
        keep = false;
        break;
      }
    }
    if (keep) {
      kept.push_back(c.id);
    } else if (fill) {
      pruned.push_back(c.id);
    }
  }
  for (std::size_t i = 0; fill && i < pruned.size() && kept.size() < degree; ++i) {
    kept.push_back(pruned[i]);
  }
}

/// Adjacency under construction: n rows of at most `cap` ids.
struct adjacency_lists {
  std::vector<std::vector<id_t>> rows;
  std::span<const id_t> neighbors(id_t i) const { return rows[i]; }
};

/// Minimal graph view over adjacency lists, so beam_search runs on the projection graph.
template <VectorStore S, Metric M>
struct building_graph {
  using metric_type = M;
  const S& store;
  const adjacency_lists& adj;
  id_t entry;
  std::size_t size() const { return store.size(); }
  std::size_t dim() const { return store.dim(); }
  id_t entry_point() const { return entry; }
  std::span<const id_t> neighbors(id_t i) const { return adj.neighbors(i); }
  float score(const float* q, id_t i) const { return M::score(q, store.row(i), store.dim()); }
};
static_assert(Graph<building_graph<view_store<float>, l2>>);

/// Marks every node reachable from `start` in `reached` (left marked from earlier calls, so the
/// repair can grow one reachable set) and returns how many it newly marked. O(n + edges).
inline std::size_t mark_reachable(const adjacency_lists& adj, id_t start,
                                  std::vector<char>& reached, std::vector<id_t>& stack) {
  if (reached[start]) return 0;
  stack.assign(1, start);
  reached[start] = 1;
  std::size_t marked = 1;
  while (!stack.empty()) {
    const id_t u = stack.back();
    stack.pop_back();
    for (const id_t v : adj.rows[u]) {
      if (!reached[v]) {
        reached[v] = 1;
        ++marked;
        stack.push_back(v);
      }
    }
  }
  return marked;
}

/// Marks the builder's own (CPU) step-3 searches.
struct no_searcher {};

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace detail

/// Builds a RoarGraph index over the keys of a `MatrixStore` from training queries, using any
/// `KnnEngine` for step 1. The metric used for pruning and search is `M`; step 1 ranks by
/// inner product for `inner_product` and by (augmented) inner product equivalent to l2 for l2.
/// Thread safety: `build` is const; concurrent builds need separate builders only if the
/// engine is not thread-safe (the CPU engine is).
template <Metric M = inner_product, KnnEngine Engine = cpu_knn_engine>
class roargraph_builder {
  using KM = l2;

 public:
  /// Uses a default-constructed engine; the CPU engine gets `params.threads`.
  explicit roargraph_builder(roargraph_params params = {})
      : params_(params), engine_(default_engine(params)) {}
  roargraph_builder(roargraph_params params, Engine engine)
      : params_(params), engine_(std::move(engine)) {}

  [[nodiscard]] const roargraph_params& params() const noexcept { return params_; }

  /// Builds the index. All validation happens before any work.
  /// Complexity: O(m n d) for kNN, O(m nq M d) projection, O(n L M d) connectivity.
  /// @param stats    if not null, receives the wall-clock seconds of each phase
  /// @param progress if set, called after each step (see `build_progress`)
  /// @throw invalid_argument for an empty key set, keys of dimension 0, no training queries,
  ///        nq < 2, M == 0, M > roargraph_max_M, L < M, connectivity_knn > max_index_size,
  ///        n x 2M overflowing size_t; dimension_mismatch if query and key dims differ;
  ///        non_finite_value for NaN/Inf in keys or queries; whatever the engine or the callback
  ///        throws.
  template <MatrixStore Store>
  [[nodiscard]] graph_index<Store, M> build(Store store, matrix_view<const float> train_queries,
                                            roargraph_build_stats* stats = nullptr,
                                            const build_progress_callback& progress = {}) const {
    validate(store.view(), train_queries);
    const auto t0 = std::chrono::steady_clock::now();
    roargraph_build_stats st;
    const knn_result knn = query_knn(store.view(), train_queries);
    st.knn_seconds = detail::seconds_since(t0);
    const std::size_t total = 1 + steps_after_knn(store.size());
    if (progress) progress({1, total, st.knn_seconds, "knn"});
    return finish(std::move(store), knn, t0, st, stats, progress, 1, total);
  }

  /// Step 1 alone: the training queries' exact neighbours over the keys, as `build` computes
  /// them (nq = min(params.nq, n); for l2 the inner product over augmented vectors). With
  /// `build_from_knn` this splits a build so that step 1 of one head can run (e.g. on a GPU)
  /// while steps 2-4 of another run on the CPU. Thread safety: const; safe concurrently with
  /// other calls when the engine is (the CPU and CUDA engines are).
  /// @throw as `build`
  template <Element T>
  [[nodiscard]] knn_result training_knn(matrix_view<const T> keys,
                                        matrix_view<const float> train_queries) const {
    validate(keys, train_queries);
    return query_knn(keys, train_queries);
  }

  /// Steps 2-4 from a step-1 result computed by `training_knn` over the same keys.
  /// `stats->knn_seconds` is left 0. Complexity as `build` without the kNN.
  /// @throw invalid_argument for an empty key set, bad params (as `build`), a kNN result with
  ///        no rows, a shape that does not match its arrays (rows x k checked for overflow), a row
  ///        without a first neighbour or an id >= n; non_finite_value for NaN/Inf in the keys
  template <MatrixStore Store>
  [[nodiscard]] graph_index<Store, M> build_from_knn(
      Store store, const knn_result& knn, roargraph_build_stats* stats = nullptr,
      const build_progress_callback& progress = {}) const {
    const auto keys = store.view();
    validate_params(keys);
    detail::require(knn.rows > 0 && knn.k > 0,
                    "roargraph_builder: expected a non-empty kNN result, got ", knn.rows, " x ",
                    knn.k);
    const std::size_t knn_ids = checked_mul(knn.rows, knn.k, "roargraph_builder: kNN result");
    detail::require(knn.ids.size() == knn_ids, "roargraph_builder: kNN result of ", knn.rows, " x ",
                    knn.k, " holds ", knn.ids.size(), " ids, expected ", knn_ids);
    for (std::size_t i = 0; i < knn.rows; ++i) {
      const auto ids = knn.row_ids(i);
      detail::require(ids[0] != invalid_id, "roargraph_builder: kNN row ", i,
                      " has no neighbour, expected at least 1");
      for (const id_t id : ids) {
        detail::require(id == invalid_id || id < keys.rows(), "roargraph_builder: kNN row ", i,
                        " holds id ", id, ", expected < ", keys.rows());
      }
    }
    require_finite(keys, "roargraph_builder: keys");
    const std::size_t total = steps_after_knn(keys.rows());
    return finish(std::move(store), knn, std::chrono::steady_clock::now(), {}, stats, progress, 0,
                  total);
  }

 private:
  // Parameters first, then the key set's shape: every size the build derives from them (2M,
  // n * 2M, the widened and augmented key copies) is checked here, before anything is read or
  // allocated, rather than found to wrap after the work is done.
  template <Element T>
  void validate_params(matrix_view<const T> keys) const {
    detail::require(params_.nq >= 2, "roargraph_builder: nq must be >= 2, got ", params_.nq);
    detail::require(params_.M > 0, "roargraph_builder: M must be > 0, got 0");
    detail::require(params_.M <= roargraph_max_M,
                    "roargraph_builder: expected M <= ", roargraph_max_M,
                    " (max degree 2M <= ", max_graph_degree, "), got M = ", params_.M);
    detail::require(params_.L >= params_.M, "roargraph_builder: expected L >= M = ", params_.M,
                    ", got L = ", params_.L);
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

  template <Element T>
  void validate(matrix_view<const T> keys, matrix_view<const float> train_queries) const {
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

  // Progress steps after the kNN: projection, the connectivity rounds, the repair.
  std::size_t steps_after_knn(std::size_t n) const {
    if (!params_.connectivity) return 1;
    return 2 + connectivity_rounds(n);
  }

  // Largest connectivity round: with kNN candidates nothing depends on the graph, one round.
  std::size_t max_batch(std::size_t n) const {
    return params_.connectivity_knn > 0 ? n : std::max<std::size_t>(1, params_.batch);
  }

  // Rounds of `enhance`: batches of 32, 64, ... keys up to `batch`, until all n keys are done.
  std::size_t connectivity_rounds(std::size_t n) const {
    const std::size_t most = max_batch(n);
    std::size_t rounds = 0;
    std::size_t batch = params_.connectivity_knn > 0 ? most : std::min<std::size_t>(32, most);
    for (std::size_t b0 = 0; b0 < n; b0 += batch, batch = std::min(2 * batch, most)) ++rounds;
    return rounds;
  }

  // Steps 2-4 and the flat adjacency; `done` steps of `total` are finished on entry.
  template <MatrixStore Store>
  graph_index<Store, M> finish(Store store, const knn_result& knn,
                               std::chrono::steady_clock::time_point t0, roargraph_build_stats st,
                               roargraph_build_stats* stats,
                               const build_progress_callback& progress, std::size_t done,
                               std::size_t total) const {
    const auto keys = store.view();
    const std::size_t n = keys.rows();
    auto report = [&](std::string_view phase) {
      ++done;
      if (progress) progress({done, total, detail::seconds_since(t0), phase});
    };
    auto t1 = std::chrono::steady_clock::now();
    detail::adjacency_lists adj = project(store, knn);
    st.projection_seconds = detail::seconds_since(t1);
    report("projection");

    // Without step 3 most keys have no out-edges (only pivots and their reverse edges do); an
    // entry without out-edges ends every search at one key, so it is chosen among keys with
    // edges there.
    const id_t entry = centroid_entry(keys, adj, /*with_edges_only=*/!params_.connectivity);
    t1 = std::chrono::steady_clock::now();
    if (params_.connectivity) {
      enhance(store, adj, entry, st, [&] { report("connectivity"); });
      const auto t2 = std::chrono::steady_clock::now();
      repair_reachability(store, adj, entry);
      st.repair_seconds = detail::seconds_since(t2);
      report("repair");
    }
    st.connectivity_seconds = detail::seconds_since(t1);
    {
      std::vector<char> reached(n, 0);
      std::vector<id_t> stack;
      st.unreachable_keys = n - detail::mark_reachable(adj, entry, reached, stack);
    }

    const std::size_t R = degree_cap();
    std::vector<id_t> flat(n * R, invalid_id);
    for (std::size_t i = 0; i < n; ++i) {
      std::copy_n(adj.rows[i].begin(), std::min(R, adj.rows[i].size()), flat.begin() + i * R);
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
    return graph_index<Store, M>(std::move(store), R, std::move(flat), std::move(entries));
  }

  template <Element T>
  knn_result query_knn(matrix_view<const T> keys, matrix_view<const float> q) const {
    const std::size_t k = std::min(params_.nq, keys.rows());
    if constexpr (std::is_same_v<M, inner_product>) {
      return engine_.search(q, keys, k);
    } else {
      return l2_knn(keys, q, k);
    }
  }

  // Each key's k - 1 nearest other keys by l2 (row x, k columns, x itself normally first).
  template <Element T>
  knn_result key_knn(matrix_view<const T> keys, std::size_t k) const {
    const std::size_t n = keys.rows(), d = keys.cols();
    std::vector<float> xs(n * d);
    for (std::size_t i = 0; i < n; ++i) detail::widen(keys.row(i), &xs[i * d], d);
    return l2_knn(keys, matrix_view<const float>(xs.data(), n, d), k);
  }

  template <Element T>
  knn_result l2_knn(matrix_view<const T> keys, matrix_view<const float> q, std::size_t k) const {
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

  // Step 2: pivot lists from each query's kNN, then reverse edges.
  template <MatrixStore Store>
  detail::adjacency_lists project(const Store& store, const knn_result& knn) const {
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
          out.rows[x] = merged.size() <= M_ ? std::move(merged)
                                            : prune_around(store, static_cast<id_t>(x), merged, M_,
                                                           true, scratch[t]);
        },
        64);
    return out;
  }

  // Step 3: keys, in a seeded random order and in batches, search the graph as it stands
  // after the previous batch; RNG-pruned results become edges both ways (lists re-pruned to
  // 2M when they overflow). Batches let the reachable part of the graph grow, as in the
  // reference's incremental insertion, while every phase either reads a frozen graph or
  // writes rows in a fixed order, so the result is independent of the thread count.
  // With `connectivity_knn` the candidates are each key's exact nearest keys instead; with an
  // engine that offers a connectivity searcher, the searches and their pruning run there.
  template <MatrixStore Store, class OnRound>
  void enhance(const Store& store, detail::adjacency_lists& adj, id_t entry,
               roargraph_build_stats& st, OnRound&& on_round) const {
    if constexpr (ConnectivityEngine<Engine, typename Store::value_type>) {
      if (params_.engine_connectivity && params_.connectivity_knn == 0 && store.size() > 1) {
        auto searcher = engine_.make_connectivity_searcher(store.view(), degree_cap());
        enhance_rounds(store, adj, entry, st, on_round, &searcher);
        return;
      }
    }
    enhance_rounds(store, adj, entry, st, on_round, static_cast<detail::no_searcher*>(nullptr));
  }

  template <MatrixStore Store, class OnRound, class Searcher>
  void enhance_rounds(const Store& store, detail::adjacency_lists& adj, id_t entry,
                      roargraph_build_stats& st, OnRound& on_round, Searcher* searcher) const {
    constexpr bool on_engine = !std::is_same_v<Searcher, detail::no_searcher>;
    const std::size_t n = store.size(), R = degree_cap();
    const bool fill = params_.connectivity_fill;
    const std::size_t L = std::min(params_.L, n);
    const detail::building_graph<Store, KM> g{store, adj, entry};
    knn_result near;
    if (params_.connectivity_knn > 0 && n > 1) {
      const auto t_knn = std::chrono::steady_clock::now();
      near = key_knn(store.view(), std::min(params_.connectivity_knn + 1, n));
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
    std::mt19937_64 rng(params_.seed);
    for (std::size_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng() % i]);

    const std::size_t most = max_batch(n);
    std::vector<std::vector<id_t>> supply(std::min(most, n));
    struct edge {
      id_t from, to;
    };
    std::vector<edge> edges;
    std::vector<std::uint32_t> pend_count(n, 0), pend_end(n, 0);
    std::vector<id_t> touched, grouped;
    connectivity_batch engine_out;
    std::size_t engine_scored = 0;
    std::vector<id_t> flat;  // rows sent to the engine's searcher
    if constexpr (on_engine) {
      std::vector<id_t> all(n);
      for (std::size_t i = 0; i < n; ++i) all[i] = static_cast<id_t>(i);
      upload_rows(*searcher, adj, all, R, flat, threads);
    }
    std::size_t batch = params_.connectivity_knn > 0 ? most : std::min<std::size_t>(32, most);
    for (std::size_t b0 = 0; b0 < n; b0 += batch, batch = std::min(2 * batch, most)) {
      const std::size_t bn = std::min(batch, n - b0);
      const auto t_search = std::chrono::steady_clock::now();
      if constexpr (on_engine) {
        searcher->search(std::span<const id_t>(order).subspan(b0, bn), entry, L, params_.M,
                         engine_out);
        engine_scored += engine_out.scored;
        for (std::size_t i = 0; i < bn; ++i) {
          const id_t* row = engine_out.kept.data() + i * engine_out.degree;
          supply[i].assign(row, row + engine_out.counts[i]);
        }
      } else {
        parallel_for(
            bn, threads,
            [&](std::size_t i, std::size_t t) {
              const id_t x = order[b0 + i];
              auto& b = buf[t];
              b.cands.clear();
              if (near.rows > 0) {
                // The engine's scores are shifted by |x|^2: rescore exactly for the RNG rule.
                detail::pair_scorer<Store, KM> ps(store);
                ps.set_pivot(x);
                for (const id_t y : near.row_ids(x)) {
                  if (y != x && y != invalid_id) b.cands.push_back({ps.key(y), y});
                }
                detail::rng_prune<Store, KM>(store, b.cands, params_.M, fill, scratch[t], supply[i],
                                             &pruned[t]);
                return;
              }
              b.ids.resize(L);
              b.scores.resize(L);
              ws[t].query.resize(store.dim());
              detail::widen(store.row(x), ws[t].query.data(), store.dim());
              const auto s = beam_search(g, std::span<const float>(ws[t].query), {L, L}, ws[t],
                                         std::span<id_t>(b.ids), std::span<float>(b.scores));
              scored[t] += s.distance_computations;
              for (std::size_t j = 0; j < s.count; ++j) {
                if (b.ids[j] != x) b.cands.push_back({to_key<KM>(b.scores[j]), b.ids[j]});
              }
              detail::rng_prune<Store, KM>(store, b.cands, params_.M, fill, scratch[t], supply[i],
                                           &pruned[t]);
            },
            // One key per grab: a search takes ~2 ms at L = 500, so grabbing 8 left threads idle
            // up to 8 searches at each of the ~130 round barriers, and the first rounds (32, 64
            // keys) used only 4 and 8 threads. The graph does not depend on it.
            1);
      }
      st.connectivity_search_seconds += detail::seconds_since(t_search);
      const auto t_merge = std::chrono::steady_clock::now();
      // The round's new edges, both ways, in generation order, grouped by source with a stable
      // counting sort over flat arrays: a vector per key made this serial step cost more than
      // the parallel re-pruning at 131072 keys (cache misses on 131072 vector headers).
      edges.clear();
      touched.clear();
      for (std::size_t i = 0; i < bn; ++i) {
        const id_t x = order[b0 + i];
        for (const id_t y : supply[i]) {
          edges.push_back({x, y});
          edges.push_back({y, x});
        }
      }
      for (const auto& e : edges) {
        if (pend_count[e.from]++ == 0) touched.push_back(e.from);
      }
      std::sort(touched.begin(), touched.end());
      std::uint32_t offset = 0;
      for (const id_t x : touched) {
        pend_end[x] = offset;
        offset += pend_count[x];
      }
      grouped.resize(edges.size());
      for (const auto& e : edges) grouped[pend_end[e.from]++] = e.to;
      parallel_for(
          touched.size(), threads,
          [&](std::size_t i, std::size_t t) {
            const id_t x = touched[i];
            auto& row = adj.rows[x];
            const std::uint32_t end = pend_end[x], begin = end - pend_count[x];
            for (std::uint32_t j = begin; j < end; ++j) {
              const id_t y = grouped[j];
              if (y != x && std::find(row.begin(), row.end(), y) == row.end()) row.push_back(y);
            }
            pend_count[x] = 0;
            if (row.size() > R) row = prune_around(store, x, row, R, fill, scratch[t]);
          },
          16);
      if constexpr (on_engine) upload_rows(*searcher, adj, touched, R, flat, threads);
      st.connectivity_merge_seconds += detail::seconds_since(t_merge);
      on_round();
    }
    st.connectivity_distance_computations += engine_scored;
    for (const std::size_t c : scored) st.connectivity_distance_computations += c;
    for (const std::size_t c : pruned) st.connectivity_prune_distance_computations += c;
  }

  // Sends `rows` of the adjacency to an engine's searcher, padded to width R.
  template <class Searcher>
  static void upload_rows(Searcher& searcher, const detail::adjacency_lists& adj,
                          const std::vector<id_t>& rows, std::size_t R, std::vector<id_t>& flat,
                          std::size_t threads) {
    flat.resize(rows.size() * R);
    parallel_for(
        rows.size(), threads,
        [&](std::size_t i, std::size_t) {
          const auto& row = adj.rows[rows[i]];
          const std::size_t k = std::min(R, row.size());
          std::copy_n(row.begin(), k, flat.begin() + i * R);
          std::fill(flat.begin() + i * R + k, flat.begin() + (i + 1) * R, invalid_id);
        },
        1024);
    searcher.set_rows(std::span<const id_t>(rows), std::span<const id_t>(flat));
  }

  // Re-pruning full lists can drop a key's last in-edge. Every key must be reachable from
  // the entry point (else no query ever finds it), so attach each unreachable key, in id
  // order, to a reachable key found by searching for it: one with a free slot if the search
  // finds one, else the best found, whose lowest-ranked edge gives way. A replaced edge can
  // cut off another key, so repeat until nothing is unreachable (bounded; each pass is BFS).
  template <MatrixStore Store>
  void repair_reachability(const Store& store, detail::adjacency_lists& adj, id_t entry) const {
    const std::size_t n = store.size(), R = degree_cap();
    const std::size_t L = std::min(params_.L, n);
    const detail::building_graph<Store, KM> g{store, adj, entry};
    search_workspace ws;
    std::vector<id_t> ids(L);
    std::vector<float> scores(L);
    std::vector<char> reached(n);
    std::vector<id_t> stack;
    auto mark_from = [&](id_t start) { (void)detail::mark_reachable(adj, start, reached, stack); };
    for (int pass = 0; pass < 8; ++pass) {
      std::fill(reached.begin(), reached.end(), 0);
      mark_from(entry);
      bool changed = false;
      for (std::size_t x = 0; x < n; ++x) {
        if (reached[x]) continue;
        ws.query.resize(store.dim());
        detail::widen(store.row(x), ws.query.data(), store.dim());
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
        if (row.size() >= R)
          row.back() = static_cast<id_t>(x);
        else
          row.push_back(static_cast<id_t>(x));
        mark_from(static_cast<id_t>(x));
        changed = true;
      }
      if (!changed) return;
    }
  }

  template <MatrixStore Store>
  std::vector<id_t> prune_around(const Store& store, id_t pivot, const std::vector<id_t>& ids,
                                 std::size_t degree, bool fill, std::vector<float>& scratch) const {
    detail::pair_scorer<Store, KM> ps(store);
    ps.set_pivot(pivot);
    std::vector<scored_id> cands;
    cands.reserve(ids.size());
    for (id_t c : ids) cands.push_back({ps.key(c), c});
    std::vector<id_t> kept;
    detail::rng_prune<Store, KM>(store, cands, degree, fill, scratch, kept);
    return kept;
  }

  // The key that is the best key of the most training queries (ties: lower id).
  static id_t pivot_mode(const knn_result& knn, std::size_t n) {
    std::vector<std::uint32_t> count(n, 0);
    for (std::size_t qi = 0; qi < knn.rows; ++qi) {
      const id_t p = knn.row_ids(qi)[0];
      if (p != invalid_id) ++count[p];
    }
    return static_cast<id_t>(std::max_element(count.begin(), count.end()) - count.begin());
  }

  // Step 4: the key nearest (Euclidean) to the key centroid.
  template <Element T>
  static id_t centroid_entry(matrix_view<const T> keys, const detail::adjacency_lists& adj,
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

  static Engine default_engine(const roargraph_params& p) {
    if constexpr (std::is_same_v<Engine, cpu_knn_engine>) {
      cpu_knn_params kp;
      kp.threads = p.threads;
      return cpu_knn_engine(kp);
    } else {
      return Engine{};
    }
  }

  std::size_t degree_cap() const { return 2 * params_.M; }

  std::size_t thread_count() const {
    return params_.threads == 0 ? default_thread_count() : params_.threads;
  }

  roargraph_params params_;
  Engine engine_;
};

}  // namespace kvsift
