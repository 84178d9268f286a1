#pragma once
// Page gather (Spin): copies scattered head-wise KV pages between pinned host memory and GPU
// pages with one persistent kernel per step, whatever head or request each page belongs to.
// One warp moves one page at a time with 16-byte vector accesses; the grid is sized to the
// GPU, and warps stride over the copy list, so thousands of 4-32 KB pages cost one launch
// instead of one cudaMemcpyAsync each. All offsets are 64-bit (pools past 2^31 bytes work).
//
// Host pages must be pinned and device-accessible (cudaHostAlloc / cudaMallocHost, or
// cudaHostRegister with cudaHostRegisterMapped; with unified addressing the host pointer is
// used directly). The copy list uses kvsift::page_copy from <kvsift/memory/partition_map.hpp>
// (what partition_map::retrieve produces); it must live in device or pinned host memory.
//
// Device-side errors (a page id beyond a pool) skip that copy and set bit 0 of `*status`.
// Thread safety: no state; concurrent calls need disjoint destinations.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include <kvsift/cuda/error.cuh>
#include <kvsift/memory/partition_map.hpp>

namespace kvsift::cuda {

/// Status bit set when a copy names a page beyond its pool (that copy is skipped).
inline constexpr int gather_page_out_of_range = 1;

/// Device handle of two page pools of `page_bytes`-sized pages: `host` (pinned) and `device`.
/// Trivially copyable; passed to the copy kernel by value.
struct page_pools_ref {
  void* host = nullptr;  ///< pinned, device-accessible; host_pages pages
  std::uint64_t host_pages = 0;
  void* device = nullptr;  ///< device memory; device_pages pages
  std::uint64_t device_pages = 0;
  std::uint64_t page_bytes = 0;  ///< a positive multiple of 16; both bases 16-byte aligned
};

/// Former name of `page_pools_ref` (device handles are `*_ref`), kept for one release.
using page_pools [[deprecated("use kvsift::cuda::page_pools_ref")]] = page_pools_ref;

/// Launch tuning: blocks per SM of 256 threads (8 warps). Default good on Hopper.
struct gather_policy {
  int blocks_per_sm = 8;
};

/**
 * @brief Copies host page copies[i].cpu_page to device page copies[i].gpu_page, for all i.
 * @param copies  device or pinned host, [count]
 * @param status  device, may be null; bit gather_page_out_of_range set on a bad page id
 * @throw kvsift::invalid_argument null pools or copy list with count > 0, page_bytes not a
 *        positive multiple of 16, misaligned bases, a stream or device pool of another device
 *        than the current one, a copy list or host pool in pageable host memory
 * @throw kvsift::cuda_error the launch failed
 * @note O(count * page_bytes), one launch; count == 0 launches nothing. Asynchronous.
 *       Overlapping destinations (one GPU page twice) are a race, as with memcpy.
 */
void gather_pages(const page_copy* copies, std::uint64_t count, const page_pools_ref& pools,
                  int* status, cudaStream_t stream, const gather_policy& policy = {});

/**
 * @brief The way back: copies device page copies[i].gpu_page to host page copies[i].cpu_page.
 * Same contract as gather_pages.
 */
void scatter_pages(const page_copy* copies, std::uint64_t count, const page_pools_ref& pools,
                   int* status, cudaStream_t stream, const gather_policy& policy = {});

}  // namespace kvsift::cuda

#include <kvsift/cuda/detail/page_gather.inl>
