#pragma once
// Batched beam search over a graph on the GPU, with optional RNG pruning of each result: the
// connectivity step (step 3) of the RoarGraph build, where every key searches the graph for its
// own neighbours. On the CPU that step is 95% of a build (131072 keys: 11500 vectors scored per
// search at ~170 ns each, memory-latency bound); here one warp runs one search, thousands run at
// once, and the keys (32-64 MiB) stay in the H100's 50 MB L2.
//
// The search is the CPU `beam_search` step for step: a pool of the L best candidates (higher
// key first, ties to the lower id), expand the best unexpanded candidate, score its unvisited
// neighbours, keep the L best, stop when every pool entry is expanded. The pool content after an
// expansion does not depend on the order in which its neighbours are inserted, so with scores
// that are exact in f32 the GPU returns the CPU's result id for id; otherwise only summation
// order differs. Pruning is `rng_prune` with fill, around the query key.
//
// Two entry points:
// - `graph_search(...)`: device pointers in and out, caller-provided workspace (size it with
//   `graph_search_workspace_size`), a stream; never allocates, never synchronises.
// - `connectivity_searcher<T>`: host keys in, device copies of keys and adjacency kept across
//   calls, rows updated incrementally; models `kvsift::ConnectivitySearcher`, which is how
//   `roargraph_builder<M, cuda::knn_engine>` runs step 3 on the GPU.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#pragma nv_diagnostic push
#pragma nv_diag_suppress 554
#include <kvsift/core/element.hpp>
#include <kvsift/core/ids.hpp>
#include <kvsift/core/matrix_view.hpp>
#include <kvsift/index/connectivity.hpp>
#pragma nv_diagnostic pop
#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda {

/// Largest pool, adjacency width and pruning degree the kernel supports.
inline constexpr int max_graph_search_L = 1024;
inline constexpr int max_graph_search_width = 256;
inline constexpr int max_graph_search_degree = 64;

/// Ranking of `graph_search`: inner product (higher first) or squared l2 (lower first).
enum class graph_metric { inner_product, l2 };

/// Per-call parameters of `graph_search`.
struct graph_search_params {
  int L = 100;     ///< pool size, 1..max_graph_search_L; every pool entry is returned
  int degree = 0;  ///< RNG-prune each result to this many ids (0 = no pruning output)
  graph_metric metric = graph_metric::l2;
  /// Expand only the best this many pool entries, 0..L (0 = L), as
  /// `kvsift::beam_search_params::expand_limit`.
  int expand_limit = 0;
};

/// Device handle of one graph: n keys (row-major, stride `ld` elements) and an n x width adjacency,
/// rows padded with invalid_id. T = float, __half or __nv_bfloat16.
template <class T>
struct graph_ref {
  const T* keys = nullptr;
  std::int64_t n = 0, d = 0, ld = 0;
  const id_t* adjacency = nullptr;
  int width = 0;
  id_t entry = 0;
};

/// Former name of `graph_ref` (device handles are `*_ref`), kept for one release.
template <class T>
using device_graph [[deprecated("use kvsift::cuda::graph_ref")]] = graph_ref<T>;

/// Device outputs of `graph_search` for m queries; any pointer may be null to skip it.
struct graph_search_outputs {
  id_t* ids = nullptr;                   ///< m x L pool ids, best first, invalid_id padded
  float* scores = nullptr;               ///< m x L raw scores (dot, or squared distance)
  std::uint32_t* counts = nullptr;       ///< m: pool entries
  id_t* kept = nullptr;                  ///< m x degree pruned neighbours (needs degree > 0)
  std::uint32_t* kept_counts = nullptr;  ///< m
  std::uint32_t* scored = nullptr;       ///< m: vectors scored by the search
};

/**
 * @brief Bytes of workspace `graph_search` needs for m queries over n keys (one visited bitset
 *        per concurrently running search; at most 8192 run at once).
 * @throw kvsift::invalid_argument n or m not positive
 * @note O(1), host only.
 */
inline std::size_t graph_search_workspace_size(std::int64_t n, std::int64_t m);

/**
 * @brief Beam search of every query over the graph, best-first pool of L; optionally the RNG
 *        pruning of each pool around its query key (the query's own id is skipped).
 *
 * Query i is the key row `query_rows[i]` (self-search, as the connectivity step needs).
 * @throw kvsift::invalid_argument bad sizes (n, d, m, L, width, degree out of range), an entry
 *        id >= n, a too-small workspace, null required pointers, host pointers, a stream or
 *        pointer of another device, a pruning output without degree
 * @throw kvsift::cuda_error a CUDA call failed
 * @note Work per query O(hops * width * d) like the CPU search; memory O(L) shared per warp.
 *       Row ids in the adjacency must be < n or invalid_id (not checked: device memory);
 *       `connectivity_searcher` checks them on the host. Thread safety: concurrent calls need
 *       separate workspaces.
 */
template <class T>
void graph_search(const graph_ref<T>& g, const id_t* query_rows, std::int64_t m,
                  const graph_search_params& p, const graph_search_outputs& out, void* workspace,
                  std::size_t workspace_bytes, cudaStream_t stream);

