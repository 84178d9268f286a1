#pragma once
// Kernel and host dispatch behind <kvsift/cuda/sparse_attention.cuh> (internal).

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include <kvsift/core/error.hpp>
#include <kvsift/core/ids.hpp>
#include <kvsift/cuda/detail/dependent_launch.cuh>
#include <kvsift/cuda/detail/device_buffer.cuh>
#include <kvsift/cuda/detail/merge.inl>
#include <kvsift/cuda/detail/vec.cuh>
#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda::detail {

inline constexpr int attention_threads = 128;
/// Tokens a thread group loads (K and V) before the first use: the memory-level parallelism.
/// 6 measured best on the H200 (4 within 2% at batch, 8 slower: 76 registers instead of 56;
/// bench/results/h200_sparse_attention_raw_vectors.txt).
inline constexpr int attention_tokens_per_group = 6;
/// Tokens whose K/V offsets are resolved into shared memory per step: a decode step's few
/// hundred tokens per block pay one id + page-table round trip, not one per 256 tokens.
inline constexpr int attention_offset_tile = 1024;

/// A group of G lanes (G divides 32) holds one token's head_dim elements, VPT 16-byte vectors
/// per lane; NG groups per block work on different tokens.
template <class T, int D>
struct attention_shape {
  static constexpr int vec = vec_size_v<T>;
  static constexpr int total_vecs = D / vec;
  static constexpr int group = total_vecs < 32 ? total_vecs : 32;
  static constexpr int vecs_per_lane = total_vecs / group;
  static constexpr int groups = attention_threads / group;
  static_assert(D % vec == 0 && total_vecs % group == 0 && 32 % group == 0);
};

/// The token lists of sparse_attention's interface: head h attends ids[indptr[h], indptr[h + 1]).
struct csr_token_lists {
  const std::int64_t* __restrict__ indptr;
  const std::int32_t* __restrict__ ids;
  struct head_list {
    std::int64_t begin, end;
    const std::int32_t* __restrict__ ids;
    __device__ std::int32_t id(std::int64_t i) const { return ids[i]; }
  };
  __device__ head_list head(int h) const { return {indptr[h], indptr[h + 1], ids}; }
};

/// decode_step's token lists, read where the step's kernels leave them, with no CSR built:
/// head h attends its static window, window[h] tokens: [0, first[h]) and then [last[h], ...)
/// (from the step's first kernel), then the first min(counts[h], capacity) ids of its search
/// result row ids[h * capacity, ...). Window first, as the step's CSR lists had them, so the
/// attention sums in the same order as over those lists. With `capped` (optional), a head whose
/// flag is set attends its window only: its middle tokens are the dense pass's (capped_middle).
struct window_then_rows {
  const std::uint32_t* __restrict__ first;
  const std::uint32_t* __restrict__ last;
  const std::uint32_t* __restrict__ window;
  const id_t* __restrict__ ids;
  const std::uint32_t* __restrict__ counts;
  int capacity;
  const std::uint32_t* __restrict__ capped = nullptr;
  struct head_list {
    std::int64_t begin, end;
    std::uint32_t first, last, window;
    const id_t* __restrict__ row;
    __device__ std::int32_t id(std::int64_t i) const {
      if (i < window) {
        const auto t = static_cast<std::uint32_t>(i);
        return static_cast<std::int32_t>(t < first ? t : last + (t - first));
      }
      // invalid_id reads as -1: flagged and skipped with a status word, as any bad id.
      return static_cast<std::int32_t>(row[i - window]);
    }
  };
  __device__ head_list head(int h) const {
    const std::uint32_t w = window[h];
    const bool dense = capped != nullptr && capped[h] != 0u;
    const std::uint32_t n = dense ? 0u : min(counts[h], static_cast<std::uint32_t>(capacity));
    return {0,        std::int64_t{w} + n,
            first[h], last[h],
            w,        ids + static_cast<std::int64_t>(h) * capacity};
  }
};

