#pragma once
// Argument checks every search entry point shares (graph, exact and block searches): part of
// the search vocabulary, so index/ can validate its queries exactly as the graph searches do
// without including them.

#include <cmath>
#include <cstddef>
#include <span>

#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/search/search_params.hpp"

namespace kvsift::detail {

/// @throw dimension_mismatch if the query length differs from the index dimension.
inline void validate_query(std::span<const float> query, std::size_t dim, const char* who) {
  require<dimension_mismatch>(query.size() == dim, who, ": expected query dimension ", dim,
                              ", got ", query.size());
}

/// True if every element of `query` is finite. O(d), once per search at the entry: a query
/// with NaN/Inf scores NaN or +-inf against every key, so its "best" keys would be arbitrary;
/// the searches return no results for it instead (see docs/algorithms.md, NaN and Inf).
[[nodiscard]] inline bool finite_query(std::span<const float> query) noexcept {
  bool ok = true;
  for (const float x : query) ok &= std::isfinite(x);
  return ok;
}

/// @throw out_of_range if an extra entry id is >= n and not invalid_id (padding, skipped).
inline void validate_entries(std::span<const id_t> entries, std::size_t n, const char* who) {
  for (id_t e : entries) {
    // invalid_id is padding (a short previous answer, a routed seed list), skipped by `seed`.
    require<out_of_range>(e < n || e == invalid_id, who, ": expected entry ids < ", n,
                          " (or invalid_id, skipped), got ", e);
  }
}

/// @throw invalid_argument if k == 0, L < k or expand_limit > L (beam_search's parameters,
///        also gqa_beam_search's per head).
inline void validate_beam(const beam_search_params& p, const char* who) {
  require(p.k > 0, who, ": k must be > 0, got 0");
  require(p.L >= p.k, who, ": expected L >= k = ", p.k, ", got L = ", p.L);
  require(p.expand_limit <= p.L, who, ": expected expand_limit <= L = ", p.L, " (0 = L), got ",
          p.expand_limit);
}

/// @throw invalid_argument for beta < 0 or non-finite, l0 == 0, max_candidates < l0 (unless 0),
///        an infinite seed_score.
inline void validate_dipr(const dipr_params& p, const char* who) {
  require(std::isfinite(p.beta) && p.beta >= 0.0f, who, ": expected finite beta >= 0, got ",
          p.beta);
  require(p.l0 > 0, who, ": l0 must be > 0, got 0");
  require(p.max_candidates == 0 || p.max_candidates >= p.l0, who,
          ": expected max_candidates >= l0 = ", p.l0, " (or 0 for auto), got ", p.max_candidates);
  require(!std::isinf(p.seed_score), who, ": expected a finite seed_score or NaN, got ",
          p.seed_score);
}

}  // namespace kvsift::detail
