#pragma once
// Coarse-grained block index: the context is cut into blocks of adjacent tokens and each block
// is summarised by a representative; a query scores the summaries (n / block_size of them
// instead of n keys) and fetches whole blocks. This is the index AlayaDB's planner picks when
// the GPU budget is generous: the summaries are small enough to stay on the GPU and a block is
// the unit the memory layer moves, so block b maps onto one partition, tokens_of(b).
//
// Representatives are a policy (`BlockRepresentative`):
// - `minmax_representative` (Quest): per-dimension min and max of the block's keys. For every
//   key k in the block, q.k = sum_i q_i k_i <= sum_i max(q_i max_i, q_i min_i), so the block
//   score is a true upper bound of its best logit. The block mean is kept too: the best logit
//   of a block is at least the mean logit q.mean, which gives the lower bound block-level DIPR
//   needs (Quest itself only stores min/max; the mean costs d more floats per block).
// - `representative_keys` (InfLLM): the r keys of the block that receive the most in-block
//   attention from the block's own (causal) queries. The block score is the best logit over
//   them: a true lower bound of the block's best logit, but only an estimate of the upper one.
//
// Scores are raw inner products q.k (unscaled logits), the units of dipr_params::beta.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <limits>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/core/metric.hpp"
#include "kvsift/core/topk.hpp"
#include "kvsift/search/vocabulary.hpp"

namespace kvsift {

/// What a representative says about the best logit max_{k in block} q.k of one block.
struct block_bounds {
  float upper = 0;  ///< ranking score; a guaranteed upper bound iff R::upper_is_bound
  float lower = 0;  ///< a guaranteed lower bound of the block's best logit
};

/// Tokens [first, last) of a block: what the memory layer fetches for it.
struct token_range {
  std::size_t first = 0;
  std::size_t last = 0;
  [[nodiscard]] std::size_t size() const noexcept { return last - first; }
};

/// A block summary policy. `reset(dim)` starts a build; `append(keys, queries, first, last)`
/// summarises keys [first, last) (queries has one row per token, or is empty when the policy
/// does not need queries); `bounds(q, b)` scores block b; `floats_per_block()` is its memory.
template <class R>
concept BlockRepresentative = std::copy_constructible<R> &&
    requires(R& r, const R& cr, matrix_view<const float> keys, std::size_t i, const float* q) {
  { R::name } -> std::convertible_to<std::string_view>;
  { R::upper_is_bound } -> std::convertible_to<bool>;
  { R::needs_queries } -> std::convertible_to<bool>;
  r.reset(i);
  r.append(keys, keys, i, i);
  { cr.bounds(q, i) } -> std::same_as<block_bounds>;
  { cr.floats_per_block() } -> std::convertible_to<std::size_t>;
};

/// Quest: per-dimension min / max (and the mean, for a lower bound). 3 * d floats per block.
/// Thread safety: const members safe concurrently.
class minmax_representative {
 public:
  static constexpr std::string_view name = "minmax";
  static constexpr bool upper_is_bound = true;
  static constexpr bool needs_queries = false;

  void reset(std::size_t dim) {
    dim_ = dim;
    data_.clear();
  }
  /// O((last - first) * d).
  void append(matrix_view<const float> keys, matrix_view<const float> /*queries*/,
              std::size_t first, std::size_t last) {
    const std::size_t base = data_.size();
    data_.resize(base + 3 * dim_);
    float* mn = data_.data() + base;
    float* mx = mn + dim_;
    float* mean = mx + dim_;
    std::copy(keys.row(first), keys.row(first) + dim_, mn);
    std::copy(keys.row(first), keys.row(first) + dim_, mx);
    std::vector<double> sum(dim_, 0.0);
    for (std::size_t t = first; t < last; ++t) {
      const float* k = keys.row(t);
      for (std::size_t i = 0; i < dim_; ++i) {
        mn[i] = std::min(mn[i], k[i]);
        mx[i] = std::max(mx[i], k[i]);
        sum[i] += k[i];
      }
    }
    for (std::size_t i = 0; i < dim_; ++i) {
      mean[i] = static_cast<float>(sum[i] / static_cast<double>(last - first));
    }
  }
  /// O(d), no allocation.
  [[nodiscard]] block_bounds bounds(const float* q, std::size_t b) const noexcept {
    const float* mn = data_.data() + b * 3 * dim_;
    const float* mx = mn + dim_;
    float upper = 0;
    float magnitude = 0;
    for (std::size_t i = 0; i < dim_; ++i) {
      upper += std::max(q[i] * mx[i], q[i] * mn[i]);
      magnitude += std::abs(q[i]) * std::max(std::abs(mx[i]), std::abs(mn[i]));
    }
    // q.k and this sum are rounded differently (SIMD order vs sequential); both errors are
    // below d * eps * sum |q_i k_i|, so a nudge of that size keeps "upper >= every q.k" true
    // in float arithmetic, not only in exact arithmetic.
    upper += 4.0f * static_cast<float>(dim_) * std::numeric_limits<float>::epsilon() * magnitude;
    return {upper, inner_product::score(q, mx + dim_, dim_)};
  }
  [[nodiscard]] std::size_t floats_per_block() const noexcept { return 3 * dim_; }

