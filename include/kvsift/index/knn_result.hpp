#pragma once
// Result of a batched exact k-nearest-neighbour search: row-major (rows x k) ids and scores.

#include <cstddef>
#include <span>
#include <vector>

#include "kvsift/core/ids.hpp"

namespace kvsift {

/// Row i holds the k best keys of query i, best first (ties: lower id first). When fewer than
/// k keys exist the tail is padded with `invalid_id` and the metric's worst score.
struct knn_result {
  std::size_t rows = 0;
  std::size_t k = 0;
  std::vector<id_t> ids;
  std::vector<float> scores;

  [[nodiscard]] std::span<const id_t> row_ids(std::size_t i) const noexcept {
    return {ids.data() + i * k, k};
  }
  [[nodiscard]] std::span<const float> row_scores(std::size_t i) const noexcept {
    return {scores.data() + i * k, k};
  }
};

}  // namespace kvsift
