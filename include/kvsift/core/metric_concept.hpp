#pragma once
// The `Metric` concept and the rank keys that let one search serve every metric, apart from the
// metrics themselves (<kvsift/core/metric.hpp>, with their SIMD kernels): code that
// only ranks scores a graph computed (the searches) includes this header alone.

#include <cmath>
#include <concepts>
#include <cstddef>
#include <limits>
#include <string_view>

#include "kvsift/core/element.hpp"

namespace kvsift {

/// A similarity/distance policy. Models provide a raw score for (f32 query, stored vector of
/// any `Element` type) and say whether higher raw scores are better.
template <class M>
concept Metric = requires(const float* q, const float* xf, const half* xh, const bfloat16* xb,
                          std::size_t d) {
  { M::name } -> std::convertible_to<std::string_view>;
  { M::higher_is_better } -> std::convertible_to<bool>;
  { M::score(q, xf, d) } -> std::same_as<float>;
  { M::score(q, xh, d) } -> std::same_as<float>;
  { M::score(q, xb, d) } -> std::same_as<float>;
};

/// Worst possible raw score of a metric: what padded (missing) results carry.
template <Metric M>
constexpr float worst_score() noexcept {
  return M::higher_is_better ? -std::numeric_limits<float>::infinity()
                             : std::numeric_limits<float>::infinity();
}

/// Rank key: larger is better for every metric; NaN becomes the worst key.
template <Metric M>
inline float to_key(float score) noexcept {
  if (std::isnan(score)) return -std::numeric_limits<float>::infinity();
  return M::higher_is_better ? score : -score;
}

/// Inverse of `to_key` (NaN scores come back as the worst score).
template <Metric M>
inline float from_key(float key) noexcept {
  return M::higher_is_better ? key : -key;
}

}  // namespace kvsift