 private:
  std::size_t dim_ = 0;
  std::vector<float> data_;  // per block: min, max, mean
};

/// InfLLM: the `r` keys with the highest in-block attention from the block's own queries.
/// Token j's weight is sum over queries i in the block with i >= j (causal) of
/// softmax_{t in [first, i]}(q_i.k_t / sqrt(d)) at t = j. r * d floats per block (a block
/// shorter than r repeats its best key so every block has r rows).
/// Thread safety: const members safe concurrently.
class representative_keys {
 public:
  static constexpr std::string_view name = "representative_keys";
  static constexpr bool upper_is_bound = false;
  static constexpr bool needs_queries = true;

  /// @throw invalid_argument if r == 0.
  explicit representative_keys(std::size_t r = 4) : r_(r) {
    detail::require(r > 0, "representative_keys: expected r > 0, got 0");
  }
  [[nodiscard]] std::size_t r() const noexcept { return r_; }

  void reset(std::size_t dim) {
    dim_ = dim;
    data_.clear();
  }
  /// O((last - first)^2 * d).
  void append(matrix_view<const float> keys, matrix_view<const float> queries, std::size_t first,
              std::size_t last) {
    const std::size_t len = last - first;
    const float scale = 1.0f / std::sqrt(static_cast<float>(dim_));
    std::vector<double> weight(len, 0.0);
    std::vector<float> logit(len);
    for (std::size_t i = 0; i < len; ++i) {
      float best = -std::numeric_limits<float>::infinity();
      for (std::size_t j = 0; j <= i; ++j) {
        logit[j] = scale * inner_product::score(queries.row(first + i), keys.row(first + j), dim_);
        best = std::max(best, logit[j]);
      }
      double z = 0;
      for (std::size_t j = 0; j <= i; ++j) z += std::exp(static_cast<double>(logit[j] - best));
      for (std::size_t j = 0; j <= i; ++j) {
        weight[j] += std::exp(static_cast<double>(logit[j] - best)) / z;
      }
    }
    std::vector<std::size_t> order(len);
    for (std::size_t j = 0; j < len; ++j) order[j] = j;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return weight[a] > weight[b]; });
    for (std::size_t s = 0; s < r_; ++s) {
      const float* k = keys.row(first + order[std::min(s, len - 1)]);
      data_.insert(data_.end(), k, k + dim_);
    }
  }
  /// O(r * d), no allocation.
  [[nodiscard]] block_bounds bounds(const float* q, std::size_t b) const noexcept {
    float best = -std::numeric_limits<float>::infinity();
    const float* reps = data_.data() + b * r_ * dim_;
    for (std::size_t s = 0; s < r_; ++s) {
      best = std::max(best, inner_product::score(q, reps + s * dim_, dim_));
    }
    return {best, best};
  }
  [[nodiscard]] std::size_t floats_per_block() const noexcept { return r_ * dim_; }

 private:
  std::size_t r_ = 4;
  std::size_t dim_ = 0;
  std::vector<float> data_;
};

static_assert(BlockRepresentative<minmax_representative>);
static_assert(BlockRepresentative<representative_keys>);

/// Output of a block search; reuse one object across calls to avoid allocation.
struct block_result {
  std::vector<std::size_t> blocks;  ///< best-first by block score
  std::vector<float> scores;        ///< block scores (bounds().upper), best-first
  search_stats stats;               ///< distance_computations = blocks scored
};

/// Coarse block index over keys (f32, inner product). Keeps only the summaries: the keys are
/// read at build time and never again. Thread safety: const members safe concurrently (one
/// workspace per thread).
template <BlockRepresentative R = minmax_representative>
class block_index {
 public:
  using representative_type = R;

