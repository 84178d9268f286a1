#pragma once
// How a DIPR answer is formed from the scored candidates: shared by the graph search
// (dipr_search) and the exact scan (flat_index::dipr), so both answer the same range query.

#include <algorithm>
#include <cstddef>
#include <limits>
#include <vector>

#include "kvsift/core/metric_concept.hpp"
#include "kvsift/core/topk.hpp"
#include "kvsift/search/search_params.hpp"

namespace kvsift::detail {

/// Keeps list entries within beta of best, sorted best-first, into `out` as raw scores.
template <Metric M>
void emit_dipr(std::vector<scored_id>& list, float best_key, float beta, bool seeded,
               dipr_result& out) {
  const float threshold = best_key - beta;
  if (best_key == -std::numeric_limits<float>::infinity()) list.clear();  // only NaN scores
  std::erase_if(list, [&](const scored_id& s) { return !(s.key >= threshold); });
  std::sort(list.begin(), list.end(), rank_order{});
  out.ids.resize(list.size());
  out.scores.resize(list.size());
  for (std::size_t i = 0; i < list.size(); ++i) {
    out.ids[i] = list[i].id;
    out.scores[i] = from_key<M>(list[i].key);
  }
  out.stats.count = list.size();
  // Only the "nothing scored" key -inf means no best; a key of +inf is a real (infinite) best.
  out.best_score = (best_key == -std::numeric_limits<float>::infinity() && !seeded)
                       ? worst_score<M>()
                       : from_key<M>(best_key);
}

}  // namespace kvsift::detail
