#pragma once
// Kernels and host dispatch behind <kvsift/cuda/offloaded_attention.cuh> (internal): the
// selection, the table and copy-list update after the LRU step, and the fixed-order workspace.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include <kvsift/core/error.hpp>
#include <kvsift/cuda/detail/device_buffer.cuh>

namespace kvsift::cuda::detail {

/// Fills the LRU state (keys empty, ages 0, slot_of empty) and the page table (guard page).
__global__ void offload_reset_kernel(bucketed_lru_ref lru, std::int32_t* table,
                                     std::int32_t guard) {
  const std::uint64_t slots = std::uint64_t{lru.pairs} * lru.capacity;
  const std::uint64_t entries = std::uint64_t{lru.pairs} * lru.pages;
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < slots;
       i += stride) {
    lru.keys[i] = lru_empty;
    lru.ages[i] = 0;
  }
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < entries;
       i += stride) {
    lru.slot_of[i] = lru_empty;
    table[i] = guard;
  }
}

/// The LRU's selection: selected[i] = the page of id i (ids beyond max_ids are left out and
/// flagged), offsets[pair] = the first id of the pair's first query head. Also zeroes the
/// copy count. One grid over max(ids, pairs + 1).
__global__ void offload_select_kernel(const std::int64_t* indptr, const std::int32_t* ids,
                                      std::uint64_t max_ids, int pairs, int group, int page_size,
                                      std::uint32_t* selected, std::uint64_t* offsets,
                                      std::uint64_t* copy_count, int* status) {
  const auto total_raw = static_cast<std::uint64_t>(indptr[pairs * group]);
  const std::uint64_t total = total_raw < max_ids ? total_raw : max_ids;
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  const std::uint64_t first = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (std::uint64_t i = first; i < total; i += stride) {
    // A negative id wraps to a huge page, which the LRU refuses for its pair.
    selected[i] = static_cast<std::uint32_t>(ids[i]) / static_cast<std::uint32_t>(page_size);
  }
  for (std::uint64_t pr = first; pr <= static_cast<std::uint64_t>(pairs); pr += stride) {
    const auto at = static_cast<std::uint64_t>(indptr[pr * group]);
    offsets[pr] = at < total ? at : total;
  }
  if (first == 0) {
    *copy_count = 0;
    if (total_raw > max_ids && status != nullptr) atomicOr(status, offloaded_too_many_ids);
  }
}

/// After the LRU step, one block per pair: evicted pages -> guard in the table, admitted pages
/// -> their device page, and their copies (host page -> device page) appended to the list.
/// A pair whose step failed changed nothing; its code goes to the status word. Pair p's
/// evictions are at ev_keys[p * eviction_stride, ...), the stride the LRU step was given.
__global__ void offload_admit_kernel(bucketed_lru_ref lru, std::int32_t* table,
                                     const std::uint64_t* host_page, std::uint64_t host_pages,
                                     const std::uint64_t* offsets, std::uint64_t eviction_stride,
                                     const std::uint32_t* ev_keys, const std::uint32_t* ad_keys,
                                     const std::uint32_t* ad_slots, const std::uint32_t* counts,
                                     const int* lru_status, page_copy* copies,
                                     std::uint64_t* copy_count, int* status) {
  const std::uint32_t pair = blockIdx.x;
  __shared__ std::uint64_t base;
  const int code = lru_status[pair];
  if (code != lru_ok) {
    if (threadIdx.x == 0 && status != nullptr) {
      atomicOr(status, code == lru_page_out_of_range    ? offloaded_page_out_of_range
                       : code == lru_limit_out_of_range ? offloaded_limit_out_of_range
                                                        : offloaded_over_capacity);
    }
    return;
  }
  const std::uint64_t off = offsets[pair];
  const std::uint32_t evicted = counts[3 * pair + 1], admitted = counts[3 * pair + 2];
  const std::uint64_t row = std::uint64_t{pair} * lru.pages;
  const auto guard = static_cast<std::int32_t>(std::uint64_t{lru.pairs} * lru.capacity);
  const std::uint64_t ev_off = std::uint64_t{pair} * eviction_stride;
  for (std::uint32_t j = threadIdx.x; j < evicted; j += blockDim.x) {
    table[row + ev_keys[ev_off + j]] = guard;
  }
  if (threadIdx.x == 0) {
    base = atomicAdd(reinterpret_cast<unsigned long long*>(copy_count),
                     static_cast<unsigned long long>(admitted));
  }
  __syncthreads();  // evictions before admissions: a slot's old page never overwrites a new one
  for (std::uint32_t j = threadIdx.x; j < admitted; j += blockDim.x) {
    const std::uint32_t key = ad_keys[off + j];
    const std::uint64_t dev = std::uint64_t{pair} * lru.capacity + ad_slots[off + j];
    table[row + key] = static_cast<std::int32_t>(dev);
    std::uint64_t host = host_page[row + key];
    if (host >= host_pages) {
      if (status != nullptr) atomicOr(status, offloaded_bad_copy);
      host = ~std::uint64_t{0};  // beyond the pool: the gather skips it
    }
    copies[base + j] = page_copy{host, dev};
  }
}

