#pragma once
// Batched log-sum-exp merge of attention partial states on the GPU.
//
// A partial state of one (position, head) is `o[head_dim]` (the softmax-normalised output over
// a token subset) and `lse` (f32, natural log of the sum of exp of the scaled logits over that
// subset). The empty state is `o = 0, lse = -inf`; it is the identity of the merge, and merging
// only empty states gives the empty state (never NaN). This is the layout of the CPU side
// (<kvsift/attention/partial_state.hpp>); FlashInfer's merge kernels use base-2 lse instead.
//
// Merging states over disjoint token sets S_1..S_n gives the state over their union:
//   lse = log(sum_j exp(lse_j)),  o = sum_j exp(lse_j - lse) * o_j
// computed with the running-maximum rewrite so that |lse| up to ~1e30 does not overflow.
//
// Invalid input (the CPU merge's non_finite_value): an lse that is NaN or +inf. The lse values
// live on the device, so they cannot be checked on the host before the launch without a sync;
// instead the kernel skips such a (position, head): out of place it writes the empty state
// (o = 0, lse = -inf), in place it leaves the row unchanged, and when the caller passes a
// `status` word (device pointer to one int it zeroed) it ORs 1 into it, as sparse_attention
// does for bad token ids. So an lse never turns into NaN output. NaN inside `o` is not
// inspected and propagates with a non-zero weight, as on the CPU.
//
// Element types of `o`: float, __half, __nv_bfloat16 (math in f32). Every `o` row must be
// 16-byte aligned: head_dim a multiple of 4 (f32) or 8 (f16/bf16) and base pointers aligned
// (cudaMalloc gives 256 bytes). Kernels are memory bound: one 16-byte load per state and
// thread, a whole (position, head) row handled by consecutive threads.
//
// Thread safety: the functions hold no state; concurrent calls on different streams are safe
// when their outputs do not overlap. All calls are asynchronous with respect to the host.

#include <cuda_runtime.h>

#include <cstdint>

#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda {

/// Launch tuning for the merge kernels. Defaults are good on Hopper (H100/H200).
struct merge_policy {
  /// Threads per block, in [32, 512]. The pair merge out of place: a block covers 2 x
  /// threads_per_block 16-byte vectors (of consecutive rows); in place `threads_per_block /
  /// min(32, head_dim / vec)` rows. `merge_states`: as many blocks as the device holds at once,
  /// striding over the vectors.
  int threads_per_block = 256;
};

/**
 * @brief Merges a variable number of partial states per position, for every head.
 *
 * Position p merges states rows `indptr[p] .. indptr[p + 1]` (like FlashInfer's
 * variable_length_merge_states, but natural-log lse). A position with no state gets the empty
 * state.
 *
 * @param states_o   device, [num_states][num_heads][head_dim]
 * @param states_lse device, [num_states][num_heads], natural log; -inf marks an empty state
 * @param indptr     device, [num_pos + 1], non-decreasing, indptr[num_pos] <= num_states
 *                   (not checked: it lives on the device)
 * @param out_o      device, [num_pos][num_heads][head_dim]; must not overlap the inputs
 * @param out_lse    device, [num_pos][num_heads]
 * @param stream     stream the kernel is enqueued on
 * @param status     optional device int the caller zeroed; 1 is ORed in when some state's lse
 *                   is NaN or +inf (that position/head is then written as the empty state)
 *
 * @throw kvsift::invalid_argument negative sizes, head_dim not a positive multiple of the
 *        16-byte vector, a null or misaligned pointer with a nonzero size, a stream or pointer
 *        of another device than the current one or host memory (the message names both
 *        devices); all checked before anything is launched
 * @throw kvsift::cuda_error the launch failed
 * @note O(num_states * num_heads * head_dim) work, one kernel launch; num_pos == 0 launches
 *       nothing. An lse of NaN or +inf is invalid (see the file comment): never NaN out.
 *       A thread fetches the indptr range of its item after next and the first two states of
 *       its next item while it merges the current one, so the indptr's extra round trip is
 *       hidden (92% of the copy bandwidth at 32768 x 32 x 128 x 2 f16 on an H200).
 */
template <class T>
void merge_states(const T* states_o, const float* states_lse, std::int64_t num_states,
                  const std::int64_t* indptr, std::int64_t num_pos, int num_heads, int head_dim,
                  T* out_o, float* out_lse, cudaStream_t stream, const merge_policy& policy = {},
                  int* status = nullptr);

/**
 * @brief Merges exactly two states per (row, head): (v_a, s_a) with (v_b, s_b).
 *
 * @param v_a,v_b   device, [num_rows][num_heads][head_dim]
 * @param s_a,s_b   device, [num_rows][num_heads], natural-log lse
 * @param v_out     device, [num_rows][num_heads][head_dim]; must not overlap the inputs
 *                  (use merge_state_in_place to overwrite one)
 * @param s_out     device, [num_rows][num_heads]
 * @param status    optional device status word, as merge_states (invalid rows: empty state)
 * @throw kvsift::invalid_argument / kvsift::cuda_error as merge_states
 * @note O(num_rows * num_heads * head_dim), one launch; num_rows == 0 launches nothing.
 */
template <class T>
void merge_state(const T* v_a, const float* s_a, const T* v_b, const float* s_b, T* v_out,
                 float* s_out, std::int64_t num_rows, int num_heads, int head_dim,
                 cudaStream_t stream, const merge_policy& policy = {}, int* status = nullptr);

/**
 * @brief In place: (v, s) <- merge((v, s), (v_other, s_other)).
 *
 * Same shapes and guarantees as merge_state; (v, s) must not overlap (v_other, s_other).
 * A row with an invalid lse (NaN or +inf on either side) is left unchanged and reported
 * through `status` when given, like the CPU merge_into, which leaves its accumulator unchanged.
 */
template <class T>
void merge_state_in_place(T* v, float* s, const T* v_other, const float* s_other,
                          std::int64_t num_rows, int num_heads, int head_dim, cudaStream_t stream,
                          const merge_policy& policy = {}, int* status = nullptr);

}  // namespace kvsift::cuda

#include <kvsift/cuda/detail/merge.inl>
