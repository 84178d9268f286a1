#pragma once
// A RoarGraph index that grows during decode: generated tokens' keys join it one by one by
// RoarGraph's update rule (RetrievalAttention, appendix C), without a rebuild.
//
// For a new key x the rule is the build's own, applied to one key:
//   1. score x against the kept prefill training queries; the `query_neighbors` queries that
//      score x highest are its nearest queries (x would be near the top of their answers).
//      Which queries: those whose kNN lists hold the keys a graph search from x finds (pool
//      L, Euclidean, as step 3 of the build searches), nearest found key first, at most
//      `query_candidates` of them (a query-side index: the kNN lists read backwards), or
//      every query (`query_candidates` = 0, O(m d) per key: 4 ms per key at m = 26214,
//      d = 256);
//   2. candidates: the keys of those queries' kNN lists (the keys those queries attend to,
//      which is what the projection, step 2 of the build, links) plus the keys a graph search
//      from x finds (pool L, Euclidean, as step 3 of the build searches);
//   3. x's edges: the candidates RNG-pruned around x with the build's pruning
//      (`detail::rng_prune`, Euclidean, filled up to `degree`);
//   4. each scored query's kNN list takes x in place of its worst key when x scores better
//      (with every query scored, the lists stay the exact top-nq of their query over all keys,
//      inserted ones included);
//   5. reverse edges y -> x for every chosen y and for the pivot (best key) of every list x
//      entered in 4 (the projection links a query's pivot to its other kNN keys; without
//      these edges recall after inserting 20% of OOD keys dropped by 0.03-0.04): appended
//      while y's row has room; a full row becomes what the build's re-pruning (RNG in rank
//      order, filled to R) makes of its R edges and x, edge for edge. A row remembers its
//      last pruning's layout (kept edges, then pruned ones, each in rank order), so a few
//      distances decide when x is occluded by a kept edge ranking before it (the fill drops
//      the farthest pruned candidate, x or the row's last edge) or when x is kept and
//      occludes none of the kept edges after it (x joins them, the last pruned edge goes);
//      otherwise (x frees pruned edges, or the layout is unknown) the row is re-pruned,
//      O(R^2). If no row kept x, x replaces the lowest-ranked edge of its nearest chosen
//      neighbour, so every inserted key has an in-edge;
//   6. x -> p for every pivot p whose row kept x, while x's row has room (the projection links
//      every key a pivot keeps back to the pivot; without it late queries of a real dump lost
//      the attention sink, the pivot of most lists).
//
// Memory kept for the rule, beyond the graph (n x max_degree ids) and the keys: the training
// queries (m x d f32), their kNN lists (m x nq ids + m x nq f32 scores) and per query its
// best and worst entry (12 bytes); per row how many of its edges RNG kept (4 bytes); with
// `query_candidates`, the lists read backwards (m x nq ids, 24 bytes of vector per key, 4 per
// query). At m = n / 10, nq = 100, d = 128 that is 136 bytes per key (plus 68 for the
// backward lists), against 280 for the graph at degree 70.
//
// The index owns its keys (copied once at construction) and grows them geometrically, so an
// insert appends to amortised-constant storage and never copies all keys.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "kvsift/core/detail/prefetch.hpp"
#include "kvsift/core/element.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/core/metric.hpp"
#include "kvsift/core/topk.hpp"
#include "kvsift/core/vector_store.hpp"
#include "kvsift/core/visited_set.hpp"
#include "kvsift/index/graph_index.hpp"
#include "kvsift/index/knn_result.hpp"
#include "kvsift/index/roargraph_builder.hpp"
#include "kvsift/search/search_workspace.hpp"

