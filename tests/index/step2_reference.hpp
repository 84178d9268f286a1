#pragma once
// Step 2 of a RoarGraph build (the projection) written out plainly on the host: the reference
// that the CPU builder's engine hook (tests/index/roargraph_builder_test.cpp) and the device
// projection (tests/cuda/graph_search_test.cu) are both checked against.

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "kvsift/core/ids.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/core/metric.hpp"
#include "kvsift/core/topk.hpp"
#include "kvsift/core/vector_store.hpp"
#include "kvsift/index/rng_prune.hpp"

namespace kvsift_test {

/// What the reference saw: the longest pivot's candidate set, and how many rows overflowed the
/// degree after the reverse edges and were pruned again. Lets a test show that its data reaches
/// the paths it means to check.
struct step2_stats {
  std::size_t longest = 0;
  std::size_t repruned = 0;
};

/// Step 2 over training lists of `k` ids each (`ids`: row-major, each list's pivot first, the
/// tail padded with invalid_id): each pivot's candidates (the other ids of its lists, distinct,
/// without itself) ranked by l2 around it and RNG-pruned with fill to `degree`; then each row
/// gets the pivots that kept it and it does not hold, pivots ascending; a row longer than
/// `degree` is pruned again around its key. Returns the rows. O(lists k + n degree^2 d).
inline std::vector<std::vector<kvsift::id_t>> project_on_host(kvsift::matrix_view<const float> keys,
                                                              std::span<const kvsift::id_t> ids,
                                                              std::size_t k, std::size_t degree,
                                                              step2_stats* stats = nullptr) {
  using kvsift::id_t;
  const kvsift::view_store<float> store(keys);
  const std::size_t n = keys.rows();
  std::vector<float> scratch;
  auto prune = [&](std::size_t x, const std::vector<id_t>& c) {
    kvsift::detail::pair_scorer<kvsift::view_store<float>, kvsift::l2> ps(store);
    ps.set_pivot(static_cast<id_t>(x));
    std::vector<kvsift::scored_id> cands;
    for (const id_t y : c) cands.push_back({ps.key(y), y});
    std::vector<id_t> kept;
    kvsift::detail::rng_prune<kvsift::view_store<float>, kvsift::l2>(store, cands, degree, true,
                                                                     scratch, kept);
    return kept;
  };
  step2_stats seen;
  std::vector<std::vector<id_t>> pooled(n), fwd(n), rows(n);
  for (std::size_t q = 0; q * k < ids.size(); ++q) {
    for (std::size_t j = 1; j < k && ids[q * k + j] != kvsift::invalid_id; ++j) {
      pooled[ids[q * k]].push_back(ids[q * k + j]);
    }
  }
  for (std::size_t p = 0; p < n; ++p) {
    auto& c = pooled[p];
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    std::erase(c, static_cast<id_t>(p));
    seen.longest = std::max(seen.longest, c.size());
    if (!c.empty()) fwd[p] = prune(p, c);
  }
  for (std::size_t p = 0; p < n; ++p) rows[p] = fwd[p];
  for (std::size_t p = 0; p < n; ++p) {
    for (const id_t x : fwd[p]) {
      if (std::find(fwd[x].begin(), fwd[x].end(), p) == fwd[x].end()) {
        rows[x].push_back(static_cast<id_t>(p));
      }
    }
  }
  for (std::size_t x = 0; x < n; ++x) {
    if (rows[x].size() > degree) {
      ++seen.repruned;
      rows[x] = prune(x, rows[x]);
    }
  }
  if (stats != nullptr) *stats = seen;
  return rows;
}

}  // namespace kvsift_test
