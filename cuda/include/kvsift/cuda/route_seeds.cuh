#pragma once
// Seeds for cold decode searches from routing queries.
//
// A decode query lands near the answers of the prefill queries that resemble it: the build's
// training queries (RoarGraph's step 1) already know their exact top keys. A routing set keeps a
// few of them per graph (R vectors, e.g. a strided sample of the training queries, each with its
// exact top `list_len` keys). `route_seeds` scores every decode query against its graph's R
// routing vectors (one dense pass, a GQA group's query heads sharing each load), takes the `top`
// best and writes their lists, concatenated, as the query's seeds for `decode_search`
// (`decode_queries::seeds`), where `decode_search_params::expand_limit` then stops the walk
// early: a warm start without a previous step (docs/decode_search.md, "Routed seeds").

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include <kvsift/core/ids.hpp>
#include <kvsift/cuda/decode_search.cuh>
#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda {

/// Largest `route_params::top`, `route_params::group` and `route_params::probe`.
inline constexpr int max_route_top = 16;
inline constexpr int max_route_group = 8;
inline constexpr int max_route_probe = 16;
/// Largest group * max_rows, or with probe group * max(max_clusters, group * probe *
/// max_cluster_rows) (the launch keeps that many scores in shared memory).
inline constexpr int max_route_scores = 32768;

/**
 * @brief Device handle of the routing vectors of many graphs (one set per graph of a
 *        `graph_set_ref`).
 *
 * Graph g owns rows [offset[g], offset[g + 1]) of `vectors` and of `lists`; row r's list holds
 * key ids of graph g (its routing query's best keys, best first; invalid_id padding is skipped by
 * the search). Vectors are ranked by inner product with the query: pass unit-norm vectors to
 * route by cosine. Trivially copyable; all pointers are device pointers.
 *
 * Clustered sets (`kvsift::cluster_routes`, optional): graph g's clusters are centroid rows
 * [cluster_offset[g], cluster_offset[g + 1]); cluster c holds the routing rows
 * [cluster_rows[c], cluster_rows[c + 1]) (global rows, so graph g's first cluster starts at
 * offset[g] and its last ends at offset[g + 1]). With `route_params::probe` > 0 a query scores
 * its graph's centroids and only the rows of its best `probe` clusters.
 *
 * `kvsift::stack_route_sets` (<kvsift/index/route_set.hpp>) lays host sets out in these arrays
 * and computes max_rows, max_clusters and max_cluster_rows; upload its arrays as they are.
 */
template <class T>
struct route_set_ref {
  const T* vectors = nullptr;            ///< [offset[num_graphs]][ld]
  std::int64_t ld = 0;                   ///< row stride of vectors in elements, >= dim
  int dim = 0;                           ///< the queries' dimension
  const id_t* lists = nullptr;           ///< [offset[num_graphs]][list_len]
  int list_len = 0;                      ///< ids per list, >= 1
  const std::int64_t* offset = nullptr;  ///< [num_graphs + 1], non-decreasing, from 0
  int num_graphs = 0;
  /// Largest offset[g + 1] - offset[g] (host-known; sizes shared memory). A graph with more rows
  /// is a device-side error (status bit `decode_status_bad_graph`).
  int max_rows = 0;
  const T* centroids = nullptr;                  ///< [cluster_offset[num_graphs]][ld]; or null
  const std::int64_t* cluster_offset = nullptr;  ///< [num_graphs + 1], from 0
  const std::int64_t* cluster_rows = nullptr;    ///< [cluster_offset[num_graphs] + 1]
  /// Largest cluster_offset[g + 1] - cluster_offset[g], <= max_rows; more is a device-side error.
  int max_clusters = 0;
  /// Largest cluster_rows[c + 1] - cluster_rows[c] (0: max_rows); a probed cluster with more rows
  /// is a device-side error. With probe it sizes the scores kept in shared memory (group x
  /// max(max_clusters, group x probe x max_cluster_rows) instead of group x max_rows), so small
  /// clusters let more routing blocks share an SM.
  int max_cluster_rows = 0;
};

/// Per-call parameters of `route_seeds`.
struct route_params {
  int top = 4;  ///< routing vectors taken per query, 1..max_route_top
  /// Consecutive queries that share a graph (a GQA group's query heads): one block scores them
  /// together, reading each routing vector once. The launch's last block may hold fewer; a
  /// block whose queries name different graphs is a device-side error.
  int group = 1;
  /// 0: every routing row competes. 1..max_route_probe: the rows of the query's best `probe`
  /// clusters (centroids ranked by inner product, ties to the lower cluster) compete; needs a
  /// clustered set. A group's queries share each load of the rows of every cluster one of them
  /// probes.
  int probe = 0;
};

/// Seeds per query `route_seeds` writes: top * list_len (the `seeds_ld` to search with).
/// @throw kvsift::invalid_argument top or list_len out of range, or the product above
///        max_decode_search_seeds
inline int route_seeds_ld(int list_len, const route_params& p);

/**
 * @brief Writes, for every query i, the lists of the p.top routing vectors of graph
 *        queries.graph[i] with the highest inner product with queries.q[i] (ties to the lower
 *        row), best first, into seeds[i][0, top * list_len); missing routes (a graph with fewer
 *        rows) and queries holding NaN or Inf get invalid_id. With p.probe > 0 only the rows of
 *        the query's p.probe best clusters compete (`kvsift::route_seeds` with probe).
 *
 * Reads queries.q, queries.ld and queries.graph only.
 * @throw kvsift::invalid_argument m < 0, parameters or sizes out of range, group * max_rows
 *        (with probe, group * max(max_clusters, group * probe * max_cluster_rows)) above
 *        max_route_scores, null or host pointers, a stream of another device, probe > 0
 *        without centroids or with max_clusters outside [1, max_rows]
 * @throw kvsift::dimension_mismatch queries.ld or routes.ld below routes.dim
 * @throw kvsift::cuda_error a launch failed
 * @note O(rows_g * dim) per group of queries plus O(top * (rows_g + list_len)) per query; with
 *       probe, O((clusters_g + probed rows) * dim) per group, probed rows being those of the
 *       clusters any of its queries probes;
 *       asynchronous on `stream`, never allocates. Device-side errors (a graph id out of range, a
 *       graph with more than max_rows rows or max_clusters clusters, a probed cluster of more than
 *       max_cluster_rows rows, cluster bounds that do not
 *       tile the graph's rows, a block's queries over different graphs) set
 *       `decode_status_bad_graph` in *status (when given) and leave those rows all invalid_id.
 *       Thread safety: no state.
 */
template <class T>
void route_seeds(const route_set_ref<T>& routes, const decode_queries& queries, std::int64_t m,
                 const route_params& p, id_t* seeds, std::uint32_t* status, cudaStream_t stream);

}  // namespace kvsift::cuda

#include <kvsift/cuda/detail/route_seeds.inl>
