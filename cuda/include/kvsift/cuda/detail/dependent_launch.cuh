#pragma once
// Programmatic dependent launch (sm_90 and later; internal): a small kernel that consumes the
// results of the kernel before it on the stream is launched while that kernel still runs, and
// waits on the device, not on the host's launch path, for its results. sparse_attention's
// split merge uses it: at batch 1 the merge's launch gap is a visible share of the step
// (bench/results/h200_sparse_attention_pdl.txt).

#include <cuda_runtime.h>

#include <utility>

#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda::detail {

/// In a kernel launched by `launch_dependent`: waits until the kernel before it on the stream
/// has completed and its memory is visible. A no-op for a kernel launched normally (it then
/// starts after that kernel anyway) and before sm_90. Call it before the first read of the
/// previous kernel's results.
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// In the kernel a dependent one follows: lets the dependent kernel launch once every block of
/// this one has called it or exited (it still waits for this kernel's results in
/// wait_for_prior_grid). A no-op before sm_90 and when no dependent launch follows.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// True when `device` can launch dependent kernels early (compute capability >= 9).
inline bool dependent_launch_supported(int device) {
  int major = 0;
  KVSIFT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 9;
}

/// Launches `kernel` on `stream` (of `device`, the current device, which the caller has looked
/// up already) so that it may start before the kernel before it on the stream has finished (the
/// kernel must call wait_for_prior_grid before reading that kernel's results); a plain launch
/// where the device cannot. Launch errors are thrown as cuda_error.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                      int device, Args&&... args) {
  if (!dependent_launch_supported(device)) {
    kernel<<<grid, block, 0, stream>>>(std::forward<Args>(args)...);
    KVSIFT_CUDA_CHECK(cudaGetLastError());
    return;
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  KVSIFT_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace kvsift::cuda::detail
