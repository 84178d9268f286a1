#pragma once
// Small host-side helpers shared by the CUDA wrappers (internal): a scoped current-device
// switch, a grow-only device allocation, and the checks that a stream and pointers belong to
// the current device.

#include <cuda_runtime.h>

#include <cstddef>

#include <kvsift/core/error.hpp>
#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda::detail {

/// Alignment of every piece a kernel family carves out of a caller's workspace (cudaMalloc's).
inline constexpr std::size_t workspace_alignment = 256;

/// n rounded up to the workspace alignment (one definition for every header that carves).
inline std::size_t align_up(std::size_t n) {
  return (n + workspace_alignment - 1) / workspace_alignment * workspace_alignment;
}

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

/// device_guard for destructors: never throws, and restores the previous device only when it
/// could be read. An engine destroyed on the caller's thread frees its buffers on its own
/// device and must leave the caller on the device it had (a destructor that only switched left
/// the caller on the engine's device, and its next allocation landed there).
class quiet_device_guard {
 public:
  explicit quiet_device_guard(int device) noexcept {
    known_ = cudaGetDevice(&previous_) == cudaSuccess;
    if (!known_ || device != previous_) cudaSetDevice(device);
  }
  quiet_device_guard(const quiet_device_guard&) = delete;
  quiet_device_guard& operator=(const quiet_device_guard&) = delete;
  ~quiet_device_guard() {
    if (known_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool known_ = false;
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

/// Stream-ordered device allocation (cudaMallocAsync), freed on the same stream when it goes
/// out of scope. For a call's temporaries while other work runs on the device: cudaFree waits
/// for the whole device, so a builder that freed its buffers so waited for every other
/// builder's kernels.
class stream_buffer {
 public:
  stream_buffer() = default;
  stream_buffer(const stream_buffer&) = delete;
  stream_buffer& operator=(const stream_buffer&) = delete;
  ~stream_buffer() {
    if (p_ != nullptr) cudaFreeAsync(p_, stream_);
  }
  /// `bytes` of device memory ordered on `stream` (at most one allocation per buffer).
  void* allocate(std::size_t bytes, cudaStream_t stream) {
    kvsift::detail::require(p_ == nullptr, "stream_buffer: allocated twice");
    KVSIFT_CUDA_CHECK(cudaMallocAsync(&p_, bytes, stream));
    stream_ = stream;
    return p_;
  }

 private:
  void* p_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

/// Throws unless `stream` is a default stream or one of `device`; `who` prefixes the message.
inline void require_stream_on(cudaStream_t stream, int device, const char* who) {
  // The default stream handles (0, legacy, per-thread) always mean the current device.
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return;
  int stream_device = 0;
  KVSIFT_CUDA_CHECK(cudaStreamGetDevice(stream, &stream_device));
  kvsift::detail::require(stream_device == device, who, ": the stream belongs to device ",
                          stream_device, ", expected the current device ", device);
}

/// Throws unless `p` is device (or managed) memory of `device`; `who` prefixes the message.
inline void require_device_pointer(const void* p, int device, const char* who, const char* what) {
  kvsift::detail::require(p != nullptr, who, ": ", what, " is null");
  cudaPointerAttributes attr{};
  KVSIFT_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
  kvsift::detail::require(attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged,
                          who, ": ", what, " must be device memory, got a host pointer");
  kvsift::detail::require(attr.type == cudaMemoryTypeManaged || attr.device == device, who, ": ",
                          what, " lives on device ", attr.device, ", expected the current device ",
                          device);
}

/// Throws unless `p` is memory a kernel on `device` can read and write: device memory of
/// `device`, managed memory, or pinned host memory (with unified addressing every device
/// reaches it); `who` prefixes the message. For inputs documented as "device or pinned".
inline void require_accessible_pointer(const void* p, int device, const char* who,
                                       const char* what) {
  kvsift::detail::require(p != nullptr, who, ": ", what, " is null");
  cudaPointerAttributes attr{};
  KVSIFT_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
  kvsift::detail::require(attr.type != cudaMemoryTypeUnregistered, who, ": ", what,
                          " must be device or pinned host memory, got pageable host memory");
  kvsift::detail::require(attr.type != cudaMemoryTypeDevice || attr.device == device, who, ": ",
                          what, " lives on device ", attr.device, ", expected the current device ",
                          device);
}

/// require_device_pointer for an optional argument: null passes.
inline void require_optional_device_pointer(const void* p, int device, const char* who,
                                            const char* what) {
  if (p != nullptr) require_device_pointer(p, device, who, what);
}

/// The calling thread's current device.
inline int current_device() {
  int device = 0;
  KVSIFT_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

}  // namespace kvsift::cuda::detail