  block_index() = default;

  /// Builds the summaries of ceil(n / block_size) blocks (the last one may be shorter).
  /// `queries` (one row per token, as keys) is required by representatives that need it and
  /// ignored otherwise. Complexity: that of R::append over all blocks.
  /// A block_size beyond n makes one block of all n tokens.
  /// @throw invalid_argument if block_size == 0 or keys is empty; out_of_range for more than
  ///        max_index_size keys (token ids are 32-bit); non_finite_value for NaN/Inf
  ///        in keys or queries; dimension_mismatch if queries are needed and their shape
  ///        differs from keys'.
  block_index(matrix_view<const float> keys, std::size_t block_size,
              matrix_view<const float> queries = {}, R rep = R{})
      : rep_(std::move(rep)), n_(keys.rows()), dim_(keys.cols()), block_size_(block_size) {
    detail::require(block_size > 0, "block_index: expected block_size > 0, got 0");
    detail::require(keys.rows() > 0 && keys.cols() > 0, "block_index: expected a non-empty key ",
                    "set, got ", keys.rows(), " x ", keys.cols());
    require_indexable(keys.rows(), "block_index: keys");
    require_finite(keys, "block_index: keys");
    if constexpr (R::needs_queries) {
      detail::require<dimension_mismatch>(
          queries.rows() == keys.rows() && queries.cols() == keys.cols(), "block_index: ", R::name,
          " needs one query per key: expected ", keys.rows(), " x ", keys.cols(), ", got ",
          queries.rows(), " x ", queries.cols());
      require_finite(queries, "block_index: queries");
    }
    rep_.reset(dim_);
    for (std::size_t b = 0; b < blocks(); ++b) {
      const auto r = tokens_of(b);
      rep_.append(keys, queries, r.first, r.last);
    }
  }

  [[nodiscard]] std::size_t size() const noexcept { return n_; }  ///< tokens
  [[nodiscard]] std::size_t dim() const noexcept { return dim_; }
  [[nodiscard]] std::size_t block_size() const noexcept { return block_size_; }
  [[nodiscard]] std::size_t blocks() const noexcept {
    // Not (n + block_size - 1) / block_size: that wrapped to 0 blocks for a huge block_size.
    return block_size_ == 0 ? 0 : ceil_div(n_, block_size_);
  }
  [[nodiscard]] const R& representative() const noexcept { return rep_; }
  /// Bytes of the summaries (what the GPU keeps resident for this index), f32.
  [[nodiscard]] std::size_t summary_bytes() const noexcept {
    return blocks() * rep_.floats_per_block() * sizeof(float);
  }

  /// Token range (= partition) of block b. O(1).
  /// @throw out_of_range if b >= blocks().
  [[nodiscard]] token_range tokens_of(std::size_t b) const {
    detail::require<out_of_range>(b < blocks(), "block_index::tokens_of: expected block < ",
                                  blocks(), ", got ", b);
    const std::size_t first = b * block_size_;  // < n: b < blocks()
    return {first, first + std::min(block_size_, n_ - first)};
  }

  /// Bounds of block b for query q. O(cost of R::bounds).
  /// @throw dimension_mismatch for a wrong query length; out_of_range if b >= blocks().
  [[nodiscard]] block_bounds bounds(std::span<const float> q, std::size_t b) const {
    detail::validate_query(q, dim_, "block_index::bounds");
    detail::require<out_of_range>(b < blocks(), "block_index::bounds: expected block < ", blocks(),
                                  ", got ", b);
    return rep_.bounds(q.data(), b);
  }

  /// The k blocks with the highest scores among blocks holding at least one token that passes
  /// `pred` (fewer if fewer exist). Complexity O(B * bound + B log k) for B blocks, plus
  /// O(n) predicate calls when filtered. NaN scores rank last; a query holding NaN or Inf
  /// returns no blocks.
  /// @throw invalid_argument if k == 0; dimension_mismatch for a wrong query length;
  ///        out_of_range for a predicate beyond the index.
  template <Predicate P = no_filter>
  void topk(std::span<const float> q, std::size_t k, search_workspace& ws, block_result& out,
            const P& pred = {}) const {
    detail::require(k > 0, "block_index::topk: k must be > 0, got 0");
    detail::validate_query(q, dim_, "block_index::topk");
    validate_predicate(pred, n_);
    out.stats = {};
    const std::size_t nb = detail::finite_query(q) ? blocks() : 0;
    ws.topk.reset(std::min(k, nb));  // never more than the blocks: no oversized reservation
    for (std::size_t b = 0; b < nb; ++b) {
      if (passing(b, pred) == coverage::none) continue;
      ++out.stats.distance_computations;
      ws.topk.push(to_key<inner_product>(rep_.bounds(q.data(), b).upper), static_cast<id_t>(b));
    }
    emit(ws.topk.sorted(), out);
  }

