#pragma once
// Kernel and host dispatch behind <kvsift/cuda/page_gather.cuh> (internal).

#include <cuda_runtime.h>

#include <cstdint>

#include <kvsift/core/error.hpp>
#include <kvsift/cuda/detail/device_buffer.cuh>
#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda::detail {

inline constexpr int gather_threads = 256;
inline constexpr int gather_unroll = 4;  // 16-byte loads in flight per lane before the stores

/// One warp per copy, warps striding over copies [0, count).
template <bool ToDevice>
__device__ __forceinline__ void page_copy_body(const page_copy* copies, std::uint64_t count,
                                               const page_pools_ref& pools, int* status) {
  const std::uint64_t lane = threadIdx.x % 32;
  const std::uint64_t warps = std::uint64_t{gridDim.x} * (gather_threads / 32);
  const std::uint64_t vecs = pools.page_bytes / sizeof(uint4);
  auto* host = static_cast<uint4*>(pools.host);
  auto* dev = static_cast<uint4*>(pools.device);
  for (std::uint64_t i = (std::uint64_t{blockIdx.x} * gather_threads + threadIdx.x) / 32; i < count;
       i += warps) {
    const page_copy c = copies[i];
    if (c.cpu_page >= pools.host_pages || c.gpu_page >= pools.device_pages) {
      if (lane == 0 && status != nullptr) atomicOr(status, gather_page_out_of_range);
      continue;
    }
    const uint4* src = (ToDevice ? host + c.cpu_page * vecs : dev + c.gpu_page * vecs);
    uint4* dst = ToDevice ? dev + c.gpu_page * vecs : host + c.cpu_page * vecs;
    for (std::uint64_t v = lane; v < vecs; v += 32 * gather_unroll) {
      uint4 r[gather_unroll];
#pragma unroll
      for (int u = 0; u < gather_unroll; ++u) {
        if (v + 32 * u < vecs) r[u] = src[v + 32 * u];
      }
#pragma unroll
      for (int u = 0; u < gather_unroll; ++u) {
        if (v + 32 * u < vecs) dst[v + 32 * u] = r[u];
      }
    }
  }
}

template <bool ToDevice>
__global__ void __launch_bounds__(gather_threads)
    page_copy_kernel(const page_copy* copies, std::uint64_t count, page_pools_ref pools,
                     int* status) {
  page_copy_body<ToDevice>(copies, count, pools, status);
}

/// The same with the count known only on the device (`*count`, at most `max_count`): a list
/// built by an earlier kernel on the stream, copied without a host round trip.
template <bool ToDevice>
__global__ void __launch_bounds__(gather_threads)
    counted_page_copy_kernel(const page_copy* copies, std::uint64_t max_count,
                             const std::uint64_t* count, page_pools_ref pools, int* status) {
  const std::uint64_t n = *count < max_count ? *count : max_count;
  page_copy_body<ToDevice>(copies, n, pools, status);
}

/// Blocks for `count` copies: one warp per copy up to a persistent grid of blocks_per_sm per SM.
inline unsigned page_copy_blocks(std::uint64_t count, const gather_policy& policy) {
  int device = 0, sms = 0;
  KVSIFT_CUDA_CHECK(cudaGetDevice(&device));
  KVSIFT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const std::uint64_t warps_per_block = gather_threads / 32;
  const std::uint64_t needed = (count + warps_per_block - 1) / warps_per_block;
  const std::uint64_t persistent = std::uint64_t(sms) * std::uint64_t(policy.blocks_per_sm);
  return static_cast<unsigned>(needed < persistent ? needed : persistent);
}

template <bool ToDevice>
void launch_page_copy(const page_copy* copies, std::uint64_t count, const page_pools_ref& pools,
                      int* status, cudaStream_t stream, const gather_policy& policy,
                      const char* who) {
  if (count == 0) return;
  kvsift::detail::require(copies != nullptr && pools.host != nullptr && pools.device != nullptr,
                          who, ": null copy list or pool with ", count, " copies");
  kvsift::detail::require(pools.page_bytes > 0 && pools.page_bytes % 16 == 0, who,
                          ": page_bytes must be a positive multiple of 16, got ", pools.page_bytes);
  kvsift::detail::require(reinterpret_cast<std::uintptr_t>(pools.host) % 16 == 0 &&
                              reinterpret_cast<std::uintptr_t>(pools.device) % 16 == 0,
                          who, ": pool bases must be 16-byte aligned");
  kvsift::detail::require(policy.blocks_per_sm > 0, who, ": blocks_per_sm must be > 0, got ",
                          policy.blocks_per_sm);
  const int device = current_device();
  require_stream_on(stream, device, who);
  require_accessible_pointer(copies, device, who, "the copy list");
  require_accessible_pointer(pools.host, device, who, "the host pool");
  require_device_pointer(pools.device, device, who, "the device pool");
  require_optional_device_pointer(status, device, who, "status");
  page_copy_kernel<ToDevice><<<page_copy_blocks(count, policy), gather_threads, 0, stream>>>(
      copies, count, pools, status);
  KVSIFT_CUDA_CHECK(cudaGetLastError());
}

/// Host to device copies of a list whose length `*count` (device) is at most `max_count`; the
/// pools were checked by the caller. Nothing is launched for max_count == 0.
inline void launch_counted_page_copy(const page_copy* copies, std::uint64_t max_count,
                                     const std::uint64_t* count, const page_pools_ref& pools,
                                     cudaStream_t stream, const gather_policy& policy = {}) {
  if (max_count == 0) return;
  counted_page_copy_kernel<true>
      <<<page_copy_blocks(max_count, policy), gather_threads, 0, stream>>>(copies, max_count, count,
                                                                           pools, nullptr);
  KVSIFT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kvsift::cuda::detail

namespace kvsift::cuda {

inline void gather_pages(const page_copy* copies, std::uint64_t count, const page_pools_ref& pools,
                         int* status, cudaStream_t stream, const gather_policy& policy) {
  detail::launch_page_copy<true>(copies, count, pools, status, stream, policy, "gather_pages");
}

inline void scatter_pages(const page_copy* copies, std::uint64_t count, const page_pools_ref& pools,
                          int* status, cudaStream_t stream, const gather_policy& policy) {
  detail::launch_page_copy<false>(copies, count, pools, status, stream, policy, "scatter_pages");
}

}  // namespace kvsift::cuda
