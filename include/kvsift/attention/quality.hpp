#pragma once
// Attention-quality metrics of a sparse selection against full attention: the share of the
// softmax mass the selection recovers and the relative L2 error of its output. These are the
// figures of the AlayaDB / RetrievalAttention evaluations; kvsift-bench, the planner benchmark
// and the examples all report them through this one definition.
//
// The attended set of retrieval-based sparse attention is a static window (the first
// `initial` and the last `recent` tokens of the context, always on the GPU) plus the retrieved
// tokens. `attended_tokens` builds that union without double counting, so "tokens attended"
// means the same in every report.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "kvsift/attention/partial_state.hpp"
#include "kvsift/attention/sparse_attention.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"

namespace kvsift {

/// The static window: the first `initial` tokens (attention sinks) and the last `recent` ones.
/// Defaults are the 128 + 512 of RetrievalAttention / AlayaDB.
struct static_window {
  std::size_t initial = 128;
  std::size_t recent = 512;
};

/// Quality of an approximate attention state against the full one.
struct attention_quality {
  /// exp(lse_approx - lse_full): the share of the full softmax mass on the attended tokens,
  /// in [0, 1] up to rounding when the attended set is a subset of the context.
  double recovery = 0.0;
  /// ||o_approx - o_full||_2 / ||o_full||_2 (the absolute error when o_full is zero).
  double rel_l2_error = 0.0;
};

/// Compares an approximate state with the full-attention state of the same query.
/// Complexity O(dim), no allocation. Thread safety: reads only.
/// @throw dimension_mismatch if the dims differ.
/// @throw invalid_argument if `full` is empty (no token: nothing to compare against).
[[nodiscard]] inline attention_quality compare_states(partial_state_view full,
                                                      partial_state_view approx) {
  detail::require<dimension_mismatch>(full.dim() == approx.dim(),
                                      "compare_states: expected approx dim ", full.dim(), ", got ",
                                      approx.dim());
  detail::require(!full.is_empty(), "compare_states: expected a non-empty full state");
  double err = 0.0;
  double norm = 0.0;
  for (std::size_t j = 0; j < full.dim(); ++j) {
    const double diff = static_cast<double>(approx.o[j]) - full.o[j];
    err += diff * diff;
    norm += static_cast<double>(full.o[j]) * full.o[j];
  }
  attention_quality r;
  // An empty approximation recovers nothing and its output is 0 (error 1 relative to o_full).
  r.recovery = approx.is_empty()
                   ? 0.0
                   : std::exp(static_cast<double>(approx.lse) - static_cast<double>(full.lse));
  r.rel_l2_error = norm > 0.0 ? std::sqrt(err / norm) : std::sqrt(err);
  return r;
}

/// The tokens attended for a context of `context` tokens: the static window plus `retrieved`,
/// sorted ascending and without duplicates (a retrieved id inside the window counts once).
/// Complexity O(w + r log r) for a window of w tokens and r retrieved ids.
/// @throw out_of_range if a retrieved id is >= context (names the first one).
[[nodiscard]] inline std::vector<id_t> attended_tokens(std::size_t context,
                                                       std::span<const id_t> retrieved,
                                                       static_window window = {}) {
  for (std::size_t i = 0; i < retrieved.size(); ++i) {
    detail::require<out_of_range>(retrieved[i] < context, "attended_tokens: retrieved[", i,
                                  "] = ", retrieved[i], " is not below the context length ",
                                  context);
  }
  const std::size_t head = std::min(window.initial, context);
  const std::size_t tail_begin = context - std::min(window.recent, context);
  std::vector<id_t> ids;
  ids.reserve(head + (context - tail_begin) + retrieved.size());
  for (std::size_t t = 0; t < head; ++t) ids.push_back(static_cast<id_t>(t));
  for (std::size_t t = std::max(head, tail_begin); t < context; ++t) {
    ids.push_back(static_cast<id_t>(t));
  }
  ids.insert(ids.end(), retrieved.begin(), retrieved.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

/// Quality of attending `attended` (e.g. from attended_tokens) instead of the whole context
/// [0, context) of KV head `kv_head`, for query `q`.
/// Complexity O((context + attended.size()) * head_dim). Thread safety: reads only.
/// `scale` is the logit scale (0: 1 / sqrt(head_dim)), as attention_params::scale.
/// @throw out_of_range if context > kv.tokens() or an attended id is >= context.
/// @throw everything dense_attention / sparse_attention throw (shapes, head, non-finite q),
///        before any work is done.
template <KvSource S>
[[nodiscard]] attention_quality selection_quality(std::span<const float> q, std::size_t kv_head,
                                                  std::size_t context,
                                                  std::span<const id_t> attended, const S& kv,
                                                  float scale = 0.0f) {
  detail::require<out_of_range>(context <= kv.tokens(), "selection_quality: context ", context,
                                " exceeds the ", kv.tokens(), " tokens of the K/V source");
  for (std::size_t i = 0; i < attended.size(); ++i) {
    detail::require<out_of_range>(attended[i] < context, "selection_quality: attended[", i,
                                  "] = ", attended[i], " is not below the context length ",
                                  context);
  }
  const attention_params params{.scale = scale};
  const auto full = dense_attention(q, kv_head, 0, context, kv, params);
  const auto approx = sparse_attention(q, kv_head, attended, kv, params);
  return compare_states(full, approx);
}

}  // namespace kvsift
