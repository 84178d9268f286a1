#pragma once
// Device handle of head-wise paged K/V memory on the GPU (Spin's layout).

#include <cstdint>

namespace kvsift::cuda {

/**
 * @brief Head-wise pages of K and V in GPU memory, and the table that maps them.
 *
 * `k_pages` and `v_pages` are two pools of identical shape [num_pages][page_size][head_dim]
 * (row-major, elements of type T: float, __half or __nv_bfloat16). A page holds consecutive
 * tokens of one KV head. Token t of KV head h lives in physical page
 * `page_table[h * max_pages_per_head + t / page_size]`, row `t % page_size`.
 *
 * Trivially copyable; passed to kernels by value. K and V share one head_dim. Pointers are
 * device pointers and must be 16-byte aligned (cudaMalloc's are).
 * Thread safety: as safe as the memory it views.
 */
template <class T>
struct paged_kv_ref {
  const T* k_pages = nullptr;
  const T* v_pages = nullptr;
  std::int64_t num_pages = 0;
  int page_size = 0;
  int head_dim = 0;
  /// device, [num_kv_heads][max_pages_per_head], physical page ids in [0, num_pages)
  const std::int32_t* page_table = nullptr;
  int num_kv_heads = 0;
  int max_pages_per_head = 0;
};

/// Former name of `paged_kv_ref` (device handles are `*_ref`), kept for one release.
template <class T>
using paged_kv_view [[deprecated("use kvsift::cuda::paged_kv_ref")]] = paged_kv_ref<T>;

}  // namespace kvsift::cuda
