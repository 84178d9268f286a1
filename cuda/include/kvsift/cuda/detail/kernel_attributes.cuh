#pragma once
// Function attributes set once per (kernel, device) instead of before every launch.
//
// A kernel that takes more than 48 KiB of dynamic shared memory must be allowed to, per device,
// with cudaFuncSetAttribute; each call costs host time on every launch of a decode step. The
// attribute is a limit, not the launch's size, so raising it to the device's opt-in maximum
// once lets every later launch of any size through. Per device: an engine that drives several
// GPUs from one process (tensor parallelism) launches the same kernel on each.
#include <cuda_runtime.h>

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

}  // namespace kvsift::cuda::detail
