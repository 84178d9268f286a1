#pragma once
// Small host-side helpers shared by the CUDA wrappers (internal): a scoped current-device
// switch and a grow-only device allocation.

#include <cuda_runtime.h>

#include <cstddef>

#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda::detail {

/// Restores the calling thread's current device on scope exit.
class device_guard {
 public:
  explicit device_guard(int device) {
    KVSIFT_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) KVSIFT_CUDA_CHECK(cudaSetDevice(device));
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

/// Grow-only device allocation.
struct grow_buffer {
  void* p = nullptr;
  std::size_t bytes = 0;
  void* reserve(std::size_t want) {
    if (want > bytes) {
      if (p != nullptr) KVSIFT_CUDA_CHECK(cudaFree(p));
      p = nullptr;
      bytes = 0;
      KVSIFT_CUDA_CHECK(cudaMalloc(&p, want));
      bytes = want;
    }
    return p;
  }
  void release() noexcept {
    if (p != nullptr) cudaFree(p);
    p = nullptr;
    bytes = 0;
  }
};

}  // namespace kvsift::cuda::detail
