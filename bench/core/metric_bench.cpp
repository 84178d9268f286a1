// Metric kernels: kvsift's inner product (the compiler's vector extension) against a plain
// scalar loop and, where xsimd is installed, the same four-chain loop written with xsimd (the
// library the kernels used before), all measured in the same run, for f32 / f16 / bf16 keys at
// attention head dims.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kvsift/core/metric.hpp"

#if defined(KVSIFT_BENCH_XSIMD)
#include <xsimd/xsimd.hpp>
#endif

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

// The f32 baselines (a plain loop, the xsimd loop) over the same rows as bm_inner_product.
template <float (*Dot)(const float*, const float*, std::size_t)>
void bm_f32_loop(benchmark::State& state) {
  const auto d = static_cast<std::size_t>(state.range(0));
  const auto keys = random_rows<float>(rows, d);
  const auto q = random_rows<float>(1, d);
  for (auto _ : state) {
    float acc = 0;
    for (std::size_t i = 0; i < rows; ++i) acc += Dot(q.data(), &keys[i * d], d);
    benchmark::DoNotOptimize(acc);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * rows));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * rows * d * sizeof(float)));
}
void bm_scalar_baseline(benchmark::State& state) { bm_f32_loop<scalar_dot>(state); }

#if defined(KVSIFT_BENCH_XSIMD)
float xsimd_dot(const float* a, const float* b, std::size_t d) {
  using fbatch = xsimd::batch<float>;
  constexpr std::size_t w = fbatch::size;
  std::size_t i = 0;
  fbatch s0(0.0f), s1(0.0f), s2(0.0f), s3(0.0f);
  for (; i + 4 * w <= d; i += 4 * w) {
    s0 = xsimd::fma(fbatch::load_unaligned(a + i), fbatch::load_unaligned(b + i), s0);
    s1 = xsimd::fma(fbatch::load_unaligned(a + i + w), fbatch::load_unaligned(b + i + w), s1);
    s2 = xsimd::fma(fbatch::load_unaligned(a + i + 2 * w), fbatch::load_unaligned(b + i + 2 * w),
                    s2);
    s3 = xsimd::fma(fbatch::load_unaligned(a + i + 3 * w), fbatch::load_unaligned(b + i + 3 * w),
                    s3);
  }
  for (; i + w <= d; i += w) {
    s0 = xsimd::fma(fbatch::load_unaligned(a + i), fbatch::load_unaligned(b + i), s0);
  }
  float acc = xsimd::hadd((s0 + s1) + (s2 + s3));
  for (; i < d; ++i) acc += a[i] * b[i];
  return acc;
}

void bm_xsimd_peer(benchmark::State& state) { bm_f32_loop<xsimd_dot>(state); }
BENCHMARK(bm_xsimd_peer)->Arg(64)->Arg(128);
#endif

}  // namespace

BENCHMARK(bm_scalar_baseline)->Arg(64)->Arg(128);
BENCHMARK_TEMPLATE(bm_inner_product, float)->Arg(64)->Arg(128);
BENCHMARK_TEMPLATE(bm_inner_product, kvsift::half)->Arg(64)->Arg(128);
BENCHMARK_TEMPLATE(bm_inner_product, kvsift::bfloat16)->Arg(64)->Arg(128);
