#pragma once
// The exact oracle of the index quality tests: top-k by inner product in double precision.

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "kvsift/core/ids.hpp"
#include "kvsift/core/matrix_view.hpp"

namespace kvsift_test {

/// Ids of each query's k highest inner products (ties to the lower id), computed in double.
/// O(queries * keys * d).
inline std::vector<std::vector<kvsift::id_t>> exact_topk(kvsift::matrix_view<const float> keys,
                                                         kvsift::matrix_view<const float> queries,
                                                         std::size_t k) {
  std::vector<std::vector<kvsift::id_t>> out(queries.rows());
  std::vector<std::pair<double, kvsift::id_t>> s(keys.rows());
  for (std::size_t i = 0; i < queries.rows(); ++i) {
    for (std::size_t j = 0; j < keys.rows(); ++j) {
      double dot = 0;
      for (std::size_t c = 0; c < keys.cols(); ++c) {
        dot += static_cast<double>(queries.row(i)[c]) * keys.row(j)[c];
      }
      s[j] = {-dot, static_cast<kvsift::id_t>(j)};
    }
    std::partial_sort(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(k), s.end());
    for (std::size_t j = 0; j < k; ++j) out[i].push_back(s[j].second);
  }
  return out;
}

}  // namespace kvsift_test
