// CPU sparse attention: 2048 randomly selected tokens out of a 32768-token context (K/V far
// larger than L2, as in decode), d = 64 / 128, f32 and f16 K/V, against a scalar baseline of
// plain loops over the same data in the same run. Items are tokens, so items_per_second / 1e6
// is tokens per microsecond on one core; bytes are the K and V rows read. Plus the merge.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kvsift/attention/merge.hpp"
#include "kvsift/attention/sparse_attention.hpp"

namespace {

constexpr std::size_t context = 32768;
constexpr std::size_t selected = 2048;

template <class T>
struct fixture {
  std::size_t d;
  std::vector<T> k, v;
  std::vector<float> q;
  std::vector<kvsift::id_t> ids;
  explicit fixture(std::size_t dim) : d(dim), k(context * dim), v(context * dim), q(dim) {
    std::mt19937 gen(1);
    std::normal_distribution<float> dist;
    for (auto& x : k) x = T(dist(gen));
    for (auto& x : v) x = T(dist(gen));
    for (auto& x : q) x = dist(gen);
    std::uniform_int_distribution<kvsift::id_t> pick(0, context - 1);
    ids.resize(selected);
    for (auto& t : ids) t = pick(gen);
  }
  kvsift::kv_view<T> view() const {
    return {kvsift::matrix_view<const T>(k.data(), context, d),
            kvsift::matrix_view<const T>(v.data(), context, d)};
  }
};

template <class T>
void report(benchmark::State& state, std::size_t d) {
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * selected));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * selected * 2 * d * sizeof(T)));
}

template <class T>
void bm_sparse_attention(benchmark::State& state) {
  const auto d = static_cast<std::size_t>(state.range(0));
  const fixture<T> f(d);
  const auto kv = f.view();
  kvsift::partial_state out(d);
  for (auto _ : state) {
    kvsift::sparse_attention(f.q, 0, f.ids, kv, {}, out);
    benchmark::DoNotOptimize(out.o.data());
  }
  report<T>(state, d);
}

/// Plain loops, same data: online softmax one token at a time, scalar dot and axpy.
template <class T>
void bm_scalar_baseline(benchmark::State& state) {
  const auto d = static_cast<std::size_t>(state.range(0));
  const fixture<T> f(d);
  std::vector<float> o(d);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (auto _ : state) {
    std::fill(o.begin(), o.end(), 0.0f);
    float m = -std::numeric_limits<float>::infinity();
    float l = 0.0f;
    for (const kvsift::id_t t : f.ids) {
      const T* k = &f.k[t * d];
      const T* v = &f.v[t * d];
      float s = 0.0f;
      for (std::size_t j = 0; j < d; ++j) s += f.q[j] * kvsift::to_float(k[j]);
      s *= scale;
      const float m_new = std::max(m, s);
      const float alpha = std::exp(m - m_new);
      const float p = std::exp(s - m_new);
      for (std::size_t j = 0; j < d; ++j) o[j] = o[j] * alpha + p * kvsift::to_float(v[j]);
      l = l * alpha + p;
      m = m_new;
    }
    for (auto& x : o) x /= l;
    benchmark::DoNotOptimize(o.data());
    benchmark::DoNotOptimize(m + std::log(l));
  }
  report<T>(state, d);
}

void bm_merge(benchmark::State& state) {
  const auto d = static_cast<std::size_t>(state.range(0));
  std::mt19937 gen(2);
  std::normal_distribution<float> dist;
  kvsift::partial_state a(d), b(d);
  for (auto& x : a.o) x = dist(gen);
  for (auto& x : b.o) x = dist(gen);
  a.lse = 3.0f;
  b.lse = 2.5f;
  for (auto _ : state) {
    auto acc = a;  // copy so the state does not drift; the copy is part of the cost
    kvsift::merge_into(acc, b);
    benchmark::DoNotOptimize(acc.o.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 3 * d * sizeof(float)));
}

void bm_merge_n(benchmark::State& state) {
  const std::size_t d = 128;
  const auto n = static_cast<std::size_t>(state.range(0));
  std::mt19937 gen(3);
  std::normal_distribution<float> dist;
  std::vector<kvsift::partial_state> states(n, kvsift::partial_state(d));
  for (auto& s : states) {
    for (auto& x : s.o) x = dist(gen);
    s.lse = dist(gen);
  }
  for (auto _ : state) {
    auto r = kvsift::merge_n(states);
    benchmark::DoNotOptimize(r.o.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * (n + 1) * d * sizeof(float)));
}

}  // namespace

BENCHMARK_TEMPLATE(bm_scalar_baseline, float)->Arg(64)->Arg(128);
BENCHMARK_TEMPLATE(bm_sparse_attention, float)->Arg(64)->Arg(128);
BENCHMARK_TEMPLATE(bm_scalar_baseline, kvsift::half)->Arg(64)->Arg(128);
BENCHMARK_TEMPLATE(bm_sparse_attention, kvsift::half)->Arg(64)->Arg(128);
BENCHMARK_TEMPLATE(bm_sparse_attention, kvsift::bfloat16)->Arg(64)->Arg(128);
BENCHMARK(bm_merge)->Arg(64)->Arg(128);
BENCHMARK(bm_merge_n)->Arg(2)->Arg(8);
