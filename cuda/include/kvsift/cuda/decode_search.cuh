#pragma once
// Batched graph search for decode queries on the GPU: one launch serves every (request, query
// head) of a decode step, each over its own graph (one per (request, KV head), shared by the
// query heads of a GQA group), top-k or DIPR, optionally filtered by an id range with the
// 2-hop walk. Results come out as padded rows (`ids`, `scores`, `counts`) and, through
// `decode_results_to_csr`, as the CSR token lists `sparse_attention` reads.
//
// Each search is the CPU search step for step (`beam_search`, `dipr_search`, the ACORN 2-hop
// rule of `search/detail/graph_walk.hpp`): same seeding, same pool order (higher key first,
// ties to the lower id), same expansion choice, same stopping rule. With scores that are exact
// in f32 (small integers) the GPU returns the CPU's results id for id; otherwise only the
// summation order of the dot products differs. A top-k search runs on a block of four or eight
// warps (its step's row-id loads, visited-set updates, scoring and merge spread over 128 or 256
// threads; a decode batch leaves only a few searches per SM), a DIPR search on one warp; all
// walk the same way (see `decode_search_params::warps_per_search`).
//
// Keys are read where they live: either one dense matrix holding every graph's keys, or the
// head-wise paged K pool through its page table (`paged_kv_ref`), so no second copy of the
// keys exists. All graphs of a step sit in one device structure (`graph_set_ref`): the rows of
// every adjacency concatenated, with per-graph offsets.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include <kvsift/core/ids.hpp>
#include <kvsift/cuda/error.cuh>
#include <kvsift/cuda/graph_search.cuh>
#include <kvsift/cuda/paged_kv_ref.cuh>

