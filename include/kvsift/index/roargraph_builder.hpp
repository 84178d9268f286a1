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
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/detail/clock.hpp"
#include "kvsift/core/detail/simd_kernels.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/core/metric.hpp"
#include "kvsift/core/parallel_for.hpp"
#include "kvsift/core/topk.hpp"
#include "kvsift/core/vector_store.hpp"
#include "kvsift/index/build_progress.hpp"
#include "kvsift/index/connectivity.hpp"
#include "kvsift/index/detail/roargraph_graph.hpp"
#include "kvsift/index/graph_index.hpp"
#include "kvsift/index/knn.hpp"
#include "kvsift/index/rng_prune.hpp"
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
  /// (`ConnectivityEngine`, e.g. `cuda::knn_engine`). The graph equals the CPU-built one up to
  /// floating-point summation order in the scores. The engine may limit L and M (the CUDA
  /// engine: L <= 1024, M <= 64) and throws beyond them. Not used without
  /// `connectivity_fill` (an engine's searches fill their pruned lists).
  bool engine_connectivity = true;
  /// With `engine_connectivity`: merge each round's edges and re-prune the rows on the engine
  /// too when its searcher offers it (`MergingConnectivitySearcher`) and
  /// `connectivity_degree_cap` is 0; the rows then stay on the engine until step 3 ends. Same
  /// graph as the CPU merge (up to summation order, as above).
  bool engine_merge = true;
  /// With step 3's merge on the engine (`engine_merge` applies): run step 2 (the projection)
  /// there too when its searcher offers it (`ProjectingConnectivitySearcher`, the CUDA engine
  /// does), so that the rows are made where step 3 reads them. Same graph as the CPU step 2
  /// (up to summation order, as above).
  bool engine_projection = true;
  /// Fill step 3's RNG-pruned lists (and re-pruned rows) up to their degree with pruned
  /// candidates, as step 2 does. Without fill the graph is about 2.7x sparser (mean degree 19
  /// instead of 52 at M = 35): fewer keys scored per query at top-10 (-28% at recall@10 0.95
  /// on 32768 OOD keys, -10% on the real sample) but more at top-100 (+17% at recall@100 0.95
  /// on OOD). A trade-off by k, so the default keeps the denser graph (docs/algorithms.md).
  bool connectivity_fill = true;
  /// Step 3's CPU searches expand at most this many neighbours of each node (0 = all; see
  /// `beam_search_params::degree_cap`). Cheaper searches over the growing graph, measured for
  /// its effect on build time and recall in docs/algorithms.md. An engine's searches honour it
  /// too: they are sent the rows cut to the cap, so the graph is the CPU build's.
  std::size_t connectivity_degree_cap = 0;
  /// Step 3's searches expand only the best round(fraction * L) entries of their pool (at
  /// least 1; `beam_search_params::expand_limit`), 0 < fraction <= 1; 1 expands every entry,
  /// the paper's search. The pool's lower ranks are still scored and kept, so the RNG pruning
  /// sees the same candidates near the key; the search takes fewer hops. An engine's searches
  /// honour it when they offer `set_expand_limit` (`ExpandLimitingSearcher`, the CUDA engine
  /// does); otherwise a build with a fraction below 1 searches on the CPU. The default cut the
  /// vectors scored by step 3 on 131072 OOD keys to 0.67x with recall@10 / recall@100 equal or
  /// better at every pool from 10 to 300; 0.7 cut them to 0.53x but lost up to 0.007 at the
  /// smallest pool (docs/algorithms.md).
  double connectivity_expand_fraction = 0.8;
  /// Step 3's CPU searches of a round are handed to the threads region by region: each key is
  /// assigned to the nearest of about this many sampled keys (32 coarse ones, then
  /// clusters / 32 fine ones within its coarse cluster), and a round's keys are searched in
  /// cluster order, so that searches running close in time read the same graph rows and keys.
  /// Only the order within a round changes (each round searches the graph as the round
  /// before left it), so the graph is the same bit for bit. 0 = the rounds' random order.
  /// Costs n * (32 + clusters / 32) key scores once. Pays where the keys do not fit the CPU's
  /// last-level cache (docs/algorithms.md). Not used by an engine's searches.
  std::size_t step3_locality_clusters = 4096;
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

