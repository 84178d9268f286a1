#pragma once
// Attention over retrieved tokens whose K/V live in pinned host memory (the offloaded variant of
// RetrievalAttention / Spin), one decode step of one layer, every stage on the caller's stream
// and no host synchronisation:
//
//   retrieved token ids (CSR per query head; from a CPU search written to pinned memory, or
//   from decode_search on the device)
//   -> the pages they fall in, per (request, KV head) pair
//   -> the bucketed LRU step decides which pages stay in the pair's device slots
//   -> the device page table follows the LRU (evicted pages point at a guard page, admitted
//      ones at their slot) and the admitted pages' copy list is built on the device
//   -> the warp gather copies exactly those pages, K and V, from the host tier
//   -> paged sparse_attention over the retrieved ids through that page table.
//
// The result is a partial state (o, lse) over the retrieved tokens, ready for merge_state with
// the window's. Every piece is the library's own (bucketed_lru_step, gather_pages,
// sparse_attention); this header chains them without a host round trip: the number of pages
// to copy is known only on the device, so the gather reads it there.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include <kvsift/cuda/bucketed_lru.cuh>
#include <kvsift/cuda/error.cuh>
#include <kvsift/cuda/page_gather.cuh>
#include <kvsift/cuda/paged_kv_ref.cuh>
#include <kvsift/cuda/sparse_attention.cuh>

namespace kvsift::cuda {

/**
 * @brief Device handles of one layer's offloaded K/V, one pair per (request, KV head).
 *
 * Host tier: `k_pools.host` / `v_pools.host`, pinned pages; logical page p of pair i (tokens
 * [p * page_size, (p + 1) * page_size) of that KV head) is host page `host_page[i * pages + p]`.
 * Device tier: `k_pools.device` / `v_pools.device` hold `pairs * capacity + 1` pages: pair i's
 * slots are pages [i * capacity, (i + 1) * capacity), and the last page is a guard that every
 * non-resident table entry points at, so a page that failed to come in (see the status bits)
 * is read from memory that exists. `page_table` ([pairs][pages] int32, device) is what
 * sparse_attention reads; `offloaded_reset` initialises it with the LRU state, and
 * `offloaded_attention` keeps it equal to the LRU's slot_of. `lru.limits` (optional) caps
 * each pair below its capacity: buffer elasticity's per-pair shares (`pair_page_limits`) are
 * honoured by the step that reads them, a lowered limit evicting the excess first.
 * Trivially copyable. Pool page bytes must equal page_size * head_dim * sizeof(T).
 */
struct offloaded_kv_ref {
  bucketed_lru_ref lru;                      ///< pairs, capacity (slots) and pages per pair
  std::int32_t* page_table = nullptr;        ///< device, [pairs][pages]
  const std::uint64_t* host_page = nullptr;  ///< device or pinned, [pairs][pages]
  page_pools_ref k_pools;                    ///< host and device tiers of K
  page_pools_ref v_pools;                    ///< host and device tiers of V, same page ids
  int page_size = 0;                         ///< tokens per page
  int head_dim = 0;                          ///< 64, 128 or 256
};

/// Status bits of `offloaded_attention` (ORed into the caller's word).
enum offloaded_status : int {
  offloaded_page_out_of_range = 1,   ///< a retrieved id beyond the pair's pages (pair skipped)
  offloaded_over_capacity = 2,       ///< a pair's distinct pages > its limit (pair skipped)
  offloaded_too_many_ids = 4,        ///< more retrieved ids than max_ids (the rest not paged)
  offloaded_bad_copy = 8,            ///< a host page id beyond the host tier (copy skipped)
  offloaded_limit_out_of_range = 16  ///< a pair's lru.limits entry > capacity (pair skipped)
};

/// Per-call parameters of `offloaded_attention`.
struct offloaded_attention_params {
  int buckets = 64;  ///< the LRU's age buckets, [2, 256]
  /// The attention's parameters (scale, split count, its own status word: with it, every id
  /// and table entry the attention reads is checked).
  sparse_attention_params attention{};
};

/**
 * @brief Empties the LRU state of every pair and points every table entry at the guard page.
 * @throw kvsift::invalid_argument null pointers, capacity or pages out of the LRU's range, a
 *        stream, page table or LRU state of another device (or host memory)
 * @throw kvsift::cuda_error a launch failed
 * @note O(pairs * (capacity + pages)); asynchronous.
 */
inline void offloaded_reset(const offloaded_kv_ref& kv, cudaStream_t stream);

/**
 * @brief Bytes of workspace `offloaded_attention` needs for at most `max_ids` retrieved ids.
 * @throw kvsift::invalid_argument num_qo_heads not a positive multiple of kv.lru.pairs, a bad
 *        head_dim or split count (as sparse_attention_workspace_size), a size that overflows
 * @note O(1), host only.
 */
inline std::size_t offloaded_attention_workspace_size(const offloaded_kv_ref& kv, int num_qo_heads,
                                                      std::size_t max_ids,
                                                      const offloaded_attention_params& p = {});

/**
 * @brief Attention of each query head over its retrieved tokens, paging them in from the host
 *        tier as the LRU decides.
 *
 * Query head h belongs to pair h / (num_qo_heads / pairs) (GQA within a request's KV head).
 * Its tokens are ids[indptr[h] .. indptr[h + 1]) (positions in the pair's KV head); a pair's
 * selection is the pages of its query heads' ids, in order (duplicates are hits).
 *
 * @param q        device, [num_qo_heads][head_dim] f32
 * @param indptr   device or pinned, [num_qo_heads + 1] non-decreasing, indptr[0] = 0
 * @param ids      device or pinned, the retrieved ids; at most `max_ids` are paged in
 * @param out_o    device, [num_qo_heads][head_dim] f32
 * @param out_lse  device, [num_qo_heads] f32, natural log
 * @param status   device word (caller zeroes) for `offloaded_status` bits, or null; a pair
 *                 whose LRU step failed keeps its state and its heads read the guard page
 * @throw kvsift::dimension_mismatch a head dim other than 64, 128 or 256
 * @throw kvsift::invalid_argument the checks of offloaded_attention_workspace_size, pool page
 *        sizes that do not match the page size, head dim and T, device pools smaller than
 *        pairs * capacity + 1 pages, null pointers, a too-small workspace, buckets outside
 *        [2, 256], a stream or pointer of another device (all before anything is launched)
 * @throw kvsift::cuda_error a launch failed
 * @note Five launches plus the gathers' and the attention's; asynchronous; never allocates.
 *       Work O(ids + pairs * capacity) for the paging, O(admitted pages * page bytes) copied,
 *       O(ids * head_dim) for the attention. Thread safety: mutates the LRU state, the page
 *       table and the device tier: one call at a time per `kv`.
 */
template <class T>
void offloaded_attention(const offloaded_kv_ref& kv, const float* q, int num_qo_heads,
                         const std::int64_t* indptr, const std::int32_t* ids, std::size_t max_ids,
                         float* out_o, float* out_lse, void* workspace, std::size_t workspace_bytes,
                         cudaStream_t stream, const offloaded_attention_params& p = {},
                         int* status = nullptr);

}  // namespace kvsift::cuda

#include <kvsift/cuda/detail/offloaded_attention.inl>
