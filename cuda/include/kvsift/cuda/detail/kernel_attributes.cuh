#pragma once
// Function attributes set once per (kernel, device) instead of before every launch.
//
// A kernel that takes more than 48 KiB of dynamic shared memory must be allowed to, per device,
// with cudaFuncSetAttribute; each call costs host time on every launch of a decode step. The
// attribute is a limit, not the launch's size, so raising it to the device's opt-in maximum
// once lets every later launch of any size through. Per device: an engine that drives several
// GPUs from one process (tensor parallelism) launches the same kernel on each. The L1 /
// shared split that follows a launch's size (`prefer_resident_blocks`) is set only when it
// changes.
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda::detail {

/// Devices whose attribute state is remembered; a device id beyond it sets the attributes on
/// every launch (correct, only slower).
inline constexpr int attribute_cache_devices = 64;

// The flags are read and set with the __atomic builtins (acquire / release: a thread that sees
// a flag set launches after the attribute calls that preceded it), not <atomic>, which costs
// every includer compile time (docs/architecture.md). Other host compilers set the attributes
// on every launch.
#if defined(__GNUC__) || defined(__clang__)
inline bool attribute_flag_set(const bool* f) noexcept {
  return __atomic_load_n(f, __ATOMIC_ACQUIRE);
}
inline void set_attribute_flag(bool* f) noexcept { __atomic_store_n(f, true, __ATOMIC_RELEASE); }
#else
inline bool attribute_flag_set(const bool*) noexcept { return false; }
inline void set_attribute_flag(bool*) noexcept {}
#endif

/**
 * @brief Allows `Kernel` on `device` (the current device) up to `smem_max` bytes of dynamic
 *        shared memory (the device's opt-in maximum) and sets its preferred split of the
 *        unified L1 / shared memory: `carveout` percent of the maximum shared memory
 *        (cudaFuncAttributePreferredSharedMemoryCarveout; cudaSharedmemCarveoutMaxShared = all
 *        of it), or cudaSharedmemCarveoutDefault to leave the split to the driver, which sizes
 *        it for the most resident blocks. Once per (kernel, device).
 *
 * Thread safety: safe to call concurrently (two threads may both set the attributes the first
 * time; setting them twice is harmless).
 * @note The attributes belong to the device's primary context: after cudaDeviceReset they are
 *       gone while the flag stays set, and a later launch of the kernel on that device with
 *       more than 48 KiB of shared memory fails with a cuda_error. Engines do not reset devices
 *       they keep using; a test that does must not launch kvsift's searches afterwards.
 * @throw cuda_error when the runtime refuses an attribute
 */
template <auto Kernel>
void allow_shared_memory(int device, int smem_max, int carveout) {
  static bool done[attribute_cache_devices] = {};
  const bool cached = device >= 0 && device < attribute_cache_devices;
  if (cached && attribute_flag_set(&done[device])) return;
  KVSIFT_CUDA_CHECK(
      cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max));
  if (carveout != cudaSharedmemCarveoutDefault) {
    KVSIFT_CUDA_CHECK(
        cudaFuncSetAttribute(Kernel, cudaFuncAttributePreferredSharedMemoryCarveout, carveout));
  }
  if (cached) set_attribute_flag(&done[device]);
}

/**
 * @brief Sets `Kernel`'s preferred split of the unified L1 / shared memory on `device` (the
 *        current device) to the smallest that keeps `resident` blocks of `block_bytes` each
 *        (dynamic plus static shared memory plus the per-block reservation) on one SM, out of
 *        `smem_sm` bytes of shared memory an SM can have at most. The rest stays L1.
 *
 * Why per launch: a walk's key rows are random reads, and the L1 left beside the shared memory
 * caches their page-table entries and adjacency rows. A launch of 512 searches on 132 SMs needs
 * four resident blocks per SM, a launch of 1024 needs all the shared memory it can get; one
 * fixed split would cap the large batch or starve the small one of L1.
 *
 * The attribute is set only when it differs from the last value set for (kernel, device), so
 * a steady decode loop pays no host call. It is a preference: the driver rounds it up to a
 * split the hardware has, and never picks one that cannot run a block, so a race between two
 * threads setting different values changes speed, not results.
 *
 * Complexity: O(1); one cudaFuncSetAttribute when the value changes.
 * Thread safety: safe to call concurrently (see above).
 * @throw cuda_error when the runtime refuses the attribute
 */
template <auto Kernel>
void prefer_resident_blocks(int device, int resident, std::size_t block_bytes, int smem_sm) {
  const std::size_t want = static_cast<std::size_t>(resident > 0 ? resident : 1) * block_bytes;
  const std::size_t sm = smem_sm > 0 ? static_cast<std::size_t>(smem_sm) : 1;
  const int percent = want >= sm ? 100 : static_cast<int>((want * 100 + sm - 1) / sm);
  // The last percent set, plus one (0 = never set), per device.
  static int last[attribute_cache_devices] = {};
  const bool cached = device >= 0 && device < attribute_cache_devices;
#if defined(__GNUC__) || defined(__clang__)
  if (cached && __atomic_load_n(&last[device], __ATOMIC_RELAXED) == percent + 1) return;
#endif
  KVSIFT_CUDA_CHECK(
      cudaFuncSetAttribute(Kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent));
#if defined(__GNUC__) || defined(__clang__)
  if (cached) __atomic_store_n(&last[device], percent + 1, __ATOMIC_RELAXED);
#endif
}

/**
 * @brief The most blocks of `Kernel` with `threads` threads one SM of `device` holds, by its
 *        registers, threads and static shared memory (dynamic shared memory not counted), and
 *        its static shared memory in bytes. Computed once per (kernel, threads, device).
 *
 * Thread safety: safe to call concurrently (two threads may both compute it the first time).
 * @throw cuda_error when the runtime fails the queries
 */
template <auto Kernel, int Threads>
std::pair<int, std::size_t> resident_limit(int device) {
  // (static bytes << 16 | blocks), one word so that a reader sees both or neither; 0 = unknown.
  static unsigned long long known[attribute_cache_devices] = {};
  const bool cached = device >= 0 && device < attribute_cache_devices;
#if defined(__GNUC__) || defined(__clang__)
  if (cached) {
    const unsigned long long w = __atomic_load_n(&known[device], __ATOMIC_RELAXED);
    if (w != 0) return {static_cast<int>(w & 0xffff), static_cast<std::size_t>(w >> 16)};
  }
#endif
  cudaFuncAttributes attr{};
  KVSIFT_CUDA_CHECK(cudaFuncGetAttributes(&attr, Kernel));
  int b = 0;
  KVSIFT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, Kernel, Threads, 0));
  b = b < 1 ? 1 : (b > 0xffff ? 0xffff : b);
#if defined(__GNUC__) || defined(__clang__)
  if (cached) {
    __atomic_store_n(&known[device],
                     static_cast<unsigned long long>(attr.sharedSizeBytes) << 16 |
                         static_cast<unsigned long long>(b),
                     __ATOMIC_RELAXED);
  }
#endif
  return {b, attr.sharedSizeBytes};
}

}  // namespace kvsift::cuda::detail
