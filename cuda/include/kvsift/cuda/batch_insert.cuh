#pragma once
// Batched insert on the GPU: one launch per decode step appends one generated key to every
// graph of a `graph_set_ref` (one graph per (request, KV head)), by the rule of the CPU's
// `insertable_graph` (<kvsift/index/insertable_graph.hpp>, which documents each step) with the
// query-side index of capacity H (`graph_insert_params::holder_capacity`):
//   1. a Euclidean graph search of pool L from the new key x (decode_search, the CPU's walk);
//   2. the training queries on the key -> query lists of the keys it found, nearest key first,
//      at most C; x is scored against them;
//   3. candidates: the kNN keys of x's `query_neighbors` nearest gathered queries and the keys
//      found, RNG-pruned around x to `degree` (filled); that is x's row;
//   4. every gathered query's kNN list that x beats takes x in place of its worst key (the
//      evicted key leaves its key -> query list, x's list gets the first H such queries);
//   5. reverse edges y -> x for x's neighbours and the pivots (best keys) of the lists x
//      entered: appended to a row with room, else the row is re-pruned with x; x -> p for each
//      pivot p that kept x, while x's row has room; an in-edge for x if no row kept it.
// With the same state and exact (small integer) scores the graph, lists and key -> query
// lists equal the CPU's after each key, id for id (tests/cuda/batch_insert_test.cu); otherwise
// only the summation order of the distances differs.
//
// Each graph's insert runs on one block of 1024 threads, so one launch serves every graph of a
// step at once; within a graph the steps are parallel over warps where the CPU's results do not
// depend on order (scoring, the lists x enters, the reverse-edge rows, which are distinct).
// Measured on the H200 (Gemma-3 32K layer 11, the last 20% of the keys inserted, G copies of
// the graph per launch; docs/algorithms.md): 1.80 ms per launch for one graph, 2.35 ms for 64
// (37 us per key, 19x one CPU thread's insert in the same run); recall equal to the CPU insert's.
// Since then (full rows settled from `batch_insert_state_ref::layouts`, x's pruning on the whole
// block): 1.29 / 1.85 ms, the same graph; with `expand_width` 8 as well 0.97 / 1.27 ms (19.8 us
// per key), recall within 0.004.
// A launch is a chain of dependent steps: run it off the decode step's critical path (its own
// stream), not inside it.
//
// Storage. The graph grows in place: graph g owns rows [row_offset[g], row_offset[g + 1]) of
// the adjacency and holds sizes[g] keys (`graph_set_ref::sizes`); the key being inserted is
// key sizes[g] of graph g, already stored where the searches read keys (the engine wrote it
// into the KV cache). The query side lives in `batch_insert_state_ref`: per graph its training
// queries and their kNN lists, per query its worst and best entry, per key row its key ->
// query list (H slots). `make_insert_lists` prepares the lists on the host from the build's
// training kNN.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include <kvsift/core/ids.hpp>
#include <kvsift/cuda/decode_search.cuh>
#include <kvsift/cuda/error.cuh>
#include <kvsift/cuda/paged_kv_ref.cuh>