/// decode_step's full-attention pass for DIPR heads whose search was capped: head h attends
/// every token of [first[h], last[h]) (its retrieval range, the window excluded) where
/// capped[h] is set, nothing otherwise. The pass leaves its split states to the caller's merge
/// (leaves_split_states_v), and a head with an empty list writes none: most heads are not
/// capped, and the merge reads a head's split states only where it is.
struct capped_middle {
  const std::uint32_t* __restrict__ first;
  const std::uint32_t* __restrict__ last;
  const std::uint32_t* __restrict__ capped;
  struct head_list {
    std::int64_t begin, end;
    __device__ std::int32_t id(std::int64_t i) const { return static_cast<std::int32_t>(i); }
  };
  __device__ head_list head(int h) const {
    if (capped[h] == 0u) return {0, 0};
    return {std::int64_t{first[h]}, std::int64_t{last[h]}};
  }
};

/// Whether the attention over `Lists` leaves its split states ([heads * splits] rows in the
/// outputs, no split merge) and skips heads with empty lists, for a merge of the caller's.
template <class Lists>
inline constexpr bool leaves_split_states_v = false;
template <>
inline constexpr bool leaves_split_states_v<capped_middle> = true;

/// One block per (split, query head). Online softmax in base 2 per group, then the groups'
/// states are combined through shared memory and written as one partial state. `Lists` gives
/// each head's token ids (csr_token_lists or window_then_rows); they are read only after
/// wait_for_prior_grid, since decode_step launches this kernel as a dependent of its search,
/// whose results they are.
template <class T, int D, class Lists>
__global__ void __launch_bounds__(attention_threads)
    sparse_attention_kernel(const float* __restrict__ q, const paged_kv_ref<T> kv, Lists lists,
                            int group_size, float scale_log2, int num_splits,
                            float* __restrict__ out_o, float* __restrict__ out_lse, int* status) {
  using S = attention_shape<T, D>;
  constexpr int V = S::vec;
  constexpr int VPT = S::vecs_per_lane;
  constexpr int U = attention_tokens_per_group;
  constexpr float ln2 = 0.693147180559945309f;

  // The split merge after this kernel (a small grid) may launch now and wait on the device for
  // this kernel's results (dependent_launch.cuh).
  allow_dependent_launch();
  const int head = blockIdx.y;
  const int split = blockIdx.x;
  const int kv_head = head / group_size;
  const int g = threadIdx.x / S::group;
  const int lane = threadIdx.x % S::group;
  if constexpr (leaves_split_states_v<Lists>) {
    // decode_step's full-attention pass, not a dependent launch, where most heads have empty
    // lists: the block stops before it loads anything else (it writes no state).
    const auto l = lists.head(head);
    if (l.end <= l.begin) return;
  }

  float qr[VPT][V];
#pragma unroll
  for (int r = 0; r < VPT; ++r) {
    const float* src = q + static_cast<std::int64_t>(head) * D + (r * S::group + lane) * V;
#pragma unroll
    for (int i = 0; i < V; i += 4) {
      const float4 x = *reinterpret_cast<const float4*>(src + i);
      qr[r][i] = x.x * scale_log2;
      qr[r][i + 1] = x.y * scale_log2;
      qr[r][i + 2] = x.z * scale_log2;
      qr[r][i + 3] = x.w * scale_log2;
    }
  }

  wait_for_prior_grid();  // a no-op unless launched by launch_dependent (decode_step)
  const auto list = lists.head(head);
  const std::int64_t b = list.begin;
  const std::int64_t e = list.end;
  const std::int64_t chunk = (e - b + num_splits - 1) / num_splits;
  const std::int64_t cb = b + split * chunk < e ? b + split * chunk : e;
  const std::int64_t ce = cb + chunk < e ? cb + chunk : e;

  const std::int32_t* table =
      kv.page_table + static_cast<std::int64_t>(kv_head) * kv.max_pages_per_head;
  const std::int64_t token_limit = static_cast<std::int64_t>(kv.max_pages_per_head) * kv.page_size;

  float m = neg_inf();  // running max of base-2 logits
  float s = 0.0f;       // running sum of exp2(logit - m)
  float acc[VPT][V] = {};

  // Token offsets are resolved a tile at a time by the whole block (coalesced id loads, one
  // page-table gather) so that the main loop waits on nothing but the K/V loads themselves.
  __shared__ std::int64_t sm_offset[attention_offset_tile];  // -1: token skipped (status mode)
  for (std::int64_t tile0 = cb; tile0 < ce; tile0 += attention_offset_tile) {
    const int tile_n =
        static_cast<int>(ce - tile0 < attention_offset_tile ? ce - tile0 : attention_offset_tile);
    __syncthreads();  // the previous tile's offsets have been consumed
    for (int i = threadIdx.x; i < tile_n; i += attention_threads) {
      const std::int32_t id = list.id(tile0 + i);
      std::int64_t offset = -1;
      if (status != nullptr) {
        const bool id_ok = id >= 0 && id < token_limit;
        const std::int32_t phys = id_ok ? table[id / kv.page_size] : -1;
        if (!id_ok || phys < 0 || phys >= kv.num_pages) {
          atomicOr(status, 1);
        } else {
          offset = (static_cast<std::int64_t>(phys) * kv.page_size + id % kv.page_size) * D;
        }
      } else {
        const int page = id / kv.page_size;
        offset =
            (static_cast<std::int64_t>(table[page]) * kv.page_size + (id - page * kv.page_size)) *
            D;
      }
      sm_offset[i] = offset;
    }
    __syncthreads();

    // The trip count is uniform across the block, so whole warps reach the shuffles together.
    for (int base = 0; base < tile_n; base += S::groups * U) {
      // Raw 16-byte vectors until use: a 16-bit row costs half the registers it would as
      // floats, which leaves room for more tokens in flight without spilling.
      uint4 k[U][VPT];
      uint4 v[U][VPT];
      bool valid[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int idx = base + g * U + u;
        const std::int64_t offset = idx < tile_n ? sm_offset[idx] : -1;
        valid[u] = offset >= 0;
#pragma unroll
        for (int r = 0; r < VPT; ++r) {
          const int col = (r * S::group + lane) * V;
          if (valid[u]) {
            k[u][r] = *reinterpret_cast<const uint4*>(kv.k_pages + offset + col);
            v[u][r] = *reinterpret_cast<const uint4*>(kv.v_pages + offset + col);
          } else {
            k[u][r] = v[u][r] = make_uint4(0u, 0u, 0u, 0u);  // zeros in every element type
          }
        }
      }

      float logit[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float dot = 0.0f;
#pragma unroll
        for (int r = 0; r < VPT; ++r) {
          float kf[V];
          widen_vec<T>(k[u][r], kf);
#pragma unroll
          for (int i = 0; i < V; ++i) dot = fmaf(qr[r][i], kf[i], dot);
        }
#pragma unroll
        for (int off = S::group / 2; off > 0; off /= 2) {
          dot += __shfl_xor_sync(0xffffffffu, dot, off);
        }
        logit[u] = valid[u] ? dot : neg_inf();
      }

      float m_new = m;
#pragma unroll
      for (int u = 0; u < U; ++u) m_new = nan_max(m_new, logit[u]);
      if (m_new == neg_inf()) continue;  // this group had no valid token in this trip
      const float alpha = exp2f(m - m_new);
      s *= alpha;
#pragma unroll
      for (int r = 0; r < VPT; ++r) {
#pragma unroll
        for (int i = 0; i < V; ++i) acc[r][i] *= alpha;
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const float p = exp2f(logit[u] - m_new);
        s += p;
#pragma unroll
        for (int r = 0; r < VPT; ++r) {
          float vf[V];
          widen_vec<T>(v[u][r], vf);
#pragma unroll
          for (int i = 0; i < V; ++i) acc[r][i] = fmaf(p, vf[i], acc[r][i]);
        }
      }
      m = m_new;
    }
  }

  __shared__ __align__(16) float sm_o[S::groups][D];
  __shared__ float sm_m[S::groups];
  __shared__ float sm_s[S::groups];
#pragma unroll
  for (int r = 0; r < VPT; ++r) {
    const int col = (r * S::group + lane) * V;
#pragma unroll
    for (int i = 0; i < V; i += 4) {
      *reinterpret_cast<float4*>(&sm_o[g][col + i]) =
          make_float4(acc[r][i], acc[r][i + 1], acc[r][i + 2], acc[r][i + 3]);
    }
  }
  if (lane == 0) {
    sm_m[g] = m;
    sm_s[g] = s;
  }
  __syncthreads();

  float big_m = neg_inf();
#pragma unroll
  for (int gg = 0; gg < S::groups; ++gg) big_m = nan_max(big_m, sm_m[gg]);
  float w[S::groups];
  float big_s = 0.0f;
#pragma unroll
  for (int gg = 0; gg < S::groups; ++gg) {
    w[gg] = big_m == neg_inf() ? 0.0f : exp2f(sm_m[gg] - big_m);
    big_s = fmaf(sm_s[gg], w[gg], big_s);
  }
  const float inv = big_m == neg_inf() ? 0.0f : 1.0f / big_s;
  const std::int64_t out_row =
      num_splits == 1 ? head : static_cast<std::int64_t>(head) * num_splits + split;
  for (int col = threadIdx.x; col < D; col += attention_threads) {
    float o = 0.0f;
#pragma unroll
    for (int gg = 0; gg < S::groups; ++gg) o = fmaf(sm_o[gg][col], w[gg], o);
    out_o[out_row * D + col] = o * inv;
  }
  if (threadIdx.x == 0) {
    out_lse[out_row] = big_m == neg_inf() ? big_m : (big_m + log2f(big_s)) * ln2;
  }
}

