#pragma once
// GQA-shared index building. Under grouped-query attention several query heads read one KV
// head; building one index per KV head from queries of every head in the group costs one
// build instead of `group` builds, and covers what each head will ask for. Each head
// contributes a sampled fraction of its prefill queries.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvsift/core/dense_matrix.hpp"
#include "kvsift/core/detail/mt19937_64.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/matrix_view.hpp"

namespace kvsift {

/// Samples round(ratio * rows) queries (at least 1) from each head's query matrix without
/// replacement, keeping each head's rows in their original order, and stacks them head by
/// head. Deterministic for a seed on every platform (selection sampling on mt19937_64).
/// O(total rows * dim). Thread safety: pure function.
/// @throw invalid_argument if no heads are given, a head has no queries, ratio is not in
///        (0, 1]; dimension_mismatch if heads differ in dimension.
inline dense_matrix<float> sample_gqa_queries(std::span<const matrix_view<const float>> heads,
                                              double ratio, std::uint64_t seed = 7) {
  detail::require(!heads.empty(), "sample_gqa_queries: expected at least one query head, got 0");
  detail::require(ratio > 0.0 && ratio <= 1.0, "sample_gqa_queries: expected ratio in (0, 1], got ",
                  ratio);
  const std::size_t d = heads[0].cols();
  std::size_t total = 0;
  for (std::size_t h = 0; h < heads.size(); ++h) {
    require_dim(d, heads[h].cols(), "sample_gqa_queries: query head dimension");
    detail::require(heads[h].rows() > 0, "sample_gqa_queries: head ", h,
                    " has no queries, expected at least 1");
    total += std::max<std::size_t>(
        1, static_cast<std::size_t>(std::llround(ratio * static_cast<double>(heads[h].rows()))));
  }
  dense_matrix<float> out(total, d);
  detail::mt19937_64 rng(seed);
  std::size_t next = 0;
  for (const auto& head : heads) {
    const std::size_t m = head.rows();
    std::size_t want = std::max<std::size_t>(
        1, static_cast<std::size_t>(std::llround(ratio * static_cast<double>(m))));
    // Knuth's algorithm S: row i is taken with probability want / (m - i).
    for (std::size_t i = 0; i < m && want > 0; ++i) {
      const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
      if (u * static_cast<double>(m - i) < static_cast<double>(want)) {
        std::copy_n(head.row(i), d, out.row(next++));
        --want;
      }
    }
  }
  return out;
}

}  // namespace kvsift
