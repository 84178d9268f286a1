// The CPU kNN engine (kvsift's packed GEMM + top-k) against the same engine over Eigen's GEMM,
// where Eigen is installed: same blocking, same top-k, one thread, measured in the same run.
// Shapes are step 1 of a RoarGraph build: queries x keys at attention head dims, k = 100.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kvsift/index/knn.hpp"
#if defined(KVSIFT_BENCH_EIGEN)
#include "kvsift/index/knn_eigen.hpp"
#endif

namespace {

constexpr std::size_t keys_n = 16384, queries_n = 1024, k = 100;

template <class Engine>
void bm_knn(benchmark::State& state) {
  const auto d = static_cast<std::size_t>(state.range(0));
  std::mt19937 gen(1);
  std::normal_distribution<float> dist;
  std::vector<float> keys(keys_n * d), queries(queries_n * d);
  for (auto& x : keys) x = dist(gen);
  for (auto& x : queries) x = dist(gen);
  const kvsift::matrix_view<const float> kv(keys.data(), keys_n, d),
      qv(queries.data(), queries_n, d);
  kvsift::cpu_knn_params p;
  p.threads = 1;
  const Engine engine(p);
  for (auto _ : state) benchmark::DoNotOptimize(engine.search(qv, kv, k));
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * keys_n * queries_n * d * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK_TEMPLATE(bm_knn, kvsift::cpu_knn_engine)
    ->Arg(64)
    ->Arg(128)
    ->Arg(256)
    ->Unit(benchmark::kMillisecond);
#if defined(KVSIFT_BENCH_EIGEN)
BENCHMARK_TEMPLATE(bm_knn, kvsift::eigen_knn_engine)
    ->Arg(64)
    ->Arg(128)
    ->Arg(256)
    ->Unit(benchmark::kMillisecond);
#endif