namespace kvsift {

/// Settings of `insertable_graph::insert`.
struct graph_insert_params {
  /// Out-edges chosen for a new key; 0 = max_degree / 2 (the build's M). <= max_degree.
  std::size_t degree = 0;
  /// Pool of the Euclidean graph search from the new key (the build's step 3 uses its L);
  /// about 10% of an insert's instructions at 48. At 32 recall@100 on the SmolLM2 8K dump
  /// (last 20% inserted) was 0.0105 below a rebuild at search pool 100, at 48 it is 0.0087,
  /// for 4.7% more instructions per insert (docs/algorithms.md). >= 1.
  std::size_t L = 48;
  /// Nearest training queries whose kNN keys become candidates; 0 = graph search alone
  /// (an ablation: the query-aware part of the rule off).
  std::size_t query_neighbors = 4;
  /// Offer x to the scored queries' kNN lists (step 4 above).
  bool update_query_knn = true;
  /// 0: every list x beats takes x (exact lists). T > 0: only the lists of x's T nearest
  /// training queries are offered x (approximate: the other lists go stale, and only those
  /// lists' pivots get reverse edges).
  std::size_t query_knn_lists = 0;
  /// C > 0: a query-side index instead of a scan of every training query. The index keeps,
  /// per key, the training queries whose kNN list holds it (the kNN lists read backwards); a
  /// new key scores only the queries on those lists of the keys its graph search found,
  /// nearest key first, until C queries are gathered (O(C d) instead of O(m d)). Steps 1-5
  /// then see only those queries: their nearest `query_neighbors` supply candidates, and
  /// only their lists can take the key (with `query_knn_lists` T, only the T nearest of
  /// them). Costs m x nq ids of memory. 0: every query is scored and the lists stay exact.
  /// At 32K tokens of Gemma-3 (last 20% inserted) 512 was 6.3x faster than the scan and
  /// recall@100 0.955 / 0.997 at pool 100 / 200, the scan's 0.870 / 0.982, a rebuild's
  /// 0.952 / 0.995 (docs/algorithms.md).
  std::size_t query_candidates = 512;
  /// With `query_candidates`: H > 0 records at most H queries per key in its key -> query
  /// list (its lowest-numbered holders when the list was made: at construction, or as the
  /// key entered lists during its insert; a query that drops the key frees its entry, and no
  /// later holder takes it). 0 = every holder. The cap keeps a hub (the attention sink sits
  /// in most lists) from filling the C gathered queries with its own holders alone, and it
  /// bounds the index at n x H ids, a fixed-size table (the GPU insert's). Gemma-3 32K, last
  /// 20% inserted, recall@100 at pool 100: layer 11 H = 16 / 32 / 64 / 128 / 256 / every
  /// 0.8976 / 0.9066 / 0.9647 / **0.9676** / 0.9615 / 0.9564 (rebuild 0.9519); layer 17
  /// 128: 0.9731, every: 0.9671 (rebuild 0.9781); synthetic OOD recall@10 at pool 20 0.7740
  /// against 0.7825 (docs/algorithms.md).
  std::size_t holder_capacity = 128;
  /// Fill pruned lists up to their degree with pruned candidates, as the build does
  /// (`roargraph_params::connectivity_fill`).
  bool fill = true;
};

/// Memory held by an `insertable_graph`, in bytes (sizes, not capacities).
struct insertable_graph_memory {
  std::size_t keys = 0;         ///< n x d x sizeof(T)
  std::size_t graph = 0;        ///< n x max_degree ids + n degrees + n row layouts
  std::size_t queries = 0;      ///< m x d f32 training queries
  std::size_t query_knn = 0;    ///< m x nq ids and scores + per query its best and worst
  std::size_t query_index = 0;  ///< the key -> query lists of `query_candidates` (0 without)
};

/**
 * @brief A graph index (same search interface as `graph_index`: beam_search and dipr_search
 *        take it) over keys it owns, into which keys can be inserted.
 *
 * Thread safety: const members (the searches) are safe to call concurrently; `insert` needs
 * exclusive access: no search may run on this object during an insert (it appends to, and may
 * reallocate, the key and adjacency arrays that searches read). `shared_insertable_graph`
 * (<kvsift/index/shared_insertable_graph.hpp>) enforces that rule with a reader-writer lock.
 */
template <Element T, Metric M = inner_product>
class insertable_graph {
 public:
  using value_type = T;
  using metric_type = M;

  insertable_graph() = default;

  /**
   * @brief Takes a built graph, the training queries of its build and their kNN lists over
   *        the graph's keys (`roargraph_builder::training_knn`); copies all three.
   *
   * Complexity: O(n d + n max_degree + m nq d) (the kNN lists are rescored with M).
   * @throw invalid_argument for an empty graph, no training queries, a kNN result whose rows
   *        differ from the query count or whose arrays do not match rows x k (checked for
   *        overflow), a kNN id >= n, bad params (degree > max_degree, L == 0);
   *        dimension_mismatch for queries of another dimension; non_finite_value for NaN/Inf
   *        in the queries.
   */
  template <VectorStore Store>
  requires std::same_as<typename Store::value_type, T> insertable_graph(
      const graph_index<Store, M>& built, matrix_view<const float> train_queries,
      const knn_result& train_knn, const graph_insert_params& params = {});