inline int resolve_num_splits(int num_qo_heads, const sparse_attention_params& params,
                              const sparse_attention_policy& policy, const char* what) {
  kvsift::detail::require(params.num_splits >= 0, what, ": num_splits must be >= 0, got ",
                          params.num_splits);
  if (params.num_splits > 0) return params.num_splits;
  kvsift::detail::require(policy.blocks_per_sm > 0 && policy.max_splits > 0, what,
                          ": sparse_attention_policy fields must be > 0");
  if (num_qo_heads == 0) return 1;
  int device = 0;
  int sms = 0;
  KVSIFT_CUDA_CHECK(cudaGetDevice(&device));
  KVSIFT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const long long target = static_cast<long long>(sms) * policy.blocks_per_sm;
  const long long splits = (target + num_qo_heads - 1) / num_qo_heads;
  return static_cast<int>(std::clamp<long long>(splits, 1, policy.max_splits));
}

inline std::size_t workspace_bytes_for(int num_qo_heads, int head_dim, int splits) {
  if (splits <= 1) return 0;
  const std::size_t rows = static_cast<std::size_t>(num_qo_heads) * splits;
  return align_up(rows * head_dim * sizeof(float)) + align_up(rows * sizeof(float));
}

/// With `dependent` the attention kernel is launched as a dependent of the kernel before it on
/// the stream (launch_dependent; `device` is the current device): it starts while that kernel
/// runs and waits on the device for its results (decode_step's search).
template <class T, int D, class Lists>
void launch_sparse_attention(const float* q, int num_qo_heads, const paged_kv_ref<T>& kv,
                             const Lists& lists, int group_size, float scale, int splits,
                             float* out_o, float* out_lse, void* workspace, cudaStream_t stream,
                             int* status, bool dependent, int device) {
  constexpr float log2e = 1.44269504088896340736f;
  float* part_o = out_o;
  float* part_lse = out_lse;
  // Lists that leave their split states write them to the outputs ([heads * splits] rows).
  constexpr bool merge_here = !leaves_split_states_v<Lists>;
  if (merge_here && splits > 1) {
    const std::size_t rows = static_cast<std::size_t>(num_qo_heads) * splits;
    part_o = static_cast<float*>(workspace);
    part_lse = reinterpret_cast<float*>(static_cast<char*>(workspace) +
                                        align_up(rows * D * sizeof(float)));
  }
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(num_qo_heads));
  if (dependent) {
    launch_dependent(sparse_attention_kernel<T, D, Lists>, grid, dim3(attention_threads), stream,
                     device, q, kv, lists, group_size, scale * log2e, splits, part_o, part_lse,
                     status);
  } else {
    sparse_attention_kernel<T, D, Lists><<<grid, attention_threads, 0, stream>>>(
        q, kv, lists, group_size, scale * log2e, splits, part_o, part_lse, status);
    KVSIFT_CUDA_CHECK(cudaGetLastError());
  }
  if (merge_here && splits > 1) {
    const indptr_source<float, fixed_indptr> src{part_o, part_lse, fixed_indptr{splits}, 1, D};
    // The split states come from the kernel above: finite or -inf lse, or NaN when the query
    // holds NaN. That NaN is propagated (as it is without splits) so the head's output shows
    // it; no status word here, sparse_attention's own status keeps its one meaning (an
    // invalid token).
    // The merge launches as a dependent of the attention kernel (launch_dependent): at batch 1
    // its launch gap was a visible share of the step (h200_sparse_attention_pdl.txt).
    launch_merge<float, false, decltype(src), true>(
        src, out_o, out_lse, num_qo_heads, 1, D, stream, merge_policy{}, nullptr,
        "kvsift::cuda::sparse_attention (split merge)", merge_launch_vectors, true);
  }
}

}  // namespace kvsift::cuda::detail