/**
 * @brief Step-3 searcher of the RoarGraph build on the GPU; models
 *        `kvsift::ConnectivitySearcher`. Keeps device copies of the keys and of an n x width
 *        adjacency (all rows empty at first); `set_rows` replaces rows, `search` runs a batch.
 *
 * T is the host element type (float, kvsift::half, kvsift::bfloat16).
 * Thread safety: not thread-safe; one per build. Move-only.
 */
template <Element T>
class connectivity_searcher {
 public:
  /// Uploads the keys. @throw kvsift::invalid_argument empty keys, width out of range;
  /// kvsift::non_finite_value NaN/Inf in the keys (before any CUDA call);
  /// kvsift::cuda_error on device failure.
  connectivity_searcher(matrix_view<const T> keys, std::size_t width, int device = 0);
  ~connectivity_searcher();
  connectivity_searcher(connectivity_searcher&&) noexcept;
  connectivity_searcher& operator=(connectivity_searcher&&) noexcept;

  /**
   * @brief Replaces rows: row `rows[i]` becomes padded[i * width, (i + 1) * width).
   * @throw kvsift::invalid_argument padded.size() != rows.size() * width, a row id >= n, a
   *        neighbour id >= n other than invalid_id (nothing is uploaded then)
   */
  void set_rows(std::span<const id_t> rows, std::span<const id_t> padded);

  /**
   * @brief For each key row x in `rows`: l2 beam search of pool L from `entry`, then RNG
   *        pruning of the pool (x excluded) to `degree` with fill. Results in `out`.
   * @throw kvsift::invalid_argument an id >= n, L or degree out of range
   */
  void search(std::span<const id_t> rows, id_t entry, std::size_t L, std::size_t degree,
              connectivity_batch& out);

  /**
   * @brief `search`, then the builder's merge of its results on the device (models
   *        `kvsift::MergingConnectivitySearcher`): for each query x = rows[i] in order and
   *        each of its pruned neighbours y in order, y joins row x and x joins row y (skipped if
   *        the row holds it); rows longer than the width are then RNG-pruned around their key
   *        (l2) to the width, with fill if `fill`. The rows stay on the device.
   * @return vectors scored by the searches
   * @throw as `search`; kvsift::invalid_argument 2 * rows * degree > INT_MAX
   * @note One warp per changed row: O(c * (width + degree)) to merge a row that gains c edges,
   *       O(t^2 / 32 + t * width * d) per lane to re-prune one of t candidates. Device memory
   *       besides `search`'s: 16 bytes x (E + min(E, n + 1) * width) for the candidate lists
   *       plus 28 bytes x E for the edges, E = 2 * rows * degree (about 170 MB at 8192 rows,
   *       degree 35, width 70 and n >= 131072), kept for the next call. Synchronises the
   *       searcher's stream.
   */
  std::size_t search_and_merge(std::span<const id_t> rows, id_t entry, std::size_t L,
                               std::size_t degree, bool fill);

  /**
   * @brief Step 2 of the build (the projection) on the device (models
   *        `kvsift::ProjectingConnectivitySearcher`): every row is replaced by its projection
   *        row, as `roargraph_builder` computes it on the CPU.
   *
   * `knn_ids` holds m lists of k ids (row-major, best first, padded with invalid_id at the
   * end): the training queries' nearest keys. A list's first id is its pivot. Each pivot's
   * candidates (the other ids of the lists it heads, distinct, itself excluded) are ranked by
   * l2 distance to it (ties to the lower id) and RNG-pruned to `degree` with fill; then each
   * row x gets, in ascending order, the pivots whose pruned list holds x and that it does not
   * hold, and a row longer than `degree` is ranked and pruned around x the same way. Rows of
   * keys no list reaches are empty.
   * @throw kvsift::invalid_argument k = 0, a size that is not a multiple of k, degree outside
   *        1..min(width, max_graph_search_degree), m x (k - 1) or n x degree > INT_MAX, an id
   *        after a list's padding; kvsift::out_of_range an id >= n other than invalid_id
   *        (all checked before anything is uploaded)
   * @throw kvsift::cuda_error on device failure
   * @note O(m k) to check and sort the lists, O(c * degree * d) per pivot's c candidates to
   *       prune (a warp per pivot), O(t^2 / 32 + t * degree * d) per lane for a row of t > degree
   *       after the reverse edges. Allocates about 60 bytes per list entry on the device for
   *       the call only; synchronises the searcher's stream.
   */
  void project(std::span<const id_t> knn_ids, std::size_t k, std::size_t degree);

  /// Later searches expand only the best `limit` entries of their pool (0 = all; models
  /// `kvsift::ExpandLimitingSearcher`); a limit above a search's L expands every entry.
  void set_expand_limit(std::size_t limit) noexcept;

  /// Every row as the device holds it, without padding; `rows` is resized to n.
  /// @throw kvsift::cuda_error on device failure
  void get_rows(std::vector<std::vector<id_t>>& rows) const;

 private:
  struct state;
  std::unique_ptr<state> s_;

  // Checks the arguments of a search, uploads the query rows and launches it; the results stay
  // in the state's buffers. Returns the number of queries.
  std::int64_t enqueue_search(std::span<const id_t> rows, id_t entry, std::size_t L,
                              std::size_t degree);
  // Downloads the last search's per-query scored counts for m queries after the copies already
  // enqueued, waits for the stream, and returns their sum.
  std::size_t wait_scored(std::int64_t m);
};

}  // namespace kvsift::cuda

#include <kvsift/cuda/detail/graph_search.inl>