/// Builds a RoarGraph index over the keys of a `MatrixStore` from training queries, using any
/// `KnnEngine` for step 1. The metric used for pruning and search is `M`; step 1 ranks by
/// inner product for `inner_product` and by (augmented) inner product equivalent to l2 for l2.
/// Thread safety: `build` is const; concurrent builds need separate builders only if the
/// engine is not thread-safe (the CPU engine is).
template <Metric M = inner_product, KnnEngine Engine = cpu_knn_engine>
class roargraph_builder {
  // The key-key metric: pruning and the step-3 searches compare keys with keys, always by l2,
  // whichever metric M ranks queries against keys.
  using key_metric = l2;

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
    const auto t0 = detail::monotonic_seconds();
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
    return finish(std::move(store), knn, detail::monotonic_seconds(), {}, stats, progress, 0,
                  total);
  }

 private:
  // Parameters first, then the key set's shape: every size the build derives from them (2M,
  // n * 2M, the widened and augmented key copies) is checked here, before anything is read or
  // allocated, rather than found to wrap after the work is done.
  template <Element T>
  void validate_params(matrix_view<const T> keys) const;

  template <Element T>
  void validate(matrix_view<const T> keys, matrix_view<const float> train_queries) const;

  // Progress steps after the kNN: projection, the connectivity rounds, the repair.
  std::size_t steps_after_knn(std::size_t n) const;

  // Largest connectivity round: with kNN candidates nothing depends on the graph, one round.
  std::size_t max_batch(std::size_t n) const;

  // Rounds of `enhance`: batches of 32, 64, ... keys up to `batch`, until all n keys are done
  // (one round of n with connectivity_knn). Calls f(first, count) for each, in order.
  template <class F>
  void for_each_round(std::size_t n, F&& f) const;
  std::size_t connectivity_rounds(std::size_t n) const;

  // Step 3's expand limit for a search pool of L: round(connectivity_expand_fraction * L),
  // at least 1; 0 when that is L (every entry expanded).
  std::size_t expand_limit(std::size_t L) const;

  // Region of every key for step 3's search order (step3_locality_clusters): the nearest of 32
  // coarse centres, then of `clusters / 32` fine ones within it (centres drawn from `order`).
  template <MatrixStore Store>
  static std::vector<std::uint32_t> locality_clusters(const Store& store,
                                                      const std::vector<id_t>& order,
                                                      std::size_t clusters, std::size_t threads);

  // Steps 2-4 and the padded adjacency; `done` steps of `total` are finished on entry.
  template <MatrixStore Store>
  graph_index<Store, M> finish(Store store, const knn_result& knn, double t0,
                               roargraph_build_stats st, roargraph_build_stats* stats,
                               const build_progress_callback& progress, std::size_t done,
                               std::size_t total) const;

  template <Element T>
  knn_result query_knn(matrix_view<const T> keys, matrix_view<const float> q) const;

  // Each key's k - 1 nearest other keys by l2 (row x, k columns, x itself normally first).
  template <Element T>
  knn_result key_knn(matrix_view<const T> keys, std::size_t k) const;

  template <Element T>
  knn_result l2_knn(matrix_view<const T> keys, matrix_view<const float> q, std::size_t k) const;

  // Step 2: pivot lists from each query's kNN, then reverse edges.
  template <MatrixStore Store>
  detail::adjacency_lists project(const Store& store, const knn_result& knn) const;

  // Step 3: keys, in a seeded random order and in batches, search the graph as it stands
  // after the previous batch; RNG-pruned results become edges both ways (lists re-pruned to
  // 2M when they overflow). Batches let the reachable part of the graph grow, as in the
  // reference's incremental insertion, while every phase either reads a frozen graph or
  // writes rows in a fixed order, so the result is independent of the thread count.
  // With `connectivity_knn` the candidates are each key's exact nearest keys instead; with an
  // engine that offers a connectivity searcher, the searches and their pruning run there.
  template <MatrixStore Store, class OnRound>
  void enhance(const Store& store, detail::adjacency_lists& adj, id_t entry,
               roargraph_build_stats& st, OnRound&& on_round) const;

  // Steps 2 and 3 on the engine's searcher when it can run both and every step-3 rule lets it
  // (`engine_projection`): the projection made on the engine, step 3's rounds merged there,
  // the rows downloaded once at the end. Returns false, having done nothing, otherwise.
  // t_connect: set when step 3 starts.
  template <MatrixStore Store, class OnProjected, class OnRound>
  bool engine_steps_2_3(const Store& store, const knn_result& knn, detail::adjacency_lists& adj,
                        id_t& entry, roargraph_build_stats& st, double& t_connect,
                        OnProjected&& on_projected, OnRound&& on_round) const;

  // Whether step 3's searches may run on an engine's searcher of type S over n keys.
  template <class S>
  bool engine_searches(std::size_t n) const;

  // rows_on_engine: the searcher already holds every row (the engine's projection).
  template <MatrixStore Store, class OnRound, class Searcher>
  void enhance_rounds(const Store& store, detail::adjacency_lists& adj, id_t entry,
                      roargraph_build_stats& st, OnRound& on_round, Searcher* searcher,
                      bool rows_on_engine = false) const;

  // Sends `rows` of the adjacency to an engine's searcher, padded to width R. Only the first
  // `width` ids of each row are sent: a search over rows cut to the degree cap is the capped
  // search (`capped_neighbors`), so the engine honours the cap without knowing about it.
  template <class Searcher>
  static void upload_rows(Searcher& searcher, const detail::adjacency_lists& adj,
                          const std::vector<id_t>& rows, std::size_t R, std::size_t width,
                          std::vector<id_t>& padded_rows, std::size_t threads);

  template <MatrixStore Store>
  std::vector<id_t> prune_around(const Store& store, id_t pivot, const std::vector<id_t>& ids,
                                 std::size_t degree, bool fill, std::vector<float>& scratch) const;

  // The key that is the best key of the most training queries (ties: lower id).
  static id_t pivot_mode(const knn_result& knn, std::size_t n);

  // Step 4: the key nearest (Euclidean) to the key centroid.
  template <Element T>
  static id_t centroid_entry(matrix_view<const T> keys, const detail::adjacency_lists& adj,
                             bool with_edges_only);

  static Engine default_engine(const roargraph_params& p);

  std::size_t degree_cap() const { return 2 * params_.M; }

  std::size_t thread_count() const;

  roargraph_params params_;
  Engine engine_;
};

}  // namespace kvsift

#include "kvsift/index/detail/roargraph_builder.inl"
