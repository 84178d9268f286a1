#pragma once
// Attention of one query head over a list of token ids (the retrieved, critical tokens) or a
// contiguous range (the window), computed where K/V live, into a mergeable partial_state.
//
// K/V are read through a `KvSource`: `kv_view` (strided, one matrix per KV head at a fixed
// head stride) or `paged_kv` (head-wise pages in one pool, Spin-style). Element types f32, f16,
// bf16; all arithmetic is f32. One pass over the tokens with the online softmax, in blocks:
// the logits of a block are computed first, the running max moves once per block (so the
// output accumulator is rescaled once per block, not once per token), then the block's values
// are accumulated. Every K row and V row is read exactly once.

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>

#include "kvsift/attention/detail/attention_kernels.hpp"
#include "kvsift/attention/partial_state.hpp"
#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/element.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/core/metric.hpp"

namespace kvsift {

/// Random access to the K and V rows of `kv_heads()` heads over `tokens()` tokens, each row
/// `head_dim()` elements of `value_type`. `key(h, t)` / `value(h, t)` must be valid for
/// h < kv_heads(), t < tokens() and stay valid during the call that reads them.
template <class S>
concept KvSource = requires(const S& s, std::size_t h, id_t t) {
  typename S::value_type;
  requires Element<typename S::value_type>;
  { s.tokens() } -> std::convertible_to<std::size_t>;
  { s.kv_heads() } -> std::convertible_to<std::size_t>;
  { s.head_dim() } -> std::convertible_to<std::size_t>;
  { s.key(h, t) } -> std::same_as<const typename S::value_type*>;
  { s.value(h, t) } -> std::same_as<const typename S::value_type*>;
};

/// Strided K/V: `keys` / `values` are the (tokens x head_dim) matrices of KV head 0, with any
/// row (token) stride; head h starts `head_stride` elements after head h - 1. This covers both
/// common layouts without copies:
///   [head][token][dim]:  matrix_view(k, tokens, d),           head_stride = tokens * d
///   [token][head][dim]:  matrix_view(k, tokens, d, heads * d), head_stride = d
/// Trivially copyable, never owns memory. Thread safety: const members safe concurrently.
template <Element T>
class kv_view {
 public:
  using value_type = std::remove_const_t<T>;

  kv_view() = default;

  /// @throw dimension_mismatch if keys and values differ in rows or cols.
  /// @throw invalid_argument if kv_heads == 0, or kv_heads > 1 with head_stride == 0, or the
  ///        rows have dimension 0; out_of_range for more than max_index_size tokens.
  kv_view(matrix_view<const value_type> keys, matrix_view<const value_type> values,
          std::size_t kv_heads = 1, std::size_t head_stride = 0)
      : keys_(keys), values_(values), kv_heads_(kv_heads), head_stride_(head_stride) {
    detail::require<dimension_mismatch>(keys.rows() == values.rows(),
                                        "kv_view: expected as many value rows as key rows (",
                                        keys.rows(), "), got ", values.rows());
    require_dim(keys.cols(), values.cols(), "kv_view: values");
    require_vector_dim(keys.rows(), keys.cols(), "kv_view: keys");
    require_indexable(keys.rows(), "kv_view: tokens");
    detail::require(kv_heads >= 1, "kv_view: expected kv_heads >= 1, got ", kv_heads);
    detail::require(kv_heads == 1 || head_stride > 0, "kv_view: expected head_stride > 0 for ",
                    kv_heads, " heads, got 0");
    (void)checked_mul(kv_heads - 1, head_stride, "kv_view: head offsets (kv_heads - 1) x stride");
  }

  [[nodiscard]] std::size_t tokens() const noexcept { return keys_.rows(); }
  [[nodiscard]] std::size_t kv_heads() const noexcept { return kv_heads_; }
  [[nodiscard]] std::size_t head_dim() const noexcept { return keys_.cols(); }
  /// No bounds check (hot path); sparse_attention validates ids and heads up front.
  [[nodiscard]] const value_type* key(std::size_t h, id_t t) const noexcept {
    return keys_.row(t) + h * head_stride_;
  }
  [[nodiscard]] const value_type* value(std::size_t h, id_t t) const noexcept {
    return values_.row(t) + h * head_stride_;
  }

