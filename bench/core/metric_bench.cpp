// Metric kernels: the xsimd inner product against a plain scalar loop (the baseline measured
// in the same run), for f32 / f16 / bf16 keys at attention head dims.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kvsift/core/metric.hpp"

namespace {

float scalar_dot(const float* a, const float* b, std::size_t d) {
  float acc = 0;
  for (std::size_t i = 0; i < d; ++i) acc += a[i] * b[i];
  return acc;
}

template <class T>
std::vector<T> random_rows(std::size_t n, std::size_t d) {
  std::mt19937 gen(1);
  std::normal_distribution<float> dist;
  std::vector<T> v(n * d);
  for (auto& x : v) x = T(dist(gen));
  return v;
}

constexpr std::size_t rows = 4096;  // 2 MB of f32 keys at d = 128: stays in L2/L3

template <class T>
void bm_inner_product(benchmark::State& state) {
  const auto d = static_cast<std::size_t>(state.range(0));
  const auto keys = random_rows<T>(rows, d);
  const auto q = random_rows<float>(1, d);
  for (auto _ : state) {
    float acc = 0;
    for (std::size_t i = 0; i < rows; ++i)
      acc += kvsift::inner_product::score(q.data(), &keys[i * d], d);
    benchmark::DoNotOptimize(acc);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * rows));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * rows * d * sizeof(T)));
}

void bm_scalar_baseline(benchmark::State& state) {
  const auto d = static_cast<std::size_t>(state.range(0));
  const auto keys = random_rows<float>(rows, d);
  const auto q = random_rows<float>(1, d);
  for (auto _ : state) {
    float acc = 0;
    for (std::size_t i = 0; i < rows; ++i) acc += scalar_dot(q.data(), &keys[i * d], d);
    benchmark::DoNotOptimize(acc);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * rows));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * rows * d * sizeof(float)));
}

}  // namespace

BENCHMARK(bm_scalar_baseline)->Arg(64)->Arg(128);
BENCHMARK_TEMPLATE(bm_inner_product, float)->Arg(64)->Arg(128);
BENCHMARK_TEMPLATE(bm_inner_product, kvsift::half)->Arg(64)->Arg(128);
BENCHMARK_TEMPLATE(bm_inner_product, kvsift::bfloat16)->Arg(64)->Arg(128);