namespace kvsift::cuda {

/// Largest `batch_insert_params::query_candidates`, `query_neighbors` x kNN length + L, and
/// key -> query list capacity.
inline constexpr int max_insert_query_candidates = 4096;
inline constexpr int max_insert_candidates = 8192;
inline constexpr int max_insert_holders = 1024;

/// Status bits ORed into `status` by `batch_insert` (beside decode_search's own bits).
inline constexpr std::uint32_t insert_status_no_room = 1u << 16;  ///< sizes[g] == rows: skipped
/// The new key holds NaN/Inf, or its page is unmapped; the graph is skipped (left unchanged).
inline constexpr std::uint32_t insert_status_bad_key = 1u << 17;

/// Per-call settings (as `kvsift::graph_insert_params`, whose comments give the measurements).
struct batch_insert_params {
  int degree = 0;  ///< out-edges of a new key, 1..width; 0 = width / 2
  int L = 48;      ///< pool of the graph search from the new key, 1..1024
  /// Nodes the graph search expands per step (`decode_search_params::expand_width`, 1..32).
  /// 1: the CPU's walk, so the graph equals the CPU insert's; larger values cut the search's
  /// chain of dependent steps (most of a one-graph launch's time) and find another pool.
  int expand_width = 1;
  int query_neighbors = 4;       ///< nearest gathered queries supplying candidates, 0..8
  int query_candidates = 512;    ///< C: training queries gathered per key, 1..4096
  bool update_query_knn = true;  ///< step 4 (and the pivots' reverse edges)
  bool fill = true;              ///< fill pruned rows up to their degree
  /// Score of a training query against a key (the kNN lists' order): attention's inner
  /// product (as `insertable_graph<T, inner_product>`), or squared l2.
  graph_metric metric = graph_metric::inner_product;
};

/**
 * @brief The query side of every graph, device pointers. Graph g's training queries are rows
 *        [query_offset[g], query_offset[g + 1]) of `queries` (query ids local to the graph);
 *        query i's kNN list is knn_ids / knn_keys row query_offset[g] + i (nq entries, any
 *        order; empty slots invalid_id with key -inf), keys the rank keys of the metric (the
 *        inner product, or minus the squared distance; larger is better). Key row r (the
 *        adjacency's numbering) has its key -> query list in holders[r * H, + holder_counts[r])
 *        in ascending query order; removed entries read invalid_id.
 */
struct batch_insert_state_ref {
  id_t* adjacency = nullptr;       ///< the set's adjacency, writable (same memory as the set's)
  std::uint32_t* sizes = nullptr;  ///< the set's sizes, writable (same memory as the set's)
  const float* queries = nullptr;  ///< [query_offset[G]][query_ld] f32
  std::int64_t query_ld = 0;       ///< >= the keys' dim
  const std::int64_t* query_offset = nullptr;  ///< [G + 1], non-decreasing, from 0
  std::int64_t max_queries = 0;                ///< largest query count of a graph (host-known)
  int nq = 0;                                  ///< kNN list length, 1..1024
  id_t* knn_ids = nullptr;                     ///< [queries][nq]
  float* knn_keys = nullptr;                   ///< [queries][nq]
  float* worst_key = nullptr;                  ///< [queries]: key of the list's worst entry
  id_t* best_id = nullptr;                     ///< [queries]: the list's best entry (its pivot)
  float* best_key = nullptr;                   ///< [queries]
  id_t* holders = nullptr;                     ///< [rows][holder_capacity]
  std::uint32_t* holder_counts = nullptr;      ///< [rows]
  int holder_capacity = 128;                   ///< H, 1..max_insert_holders
  /// Optional [rows]: per full row, how many of its leading edges its last re-pruning kept
  /// (its layout: those, then the fill, each in rank order), 0xFFFFFFFF when unknown (all of
  /// them at first: `insert_lists::layouts`). With it, a full row that x cannot join among the
  /// kept edges is settled with a few distances instead of an O(R^2 d) re-pruning, as the CPU
  /// does (same graph); null: every full row is re-pruned.
  std::uint32_t* layouts = nullptr;
};

/// One graph's list arrays as `batch_insert_state_ref` holds them (host vectors to upload at
/// the graph's offsets).
struct insert_lists {
  std::vector<id_t> knn_ids;
  std::vector<float> knn_keys, worst_key, best_key;
  std::vector<id_t> best_id;
  std::vector<id_t> holders;  ///< rows x H (rows = the graph's capacity)
  std::vector<std::uint32_t> holder_counts;
  std::vector<std::uint32_t> layouts;  ///< rows, all unknown (0xFFFFFFFF)
};

/**
 * @brief The list arrays of one graph from its build's training kNN (`ids` and raw `scores`,
 *        m x nq, as `knn_result`), as `insertable_graph`'s constructor prepares them: rank keys,
 *        worst and best entry per query, and per key the first H queries (ascending) whose
 *        list holds it.
 * @param rows the graph's row capacity (>= every id in the lists)
 * @throw kvsift::invalid_argument sizes that do not match m x nq, H out of range, an id >= rows
 * @note O(m nq + rows H), host only.
 */
inline insert_lists make_insert_lists(const std::vector<id_t>& ids,
                                      const std::vector<float>& scores, std::size_t m,
                                      std::size_t nq, std::size_t rows, int holder_capacity,
                                      graph_metric metric = graph_metric::inner_product);

/**
 * @brief Workspace bytes of `batch_insert` over `set` (per graph: the search's results and
 *        visited set, the gathered queries, candidates and reverse-edge scratch).
 * @throw kvsift::invalid_argument parameters out of range (see batch_insert_params), dim < 1
 * @note O(1), host only.
 */
inline std::size_t batch_insert_workspace_size(const graph_set_ref& set, int dim,
                                               const batch_insert_state_ref& st,
                                               const batch_insert_params& p);

/**
 * @brief Inserts key sizes[g] of every graph g (read from `keys`: row row_offset[g] + sizes[g])
 *        into graph g and increments sizes[g].
 *
 * @throw kvsift::invalid_argument bad parameters or sizes, set.sizes / set.adjacency not the
 *        state's, null or host pointers, a stream or pointer of another device, a too-small
 *        workspace
 * @throw kvsift::dimension_mismatch query_ld < dim
 * @throw kvsift::cuda_error a launch failed
 * @note Asynchronous on `stream`, never allocates, never synchronises. Work per graph about the
 *       CPU insert's (a search of pool L, C query scores, the candidates' pruning, the reverse
 *       edges' re-prunings, O(R^2 d) each). A graph whose rows are full, or whose new key holds
 *       NaN/Inf or sits on an unmapped page, is left unchanged and sets a bit in `status` (device,
 *       optional; decode_search's bits may be set too). Thread safety: no state; no other
 *       kernel may read or write the graphs or the state during the launch (order it on one
 *       stream, as a decode step does).
 */
template <class T>
void batch_insert(const graph_set_ref& set, const dense_keys_ref<T>& keys,
                  const batch_insert_state_ref& st, const batch_insert_params& p, void* workspace,
                  std::size_t workspace_bytes, cudaStream_t stream,
                  std::uint32_t* status = nullptr);

/// As above with the keys in head-wise paged K memory (graph g's key t is token t of page-table
/// row g).
template <class T>
void batch_insert(const graph_set_ref& set, const paged_kv_ref<T>& kv,
                  const batch_insert_state_ref& st, const batch_insert_params& p, void* workspace,
                  std::size_t workspace_bytes, cudaStream_t stream,
                  std::uint32_t* status = nullptr);

}  // namespace kvsift::cuda

#include <kvsift/cuda/detail/batch_insert.inl>
