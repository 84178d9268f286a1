#pragma once
// Metric policies. A metric scores a f32 query against a stored vector of any element type.
// `higher_is_better` is a property of the metric: inner product ranks descending, l2
// ascending. Search code works on an internal "rank key" where larger is always better
// (`to_key`), so one implementation serves both; NaN scores map to the worst key, which is
// how "NaN ranks last" holds without breaking heap order.

#include <cmath>
#include <cstddef>
#include <string_view>

#include "kvsift/core/detail/simd_kernels.hpp"
#include "kvsift/core/element.hpp"
#include "kvsift/core/metric_concept.hpp"

namespace kvsift {

/// Inner product q . x (higher is better): attention logits before scaling.
struct inner_product {
  static constexpr std::string_view name = "inner_product";
  static constexpr bool higher_is_better = true;
  /// O(d), thread-safe, never throws.
  template <Element T>
  static float score(const float* q, const T* x, std::size_t d) noexcept {
    return detail::mixed(q, x, d, [](const float* a, const auto* b, std::size_t n) {
      return detail::dot_row(a, b, n);
    });
  }
};

/// Squared Euclidean distance (lower is better).
struct l2 {
  static constexpr std::string_view name = "l2";
  static constexpr bool higher_is_better = false;
  /// O(d), thread-safe, never throws.
  template <Element T>
  static float score(const float* q, const T* x, std::size_t d) noexcept {
    return detail::mixed(q, x, d, [](const float* a, const auto* b, std::size_t n) {
      return detail::l2sq_row(a, b, n);
    });
  }
};

static_assert(Metric<inner_product>);
static_assert(Metric<l2>);

}  // namespace kvsift
