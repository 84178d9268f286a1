#pragma once
// The log-sum-exp merge of partial attention states (the online-softmax rule). For disjoint
// token sets A and B,
//   lse(A u B) = m + log(exp(lse_A - m) + exp(lse_B - m)),   m = max(lse_A, lse_B)
//   o(A u B)   = exp(lse_A - lse(A u B)) * o_A + exp(lse_B - lse(A u B)) * o_B
// which is exact in real arithmetic, so merging the window (GPU) and the retrieved tokens
// (CPU) gives full attention over their union. The merge is commutative and associative up to
// rounding.
//
// Numerics: the O(1) weight computation runs in double. With |lse| ~ 1e4 an f32 difference
// lse_A - lse(A u B) would carry an absolute error of ~1e-3, i.e. a 1e-3 relative error in the
// weights; in double it is ~1e-12. The O(dim) weighted sum of the rows stays f32. What no
// merge can undo is the rounding of each input lse to f32: an lse near L carries up to
// |L| * 2^-24 absolute error (6e-4 at L = 1e4), which becomes that relative error in the
// weights. Below |L| ~ 100 this is under 1e-5.
//
// Empty states (lse = -inf) are the identity and are special-cased before any subtraction, so
// -inf - -inf (NaN) never happens and merging two empty states gives an empty state.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include "kvsift/attention/detail/attention_kernels.hpp"
#include "kvsift/attention/partial_state.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/matrix_view.hpp"

namespace kvsift {
namespace detail {

/// An lse must be finite or -inf (empty). NaN would poison every output element and +inf
/// has no meaning (a sum of exponentials of finite f32 logits overflows f32 only past 88 + log n,
/// which a finite f32 lse still represents).
inline void require_valid_lse(float lse, const char* what, std::size_t index) {
  require<non_finite_value>(!std::isnan(lse) && lse != std::numeric_limits<float>::infinity(), what,
                            ": expected lse finite or -inf (empty state), got ", lse, " for state ",
                            index);
}

}  // namespace detail

/// Merges `b` into the state held in the caller's buffers (`acc_o`, `acc_lse`): the form for
/// engines that keep `o` rows in their own memory. `b.o` may alias `acc_o`.
///
/// Complexity: O(dim). Thread safety: writes `acc_o` and `acc_lse` only; concurrent calls on
/// distinct accumulators are safe.
/// @throw dimension_mismatch if b.dim() != acc_o.size().
/// @throw non_finite_value if either lse is NaN or +inf (the accumulator is left unchanged;
///        `o` values are not inspected: NaN in `o` with a non-zero weight propagates).
inline void merge_into(std::span<float> acc_o, float& acc_lse, partial_state_view b) {
  require_dim(acc_o.size(), b.dim(), "merge_into: state b");
  detail::require_valid_lse(acc_lse, "merge_into", 0);
  detail::require_valid_lse(b.lse, "merge_into", 1);
  constexpr float neg_inf = -std::numeric_limits<float>::infinity();
  if (b.lse == neg_inf) return;  // identity
  if (acc_lse == neg_inf) {      // identity the other way: copy exactly, no rounding
    std::copy(b.o.begin(), b.o.end(), acc_o.begin());
    acc_lse = b.lse;
    return;
  }
  const double la = acc_lse;
  const double lb = b.lse;
  const double m = std::max(la, lb);
  // log1p keeps full precision when one side dominates (exp(-|la - lb|) tiny).
  const double lse = m + std::log1p(std::exp(-std::abs(la - lb)));
  const auto wa = static_cast<float>(std::exp(la - lse));
  const auto wb = static_cast<float>(std::exp(lb - lse));
  detail::axpby_f32(wb, b.o.data(), wa, acc_o.data(), acc_o.size());
  acc_lse = static_cast<float>(lse);
}

/// Merges `b` into `acc` in place.
/// Complexity: O(dim). Thread safety: mutates `acc` only.
/// @throw dimension_mismatch if b.dim() != acc.dim() (acc unchanged).
/// @throw non_finite_value if either lse is NaN or +inf (acc unchanged).
inline void merge_into(partial_state& acc, partial_state_view b) {
  merge_into(std::span<float>(acc.o), acc.lse, b);
}

/// Returns the merge of `a` and `b` (the state over the union of their token sets).
/// Complexity: O(dim), one allocation. Thread safety: reads only; safe concurrently.
/// @throw dimension_mismatch if a.dim() != b.dim().
/// @throw non_finite_value if either lse is NaN or +inf.
[[nodiscard]] inline partial_state merge(partial_state_view a, partial_state_view b) {
  require_dim(a.dim(), b.dim(), "merge: state b");
  detail::require_valid_lse(a.lse, "merge", 0);
  partial_state out(a);
  merge_into(out, b);
  return out;
}

/// Merges any number of states in one pass over the rows (one weight per state, computed from
/// the global max), which rounds less than a chain of pairwise merges. An empty span gives the
/// empty state of dimension `dim`.
///
/// Complexity: O(states.size() * dim). Thread safety: reads only; safe concurrently.
/// @throw dimension_mismatch if any state's dim differs from `dim`.
/// @throw non_finite_value if any lse is NaN or +inf (message names the state's index).
[[nodiscard]] inline partial_state merge_n(std::span<const partial_state_view> states,
                                           std::size_t dim) {
  constexpr float neg_inf = -std::numeric_limits<float>::infinity();
  float m = neg_inf;
  for (std::size_t i = 0; i < states.size(); ++i) {
    detail::require<dimension_mismatch>(states[i].dim() == dim, "merge_n: expected dimension ", dim,
                                        ", got ", states[i].dim(), " for state ", i);
    detail::require_valid_lse(states[i].lse, "merge_n", i);
    m = std::max(m, states[i].lse);
  }
  partial_state out(dim);
  if (m == neg_inf) return out;  // all empty (or none): no subtraction of -inf from -inf
  double sum = 0.0;
  for (const auto& s : states) sum += std::exp(static_cast<double>(s.lse) - m);
  const double lse = m + std::log(sum);  // sum >= 1: the max term contributes exp(0)
  for (const auto& s : states) {
    if (s.is_empty()) continue;
    const auto w = static_cast<float>(std::exp(static_cast<double>(s.lse) - lse));
    detail::axpy_f32(w, s.o.data(), out.o.data(), dim);
  }
  out.lse = static_cast<float>(lse);
  return out;
}

/// merge_n over owning states.
/// @throw invalid_argument if `states` is empty (there is no dimension to give the result;
///        use the overload taking `dim`), plus everything the view overload throws.
[[nodiscard]] inline partial_state merge_n(std::span<const partial_state> states) {
  detail::require(!states.empty(), "merge_n: expected at least 1 state, got 0");
  std::vector<partial_state_view> views(states.begin(), states.end());
  return merge_n(views, states.front().dim());
}

}  // namespace kvsift
