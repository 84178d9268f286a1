#pragma once
// One decode step of retrieval attention for one layer on the GPU, every stage on the caller's
// stream and no host synchronisation:
//
//   decode_search over each KV head's graph, the static window excluded by an id range
//   -> sparse_attention over each query head's static window (the first `sink` tokens and the
//      last `window`) followed by its retrieved tokens, read where they are (the window as two
//      ranges, the retrieved ids in the search's result rows: no token lists are built), and
//      launched as a dependent of the search (it waits for the search's results on the device).
//
// The two token sets are disjoint by construction, so this is attention over their union, the
// same as attending to each set and merging the two states with merge_state (what this step
// did before: two passes, a merge and three more launches; one pass is faster,
// docs/decode_search.md). With a retrieval that finds every middle token it equals full
// attention (tests/cuda/decode_step_test.cu checks this against a double-precision reference).
//
// With routes (`decode_step_routes`), one route_seeds launch before the search seeds every query
// head with the key lists of its graph's best routing vectors (after the `carry`): a cold step
// then starts next to its answer (docs/decode_search.md, "Routing inside the decode step").
//
// With `dense_when_capped`, DIPR heads whose search hit its cap (nearly flat attention: more
// keys within beta of the best than max_results) attend every token instead: the window pass
// leaves their retrieved ids out, a second pass attends their whole middle range, and a merge
// writes the outputs.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include <kvsift/cuda/decode_search.cuh>
#include <kvsift/cuda/error.cuh>
#include <kvsift/cuda/paged_kv_ref.cuh>
#include <kvsift/cuda/route_seeds.cuh>
#include <kvsift/cuda/sparse_attention.cuh>

