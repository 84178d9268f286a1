#pragma once
// The `KnnEngine` concept: step 1 of the RoarGraph build (and the training-time oracle) as a
// policy point. Kept apart from the CPU engines (<kvsift/index/knn.hpp>, and the Eigen-backed
// <kvsift/index/knn_eigen.hpp>) so that a GPU engine and its .cu translation units can model it
// without compiling any CPU engine.

#include <concepts>
#include <cstddef>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/element.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/index/knn_result.hpp"

namespace kvsift {

/// Exact query -> key top-k by inner product. Engines receive f32 queries and keys of any
/// element type and return best-first rows (ties: lower id wins), padded when k > n.
template <class E>
concept KnnEngine = requires(const E& e, matrix_view<const float> q, matrix_view<const float> kf,
                             matrix_view<const half> kh, std::size_t k) {
  { e.search(q, kf, k) } -> std::same_as<knn_result>;
  { e.search(q, kh, k) } -> std::same_as<knn_result>;
};

namespace detail {
/// The argument checks every `KnnEngine` makes before any work (CPU and CUDA engines alike).
inline void validate_knn(matrix_view<const float> q, std::size_t n, std::size_t d, std::size_t k) {
  detail::require(k > 0, "knn: k must be > 0, got 0");
  detail::require(n > 0, "knn: expected a non-empty key set, got 0 keys");
  require_indexable(n, "knn: keys");
  require_vector_dim(n, d, "knn: keys");
  detail::require(q.rows() > 0, "knn: expected at least one query, got 0");
  require_dim(d, q.cols(), "knn: query dimension vs key dimension");
  (void)checked_mul(q.rows(), k, "knn: queries x k");
}
}  // namespace detail

}  // namespace kvsift