/// Carves the workspace in a fixed order.
struct offload_layout {
  std::size_t selected = 0, offsets = 0, ev_keys = 0, ev_slots = 0, ad_keys = 0, ad_slots = 0;
  std::size_t counts = 0, lru_status = 0, copies = 0, copy_count = 0, attn = 0, total = 0;
  std::size_t attn_bytes = 0, max_copies = 0;
};

inline offload_layout offload_plan(const offloaded_kv_ref& kv, int heads, std::size_t max_ids,
                                   const sparse_attention_params& ap) {
  using kvsift::detail::require;
  const std::uint32_t pairs = kv.lru.pairs;
  require(pairs >= 1 && heads >= 1 && heads % static_cast<int>(pairs) == 0,
          "offloaded_attention: expected num_qo_heads a positive multiple of the pairs (", pairs,
          "), got ", heads);
  require(kv.lru.capacity >= 1 && kv.lru.capacity <= bucketed_lru_ref::max_capacity,
          "offloaded_attention: expected capacity in [1, ", bucketed_lru_ref::max_capacity,
          "], got ", kv.lru.capacity);
  require(kv.lru.pages >= 1 && kv.lru.pages < lru_pending,
          "offloaded_attention: expected pages per pair in [1, 2^31), got ", kv.lru.pages);
  require(std::uint64_t{pairs} * kv.lru.pages <=
                  static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max()) &&
              std::uint64_t{pairs} * kv.lru.capacity <
                  static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max()),
          "offloaded_attention: pairs * pages and pairs * capacity must fit int32, got ", pairs,
          " x ", kv.lru.pages, " and ", pairs, " x ", kv.lru.capacity);
  require(max_ids <= (std::size_t{1} << 40), "offloaded_attention: max_ids ", max_ids,
          " exceeds 2^40");
  offload_layout l;
  l.max_copies = std::min<std::size_t>(max_ids, std::size_t{pairs} * kv.lru.capacity);
  const std::size_t n = max_ids > 0 ? max_ids : 1;
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t here = at;
    at += align_up(bytes);
    return here;
  };
  l.selected = take(n * 4);
  l.offsets = take((std::size_t{pairs} + 1) * 8);
  // Evictions per pair: up to its capacity (a lowered limit evicts beyond its selection).
  const std::size_t slots = std::size_t{pairs} * kv.lru.capacity;
  l.ev_keys = take(slots * 4);
  l.ev_slots = take(slots * 4);
  l.ad_keys = take(n * 4);
  l.ad_slots = take(n * 4);
  l.counts = take(std::size_t{pairs} * 3 * 4);
  l.lru_status = take(std::size_t{pairs} * 4);
  l.copies = take((l.max_copies > 0 ? l.max_copies : 1) * sizeof(page_copy));
  l.copy_count = take(8);
  l.attn_bytes = sparse_attention_workspace_size(heads, kv.head_dim, ap);
  l.attn = take(l.attn_bytes);
  l.total = at;
  return l;
}

inline void offload_check_pools(const offloaded_kv_ref& kv, std::size_t element_bytes) {
  using kvsift::detail::require;
  require(kv.page_size >= 1, "offloaded_attention: expected page_size >= 1, got ", kv.page_size);
  // The attention's own check, made here so that nothing has run when it fails.
  kvsift::detail::require<dimension_mismatch>(
      kv.head_dim == 64 || kv.head_dim == 128 || kv.head_dim == 256,
      "offloaded_attention: head_dim must be 64, 128 or 256, got ", kv.head_dim);
  const std::uint64_t bytes =
      std::uint64_t(kv.page_size) * std::uint64_t(kv.head_dim) * element_bytes;
  const std::uint64_t need = std::uint64_t{kv.lru.pairs} * kv.lru.capacity + 1;
  for (const page_pools_ref* pools : {&kv.k_pools, &kv.v_pools}) {
    const char* which = pools == &kv.k_pools ? "K" : "V";
    require(pools->page_bytes == bytes, "offloaded_attention: ", which,
            " pools' page_bytes must be page_size * head_dim * sizeof(T) = ", bytes, ", got ",
            pools->page_bytes);
    require(pools->device != nullptr && pools->device_pages >= need, "offloaded_attention: ", which,
            " device tier must hold pairs * capacity + 1 = ", need, " pages, got ",
            pools->device == nullptr ? 0 : pools->device_pages);
    require(pools->host != nullptr && pools->host_pages >= 1, "offloaded_attention: ", which,
            " host tier is null or empty");
  }
  require(kv.k_pools.host_pages == kv.v_pools.host_pages, "offloaded_attention: K and V host ",
          "tiers must have the same pages, got ", kv.k_pools.host_pages, " and ",
          kv.v_pools.host_pages);
  require(kv.page_table != nullptr && kv.host_page != nullptr && kv.lru.keys != nullptr &&
              kv.lru.ages != nullptr && kv.lru.slot_of != nullptr,
          "offloaded_attention: null page table, host page map or LRU state");
}

}  // namespace kvsift::cuda::detail