namespace kvsift::cuda {

inline std::size_t sparse_attention_workspace_size(int num_qo_heads, int head_dim,
                                                   const sparse_attention_params& params,
                                                   const sparse_attention_policy& policy) {
  constexpr const char* what = "kvsift::cuda::sparse_attention_workspace_size";
  kvsift::detail::require(num_qo_heads >= 0, what, ": num_qo_heads must be >= 0, got ",
                          num_qo_heads);
  kvsift::detail::require(head_dim > 0, what, ": head_dim must be > 0, got ", head_dim);
  const int splits = detail::resolve_num_splits(num_qo_heads, params, policy, what);
  return detail::workspace_bytes_for(num_qo_heads, head_dim, splits);
}

namespace detail {

/// sparse_attention over any token lists (`Lists`: csr_token_lists, window_then_rows): every
/// check that does not read the lists, then the launch. With check_devices false the pointers
/// and stream are taken to be the current device's (for the library's own steps, which checked
/// their inputs once: the checks are a pointer-attribute query each, host time that a batch-1
/// step sees). With `enqueue` false it only checks (the dry run of the sharded steps). With
/// `dependent` the kernel launches as a dependent of the kernel before it
/// (launch_sparse_attention). `check_lists(device)` checks the lists' own pointers (after the null
/// checks of the other arguments, before their device checks).
template <class T, class Lists, class CheckLists>
void run_attention_lists(const float* q, int num_qo_heads, int head_dim, const paged_kv_ref<T>& kv,
                         const Lists& lists, const CheckLists& check_lists, float* out_o,
                         float* out_lse, void* workspace, std::size_t workspace_bytes,
                         cudaStream_t stream, const sparse_attention_params& params,
                         const sparse_attention_policy& policy, bool check_devices, bool enqueue,
                         bool dependent) {
  static_assert(detail::is_supported_element_v<T>,
                "K/V element type must be float, __half or __nv_bfloat16");
  using kvsift::detail::require;
  constexpr const char* what = "kvsift::cuda::sparse_attention";
  require(num_qo_heads >= 0 && num_qo_heads <= 65535, what,
          ": num_qo_heads must be in [0, 65535], got ", num_qo_heads);
  require<dimension_mismatch>(head_dim == kv.head_dim, what, ": head_dim of q (", head_dim,
                              ") != head_dim of K/V (", kv.head_dim, ")");
  require<dimension_mismatch>(head_dim == 64 || head_dim == 128 || head_dim == 256, what,
                              ": head_dim must be 64, 128 or 256, got ", head_dim);
  require(kv.num_kv_heads > 0, what, ": num_kv_heads must be > 0, got ", kv.num_kv_heads);
  require(num_qo_heads % kv.num_kv_heads == 0, what, ": num_qo_heads (", num_qo_heads,
          ") must be a multiple of num_kv_heads (", kv.num_kv_heads, ") for GQA");
  require(kv.page_size > 0, what, ": page_size must be > 0, got ", kv.page_size);
  require(kv.num_pages > 0, what, ": num_pages must be > 0, got ", kv.num_pages);
  require(kv.max_pages_per_head > 0, what, ": max_pages_per_head must be > 0, got ",
          kv.max_pages_per_head);
  require(static_cast<std::int64_t>(kv.max_pages_per_head) * kv.page_size <=
              std::numeric_limits<std::int32_t>::max(),
          what, ": max_pages_per_head * page_size must fit int32 token ids");
  const float scale = params.scale.value_or(1.0f / std::sqrt(static_cast<float>(head_dim)));
  require(std::isfinite(scale), what, ": scale must be finite, got ", scale);
  const int splits = detail::resolve_num_splits(num_qo_heads, params, policy, what);
  // Lists that leave their split states write them to the outputs, sized by the caller.
  std::size_t needed = 0;
  if constexpr (!leaves_split_states_v<Lists>) {
    needed = detail::workspace_bytes_for(num_qo_heads, head_dim, splits);
  }
  if (num_qo_heads == 0) return;
  detail::require_device_ptr(q, true, what, "q");
  detail::require_device_ptr(kv.k_pages, true, what, "k_pages");
  detail::require_device_ptr(kv.v_pages, true, what, "v_pages");
  detail::require_device_ptr(out_o, true, what, "out_o");
  require(kv.page_table != nullptr && out_lse != nullptr, what,
          ": page_table and out_lse must be non-null");
  require(workspace_bytes >= needed, what, ": workspace too small: need ", needed, " bytes, got ",
          workspace_bytes);
  require(needed == 0 ||
              (workspace != nullptr &&
               reinterpret_cast<std::uintptr_t>(workspace) % detail::workspace_alignment == 0),
          what, ": workspace must be non-null and 256-byte aligned");
  // The device is looked up only where it is used: the library's own unchecked calls that
  // launch normally pay no host call for it (-1 then; check_lists reads it only when checking).
  const int device = check_devices || dependent ? current_device() : -1;
  check_lists(device);
  if (check_devices) {
    require_stream_on(stream, device, what);
    require_device_pointer(q, device, what, "q");
    require_device_pointer(kv.k_pages, device, what, "k_pages");
    require_device_pointer(kv.v_pages, device, what, "v_pages");
    require_device_pointer(kv.page_table, device, what, "page_table");
    require_device_pointer(out_o, device, what, "out_o");
    require_device_pointer(out_lse, device, what, "out_lse");
    if (needed > 0) require_device_pointer(workspace, device, what, "workspace");
    require_optional_device_pointer(params.status, device, what, "status");
  }
  if (!enqueue) return;
  const int group_size = num_qo_heads / kv.num_kv_heads;
  auto launch = [&]<int D>() {
    detail::launch_sparse_attention<T, D>(q, num_qo_heads, kv, lists, group_size, scale, splits,
                                          out_o, out_lse, workspace, stream, params.status,
                                          dependent, device);
  };
  switch (head_dim) {
    case 64:
      launch.template operator()<64>();
      break;
    case 128:
      launch.template operator()<128>();
      break;
    default:
      launch.template operator()<256>();
      break;
  }
}

/// sparse_attention (CSR token lists); check_devices, enqueue: as run_attention_lists.
template <class T>
void run_sparse_attention(const float* q, int num_qo_heads, int head_dim, const paged_kv_ref<T>& kv,
                          const std::int64_t* token_indptr, const std::int32_t* token_ids,
                          float* out_o, float* out_lse, void* workspace,
                          std::size_t workspace_bytes, cudaStream_t stream,
                          const sparse_attention_params& params,
                          const sparse_attention_policy& policy, bool check_devices,
                          bool enqueue = true) {
  const auto check_lists = [&](int device) {
    constexpr const char* what = "kvsift::cuda::sparse_attention";
    kvsift::detail::require(token_indptr != nullptr, what, ": token_indptr must be non-null");
    if (check_devices) {
      require_device_pointer(token_indptr, device, what, "token_indptr");
      // Null ids are valid when every head's list is empty (the indptr is device data).
      require_optional_device_pointer(token_ids, device, what, "token_ids");
    }
  };
  run_attention_lists(q, num_qo_heads, head_dim, kv, csr_token_lists{token_indptr, token_ids},
                      check_lists, out_o, out_lse, workspace, workspace_bytes, stream, params,
                      policy, check_devices, enqueue, false);
}

}  // namespace detail

template <class T>
void sparse_attention(const float* q, int num_qo_heads, int head_dim, const paged_kv_ref<T>& kv,
                      const std::int64_t* token_indptr, const std::int32_t* token_ids, float* out_o,
                      float* out_lse, void* workspace, std::size_t workspace_bytes,
                      cudaStream_t stream, const sparse_attention_params& params,
                      const sparse_attention_policy& policy) {
  detail::run_sparse_attention(q, num_qo_heads, head_dim, kv, token_indptr, token_ids, out_o,
                               out_lse, workspace, workspace_bytes, stream, params, policy, true);
}

}  // namespace kvsift::cuda