  /// Block-level DIPR: every eligible block whose upper score is >= L - beta, where L is the
  /// best lower bound over blocks whose tokens all pass `pred` (a partially passing block's
  /// lower bound may come from a filtered-out key). With a representative whose upper is a
  /// true bound (minmax), every passing token within beta of the best passing logit lies in a
  /// returned block. Complexity as topk plus O(r log r) for r blocks returned. A query holding
  /// NaN or Inf returns no blocks.
  /// @throw invalid_argument for beta < 0 or non-finite; dimension_mismatch; out_of_range.
  template <Predicate P = no_filter>
  void dipr(std::span<const float> q, float beta, search_workspace& ws, block_result& out,
            const P& pred = {}) const {
    detail::require(std::isfinite(beta) && beta >= 0.0f,
                    "block_index::dipr: expected finite beta >= 0, got ", beta);
    detail::validate_query(q, dim_, "block_index::dipr");
    validate_predicate(pred, n_);
    out.stats = {};
    auto& list = ws.list;
    list.clear();
    float best_lower = -std::numeric_limits<float>::infinity();
    const std::size_t nb = detail::finite_query(q) ? blocks() : 0;
    for (std::size_t b = 0; b < nb; ++b) {
      const coverage c = passing(b, pred);
      if (c == coverage::none) continue;
      ++out.stats.distance_computations;
      const block_bounds bb = rep_.bounds(q.data(), b);
      if (c == coverage::all && !std::isnan(bb.lower)) best_lower = std::max(best_lower, bb.lower);
      list.push_back({to_key<inner_product>(bb.upper), static_cast<id_t>(b)});
    }
    // Only partially passing blocks: no valid lower bound, so every eligible block is kept.
    std::erase_if(list, [&](const scored_id& s) { return !(s.key >= best_lower - beta); });
    std::sort(list.begin(), list.end(), detail::rank_order{});
    emit(list, out);
  }

  /// Appends to `out` the ids of the tokens of `blocks` that pass `pred`, in block order.
  /// Complexity O(total tokens of the blocks).
  /// @throw out_of_range for a block >= blocks() (before anything is appended).
  template <Predicate P = no_filter>
  void tokens(std::span<const std::size_t> blocks_in, std::vector<id_t>& out,
              const P& pred = {}) const {
    for (std::size_t b : blocks_in) {
      detail::require<out_of_range>(b < blocks(), "block_index::tokens: expected blocks < ",
                                    blocks(), ", got ", b);
    }
    for (std::size_t b : blocks_in) {
      const auto r = tokens_of(b);
      for (std::size_t t = r.first; t < r.last; ++t) {
        if (pred(static_cast<id_t>(t))) out.push_back(static_cast<id_t>(t));
      }
    }
  }

 private:
  enum class coverage { none, some, all };

  template <Predicate P>
  [[nodiscard]] coverage passing(std::size_t b, const P& pred) const {
    if constexpr (std::is_same_v<P, no_filter>) {
      return coverage::all;
    } else {
      const std::size_t first = b * block_size_, last = first + std::min(block_size_, n_ - first);
      std::size_t pass = 0;
      for (std::size_t t = first; t < last; ++t) pass += pred(static_cast<id_t>(t)) ? 1 : 0;
      return pass == 0 ? coverage::none : (pass == last - first ? coverage::all : coverage::some);
    }
  }

  static void emit(const std::vector<scored_id>& best, block_result& out) {
    out.blocks.resize(best.size());
    out.scores.resize(best.size());
    for (std::size_t i = 0; i < best.size(); ++i) {
      out.blocks[i] = best[i].id;
      out.scores[i] = from_key<inner_product>(best[i].key);
    }
    out.stats.count = best.size();
  }

  R rep_{};
  std::size_t n_ = 0;
  std::size_t dim_ = 0;
  std::size_t block_size_ = 0;
};

}  // namespace kvsift
