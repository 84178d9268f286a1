#pragma once
// RNG pruning (the relative-neighbourhood rule of HNSW / NSG / RoarGraph) and the pivot-relative
// scorer it uses. Shared by the RoarGraph build (steps 2 and 3), the tests and the CUDA tests,
// which use it as the oracle of the GPU pruning.

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kvsift/core/detail/simd_kernels.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/core/metric.hpp"
#include "kvsift/core/topk.hpp"
#include "kvsift/core/vector_store.hpp"

namespace kvsift::detail {

/// Keys of candidates relative to a pivot, widened once per pivot.
template <VectorStore S, Metric M>
class pair_scorer {
 public:
  explicit pair_scorer(const S& s) : s_(s), buf_(s.dim()) {}
  void set_pivot(id_t p) { widen(s_.row(p), buf_.data(), s_.dim()); }
  /// Rank key of (pivot, x).
  float key(id_t x) const { return to_key<M>(M::score(buf_.data(), s_.row(x), s_.dim())); }

 private:
  const S& s_;
  std::vector<float> buf_;
};

/// RNG pruning around `pivot`: candidates sorted best-first by key to the pivot; keep c unless
/// an already-kept r is closer to c than the pivot is. If fewer than `degree` survive and
/// `fill` is set, pruned candidates are appended in rank order (RoarGraph's fill rule).
template <VectorStore S, Metric M>
void rng_prune(const S& s, std::vector<scored_id>& cands, std::size_t degree, bool fill,
               std::vector<float>& scratch, std::vector<id_t>& kept,
               std::size_t* scored = nullptr) {
  std::sort(cands.begin(), cands.end(), rank_order{});
  kept.clear();
  std::vector<id_t> pruned;
  scratch.resize(s.dim());
  for (const scored_id& c : cands) {
    if (kept.size() >= degree) break;
    widen(s.row(c.id), scratch.data(), s.dim());
    bool keep = true;
    for (id_t r : kept) {
      if (scored != nullptr) ++*scored;
      if (to_key<M>(M::score(scratch.data(), s.row(r), s.dim())) > c.key) {
        keep = false;
        break;
      }
    }
    if (keep) {
      kept.push_back(c.id);
    } else if (fill) {
      pruned.push_back(c.id);
    }
  }
  for (std::size_t i = 0; fill && i < pruned.size() && kept.size() < degree; ++i) {
    kept.push_back(pruned[i]);
  }
}

}  // namespace kvsift::detail
