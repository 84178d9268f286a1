#pragma once
// Recall@k of a graph's beam search against exact answers, shared by the measurement tools in
// bench/tools/ (their plain mains report it next to build figures).
#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include <kvsift/core/matrix_view.hpp>
#include <kvsift/index/knn_result.hpp>
#include <kvsift/search/beam_search.hpp>

namespace kvsift_tools {

/// Fraction of the exact top-k (the first k of each row of `exact`) that a beam search of pool
/// L over `g` returns, over all evaluation queries. One thread, O(queries * search).
template <class G>
double recall_at(const G& g, kvsift::matrix_view<const float> eval, const kvsift::knn_result& exact,
                 std::size_t k, std::size_t L) {
  std::size_t hit = 0;
  kvsift::search_workspace ws;
  std::vector<kvsift::id_t> ids(k);
  std::vector<float> scores(k);
  for (std::size_t i = 0; i < eval.rows(); ++i) {
    const auto r = kvsift::beam_search(g, std::span<const float>(eval.row(i), eval.cols()), {k, L},
                                       ws, std::span<kvsift::id_t>(ids), std::span<float>(scores));
    const auto want = exact.row_ids(i).first(k);
    for (std::size_t j = 0; j < r.count; ++j) {
      hit += std::find(want.begin(), want.end(), ids[j]) != want.end();
    }
  }
  return double(hit) / double(eval.rows() * k);
}

}  // namespace kvsift_tools
