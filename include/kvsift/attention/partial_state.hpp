#pragma once
// The partial result of attention over a subset of the context: the normalised output `o` and
// the log-sum-exp of the scaled logits. Two partial states over disjoint token sets merge
// exactly into the state over their union (see merge.hpp), which is what lets the window be
// attended on the GPU and the retrieved tokens on the CPU.

#include <cmath>
#include <cstddef>
#include <limits>
#include <numbers>
#include <span>
#include <utility>
#include <vector>

namespace kvsift {

/// Non-owning view of a partial state, e.g. over `o` rows an engine keeps in its own buffer.
/// Trivially copyable. Thread safety: as safe as the memory it views.
struct partial_state_view {
  std::span<const float> o;
  float lse = -std::numeric_limits<float>::infinity();

  [[nodiscard]] std::size_t dim() const noexcept { return o.size(); }
  /// True when the state covers no (unmasked) token; `o` is then all zero by convention.
  [[nodiscard]] bool is_empty() const noexcept {
    return lse == -std::numeric_limits<float>::infinity();
  }
};

/// Attention of one query (one head) over a set of tokens S:
///   o   = sum_{t in S} softmax_S(s)_t * v_t          (head-dim vector, normalised)
///   lse = log(sum_{t in S} exp(s_t))                  (natural log)
/// where s_t = scale * <q, k_t> + bias_t are the *scaled* logits. The empty state (no token,
/// or every token masked with bias -inf) is `o = 0, lse = -inf` and is the identity of merge.
/// Thread safety: a value type; const members are safe to call concurrently.
struct partial_state {
  std::vector<float> o;
  float lse = -std::numeric_limits<float>::infinity();

  /// Dimension-0 empty state; mostly a placeholder to assign into.
  partial_state() = default;

  /// Empty state of head dim `dim` (o = 0, lse = -inf). O(dim).
  explicit partial_state(std::size_t dim) : o(dim, 0.0f) {}

  /// Takes `o` and `lse` as given (no validation: merge validates what it reads).
  partial_state(std::vector<float> o_, float lse_) noexcept : o(std::move(o_)), lse(lse_) {}

  /// Copies a view. O(dim).
  explicit partial_state(partial_state_view v) : o(v.o.begin(), v.o.end()), lse(v.lse) {}

  [[nodiscard]] std::size_t dim() const noexcept { return o.size(); }
  [[nodiscard]] bool is_empty() const noexcept {
    return lse == -std::numeric_limits<float>::infinity();
  }

  /// Resets to the empty state of dimension `dim`, reusing the allocation. O(dim).
  void reset(std::size_t dim) {
    o.assign(dim, 0.0f);
    lse = -std::numeric_limits<float>::infinity();
  }

  // NOLINTNEXTLINE(google-explicit-constructor): a state is usable wherever a view is.
  operator partial_state_view() const noexcept { return {o, lse}; }
};

/// Natural-log LSE -> FlashInfer's base-2 LSE.
///
/// FlashInfer folds log2(e) into the softmax scale and works with exp2, so the `lse` it returns
/// is log2(sum_t 2^(s_t * log2 e)) = log2(sum_t e^(s_t)) = lse / ln 2 = lse * log2(e), where
/// s_t are the same scaled logits as here. -inf maps to -inf (an empty state stays empty).
/// O(1), noexcept, thread safe.
[[nodiscard]] inline float lse_to_base2(float lse) noexcept {
  return lse * std::numbers::log2e_v<float>;
}

/// FlashInfer's base-2 LSE -> natural-log LSE: lse = lse2 * ln 2. Inverse of lse_to_base2
/// up to one f32 rounding. O(1), noexcept, thread safe.
[[nodiscard]] inline float lse_from_base2(float lse2) noexcept {
  return lse2 * std::numbers::ln2_v<float>;
}

}  // namespace kvsift