 private:
  matrix_view<const value_type> keys_;
  matrix_view<const value_type> values_;
  std::size_t kv_heads_ = 1;
  std::size_t head_stride_ = 0;
};

/// Shape of a paged K/V store; an aggregate so call sites name every field.
struct paged_kv_shape {
  std::size_t kv_heads = 0;
  std::size_t tokens = 0;  ///< logical tokens per KV head
  std::size_t head_dim = 0;
  std::size_t page_size = 0;  ///< tokens per page
};

/// Head-wise paged K/V (Spin): a page holds `page_size` consecutive tokens of one KV head,
/// stored as page_size x head_dim elements in one pool (K pool and V pool share the physical
/// page index). `page_table[h * pages_per_head() + p]` is the physical page of head h's
/// logical page p. Token t of head h is row t % page_size of page page_table[h][t / page_size].
/// Non-owning; the caller keeps pools and table alive. Thread safety: const members safe
/// concurrently.
template <Element T>
class paged_kv {
 public:
  using value_type = std::remove_const_t<T>;

  paged_kv() = default;

  /// Validates every page-table entry once, so key()/value() need no checks.
  /// Complexity: O(kv_heads * pages_per_head).
  /// @throw invalid_argument if page_size, head_dim or kv_heads is 0, or page_size x head_dim
  ///        or kv_heads x ceil(tokens / page_size) overflows size_t.
  /// @throw out_of_range if tokens > max_index_size (token ids are 32-bit).
  /// @throw dimension_mismatch if the pools differ in size or are not whole pages, or the
  ///        table size is not kv_heads * ceil(tokens / page_size).
  /// @throw out_of_range if a table entry is not a page of the pool.
  paged_kv(std::span<const value_type> k_pool, std::span<const value_type> v_pool,
           std::span<const std::uint32_t> page_table, paged_kv_shape shape)
      : k_pool_(k_pool.data()), v_pool_(v_pool.data()), table_(page_table), shape_(shape) {
    detail::require(shape.page_size > 0 && shape.head_dim > 0 && shape.kv_heads > 0,
                    "paged_kv: expected page_size, head_dim, kv_heads > 0, got ", shape.page_size,
                    ", ", shape.head_dim, ", ", shape.kv_heads);
    require_indexable(shape.tokens, "paged_kv: tokens");
    // Checked: a wrapped page size of 0 was divided by, and a wrapped page count let an empty
    // table pass and be read past.
    const std::size_t page_elems =
        checked_mul(shape.page_size, shape.head_dim, "paged_kv: page_size x head_dim");
    detail::require<dimension_mismatch>(
        k_pool.size() == v_pool.size() && k_pool.size() % page_elems == 0,
        "paged_kv: expected equal K/V pools of whole pages (", page_elems, " elements each), got ",
        k_pool.size(), " and ", v_pool.size());
    pages_per_head_ = checked_ceil_div(shape.tokens, shape.page_size, "paged_kv: pages per head");
    const std::size_t table_size =
        checked_mul(shape.kv_heads, pages_per_head_, "paged_kv: kv_heads x pages per head");
    detail::require<dimension_mismatch>(page_table.size() == table_size,
                                        "paged_kv: expected a page table of ", table_size,
                                        " entries, got ", page_table.size());
    const std::size_t pool_pages = k_pool.size() / page_elems;
    for (std::size_t i = 0; i < page_table.size(); ++i) {
      detail::require<out_of_range>(page_table[i] < pool_pages, "paged_kv: page table entry ", i,
                                    " expected < ", pool_pages, " pages, got ", page_table[i]);
    }
  }

  [[nodiscard]] std::size_t tokens() const noexcept { return shape_.tokens; }
  [[nodiscard]] std::size_t kv_heads() const noexcept { return shape_.kv_heads; }
  [[nodiscard]] std::size_t head_dim() const noexcept { return shape_.head_dim; }
  [[nodiscard]] std::size_t page_size() const noexcept { return shape_.page_size; }
  [[nodiscard]] std::size_t pages_per_head() const noexcept { return pages_per_head_; }
  [[nodiscard]] const value_type* key(std::size_t h, id_t t) const noexcept {
    return k_pool_ + offset(h, t);
  }
  [[nodiscard]] const value_type* value(std::size_t h, id_t t) const noexcept {
    return v_pool_ + offset(h, t);
  }

 private:
  [[nodiscard]] std::size_t offset(std::size_t h, id_t t) const noexcept {
    const std::size_t page = table_[h * pages_per_head_ + t / shape_.page_size];
    return (page * shape_.page_size + t % shape_.page_size) * shape_.head_dim;
  }