  [[nodiscard]] std::size_t size() const noexcept { return degrees_.size(); }
  [[nodiscard]] std::size_t dim() const noexcept { return dim_; }
  [[nodiscard]] std::size_t max_degree() const noexcept { return R_; }
  [[nodiscard]] const graph_insert_params& params() const noexcept { return params_; }
  /// The build's entry points; inserted keys never become entries.
  [[nodiscard]] id_t entry_point() const noexcept { return entries_.front(); }
  [[nodiscard]] std::span<const id_t> entry_points() const noexcept { return entries_; }
  /// Out-neighbours of node i (no bounds check). O(1).
  [[nodiscard]] std::span<const id_t> neighbors(id_t i) const noexcept {
    return {adj_.data() + static_cast<std::size_t>(i) * R_, degrees_[i]};
  }
  /// Stored key i (no bounds check). O(1).
  [[nodiscard]] const T* row(id_t i) const noexcept {
    return keys_.data() + static_cast<std::size_t>(i) * dim_;
  }
  /// Raw metric score of a f32 query against key i. O(d).
  [[nodiscard]] float score(const float* query, id_t i) const noexcept {
    return M::score(query, row(i), dim_);
  }
  /// Hints the CPU to fetch key i. O(row bytes / 64).
  void prefetch(id_t i) const noexcept { detail::prefetch_row(row(i), dim_ * sizeof(T)); }
  /// O(n).
  [[nodiscard]] degree_stats degrees() const noexcept;
  /// O(1); O(n) with `query_candidates` (it sums the key -> query lists).
  [[nodiscard]] insertable_graph_memory memory() const noexcept;

  /**
   * @brief Inserts `keys` (count x d) in row order; key i gets id size() + i (before the call).
   *
   * Each key: O(C d) to score the gathered training queries (O(m d) with
   * query_candidates = 0), one graph search of pool L
   * (O(hops x max_degree x d)), RNG pruning of its candidates (O(candidates x degree x d) worst
   * case), O(log nq) per kNN list it enters (and O(its length) on the evicted key's backward
   * list, with query_candidates), and, per chosen neighbour or pivot with a full
   * row, O(R d) (O(R^2 d) worst case, when the row's far members are not occluded).
   * Storage grows geometrically (amortised O(d + max_degree) per key, never a copy of all keys
   * per insert). An empty batch (0 rows) is a no-op.
   *
   * Strong guarantee for every error it throws: all keys are validated, and the storage for
   * the whole batch is reserved, before the first key changes anything. (Only a
   * std::bad_alloc from per-key scratch after that leaves the keys inserted so far in place,
   * with a valid graph.)
   *
   * @return the id of the first inserted key (size() for an empty batch)
   * @throw dimension_mismatch for rows of another dimension; non_finite_value for NaN/Inf in
   *        any key; out_of_range if size() + count would exceed max_index_size (ids are 32-bit);
   *        invalid_argument if the grown arrays' sizes overflow
   * @note Thread safety: exclusive; see the class comment.
   */
  id_t insert(matrix_view<const T> keys);

  /**
   * @brief Adds decode-time queries (count x d, f32) to the training queries, each with its
   *        top keys; returns the number of the first (the count of training queries before).
   *
   * The build learns the keys' neighbourhoods from the queries of the prefill; an index that
   * only inserts keys keeps serving them with those queries alone, while a rebuild would see
   * the newer ones too. An added query is a training query like the build's: later inserts
   * score the new key against it (step 1: its list's keys point back to it in the key -> query
   * lists), take its list's keys as candidates when it is among the key's nearest (step 2),
   * and offer the key to its list (step 4). The graph itself is not changed.
   * On Gemma-3 32K (the last 20% of the keys inserted one by one, each position's query added
   * after its key) recall@100 of later queries at pool 100 / 200 rose from 0.808 / 0.902 to
   * 0.854 / 0.933 on layer 5, where a rebuild on all keys and queries reaches 0.816 / 0.919
   * (and one on all keys but only the first 80% of the queries 0.774 / 0.888); layers 11 and
   * 17 were already at the rebuild's and stayed there (docs/algorithms.md).
   *
   * This overload finds each query's top `nq` keys (nq = the build's kNN size) by a beam search
   * over the index (the metric M, pool max(pool, nq)): O(count x one search + nq log nq).
   * Strong guarantee as `insert` (everything checked and the storage reserved before the first
   * query is added). An empty batch is a no-op.
   *
   * @throw dimension_mismatch for rows of another dimension; non_finite_value for NaN/Inf;
   *        invalid_argument for pool == 0 or sizes that overflow; out_of_range if the
   *        training queries would exceed max_index_size (their numbers are 32-bit)
   * @note Thread safety: exclusive, as `insert`. Moves `training_queries()`.
   */
  std::size_t add_queries(matrix_view<const float> queries, std::size_t pool = 200);

  /**
   * @brief As above with each query's top keys given, e.g. the ids a decode search returned
   *        for it: row i of `lists` (any k >= 1; invalid_id entries skipped) for query i. The
   *        ids are scored with M and the best nq of each row kept: O(count x (k d + k log k)),
   *        no search.
   * @throw as above; invalid_argument if `lists` has another row count than `queries`, arrays
   *        that do not match rows x k, or an id twice in a row; out_of_range for an id >= size()
   */
  std::size_t add_queries(matrix_view<const float> queries, const knn_result& lists);

