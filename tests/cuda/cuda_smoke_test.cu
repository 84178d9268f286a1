// Smoke test for the CUDA toolchain: one saxpy launch checked against the host.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include <kvsift/cuda/error.cuh>

#include "cuda_test.cuh"

namespace {

__global__ void saxpy(int n, float a, const float* x, float* y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

}  // namespace

TEST_CASE("smoke_saxpy", "[cuda][cuda_smoke]") {
  constexpr int n = 1 << 20;
  constexpr float a = 2.5f;
  std::vector<float> x(n), y(n), expected(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 1000) * 0.001f;
    y[i] = static_cast<float>(i % 7) - 3.0f;
    expected[i] = a * x[i] + y[i];
  }
  float* dx = nullptr;
  float* dy = nullptr;
  const size_t bytes = n * sizeof(float);
  KVSIFT_CUDA_CHECK(cudaMalloc(&dx, bytes));
  KVSIFT_CUDA_CHECK(cudaMalloc(&dy, bytes));
  KVSIFT_CUDA_CHECK(cudaMemcpy(dx, x.data(), bytes, cudaMemcpyHostToDevice));
  KVSIFT_CUDA_CHECK(cudaMemcpy(dy, y.data(), bytes, cudaMemcpyHostToDevice));
  constexpr int threads = 256;
  saxpy<<<(n + threads - 1) / threads, threads>>>(n, a, dx, dy);
  KVSIFT_CUDA_CHECK(cudaGetLastError());
  KVSIFT_CUDA_CHECK(cudaMemcpy(y.data(), dy, bytes, cudaMemcpyDeviceToHost));
  KVSIFT_CUDA_CHECK(cudaFree(dx));
  KVSIFT_CUDA_CHECK(cudaFree(dy));
  int mismatches = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(y[i] - expected[i]) > 1e-5f * (1.0f + std::fabs(expected[i]))) ++mismatches;
  }
  CHECK(mismatches == 0);
}