  const value_type* k_pool_ = nullptr;
  const value_type* v_pool_ = nullptr;
  std::span<const std::uint32_t> table_;
  paged_kv_shape shape_;
  std::size_t pages_per_head_ = 0;
};

static_assert(KvSource<kv_view<float>>);
static_assert(KvSource<kv_view<half>>);
static_assert(KvSource<paged_kv<bfloat16>>);
static_assert(std::is_trivially_copyable_v<kv_view<half>>);
static_assert(std::is_trivially_copyable_v<paged_kv<float>>);

/// Per-call attention parameters; defaults documented per field.
struct attention_params {
  /// Logit scale; 0 (default) means 1 / sqrt(head_dim).
  float scale = 0.0f;
  /// Additive per-token bias (ALiBi, masks), one per listed token in the order given; empty
  /// (default) means none. -inf masks a token; NaN and +inf are rejected.
  std::span<const float> bias = {};
};

/// GQA: the KV head read by query head `query_head` when `query_heads` query heads share
/// `kv_heads` KV heads in groups of query_heads / kv_heads consecutive heads.
/// Complexity O(1). Thread safe.
/// @throw invalid_argument if kv_heads == 0 or query_heads % kv_heads != 0.
/// @throw out_of_range if query_head >= query_heads.
[[nodiscard]] inline std::size_t gqa_kv_head(std::size_t query_head, std::size_t query_heads,
                                             std::size_t kv_heads) {
  detail::require(kv_heads > 0 && query_heads % kv_heads == 0,
                  "gqa_kv_head: expected query_heads (", query_heads,
                  ") to be a multiple of kv_heads, got kv_heads = ", kv_heads);
  detail::require<out_of_range>(query_head < query_heads, "gqa_kv_head: expected query head < ",
                                query_heads, ", got ", query_head);
  return query_head / (query_heads / kv_heads);
}

namespace detail {

/// Tokens per online-softmax block: the logits fit on the stack and the max moves (and the
/// accumulator is rescaled) at most once per block.
inline constexpr std::size_t attention_block = 64;

template <KvSource S>
void validate_attention(std::span<const float> q, std::size_t kv_head, std::size_t n, const S& kv,
                        const attention_params& params, const char* what) {
  // Token positions become 32-bit ids; a source past max_index_size would alias invalid_id.
  require_indexable(kv.tokens(), what);
  require_dim(kv.head_dim(), q.size(), what);
  require<out_of_range>(kv_head < kv.kv_heads(), what, ": expected kv_head < ", kv.kv_heads(),
                        ", got ", kv_head);
  require<non_finite_value>(std::isfinite(params.scale), what, ": expected a finite scale, got ",
                            params.scale);
  for (std::size_t i = 0; i < q.size(); ++i) {
    require<non_finite_value>(std::isfinite(q[i]), what, ": expected a finite query, got ", q[i],
                              " at element ", i);
  }
  require<dimension_mismatch>(params.bias.empty() || params.bias.size() == n, what, ": expected ",
                              n, " bias values (one per token), got ", params.bias.size());
  for (std::size_t i = 0; i < params.bias.size(); ++i) {
    const float b = params.bias[i];
    require<non_finite_value>(!std::isnan(b) && b != std::numeric_limits<float>::infinity(), what,
                              ": expected bias finite or -inf, got ", b, " at position ", i);
  }
}

/// The one code path behind sparse_attention and dense_attention. `token_at(i)` gives the id of
/// the i-th token; all inputs are validated.
template <KvSource S, class TokenAt>
void attend(const float* q, std::size_t kv_head, std::size_t n, TokenAt token_at, const S& kv,
            const attention_params& params, partial_state& out) {
  constexpr float neg_inf = -std::numeric_limits<float>::infinity();
  constexpr float pos_inf = std::numeric_limits<float>::infinity();
  const std::size_t d = kv.head_dim();
  const float scale = params.scale != 0.0f ? params.scale : 1.0f / std::sqrt(static_cast<float>(d));
  const float* bias = params.bias.empty() ? nullptr : params.bias.data();
  out.reset(d);
  float* o = out.o.data();
  float m = neg_inf;  // running max of the logits seen so far
  float l = 0.0f;     // running sum of exp(logit - m)
  std::array<float, attention_block> s{};
  for (std::size_t b0 = 0; b0 < n; b0 += attention_block) {
    const std::size_t bn = std::min(attention_block, n - b0);
    float bmax = neg_inf;
    for (std::size_t j = 0; j < bn; ++j) {
      const id_t t = token_at(b0 + j);
#if defined(__GNUC__)
      // Random ids defeat the hardware prefetcher; the V row is read after the block's logits.
      __builtin_prefetch(kv.value(kv_head, t));
#endif
      float x = scale * inner_product::score(q, kv.key(kv_head, t), d);
      if (bias != nullptr) x += bias[b0 + j];
      // q is finite and bias is finite or -inf, so a NaN or +inf logit can only come from
      // non-finite K data (or f32 overflow). It is masked, as NaN scores rank last in search;
      // letting it in would make every output element NaN.
      if (!(x < pos_inf)) x = neg_inf;
      s[j] = x;
      bmax = std::max(bmax, x);
    }
    if (bmax == neg_inf) continue;  // whole block masked: nothing to add, no -inf - -inf
    if (bmax > m) {
      const float alpha = std::exp(m - bmax);  // m == -inf gives 0: o and l are still 0
      if (l != 0.0f) scale_f32(alpha, o, d);
      l *= alpha;
      m = bmax;
    }
    for (std::size_t j = 0; j < bn; ++j) {
      if (s[j] == neg_inf) continue;  // masked: skip the V read too
      const float p = std::exp(s[j] - m);
      l += p;
      axpy_mixed(p, kv.value(kv_head, token_at(b0 + j)), o, d);
    }
  }
  if (m == neg_inf) return;  // no unmasked token: the empty state set by reset()
  scale_f32(1.0f / l, o, d);
  out.lse = m + std::log(l);
}

}  // namespace detail

/// Attention of query `q` (one query head, f32, head_dim elements) over the tokens `tokens`
/// of KV head `kv_head`, into `out` (its allocation is reused: no allocation once it has
/// capacity for head_dim). Logits are s_i = scale * <q, k_{tokens[i]}> + bias[i]; the result
/// is the partial_state over the unmasked tokens, ready to merge. Ids may repeat (a repeated
/// id counts twice); order does not matter beyond rounding.
///
/// Results: no tokens, or every token masked (bias -inf), gives the empty state (o = 0,
/// lse = -inf), never NaN. NaN/Inf in q is rejected (it would make every logit NaN). A NaN
/// or +inf logit, which only non-finite K data can produce since q, scale and bias are
/// validated, masks that token; NaN/Inf in a V row of an unmasked token propagates into o.
///
/// Complexity: O(tokens.size() * head_dim) time, each K and V row read once; O(1) extra
/// memory (stack). Thread safety: reads `kv`, writes `out` only; concurrent calls with
/// distinct `out` are safe.
/// @throw dimension_mismatch if q.size() != kv.head_dim(), or bias is non-empty and
///        bias.size() != tokens.size().
/// @throw out_of_range if kv_head >= kv.kv_heads() or a token id >= kv.tokens() (the message
///        names the first bad position), or kv.tokens() > max_index_size.
/// @throw non_finite_value if q holds NaN/Inf, scale is not finite, or a bias is NaN or +inf.
/// All validation happens before `out` is touched.
template <KvSource S>
void sparse_attention(std::span<const float> q, std::size_t kv_head, std::span<const id_t> tokens,
                      const S& kv, const attention_params& params, partial_state& out) {
  detail::validate_attention(q, kv_head, tokens.size(), kv, params, "sparse_attention");
  const std::size_t n_tokens = kv.tokens();
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    detail::require<out_of_range>(tokens[i] < n_tokens, "sparse_attention: expected token ids < ",
                                  n_tokens, ", got ", tokens[i], " at position ", i);
  }
  detail::attend(
      q.data(), kv_head, tokens.size(), [tokens](std::size_t i) { return tokens[i]; }, kv, params,
      out);
}