namespace kvsift::cuda {

/// Largest pool (top-k L, DIPR l0), top-k k and DIPR answer the kernel supports.
inline constexpr int max_decode_search_L = 1024;
inline constexpr int max_decode_search_results = 1 << 16;
/// Largest `decode_search_params::expand_width`: top-k, and DIPR.
inline constexpr int max_decode_expand_width = 32;
inline constexpr int max_decode_dipr_expand_width = 8;
/// Largest `decode_queries::seeds_ld` (a DIPR output row can be passed whole).
inline constexpr int max_decode_search_seeds = max_decode_search_results;

/**
 * @brief Device handle of many graphs in one structure (one per (request, KV head)).
 *
 * Graph g owns the adjacency rows [row_offset[g], row_offset[g + 1]): key i of graph g has its
 * neighbours (ids local to graph g, < n_g = row_offset[g + 1] - row_offset[g], or sizes[g]) in row
 * row_offset[g] + i, padded with invalid_id. Its entry points are entries[g * max_entries ..],
 * padded with invalid_id (a graph's search seeds all of them, like `graph_index`).
 * Trivially copyable; all pointers are device pointers.
 */
struct graph_set_ref {
  const id_t* adjacency = nullptr;           ///< [row_offset[num_graphs]][width]
  const std::int64_t* row_offset = nullptr;  ///< [num_graphs + 1], non-decreasing, from 0
  const id_t* entries = nullptr;             ///< [num_graphs][max_entries]
  int num_graphs = 0;
  int width = 0;        ///< adjacency row width, 1..max_graph_search_width
  int max_entries = 1;  ///< entry slots per graph, 1..64
  /// Largest n_g (host-known; sizes the per-search visited sets). Graphs larger than this are
  /// a device-side error (status bit `decode_status_bad_graph`).
  std::int64_t max_keys = 0;
  /// Optional [num_graphs] (device): graph g holds sizes[g] keys, at most its
  /// row_offset[g + 1] - row_offset[g] rows; the rows beyond are room to grow in place
  /// (`graph_insert` appends a key per graph and increments its size). Null: every row is a
  /// key. A size beyond the rows is a device-side error (`decode_status_bad_graph`).
  const std::uint32_t* sizes = nullptr;
};

/// Keys of every graph in one dense matrix: key i of graph g is row row_offset[g] + i (the
/// adjacency's row numbering), `ld` elements apart. T = float, __half or __nv_bfloat16.
template <class T>
struct dense_keys_ref {
  const T* keys = nullptr;
  std::int64_t ld = 0;
  int dim = 0;
};

/// Top-k (best k of a pool of L) or DIPR (every key within beta of the best).
enum class decode_search_mode { topk, dipr };

/// Per-call parameters of `decode_search`; defaults documented per field.
struct decode_search_params {
  decode_search_mode mode = decode_search_mode::topk;
  graph_metric metric = graph_metric::inner_product;  ///< attention scores are dot products
  int k = 100;                                        ///< top-k: results per query, 1..L
  int L = 128;                                        ///< top-k: pool size, k..max_decode_search_L
  /// Nodes expanded per step: 1..max_decode_expand_width (32) for top-k, 1..8 for DIPR. 1
  /// (default) is the CPU's walk: results equal `beam_search` / `dipr_search` id for id.
  /// Larger values cut the sequential steps of a search (the GPU's latency chain) at the price
  /// of some extra scoring; results then differ from the CPU's in what the walk finds. Top-k
  /// expands the best `expand_width` unexpanded pool entries together. DIPR expands the best
  /// unexpanded beam entries while there are any, else the next in-range keys in discovery
  /// order that are still within beta of the best (a flood of the in-range region without the
  /// CPU's best-first heap). H200, 131072 keys, top-100 at recall@100 >= 0.95: 16 was the
  /// fastest for 256-512 searches, 8 for 1024 (docs/decode_search.md).
  int expand_width = 1;
  float beta = 1.0f;  ///< DIPR: range width in raw score units (unscaled q.k), finite, >= 0
  int l0 = 64;        ///< DIPR: exploration beam, 1..max_decode_search_L
  /// DIPR: cap on the answer and on in-range candidates (0 = 64 * l0, as `dipr_params`), at
  /// most max_decode_search_results. A search that reaches it stops (status bit
  /// `decode_status_capped`).
  int max_results = 0;
  /// Expand at most the first `degree_cap` neighbours of each node (0 = all), >= 0; as
  /// `beam_search_params::degree_cap` on the CPU (same results with expand_width 1): a sparser
  /// subgraph of the same index, fewer rows scored per expansion.
  int degree_cap = 0;
  /// With a filter: whether a neighbour that fails the filter is walked through to its own
  /// neighbours (true, default: the CPU's ACORN 2-hop rule, results as `beam_search` /
  /// `dipr_search`). false marks it visited and goes on: the walk over the graph with the
  /// failing ids deleted from every row, as `beam_search_params::walk_through` /
  /// `dipr_params::walk_through` = false on the CPU (the same results with expand_width 1). Top-k:
  /// a fresh failing id makes a step of the wider walk expand its nodes one by one (the 2-hop rule
  /// depends on their order); without the walk-through every step is one batch. DIPR: the
  /// walk-through reads a node's neighbours 32 at a time and stops at each failing one; without it
  /// an expansion is one batch of loads. Meant for filters that exclude few ids, such as a decode
  /// step's window, where walking through them finds little the walk would not: top-k 0.83 instead
  /// of 0.99 ms per search at 128K tokens, B = 16; a seeded DIPR decode step on Gemma-3
  /// 32K 1.22-1.36x faster for the same tokens (docs/decode_search.md). Selective filters need the
  /// walk-through to cross the excluded regions. Seeds that fail the filter are always walked
  /// through.
  bool walk_through = true;
  /// Warps that run one search: 1 = a warp per search (every mode); 4 or 8 = a block of four
  /// or eight warps per search (top-k only; the same walk and the same results as 1, bit for
  /// bit); 0 (default) = 1 for DIPR, and for top-k 8 when the batch runs at once with four
  /// eight-warp blocks per SM (m <= 4 x the SM count), else 4. A decode batch leaves the GPU
  /// only a few searches per SM, so more warps shorten each search's chain of latencies: 512
  /// searches over 131072-key graphs at L 256, expand_width 8 took 0.54 ms with four warps
  /// instead of 0.80 with one, and at expand_width 16 0.411 ms with eight warps against 0.445
  /// with four (H200; docs/decode_search.md).
  int warps_per_search = 0;
  /// Top-k: expand only the best `expand_limit` entries of the pool, 0..L (0 = L: every
  /// entry), as `beam_search_params::expand_limit` (same results with expand_width 1). Below
  /// L the search stops after fewer steps; it pays when the walk starts near the answer, with
  /// `decode_queries::seeds` holding the previous decode step's results (docs/algorithms.md).
  /// DIPR: must be 0.
  int expand_limit = 0;
  /// Top-k: expand at most `max_hops` nodes (0 = no cap), >= 0, as
  /// `beam_search_params::max_hops` (same results with expand_width 1); a step of the wider
  /// walk takes at most the nodes left. The launch lasts as long as its slowest search, so a
  /// cap that cuts the longest walks cuts the launch: 512 searches over 131072-key graphs,
  /// expand_width 16, L 256 with 272 hops (17 steps) reached recall@100 0.951 in 0.350 ms
  /// against 0.384 ms uncapped at L 224 (0.954), the fastest before (H200, one command;
  /// docs/decode_search.md). DIPR: the same cap, as `dipr_params::max_hops` (same results
  /// with expand_width 1): a search about to expand one node more stops and is capped
  /// (`decode_status_capped`, `decode_search_outputs::capped`), as at max_results, which
  /// bounds a flat query's walk only through its in-range keys.
  int max_hops = 0;
  /// Also enter each search at its graph's ids [0, entry_prefix) (those below the graph's key
  /// count), after the graph's entry points and the query's seeds, walked through when they fail
  /// the filter as any seed; as `beam_search_params::entry_prefix` (the same results with
  /// expand_width 1). For a decode step's sinks (`decode_step_params::sink`), on Gemma-3's layer
  /// 11 hubs next to most queries' best keys: with walk_through = false its seeded DIPR step
  /// found 0.9826 / 0.9696 of the exact selection at beta 2 / 4 logits against 0.9742 / 0.9569
  /// without them (on layers 5 and 17 the CPU's search gained little; docs/decode_search.md).
  /// 0..max_decode_search_seeds.
  int entry_prefix = 0;
};

/// The queries of one launch. All pointers are device pointers; optional ones may be null.
struct decode_queries {
  const float* q = nullptr;             ///< [m][ld] f32 query vectors (dim = the keys' dim)
  std::int64_t ld = 0;                  ///< row stride of q in floats, >= dim
  const std::int32_t* graph = nullptr;  ///< [m] graph of each query, in [0, num_graphs)
  /// Optional [m]: DIPR window seeding (the best raw score already seen, e.g. in the static
  /// window); NaN = none. Ignored by top-k.
  const float* seed_score = nullptr;
  /// Optional [m] each: only ids in [filter_first[i], filter_last[i]) may be returned (e.g.
  /// [0, n - window) to leave the static window to the window attention); the walk crosses
  /// filtered-out keys with the 2-hop rule. An empty range (first == last) returns no results.
  /// Both or neither.
  const std::uint32_t* filter_first = nullptr;
  const std::uint32_t* filter_last = nullptr;
  /// Optional [m][seeds_ld]: query i's own entry points, visited after its graph's ones (as
  /// `beam_search`'s `extra_entries`), e.g. the previous decode step's `ids` of the same
  /// (request, query head): pass that output with seeds_ld = its capacity. invalid_id entries
  /// are skipped (padding); an id beyond the graph sets `decode_status_bad_id` and is skipped.
  /// A seed that fails the filter is walked through, as an entry point is. May be the same
  /// memory as the output `ids` (seeds_ld = the capacity): each search reads its own row's
  /// seeds before it writes that row, and no other row's.
  const id_t* seeds = nullptr;
  int seeds_ld = 0;  ///< 1..max_decode_search_seeds with seeds, 0 without
  /// Optional [m][extra_seeds_ld]: a second row of entry points per query, visited after
  /// `seeds` by the same rules, so that two sources seed one search without a copy into one
  /// array: e.g. the previous step's ids in `seeds` and `route_seeds`' lists here (what
  /// `decode_step` with routes passes). Must not overlap the output `ids`.
  const id_t* extra_seeds = nullptr;
  int extra_seeds_ld = 0;  ///< 1..max_decode_search_seeds with extra_seeds, 0 without
};

/// Status bits ORed into `decode_search_outputs::status` (device, caller zeroes it).
inline constexpr std::uint32_t decode_status_bad_graph = 1;  ///< graph id or size out of range
inline constexpr std::uint32_t decode_status_bad_id = 2;     ///< neighbour/entry/page out of range
inline constexpr std::uint32_t decode_status_capped = 4;     ///< a DIPR search hit a cap
/// A filter with first > last or reaching past the graph, or an infinite seed score.
inline constexpr std::uint32_t decode_status_bad_query = 8;

/// Device outputs for m queries; capacity = k (top-k) or the resolved max_results (DIPR).
/// Any pointer but `ids`/`counts` may be null to skip it.
struct decode_search_outputs {
  id_t* ids = nullptr;              ///< [m][capacity], invalid_id padded; top-k best first
  float* scores = nullptr;          ///< [m][capacity] raw scores (dot, or squared distance)
  std::uint32_t* counts = nullptr;  ///< [m] results per query
  float* best_scores = nullptr;     ///< [m] DIPR: best raw score seen (seed included)
  std::uint32_t* scored = nullptr;  ///< [m] vectors scored
  std::uint32_t* status = nullptr;  ///< one word of decode_status_* bits (optional)
  /// [m]: 1 where a DIPR search hit max_results or max_hops (its answer may be incomplete: the
  /// walk stopped; `dipr_result::capped` on the CPU), else 0 (always 0 for top-k). `status`
  /// says only that some search of the launch was capped; this says which.
  std::uint32_t* capped = nullptr;
};

/**
 * @brief Result capacity per query (k, or DIPR's max_results with 0 resolved to 64 * l0).
 * @throw kvsift::invalid_argument parameters out of range (see decode_search_params)
 * @note O(1), host only.
 */
inline int decode_search_capacity(const decode_search_params& p);

/**
 * @brief Bytes of workspace `decode_search` needs for m queries over `set` (visited sets per
 *        concurrently running search, at most 8192 at once; DIPR adds an expanded set and two
 *        in-range lists of max_results entries each). The launch keeps the visited sets in
 *        shared memory instead when set.max_keys <= 2^18 and two blocks still fit an SM; the
 *        size asked does not depend on that (the device is not known here).
 * @throw kvsift::invalid_argument m or set.max_keys not positive, parameters out of range
 * @note O(1), host only.
 */
inline std::size_t decode_search_workspace_size(const graph_set_ref& set, std::int64_t m,
                                                const decode_search_params& p);

/**
 * @brief Searches every query over its graph, keys in one dense matrix.
 *
 * Query i searches graph queries.graph[i] with queries.q[i]; results in row i of `out`.
 * Top-k returns min(k, pool) ids best first, as `beam_search` with pool L (and expand_limit,
 * the query's seeds as extra entries); DIPR returns every scored key within beta of the best,
 * as `dipr_search` with (beta, l0, max_results, seed_score, the seeds), in discovery order (sort on
 * the caller's side if order matters; attention does not care). A query holding NaN or Inf returns
 * no results (DIPR best = seed or the worst score), as on the CPU.
 *
 * @throw kvsift::invalid_argument bad sizes or parameters, a too-small workspace, null
 *        required pointers, host pointers, a stream or pointer of another device, only one of
 *        the two filter arrays, seeds without seeds_ld (or the reverse) or seeds_ld out of
 *        range
 * @throw kvsift::dimension_mismatch queries.ld < dim
 * @throw kvsift::cuda_error a launch failed
 * @note Work per query O(hops * width * d) like the CPU search; asynchronous on `stream`,
 *       never allocates, never synchronises. Device-side errors (graph id, neighbour, entry or
 *       page id out of range, a bad filter or seed) skip the bad item, never read out of bounds,
 * and set a status bit. Thread safety: no state; concurrent calls need separate workspaces.
 */
template <class T>
void decode_search(const graph_set_ref& set, const dense_keys_ref<T>& keys,
                   const decode_queries& queries, std::int64_t m, const decode_search_params& p,
                   const decode_search_outputs& out, void* workspace, std::size_t workspace_bytes,
                   cudaStream_t stream);

/**
 * @brief As above with the keys in head-wise paged K memory: graph g reads its key t from
 *        page-table row g of `kv` (token t of "KV head" g), so num_graphs <= kv.num_kv_heads.
 *        The V pool is not read.
 * @throw as above; kvsift::dimension_mismatch kv.head_dim is not the queries' dim (here the
 *        keys' dim is kv.head_dim); kvsift::invalid_argument num_graphs > kv.num_kv_heads
 */
template <class T>
void decode_search(const graph_set_ref& set, const paged_kv_ref<T>& kv,
                   const decode_queries& queries, std::int64_t m, const decode_search_params& p,
                   const decode_search_outputs& out, void* workspace, std::size_t workspace_bytes,
                   cudaStream_t stream);

/**
 * @brief Compacts padded result rows into CSR for `sparse_attention`: indptr[i + 1] =
 *        indptr[i] + counts[i], indices = the ids of row i in order, as int32.
 *
 * `indices` needs room for m * capacity ids (the worst case; the host does not know the
 * total without a synchronisation). One launch of one block (m <= 2^20) for the scan, one for
 * the copy.
 * @throw kvsift::invalid_argument m out of range, capacity < 1, null or host pointers
 * @note O(m * capacity); asynchronous; counts > capacity are clamped to capacity.
 */
inline void decode_results_to_csr(const id_t* ids, const std::uint32_t* counts, std::int64_t m,
                                  int capacity, std::int64_t* indptr, std::int32_t* indices,
                                  cudaStream_t stream);

}  // namespace kvsift::cuda

#include <kvsift/cuda/detail/decode_search.inl>
