#pragma once
// Sparse decode attention on the GPU: each query head attends to its own list of selected
// tokens in head-wise paged K/V, producing a partial state (o, lse) ready to merge.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include <kvsift/cuda/error.cuh>
#include <kvsift/cuda/merge.cuh>
#include <kvsift/cuda/paged_kv_ref.cuh>

namespace kvsift::cuda {

/// Per-call parameters. Defaults documented per field.
struct sparse_attention_params {
  /// Logit scale; std::nullopt (default) means 1 / sqrt(head_dim). Must be finite.
  std::optional<float> scale;
  /// Blocks per query head (split-K over the token list); 0 (default) = chosen from the
  /// device's multiprocessor count and sparse_attention_policy. Must be the same value for the
  /// workspace-size query and the call.
  int num_splits = 0;
  /// Debug aid, default null. When non-null (device pointer to one int the caller zeroes), the
  /// kernel checks every token id and page-table entry, skips invalid tokens and ORs 1 into
  /// *status. When null nothing is checked: out-of-range ids are undefined behaviour.
  int* status = nullptr;
};

/// Tuning for the automatic split count. Defaults are good on Hopper (H100/H200).
struct sparse_attention_policy {
  /// Target resident blocks (128 threads each) per multiprocessor across all heads.
  int blocks_per_sm = 4;
  /// Upper bound of the automatic split count.
  int max_splits = 64;
};

/**
 * @brief Bytes of device workspace sparse_attention needs for these sizes (0 when the split
 * count resolves to 1). Call before sparse_attention with the same arguments.
 *
 * @throw kvsift::invalid_argument num_qo_heads < 0, head_dim <= 0, num_splits < 0
 * @throw kvsift::cuda_error the device query failed (automatic split count only)
 * @note O(1); queries the current device's multiprocessor count when num_splits == 0.
 */
inline std::size_t sparse_attention_workspace_size(int num_qo_heads, int head_dim,
                                                   const sparse_attention_params& params = {},
                                                   const sparse_attention_policy& policy = {});

/**
 * @brief Attention of one decode query per query head over that head's selected tokens.
 *
 * For query head h with KV head kvh = h / (num_qo_heads / num_kv_heads) (GQA) and token ids
 * token_ids[token_indptr[h] .. token_indptr[h + 1]]:
 *   s_t = scale * <q_h, k_t>,  lse_h = log(sum_t exp(s_t)),  o_h = sum_t exp(s_t - lse_h) v_t
 * in f32 (K/V widened on load). An empty list gives the empty state (o = 0, lse = -inf).
 * Each head's list is cut into num_splits contiguous chunks, one block each; the chunks'
 * partial states go to the workspace and are combined with the merge kernel of merge.cuh,
 * which on sm_90 and later launches while the attention kernel runs and waits on the device
 * for its states (programmatic dependent launch: 14.5 us instead of 16.5 us at batch 1).
 *
 * @param q            device, [num_qo_heads][head_dim] f32 (q is tiny; f32 keeps it exact)
 * @param head_dim     head dim of q; must equal kv.head_dim and be 64, 128 or 256
 * @param kv           paged K/V pools and page table (see paged_kv_ref)
 * @param token_indptr device, [num_qo_heads + 1], non-decreasing
 * @param token_ids    device, ids into the head's token sequence; each id must satisfy
 *                     0 <= id < kv.max_pages_per_head * kv.page_size and map to a valid page
 *                     (checked only with params.status). Duplicates count twice. May be null
 *                     only when every list is empty.
 * @param out_o        device, [num_qo_heads][head_dim] f32
 * @param out_lse      device, [num_qo_heads] f32, natural log
 * @param workspace    device, at least sparse_attention_workspace_size(...) bytes,
 *                     256-byte aligned; may be null when that size is 0
 *
 * @throw kvsift::dimension_mismatch head_dim != kv.head_dim, or not 64/128/256
 * @throw kvsift::invalid_argument a GQA ratio that does not divide num_qo_heads, null or
 *        misaligned pointers, non-positive page sizes/counts, a workspace that is too small,
 *        a non-finite scale, a stream or pointer of another device than the current one or
 *        host memory (the message names both devices)
 * @throw kvsift::cuda_error a launch failed
 * @note O(total tokens * head_dim) work, two launches (one when the split count is 1);
 *       asynchronous. NaN in q gives NaN o and lse for that head. Thread safety: no state;
 *       concurrent calls are safe when outputs and workspaces do not overlap.
 */
template <class T>
void sparse_attention(const float* q, int num_qo_heads, int head_dim, const paged_kv_ref<T>& kv,
                      const std::int64_t* token_indptr, const std::int32_t* token_ids, float* out_o,
                      float* out_lse, void* workspace, std::size_t workspace_bytes,
                      cudaStream_t stream, const sparse_attention_params& params = {},
                      const sparse_attention_policy& policy = {});

}  // namespace kvsift::cuda

#include <kvsift/cuda/detail/sparse_attention.inl>
