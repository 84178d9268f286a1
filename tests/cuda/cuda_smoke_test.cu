// Smoke test for the CUDA toolchain: one saxpy launch checked against the host.
//
// Plain main instead of Catch2 so that a machine without a GPU can report the test as skipped:
// exit code 77 is registered as SKIP_RETURN_CODE in CMakeLists.txt.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <vector>

namespace {

constexpr int kSkipped = 77;

__global__ void saxpy(int n, float a, const float* x, float* y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

bool check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(err));
    return false;
  }
  return true;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return kSkipped;
  }

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
  bool ok = check(cudaMalloc(&dx, bytes), "cudaMalloc(x)") &&
            check(cudaMalloc(&dy, bytes), "cudaMalloc(y)") &&
            check(cudaMemcpy(dx, x.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy(x)") &&
            check(cudaMemcpy(dy, y.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy(y)");
  if (ok) {
    constexpr int threads = 256;
    saxpy<<<(n + threads - 1) / threads, threads>>>(n, a, dx, dy);
    ok = check(cudaGetLastError(), "saxpy launch") &&
         check(cudaMemcpy(y.data(), dy, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy(y back)");
  }
  cudaFree(dx);
  cudaFree(dy);

  int mismatches = 0;
  for (int i = 0; ok && i < n; ++i) {
    if (std::fabs(y[i] - expected[i]) > 1e-5f * (1.0f + std::fabs(expected[i]))) {
      if (mismatches++ < 5) {
        std::fprintf(stderr, "y[%d] = %g, expected %g\n", i, y[i], expected[i]);
      }
    }
  }
  ok = ok && mismatches == 0;
  std::printf("cuda smoke test (saxpy, n = %d, %d device(s)): %s\n", n, devices,
              ok ? "pass" : "fail");
  return ok ? 0 : 1;
}
