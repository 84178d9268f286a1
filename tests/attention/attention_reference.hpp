#pragma once
// Test helpers for [attention]: a double-precision reference of full softmax attention that
// reads K/V through the same KvSource (so f16/bf16 inputs are the *rounded* values), random
// data, and tolerance checks.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "kvsift/attention/partial_state.hpp"
#include "kvsift/attention/sparse_attention.hpp"

namespace kvsift_test {

struct reference_state {
  std::vector<double> o;
  double lse = -std::numeric_limits<double>::infinity();
};

/// Two-pass softmax attention in double over `tokens` of head `h`; bias may be empty.
template <class S>
reference_state reference_attention(std::span<const float> q, std::size_t h,
                                    std::span<const kvsift::id_t> tokens, const S& kv, double scale,
                                    std::span<const float> bias = {}) {
  const std::size_t d = kv.head_dim();
  std::vector<double> s(tokens.size());
  double m = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto* k = kv.key(h, tokens[i]);
    double dot = 0;
    for (std::size_t j = 0; j < d; ++j) dot += double(q[j]) * double(kvsift::to_float(k[j]));
    s[i] = scale * dot + (bias.empty() ? 0.0 : double(bias[i]));
    m = std::max(m, s[i]);
  }
  reference_state r;
  r.o.assign(d, 0.0);
  if (m == -std::numeric_limits<double>::infinity()) return r;
  double sum = 0;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const double p = std::exp(s[i] - m);
    sum += p;
    const auto* v = kv.value(h, tokens[i]);
    for (std::size_t j = 0; j < d; ++j) r.o[j] += p * double(kvsift::to_float(v[j]));
  }
  for (auto& x : r.o) x /= sum;
  r.lse = m + std::log(sum);
  return r;
}

/// |o - ref| <= tol * max|ref| elementwise and |lse - ref.lse| <= tol * max(1, |ref.lse|).
inline void check_close(const kvsift::partial_state& got, const reference_state& ref, double tol) {
  REQUIRE(got.o.size() == ref.o.size());
  if (std::isinf(ref.lse)) {
    CHECK(got.is_empty());
    for (float x : got.o) CHECK(x == 0.0f);
    return;
  }
  double omax = 1e-30;
  for (double x : ref.o) omax = std::max(omax, std::abs(x));
  double worst = 0;
  for (std::size_t j = 0; j < ref.o.size(); ++j) {
    REQUIRE(std::isfinite(got.o[j]));
    worst = std::max(worst, std::abs(double(got.o[j]) - ref.o[j]) / omax);
  }
  INFO("max relative error of o " << worst << ", lse " << got.lse << " vs " << ref.lse);
  CHECK(worst <= tol);
  CHECK(std::abs(double(got.lse) - ref.lse) <= tol * std::max(1.0, std::abs(ref.lse)));
}

inline void check_close(const kvsift::partial_state& got, const kvsift::partial_state& want,
                        double tol) {
  reference_state r;
  r.o.assign(want.o.begin(), want.o.end());
  r.lse = want.lse;
  check_close(got, r, tol);
}

template <class T>
std::vector<T> random_values(std::size_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<T> v(n);
  for (auto& x : v) x = T(dist(rng));
  return v;
}

/// K and V for `heads` heads of `tokens` tokens, layout [head][token][dim].
template <class T>
struct kv_data {
  std::size_t heads, tokens, dim;
  std::vector<T> k, v;
  kv_data(std::size_t h, std::size_t n, std::size_t d, std::mt19937& rng, float sigma = 1.0f)
      : heads(h),
        tokens(n),
        dim(d),
        k(random_values<T>(h * n * d, rng, sigma)),
        v(random_values<T>(h * n * d, rng)) {}
  kvsift::kv_view<T> view() const {
    return kvsift::kv_view<T>(kvsift::matrix_view<const T>(k.data(), tokens, dim),
                              kvsift::matrix_view<const T>(v.data(), tokens, dim), heads,
                              tokens * dim);
  }
};

}  // namespace kvsift_test
