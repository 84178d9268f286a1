#pragma once
// Size arithmetic that cannot wrap: every size an API boundary computes from its inputs goes
// through these helpers, so an overflow-sized argument becomes a clear `invalid_argument`
// before any allocation or state change instead of a wrapped, too-small buffer.
//
// Why a helper rather than inline checks: the audit that introduced it found eleven boundaries
// where `a * b` or `a + b - 1` wrapped (graph adjacency, page tables, paged K/V, kNN lists);
// each had been written by hand and each missed one product. One spelling makes the check
// visible in review and greppable.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>
#include <utility>

#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"

namespace kvsift {

/// `a * b`, or throws `invalid_argument` naming `what` and both factors when it overflows
/// `std::size_t`. Complexity O(1); thread-safe.
[[nodiscard]] inline std::size_t checked_mul(std::size_t a, std::size_t b, std::string_view what) {
  std::size_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) [[unlikely]] {
    detail::fail(what, ": ", a, " x ", b, " overflows std::size_t");
  }
  return r;
}

/// `a * b * c`, checked as two products (see `checked_mul`).
[[nodiscard]] inline std::size_t checked_mul(std::size_t a, std::size_t b, std::size_t c,
                                             std::string_view what) {
  std::size_t ab = 0;
  std::size_t r = 0;
  if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &r)) [[unlikely]] {
    detail::fail(what, ": ", a, " x ", b, " x ", c, " overflows std::size_t");
  }
  return r;
}

/// `a + b`, or throws `invalid_argument` naming `what` when it overflows `std::size_t`.
[[nodiscard]] inline std::size_t checked_add(std::size_t a, std::size_t b, std::string_view what) {
  std::size_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) [[unlikely]] {
    detail::fail(what, ": ", a, " + ", b, " overflows std::size_t");
  }
  return r;
}

/// ceil(a / b) without the `a + b - 1` wrap. Precondition: b > 0 (`checked_ceil_div` checks
/// it). O(1); noexcept, for hot or noexcept callers that already know b > 0.
[[nodiscard]] constexpr std::size_t ceil_div(std::size_t a, std::size_t b) noexcept {
  return a / b + (a % b != 0 ? 1 : 0);
}

/// ceil(a / b) without the `a + b - 1` wrap; `b` must be positive (throws otherwise).
[[nodiscard]] inline std::size_t checked_ceil_div(std::size_t a, std::size_t b,
                                                  std::string_view what) {
  detail::require(b > 0, what, ": divisor must be positive, got 0");
  return ceil_div(a, b);
}

/// `x * sizeof(T)` bytes, checked; the size of a buffer of `x` elements of `T`.
template <class T>
[[nodiscard]] std::size_t checked_bytes(std::size_t x, std::string_view what) {
  return checked_mul(x, sizeof(T), what);
}

/// Largest number of vectors (keys, nodes, tokens) an index may hold: ids are 32-bit and
/// `invalid_id` (2^32 - 1) is reserved, so positions 0 .. 2^32 - 2 are valid ids.
inline constexpr std::size_t max_index_size = std::size_t{invalid_id};

/// Throws `out_of_range` unless `n <= max_index_size`, naming `what`: a count at or past
/// 2^32 - 1 would make some position alias `invalid_id` once cast to `id_t`.
inline void require_indexable(std::size_t n, std::string_view what) {
  detail::require<out_of_range>(n <= max_index_size, what, ": at most ", max_index_size,
                                " vectors (ids are 32-bit, ", invalid_id, " is invalid_id), got ",
                                n);
}

/// Converts `x` to `To`, or throws `invalid_argument` naming `what` when it does not fit
/// (narrowing a 64-bit count to a 32-bit field silently truncated before).
template <class To, class From>
[[nodiscard]] To checked_cast(From x, std::string_view what) {
  static_assert(std::numeric_limits<To>::is_integer && std::numeric_limits<From>::is_integer);
  if (!std::in_range<To>(x)) [[unlikely]] {
    detail::fail(what, ": must lie in [", +std::numeric_limits<To>::min(), ", ",
                 +std::numeric_limits<To>::max(), "], got ", +x);
  }
  return static_cast<To>(x);
}

}  // namespace kvsift
