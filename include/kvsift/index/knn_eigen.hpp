#pragma once
// The CPU kNN engine over Eigen's GEMM: the same blocking and top-k as `cpu_knn_engine`
// (<kvsift/index/knn.hpp>), with the block product done by Eigen. kvsift's default engine
// does not need Eigen; this one is kept as the peer its GEMM is measured against
// (bench/index/knn_bench.cpp) and for users who prefer Eigen's kernels. Including it needs
// Eigen 3.4 (`Eigen3::Eigen`); it is not part of <kvsift/kvsift.hpp>.

#include <Eigen/Core>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "kvsift/core/detail/simd_kernels.hpp"
#include "kvsift/core/element.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/index/detail/blocked_knn.hpp"
#include "kvsift/index/knn.hpp"
#include "kvsift/index/knn_engine.hpp"
#include "kvsift/index/knn_result.hpp"

namespace kvsift {

/// `cpu_knn_engine` with Eigen's GEMM as the block product. Same parameters, contract, errors
/// and thread safety; scores may differ from `cpu_knn_engine`'s in the last bits (Eigen sums
/// the dimensions in a blocking-dependent order), so near-ties may rank differently.
class eigen_knn_engine {
 public:
  eigen_knn_engine() = default;
  explicit eigen_knn_engine(cpu_knn_params p) : params_(p) {}

  [[nodiscard]] const cpu_knn_params& params() const noexcept { return params_; }

  /// As `cpu_knn_engine::search`.
  template <Element T>
  [[nodiscard]] knn_result search(matrix_view<const float> queries, matrix_view<const T> keys,
                                  std::size_t k) const {
    using row_mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    using cmap = Eigen::Map<const row_mat, 0, Eigen::OuterStride<>>;
    using smap = Eigen::Map<row_mat, 0, Eigen::OuterStride<>>;
    const auto d = static_cast<Eigen::Index>(keys.cols());
    return detail::blocked_knn(
        queries, keys, k, params_.query_block, params_.key_block, params_.threads,
        cpu_knn_max_block_floats, [&](matrix_view<const float> qblock) {
          return [&keys, d, qblock, widened = std::vector<float>()](
                     std::size_t k0, std::size_t kn, float* scores, std::size_t ldc) mutable {
            const float* kptr;
            std::size_t kstride;
            if constexpr (std::is_same_v<T, float>) {
              kptr = keys.row(k0);
              kstride = keys.stride();
            } else {
              widened.resize(kn * keys.cols());
              for (std::size_t r = 0; r < kn; ++r) {
                detail::widen(keys.row(k0 + r), &widened[r * keys.cols()], keys.cols());
              }
              kptr = widened.data();
              kstride = keys.cols();
            }
            const cmap qmat(qblock.data(), static_cast<Eigen::Index>(qblock.rows()), d,
                            Eigen::OuterStride<>(static_cast<Eigen::Index>(qblock.stride())));
            const cmap kmat(kptr, static_cast<Eigen::Index>(kn), d,
                            Eigen::OuterStride<>(static_cast<Eigen::Index>(kstride)));
            smap s(scores, static_cast<Eigen::Index>(qblock.rows()), static_cast<Eigen::Index>(kn),
                   Eigen::OuterStride<>(static_cast<Eigen::Index>(ldc)));
            s.noalias() = qmat * kmat.transpose();
          };
        });
  }

 private:
  cpu_knn_params params_{};
};

static_assert(KnnEngine<eigen_knn_engine>);

}  // namespace kvsift