  /// The training queries' kNN lists as they stand (the build's, updated by every insert):
  /// row i holds query i's keys best first (ties: lower id), scores raw (M's scale), missing
  /// entries invalid_id / the worst score. With `snapshot()` it is all a new insertable_graph
  /// needs to continue from this state. O(m nq log nq); thread safety as the searches.
  [[nodiscard]] knn_result query_knn() const;

  /// The training queries the kNN lists belong to (m x d, f32, row i = query i of
  /// `query_knn()`). With `query_knn()` and the graph it is the state the GPU insert
  /// (`kvsift::cuda::batch_insert`) continues from. O(1); a view valid until the object is
  /// destroyed or assigned or `add_queries` is called (inserts do not move it).
  [[nodiscard]] matrix_view<const float> training_queries() const noexcept {
    return {queries_.data(), m_, dim_};
  }

  /// A `graph_index` over a copy of the current keys and graph (to save it with graph_io, or
  /// to search it without the insert state). O(n d + n max_degree).
  [[nodiscard]] graph_index<owning_store<T>, M> snapshot() const;

 private:
  void insert_one(const T* key);
  void check_queries(matrix_view<const float> queries);
  void add_query(const float* q, std::span<scored_id> entries);
  void gather_queries();
  void update_lists(id_t x);
  void link_back(id_t x, std::span<const id_t> chosen);
  void reprune_row(id_t y, id_t x);
  [[nodiscard]] std::size_t holder_cap() const noexcept {
    return params_.holder_capacity != 0 ? params_.holder_capacity
                                        : std::numeric_limits<std::size_t>::max();
  }

  std::size_t dim_ = 0, R_ = 0, degree_ = 0;
  graph_insert_params params_{};
  std::vector<T> keys_;    // n x d
  std::vector<id_t> adj_;  // n x R, padded with invalid_id
  std::vector<std::uint32_t> degrees_;
  // Per row: how many of its leading edges RNG pruning kept, when the row is laid out as the
  // pruning leaves it (kept edges, then pruned ones, each in rank order around the row's key);
  // unknown_layout until a full row is first re-pruned (appends and the in-edge repair reset
  // it). Lets most inserts into a full row skip the re-pruning (link_back).
  static constexpr std::uint32_t unknown_layout = std::numeric_limits<std::uint32_t>::max();
  std::vector<std::uint32_t> kept_count_;
  std::vector<id_t> entries_;
  std::size_t m_ = 0, nq_ = 0;
  std::vector<float> queries_;  // m x d
  // m x nq (rank key to_key<M>, id): per query a heap, worst entry first
  // (detail::worst_first); empty slots are (-inf, invalid_id).
  std::vector<scored_id> knn_;
  std::vector<scored_id> best_;   // per query: its best kNN entry (the projection's pivot)
  std::vector<float> worst_key_;  // per query: the key of its worst kNN entry (list front)
  // With query_candidates: per key, the queries whose kNN list holds it (ascending; an entry
  // leaves when the key leaves the list), and a bit per query, set while an insert gathers
  // its queries (all clear between inserts).
  std::vector<std::vector<id_t>> holders_;
  std::vector<std::uint64_t> gathered_;
  // Scratch of the insert (exclusive, so members): no allocation per key once warmed up.
  search_workspace ws_;
  std::vector<float> xf_, yf_, scratch_, qkeys_;
  std::vector<id_t> ids_, found_, kept_, merged_, targets_, qids_;
  std::vector<std::uint32_t> offered_, entering_;
  std::vector<float> scores_;
  std::vector<scored_id> cands_, top_;
  visited_set offered_keys_;  // the keys an insert has made candidates
  bool linked_ = false;       // a re-pruning of link_back's current insert kept x
};

/// Builds a RoarGraph index with `builder` over `keys` from `train_queries` and returns it
/// ready for inserts (the training kNN of the build is kept, not recomputed).
/// Complexity: the build's, plus the copies of `insertable_graph`'s constructor.
/// @throw what `roargraph_builder::build` and the `insertable_graph` constructor throw
template <Metric M, KnnEngine Engine, Element T>
[[nodiscard]] insertable_graph<T, M> build_insertable(const roargraph_builder<M, Engine>& builder,
                                                      matrix_view<const T> keys,
                                                      matrix_view<const float> train_queries,
                                                      const graph_insert_params& params = {});

}  // namespace kvsift

#include "kvsift/index/detail/insertable_graph.inl"
