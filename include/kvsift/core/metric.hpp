#pragma once
// Metric policies. A metric scores a f32 query against a stored vector of any element type.
// `higher_is_better` is a property of the metric: inner product ranks descending, l2
// ascending. Search code works on an internal "rank key" where larger is always better
// (`to_key`), so one implementation serves both; NaN scores map to the worst key, which is
// how "NaN ranks last" holds without breaking heap order.

#include <cmath>
#include <concepts>
#include <cstddef>
#include <limits>
#include <string_view>

#include "kvsift/core/detail/simd_kernels.hpp"
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

/// Inner product q . x (higher is better): attention logits before scaling.
struct inner_product {
  static constexpr std::string_view name = "inner_product";
  static constexpr bool higher_is_better = true;
  /// O(d), thread-safe, never throws.
  template <Element T>
  static float score(const float* q, const T* x, std::size_t d) noexcept {
    return detail::mixed(q, x, d, detail::dot_f32);
  }
};

/// Squared Euclidean distance (lower is better).
struct l2 {
  static constexpr std::string_view name = "l2";
  static constexpr bool higher_is_better = false;
  /// O(d), thread-safe, never throws.
  template <Element T>
  static float score(const float* q, const T* x, std::size_t d) noexcept {
    return detail::mixed(q, x, d, detail::l2sq_f32);
  }
};

static_assert(Metric<inner_product>);
static_assert(Metric<l2>);

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
