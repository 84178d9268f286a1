#pragma once
// Synthetic out-of-distribution workload that behaves like attention: keys and queries come
// from different distributions (different mean offsets and scales, keys with varying norms),
// while each query still prefers the keys of its own latent topic. The max-inner-product
// neighbours of a query are then not the keys nearest to it, which is what defeats indexes
// built from key-key proximity (HNSW on keys) and what RoarGraph is built for.
// Deterministic for a seed on every platform and every build (own normal sampler, no std
// distributions, no product fused with a sum: detail::product).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "kvsift/core/error.hpp"
#include "kvsift/core/matrix_view.hpp"

namespace kvsift::testing {

struct ood_params {
  std::size_t keys = 10000;
  std::size_t queries = 1000;  ///< drawn i.i.d.: split into training and evaluation sets freely
  std::size_t dim = 64;
  std::size_t topics = 256;   ///< latent clusters shared by keys and queries
  float key_offset = 4.0f;    ///< norm of the common key mean (attention's "key bias")
  float query_offset = 4.0f;  ///< norm of the common query mean, orthogonal to the key mean
  float topic_scale = 2.0f;   ///< how strongly a query prefers its topic
  float noise = 0.6f;         ///< isotropic noise per coordinate (times 1/sqrt(dim))
  /// Key norms vary uniformly in [1 - spread, 1 + spread]. Larger spreads make a few
  /// large-norm keys win most inner products (hubs, like attention sinks) and are harder.
  float norm_spread = 0.2f;
  std::uint64_t seed = 42;
};

/// Row-major f32 keys (keys x dim) and queries (queries x dim).
struct ood_data {
  std::size_t dim = 0;
  std::vector<float> keys;
  std::vector<float> queries;
  [[nodiscard]] matrix_view<const float> key_view() const {
    return {keys.data(), keys.size() / dim, dim};
  }
  [[nodiscard]] matrix_view<const float> query_view() const {
    return {queries.data(), queries.size() / dim, dim};
  }
};

namespace detail {
/// a * b rounded to float before it is used. A compiler may fuse a product with the sum it
/// feeds (FMA contraction, GCC's default wherever the target has FMA), which rounds once
/// instead of twice: builds for AVX2 / AVX-512 (the Python module's variants, -march=native)
/// then drew other keys than the baseline build for the same seed. Every product of the
/// generator that meets a sum goes through here, so every build draws the baseline's values.
inline float product(float a, float b) {
  volatile float rounded = a * b;
  return rounded;
}

class normal_rng {
 public:
  explicit normal_rng(std::uint64_t seed) : gen_(seed) {}
  double uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }
  float normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u = uniform();
    while (u <= 0.0) u = uniform();
    const double v = uniform();
    const double r = std::sqrt(-2.0 * std::log(u));
    spare_ = static_cast<float>(r * std::sin(6.283185307179586 * v));
    has_spare_ = true;
    return static_cast<float>(r * std::cos(6.283185307179586 * v));
  }
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(uniform() * n) % n; }

 private:
  std::mt19937_64 gen_;
  float spare_ = 0;
  bool has_spare_ = false;
};
}  // namespace detail

/// Generates the workload. O((keys + queries) * dim).
/// @throw invalid_argument if dim < 2, topics == 0, keys == 0, norm_spread not in [0, 1), an
///        offset, scale or noise that is not finite, or (keys + queries + topics) * dim past
///        2^40 floats (all before any allocation)
inline ood_data make_ood(const ood_params& p) {
  kvsift::detail::require(p.dim >= 2, "make_ood: dim must be >= 2, got ", p.dim);
  kvsift::detail::require(p.topics > 0, "make_ood: topics must be > 0, got 0");
  kvsift::detail::require(p.keys > 0, "make_ood: keys must be > 0, got 0");
  kvsift::detail::require(p.norm_spread >= 0.0f && p.norm_spread < 1.0f,
                          "make_ood: expected norm_spread in [0, 1), got ", p.norm_spread);
  kvsift::detail::require<non_finite_value>(
      std::isfinite(p.key_offset) && std::isfinite(p.query_offset) &&
          std::isfinite(p.topic_scale) && std::isfinite(p.noise),
      "make_ood: expected finite key_offset, query_offset, topic_scale and noise, got ",
      p.key_offset, ", ", p.query_offset, ", ", p.topic_scale, ", ", p.noise);
  // Sizes checked before anything is allocated: each count, then their sum, against a cap that
  // keeps every product below in range (2^40 floats = 4 TiB).
  constexpr std::size_t cap = std::size_t{1} << 40;
  kvsift::detail::require(
      p.dim <= cap && p.keys <= cap && p.queries <= cap && p.topics <= cap &&
          (p.keys + p.queries + p.topics) <= cap / p.dim,
      "make_ood: expected (keys + queries + topics) * dim <= 2^40 floats, got (", p.keys, " + ",
      p.queries, " + ", p.topics, ") * ", p.dim);
  detail::normal_rng rng(p.seed);
  const std::size_t d = p.dim;
  const float inv = 1.0f / std::sqrt(static_cast<float>(d));
  auto random_unit = [&](std::vector<float>& v) {
    v.resize(d);
    float nrm = 0;
    for (auto& x : v) {
      x = rng.normal();
      nrm += detail::product(x, x);
    }
    nrm = std::sqrt(nrm);
    for (auto& x : v) x /= nrm;
  };
  std::vector<float> mu_k, mu_q;
  random_unit(mu_k);
  random_unit(mu_q);
  float proj = 0;  // make the query mean orthogonal to the key mean
  for (std::size_t j = 0; j < d; ++j) proj += detail::product(mu_q[j], mu_k[j]);
  float nrm = 0;
  for (std::size_t j = 0; j < d; ++j) {
    mu_q[j] -= detail::product(proj, mu_k[j]);
    nrm += detail::product(mu_q[j], mu_q[j]);
  }
  nrm = std::sqrt(nrm);
  for (auto& x : mu_q) x /= nrm;
  std::vector<std::vector<float>> topics(p.topics);
  for (auto& t : topics) random_unit(t);

  ood_data out;
  out.dim = d;
  out.keys.resize(p.keys * d);
  for (std::size_t i = 0; i < p.keys; ++i) {
    const auto& t = topics[rng.below(p.topics)];
    const float s = (1.0f - p.norm_spread) +
                    detail::product(2.0f * p.norm_spread, static_cast<float>(rng.uniform()));
    for (std::size_t j = 0; j < d; ++j) {
      const float noise = detail::product(p.noise * inv, rng.normal());
      out.keys[i * d + j] =
          detail::product(p.key_offset, mu_k[j]) + detail::product(s, t[j] + noise);
    }
  }
  out.queries.resize(p.queries * d);
  for (std::size_t i = 0; i < p.queries; ++i) {
    const auto& t = topics[rng.below(p.topics)];
    for (std::size_t j = 0; j < d; ++j) {
      const float noise = detail::product(2.0f * p.noise * inv, rng.normal());
      out.queries[i * d + j] =
          (detail::product(p.query_offset, mu_q[j]) + detail::product(p.topic_scale, t[j])) + noise;
    }
  }
  return out;
}

}  // namespace kvsift::testing
