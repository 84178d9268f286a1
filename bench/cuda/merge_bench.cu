// Benchmark of the batched LSE merge kernels (kvsift/cuda/merge.cuh), CUDA events, H100.
//
// Build and run from the repository root:
// clang-format off
//   nvcc -arch=sm_90 -std=c++20 -O3 -I include -I cuda/include bench/cuda/merge_bench.cu -o merge_bench
//   ./merge_bench
// clang-format on
//
// Reports, for 32768 positions x 32 heads x 128 dims x 2 states (f16 and f32), the achieved
// bandwidth (bytes read + written) next to cudaMemcpy device-to-device bandwidth measured in the
// same run (also read + written; target >= 85%), and the latency for 1024 x 16 x 128 x 2
// (target < 10 us).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include <kvsift/cuda/merge.cuh>

#include "bench_util.cuh"

namespace {

using kvsift::cuda_bench::back_to_back_ms;
using kvsift::cuda_bench::median_ms;

template <class T>
struct merge_problem {
  std::int64_t pos;
  int heads, dim;
  T *o = nullptr, *a = nullptr, *b = nullptr, *out = nullptr;
  float *lse = nullptr, *la = nullptr, *lb = nullptr, *lout = nullptr;
  std::int64_t* indptr = nullptr;

  merge_problem(std::int64_t p, int h, int d) : pos(p), heads(h), dim(d) {
    const std::size_t rows = static_cast<std::size_t>(p) * h;
    KVSIFT_CUDA_CHECK(cudaMalloc(&o, 2 * rows * d * sizeof(T)));
    KVSIFT_CUDA_CHECK(cudaMalloc(&lse, 2 * rows * sizeof(float)));
    KVSIFT_CUDA_CHECK(cudaMalloc(&out, rows * d * sizeof(T)));
    KVSIFT_CUDA_CHECK(cudaMalloc(&lout, rows * sizeof(float)));
    KVSIFT_CUDA_CHECK(cudaMalloc(&indptr, (p + 1) * sizeof(std::int64_t)));
    KVSIFT_CUDA_CHECK(cudaMemset(o, 0, 2 * rows * d * sizeof(T)));
    std::vector<float> l(2 * rows);
    for (std::size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>(i % 13) * 0.5f - 3.0f;
    KVSIFT_CUDA_CHECK(cudaMemcpy(lse, l.data(), l.size() * sizeof(float), cudaMemcpyHostToDevice));
    std::vector<std::int64_t> ip(p + 1);
    for (std::int64_t i = 0; i <= p; ++i) ip[i] = 2 * i;
    KVSIFT_CUDA_CHECK(
        cudaMemcpy(indptr, ip.data(), ip.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice));
    a = o;  // the pair kernels read the two halves as separate arrays
    b = o + rows * d;
    la = lse;
    lb = lse + rows;
  }
  ~merge_problem() {
    cudaFree(o);
    cudaFree(lse);
    cudaFree(out);
    cudaFree(lout);
    cudaFree(indptr);
  }
  /// Bytes read + written by one merge of 2 states per (pos, head).
  [[nodiscard]] double bytes(bool with_indptr) const {
    const double rows = static_cast<double>(pos) * heads;
    return rows * (3.0 * dim * sizeof(T) + 3.0 * sizeof(float)) +
           (with_indptr ? (pos + 1) * 8.0 : 0.0);
  }
  kvsift::cuda::merge_policy policy{};
  void varlen(cudaStream_t s) {
    kvsift::cuda::merge_states<T>(o, lse, 2 * pos, indptr, pos, heads, dim, out, lout, s, policy);
  }
  void pair(cudaStream_t s) {
    kvsift::cuda::merge_state<T>(a, la, b, lb, out, lout, pos, heads, dim, s);
  }
};

template <class T>
void bandwidth_case(const char* type, double copy_gbps, cudaStream_t s) {
  merge_problem<T> p(32768, 32, 128);
  const float ms_var = median_ms([&](cudaStream_t st) { p.varlen(st); }, s);
  const float ms_pair = median_ms([&](cudaStream_t st) { p.pair(st); }, s);
  const double gb_var = p.bytes(true) / (ms_var * 1e-3) / 1e9;
  const double gb_pair = p.bytes(false) / (ms_pair * 1e-3) / 1e9;
  std::printf(
      "merge_states (indptr)    %-4s 32768x32x128x2: %8.1f us  %7.1f GB/s  %5.1f%% of copy\n", type,
      ms_var * 1e3, gb_var, 100.0 * gb_var / copy_gbps);
  std::printf(
      "merge_state (pair)       %-4s 32768x32x128x2: %8.1f us  %7.1f GB/s  %5.1f%% of copy\n", type,
      ms_pair * 1e3, gb_pair, 100.0 * gb_pair / copy_gbps);
}

template <class T>
void latency_case(const char* type, cudaStream_t s) {
  merge_problem<T> p(1024, 16, 128);
  const float var_single = median_ms([&](cudaStream_t st) { p.varlen(st); }, s, 10, 50);
  const float var_b2b = back_to_back_ms([&](cudaStream_t st) { p.varlen(st); }, s);
  const float pair_single = median_ms([&](cudaStream_t st) { p.pair(st); }, s, 10, 50);
  const float pair_b2b = back_to_back_ms([&](cudaStream_t st) { p.pair(st); }, s);
  std::printf(
      "latency %-4s 1024x16x128x2: merge_states %6.2f us (events, 1 launch), %6.2f us "
      "(100 back to back) | merge_state %6.2f us, %6.2f us\n",
      type, var_single * 1e3, var_b2b * 1e3, pair_single * 1e3, pair_b2b * 1e3);
}

}  // namespace

int main() {
  kvsift::cuda_bench::bench_setup b;
  if (!kvsift::cuda_bench::start_bench(b)) return 1;
  const cudaStream_t s = b.stream;
  const double copy_gbps = b.copy_gbps;
  bandwidth_case<__half>("f16", copy_gbps, s);
  bandwidth_case<__nv_bfloat16>("bf16", copy_gbps, s);
  bandwidth_case<float>("f32", copy_gbps, s);
  latency_case<__half>("f16", s);
  latency_case<float>("f32", s);
  KVSIFT_CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}