namespace kvsift::cuda {

inline void offloaded_reset(const offloaded_kv_ref& kv, cudaStream_t stream) {
  using kvsift::detail::require;
  require(kv.lru.capacity >= 1 && kv.lru.capacity <= bucketed_lru_ref::max_capacity &&
              kv.lru.pages >= 1 && kv.lru.pages < detail::lru_pending,
          "offloaded_reset: expected capacity in [1, ", bucketed_lru_ref::max_capacity,
          "] and pages in [1, 2^31), got ", kv.lru.capacity, " and ", kv.lru.pages);
  require(std::uint64_t{kv.lru.pairs} * kv.lru.capacity <
              static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max()),
          "offloaded_reset: pairs * capacity must fit int32, got ", kv.lru.pairs, " x ",
          kv.lru.capacity);
  if (kv.lru.pairs == 0) return;
  require(kv.page_table != nullptr && kv.lru.keys != nullptr && kv.lru.ages != nullptr &&
              kv.lru.slot_of != nullptr,
          "offloaded_reset: null page table or LRU state");
  const int device = detail::current_device();
  detail::require_stream_on(stream, device, "offloaded_reset");
  detail::require_device_pointer(kv.page_table, device, "offloaded_reset", "page table");
  detail::require_lru_state_on(kv.lru, device, "offloaded_reset");
  const auto guard = static_cast<std::int32_t>(std::uint64_t{kv.lru.pairs} * kv.lru.capacity);
  detail::offload_reset_kernel<<<256, 256, 0, stream>>>(kv.lru, kv.page_table, guard);
  KVSIFT_CUDA_CHECK(cudaGetLastError());
}

inline std::size_t offloaded_attention_workspace_size(const offloaded_kv_ref& kv, int num_qo_heads,
                                                      std::size_t max_ids,
                                                      const offloaded_attention_params& p) {
  return detail::offload_plan(kv, num_qo_heads, max_ids, p.attention).total;
}

