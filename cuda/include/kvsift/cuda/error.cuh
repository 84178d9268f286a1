#pragma once
// The error type thrown by every CUDA host wrapper, and the check helper that raises it.
//
// User errors (bad shapes, null pointers) throw `kvsift::invalid_argument` from
// <kvsift/core/error.hpp>; failures reported by the CUDA runtime (launch errors, bad device
// pointers detected by the driver, out of memory) throw `kvsift::cuda_error`.

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include <kvsift/core/error.hpp>

namespace kvsift {

/// A CUDA runtime call or kernel launch failed. `code()` is the runtime's error code.
class cuda_error : public std::runtime_error {
 public:
  cuda_error(cudaError_t code, const std::string& what) : std::runtime_error(what), code_(code) {}

  [[nodiscard]] cudaError_t code() const noexcept { return code_; }

 private:
  cudaError_t code_;
};

namespace cuda::detail {

/// Throws `cuda_error` naming the failed expression and the call site unless `err` is success.
inline void check_cuda(cudaError_t err, const char* expr, const char* file, int line) {
  if (err != cudaSuccess) [[unlikely]] {
    throw cuda_error(
        err, kvsift::detail::concat(expr, " failed at ", file, ":", line, ": ",
                                    cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
  }
}

}  // namespace cuda::detail
}  // namespace kvsift

/// Evaluates a cudaError_t expression once and throws `kvsift::cuda_error` if it failed.
#define KVSIFT_CUDA_CHECK(expr) \
  ::kvsift::cuda::detail::check_cuda((expr), #expr, __FILE__, __LINE__)