/// sparse_attention returning a new state. Same contract; one allocation of head_dim floats.
template <KvSource S>
[[nodiscard]] partial_state sparse_attention(std::span<const float> q, std::size_t kv_head,
                                             std::span<const id_t> tokens, const S& kv,
                                             const attention_params& params = {}) {
  partial_state out;
  sparse_attention(q, kv_head, tokens, kv, params, out);
  return out;
}

/// Attention over the contiguous token range [first, last) of KV head `kv_head` (the static
/// window), through the same code path as sparse_attention, so merging the window's state with
/// the retrieved tokens' state equals attention over their union. `params.bias`, if given,
/// has last - first entries, one per token of the range.
///
/// Complexity, results and thread safety as sparse_attention.
/// @throw out_of_range if first > last or last > kv.tokens(), plus everything
///        sparse_attention throws.
template <KvSource S>
void dense_attention(std::span<const float> q, std::size_t kv_head, std::size_t first,
                     std::size_t last, const S& kv, const attention_params& params,
                     partial_state& out) {
  detail::require<out_of_range>(first <= last && last <= kv.tokens(),
                                "dense_attention: expected a range within [0, ", kv.tokens(),
                                "), got [", first, ", ", last, ")");
  detail::validate_attention(q, kv_head, last - first, kv, params, "dense_attention");
  detail::attend(
      q.data(), kv_head, last - first,
      [first](std::size_t i) { return static_cast<id_t>(first + i); }, kv, params, out);
}

/// dense_attention returning a new state.
template <KvSource S>
[[nodiscard]] partial_state dense_attention(std::span<const float> q, std::size_t kv_head,
                                            std::size_t first, std::size_t last, const S& kv,
                                            const attention_params& params = {}) {
  partial_state out;
  dense_attention(q, kv_head, first, last, kv, params, out);
  return out;
}

}  // namespace kvsift