template <class T>
void offloaded_attention(const offloaded_kv_ref& kv, const float* q, int num_qo_heads,
                         const std::int64_t* indptr, const std::int32_t* ids, std::size_t max_ids,
                         float* out_o, float* out_lse, void* workspace, std::size_t workspace_bytes,
                         cudaStream_t stream, const offloaded_attention_params& p, int* status) {
  using kvsift::detail::require;
  const detail::offload_layout l = detail::offload_plan(kv, num_qo_heads, max_ids, p.attention);
  detail::offload_check_pools(kv, sizeof(T));
  require(p.buckets >= 2 && p.buckets <= 256,
          "offloaded_attention: buckets must be in [2, 256], got ", p.buckets);
  require(q != nullptr && indptr != nullptr && out_o != nullptr && out_lse != nullptr,
          "offloaded_attention: null q, indptr or output");
  require(ids != nullptr || max_ids == 0, "offloaded_attention: null ids with max_ids ", max_ids);
  require(workspace != nullptr && workspace_bytes >= l.total, "offloaded_attention: workspace of ",
          workspace_bytes, " bytes is too small (or null), expected >= ", l.total);
  int device = 0;
  KVSIFT_CUDA_CHECK(cudaGetDevice(&device));
  detail::require_stream_on(stream, device, "offloaded_attention");
  detail::require_device_pointer(workspace, device, "offloaded_attention", "workspace");
  detail::require_device_pointer(kv.page_table, device, "offloaded_attention", "page table");
  detail::require_device_pointer(kv.k_pools.device, device, "offloaded_attention", "K device tier");
  detail::require_device_pointer(kv.v_pools.device, device, "offloaded_attention", "V device tier");
  // The LRU step and the attention below run unchecked on these and the workspace.
  detail::require_accessible_pointer(kv.k_pools.host, device, "offloaded_attention", "K host tier");
  detail::require_accessible_pointer(kv.v_pools.host, device, "offloaded_attention", "V host tier");
  detail::require_lru_state_on(kv.lru, device, "offloaded_attention");
  detail::require_device_pointer(q, device, "offloaded_attention", "q");
  detail::require_accessible_pointer(indptr, device, "offloaded_attention", "indptr");
  if (ids != nullptr) detail::require_accessible_pointer(ids, device, "offloaded_attention", "ids");
  detail::require_device_pointer(out_o, device, "offloaded_attention", "out_o");
  detail::require_device_pointer(out_lse, device, "offloaded_attention", "out_lse");
  detail::require_accessible_pointer(kv.host_page, device, "offloaded_attention", "host_page");
  detail::require_optional_device_pointer(status, device, "offloaded_attention", "status");
  detail::require_optional_device_pointer(p.attention.status, device, "offloaded_attention",
                                          "the attention's status");
  auto* base = static_cast<unsigned char*>(workspace);
  auto at = [&](std::size_t off) { return static_cast<void*>(base + off); };
  auto* selected = static_cast<std::uint32_t*>(at(l.selected));
  auto* offsets = static_cast<std::uint64_t*>(at(l.offsets));
  auto* ev_keys = static_cast<std::uint32_t*>(at(l.ev_keys));
  auto* ad_keys = static_cast<std::uint32_t*>(at(l.ad_keys));
  auto* ad_slots = static_cast<std::uint32_t*>(at(l.ad_slots));
  auto* counts = static_cast<std::uint32_t*>(at(l.counts));
  auto* lru_status = static_cast<int*>(at(l.lru_status));
  auto* copies = static_cast<page_copy*>(at(l.copies));
  auto* copy_count = static_cast<std::uint64_t*>(at(l.copy_count));
  const int pairs = static_cast<int>(kv.lru.pairs);
  const int group = num_qo_heads / pairs;

  // 1. The selection (pages of the retrieved ids) and the pairs' ranges.
  const std::uint64_t work = std::max<std::uint64_t>(max_ids, std::uint64_t(pairs) + 1);
  const auto blocks = static_cast<unsigned>(std::min<std::uint64_t>((work + 255) / 256, 1024));
  detail::offload_select_kernel<<<blocks, 256, 0, stream>>>(
      indptr, ids, max_ids, pairs, group, kv.page_size, selected, offsets, copy_count, status);
  KVSIFT_CUDA_CHECK(cudaGetLastError());
  // 2. The LRU decides residency. Evictions always go to per-pair ranges of `capacity` (the
  //    workspace holds pairs x capacity of them): required with limits, harmless without.
  const std::uint64_t eviction_stride = kv.lru.capacity;
  detail::run_bucketed_lru_step(
      kv.lru,
      {selected, offsets, ev_keys, static_cast<std::uint32_t*>(at(l.ev_slots)), ad_keys, ad_slots,
       counts, lru_status, eviction_stride},
      p.buckets, stream, false);
  // 3. The table follows, and the admitted pages' copies are listed.
  detail::offload_admit_kernel<<<static_cast<unsigned>(pairs), 256, 0, stream>>>(
      kv.lru, kv.page_table, kv.host_page, kv.k_pools.host_pages, offsets, eviction_stride, ev_keys,
      ad_keys, ad_slots, counts, lru_status, copies, copy_count, status);
  KVSIFT_CUDA_CHECK(cudaGetLastError());
  // 4. K and V pages come in (bad host ids were flagged above and are skipped here).
  if (l.max_copies > 0) {
    for (const page_pools_ref* pools : {&kv.k_pools, &kv.v_pools}) {
      detail::launch_counted_page_copy(copies, l.max_copies, copy_count, *pools, stream);
    }
  }
  // 5. The attention over the retrieved ids through the table.
  const paged_kv_ref<T> pk{static_cast<const T*>(kv.k_pools.device),
                           static_cast<const T*>(kv.v_pools.device),
                           static_cast<std::int64_t>(kv.k_pools.device_pages),
                           kv.page_size,
                           kv.head_dim,
                           kv.page_table,
                           pairs,
                           static_cast<int>(kv.lru.pages)};
  detail::run_sparse_attention<T>(q, num_qo_heads, kv.head_dim, pk, indptr, ids, out_o, out_lse,
                                  l.attn_bytes > 0 ? at(l.attn) : nullptr, l.attn_bytes, stream,
                                  p.attention, {}, false);
}

}  // namespace kvsift::cuda