namespace kvsift::cuda {

/// Per-call parameters of `decode_step`; defaults documented per field.
struct decode_step_params {
  /// Retrieval: top-k (default k 100, L 128) or DIPR. For top-k, `walk_through = false` and
  /// `expand_width` 16 (8 from 1024 queries a step) are the fast setting: the step's filter
  /// only excludes the window, and the walk-through of window tokens cost 31% of the step at
  /// 128K, B = 16 for no recall (docs/decode_search.md). DIPR takes `walk_through = false`
  /// too (with `seed_from_window`, below).
  decode_search_params search{};
  int sink = 4;      ///< first tokens of every KV head always attended (attention sinks), >= 0
  int window = 512;  ///< last tokens of every KV head always attended, >= 0
  /// Tokens of every KV head past its graph's rows, n_g .. n_g + unindexed - 1 (generated since
  /// the index was built and not inserted into it), attended with the window; the page table
  /// must map them. 0 (default): the graphs index every token. 0..2^30. Lets an engine keep
  /// decoding over an index built at prefill, every generated token attended exactly, without
  /// rebuilding or inserting (kvsift.transformers' KvsiftCache on CUDA does).
  int unindexed = 0;
  /// Attention logit scale; std::nullopt (default) = 1 / sqrt(head_dim). Must be finite.
  std::optional<float> scale;
  /// DIPR only: a query head whose search hit `search.max_results` or `search.max_hops`
  /// attends every token of its KV head (full attention) instead of the truncated answer
  /// (true); false (default) attends what the capped walk found. A search is capped when nearly
  /// flat attention puts more keys within beta of the best than the caps allow: its answer is
  /// then the in-range keys the walk met before it stopped, an arbitrary part of a set that full
  /// attention covers exactly. Caps bound the launch, whose time is the flat queries' walks,
  /// and the switch keeps those heads exact. Not a cheap route to accuracy: on Gemma-3 layer 11 a
  /// larger top-k reaches the same output error with fewer tokens (docs/decode_search.md). Costs a
  /// second attention pass over the capped heads' middle tokens, in `decode_step_dense_chunk`-token
  /// splits, and a merge, also when no head is capped (its blocks then stop at once: 45-56 us at
  /// 1024 query heads, H200). Ignored by top-k, which is never capped.
  bool dense_when_capped = false;
  /// DIPR only: seed each search with its query head's best raw score q.k over the window
  /// tokens (`decode_queries::seed_score`, as the CPU's `plan_step_params::seed_from_window`):
  /// the range is then every middle token within beta of the best token of the whole context,
  /// window included, which is what an exact DIPR over the context keeps of the middle. Without
  /// the seed (false, default) the range is measured from the best middle token, so where the
  /// window holds the best keys (the attention sink, recent tokens) the range is wider and the
  /// walk longer: on Gemma-3 layer 11 at 32K (beta 4 logits) 827 tokens a head in 9.37 ms
  /// unseeded, 551 (the exact selection's count) in 2.48 ms seeded, 1.87 ms seeded without the
  /// walk-through (64 query heads, H200; docs/decode_search.md). Costs one launch that scores
  /// each head's window rows (read again by the attention). Ignored by top-k; needs
  /// `search.metric` inner_product (the seed is a dot product).
  bool seed_from_window = false;
};

/// Tokens per block of decode_step's full-attention pass over a capped DIPR head's middle
/// tokens (`dense_when_capped`): a 131072-token head is split 32 ways, so one capped head
/// does not leave the step waiting on one block.
inline constexpr int decode_step_dense_chunk = 4096;

/**
 * @brief The routing sets `decode_step` routes its queries through before it searches (one set
 *        per graph, `kvsift::stack_route_sets` uploaded; route_seeds.cuh).
 *
 * Each query head scores its graph's routing vectors (or, with `params.probe`, the rows of its
 * best clusters) and the lists of the best `params.top` seed its search, after the graph's entry
 * points and the `carry`: a cold query starts next to its answer, and with
 * `decode_step_params::search.expand_limit` below L the walk stops after fewer steps
 * (docs/decode_search.md). `params.group` query heads are routed by one block: it must divide
 * the GQA group (num_qo_heads / num_graphs), the heads of a block sharing a graph.
 */
template <class R>
struct decode_step_routes {
  route_set_ref<R> set;
  route_params params;
};

/**
 * @brief Bytes of workspace `decode_step` needs: the search's results and workspace, the
 *        attention's split states; for DIPR with `dense_when_capped`, also each head's capped
 *        flag, its window-pass state and the full-attention pass's split states.
 * @throw kvsift::invalid_argument bad sizes or parameters (as decode_search and
 *        sparse_attention_workspace_size), sink or window negative
 * @throw kvsift::cuda_error a device query failed
 * @note O(1), host only.
 */
inline std::size_t decode_step_workspace_size(const graph_set_ref& set, int num_qo_heads,
                                              int head_dim, const decode_step_params& p = {});

/**
 * @brief Bytes of workspace `decode_step` with routes needs: the above plus the routed seeds,
 *        num_qo_heads x route_seeds_ld(routes.set.list_len, routes.params) ids.
 * @throw kvsift::invalid_argument as above, and top or list_len out of range or their product
 *        above max_decode_search_seeds (route_seeds_ld)
 * @note O(1), host only.
 */
template <class R>
std::size_t decode_step_workspace_size(const graph_set_ref& set, int num_qo_heads, int head_dim,
                                       const decode_step_params& p,
                                       const decode_step_routes<R>& routes);

/**
 * @brief Retrieval attention of one decode query per query head.
 *
 * Graph g indexes every token of KV head g of `kv` (n_g = its row count in `set`; page-table
 * row g); query head h uses graph h / (num_qo_heads / set.num_graphs) (GQA). The window of
 * head g is tokens [0, min(sink, n_g)) and [max(sink, n_g - window), n_g + p.unindexed);
 * retrieval searches the tokens between (none when the window covers the head). Output: o =
 * attention over the union, lse its natural-log normaliser, as `sparse_attention`. For DIPR with
 * `p.dense_when_capped`, a head whose search was capped attends all n_g tokens instead.
 *
 * @param q        device, [num_qo_heads][head_dim] f32
 * @param out_o    device, [num_qo_heads][head_dim] f32
 * @param out_lse  device, [num_qo_heads] f32
 * @param status   optional device word (caller zeroes): decode_search's status bits
 * @param carry    optional device [num_qo_heads][decode_search_capacity(p.search)] ids, the
 *                 warm start: read as each query head's search seeds (the previous step's
 *                 retrieval; invalid_id entries are ignored, so fill it with 0xFF bytes
 *                 before the first step) and overwritten with this step's retrieved ids. With
 *                 `p.search.expand_limit` below L the search stops after fewer steps; on real
 *                 keys that pays where consecutive queries of a head share many keys
 *                 (docs/decode_search.md).
 * @param capped   optional device [num_qo_heads]: 1 where the head's DIPR search hit
 *                 `max_results` or `max_hops` (with `dense_when_capped`, the heads that attended
 *                 every token), else 0; always 0 for top-k (`decode_search_outputs::capped`).
 * @throw kvsift::invalid_argument kv.num_kv_heads != set.num_graphs, a GQA ratio that does not
 *        divide, a too-small workspace, and whatever decode_search and sparse_attention throw
 *        for these arguments
 * @note One launch plus the search's and the attention's (DIPR with dense_when_capped: two
 *       more, the full-attention pass and the merge of the two passes' states; DIPR with
 *       seed_from_window: one more, the window's scores, O(window * head_dim) per head);
 *       asynchronous; never allocates. Work: the search (see decode_search) plus
 *       O((results + sink + window) * head_dim) per query head, O(n_g * head_dim) for a
 *       capped one. Thread safety: no state; concurrent calls need separate workspaces and outputs.
 */
template <class T>
void decode_step(const graph_set_ref& set, const paged_kv_ref<T>& kv, const float* q,
                 int num_qo_heads, int head_dim, float* out_o, float* out_lse, void* workspace,
                 std::size_t workspace_bytes, cudaStream_t stream, const decode_step_params& p = {},
                 std::uint32_t* status = nullptr, id_t* carry = nullptr,
                 std::uint32_t* capped = nullptr);

/**
 * @brief `decode_step` with routed seeds: one route_seeds launch (each query head against its
 *        graph's routing set) before the search, whose seeds are then the carry (when given)
 *        followed by the routed lists. Everything else as above.
 *
 * @param routes  the graphs' routing sets (routes.set.num_graphs == set.num_graphs,
 *                routes.set.dim == head_dim) and the routing parameters
 * @param workspace of `decode_step_workspace_size(set, num_qo_heads, head_dim, p, routes)` bytes
 * @throw kvsift::invalid_argument as above, what route_seeds throws for these sets and
 *        parameters, routes.params.group not dividing the GQA group, a set over another number
 *        of graphs
 * @throw kvsift::dimension_mismatch routes.set.dim != head_dim
 * @note Every argument (the search's, the attention's, the routing's) is checked before the
 *       first launch. One launch more than `decode_step`, O(rows_g * head_dim) per group of
 *       routed heads (route_seeds); with the routed seeds and an expand limit the search
 *       scores fewer keys. Asynchronous; never allocates; thread safety as above.
 */
template <class T, class R>
void decode_step(const graph_set_ref& set, const decode_step_routes<R>& routes,
                 const paged_kv_ref<T>& kv, const float* q, int num_qo_heads, int head_dim,
                 float* out_o, float* out_lse, void* workspace, std::size_t workspace_bytes,
                 cudaStream_t stream, const decode_step_params& p = {},
                 std::uint32_t* status = nullptr, id_t* carry = nullptr,
                 std::uint32_t* capped = nullptr);

}  // namespace kvsift::cuda

#include <kvsift/cuda/detail/decode_step.inl>
