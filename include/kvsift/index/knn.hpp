#pragma once
// Exact maximum-inner-product kNN on the CPU: blocked GEMM with Eigen (query block x key
// block) followed by a per-row bounded top-k merge. This is step 1 of the RoarGraph build and
// the training-time oracle; a CUDA engine models the same `KnnEngine` concept
// (<kvsift/index/knn_engine.hpp>, which does not include Eigen).

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <vector>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/detail/simd_kernels.hpp"
#include "kvsift/core/element.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/core/parallel_for.hpp"
#include "kvsift/core/topk.hpp"
#include "kvsift/index/knn_engine.hpp"
#include "kvsift/index/knn_result.hpp"

namespace kvsift {

/// Tuning of the CPU engine. Defaults suit d in [64, 256] on a few-MB L2 cache. Block sizes
/// are clamped, never rejected: 0 counts as 1, a block beyond the queries / keys is the whole
/// set, and the per-thread score block (query_block x key_block floats) is capped at
/// `cpu_knn_max_block_floats` by shrinking key_block. Results do not depend on them.
struct cpu_knn_params {
  std::size_t threads = 0;        ///< 0 = hardware concurrency
  std::size_t query_block = 256;  ///< queries per GEMM block
  std::size_t key_block = 2048;   ///< keys per GEMM block
};

/// Largest score block (floats) one CPU kNN thread allocates: 256 MiB. A key_block of SIZE_MAX
/// used to reach Eigen as a negative size; clamped to the keys it still allocated
/// query_block x n floats.
inline constexpr std::size_t cpu_knn_max_block_floats = std::size_t{1} << 26;

/// CPU exact kNN engine. Thread safety: `search` is const and safe to call concurrently
/// (each call uses its own threads and buffers).
class cpu_knn_engine {
 public:
  cpu_knn_engine() = default;
  explicit cpu_knn_engine(cpu_knn_params p) : params_(p) {}

  [[nodiscard]] const cpu_knn_params& params() const noexcept { return params_; }

  /// k best keys per query by inner product. O(m * n * d) flops + O(m * n log k) selection.
  /// NaN products rank last.
  /// @throw invalid_argument if k == 0, there are no keys or no queries, keys have dimension
  ///        0, or queries x k overflows size_t; out_of_range for more than max_index_size
  ///        keys (ids are 32-bit); dimension_mismatch if query and key dims differ.
  template <Element T>
  [[nodiscard]] knn_result search(matrix_view<const float> queries, matrix_view<const T> keys,
                                  std::size_t k) const {
    detail::validate_knn(queries, keys.rows(), keys.cols(), k);
    const std::size_t m = queries.rows(), n = keys.rows(), d = keys.cols();
    const std::size_t results_per_query = std::min(k, n);
    knn_result out;
    out.rows = m;
    out.k = k;
    out.ids.assign(m * k, invalid_id);  // m * k checked by validate_knn
    out.scores.assign(m * k, -std::numeric_limits<float>::infinity());

    using row_mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    using cmap = Eigen::Map<const row_mat, 0, Eigen::OuterStride<>>;
    const std::size_t qb = std::clamp<std::size_t>(params_.query_block, 1, m);
    const std::size_t kb = std::clamp<std::size_t>(
        params_.key_block, 1, std::min(n, std::max<std::size_t>(1, cpu_knn_max_block_floats / qb)));
    const std::size_t nblocks = checked_ceil_div(m, qb, "knn: query blocks");

    parallel_for(nblocks, params_.threads, [&](std::size_t b, std::size_t) {
      const std::size_t q0 = b * qb, qn = std::min(qb, m - q0);
      cmap qmat(queries.row(q0), static_cast<Eigen::Index>(qn), static_cast<Eigen::Index>(d),
                Eigen::OuterStride<>(static_cast<Eigen::Index>(queries.stride())));
      row_mat scores(static_cast<Eigen::Index>(qn), static_cast<Eigen::Index>(kb));
      std::vector<float> widened;  // only for 16-bit keys
      std::vector<topk_selector> sel(qn, topk_selector(results_per_query));
      for (std::size_t k0 = 0; k0 < n; k0 += kb) {
        const std::size_t kn = std::min(kb, n - k0);
        const float* kptr;
        std::size_t kstride;
        if constexpr (std::is_same_v<T, float>) {
          kptr = keys.row(k0);
          kstride = keys.stride();
        } else {
          widened.resize(kn * d);
          for (std::size_t r = 0; r < kn; ++r) detail::widen(keys.row(k0 + r), &widened[r * d], d);
          kptr = widened.data();
          kstride = d;
        }
        cmap kmat(kptr, static_cast<Eigen::Index>(kn), static_cast<Eigen::Index>(d),
                  Eigen::OuterStride<>(static_cast<Eigen::Index>(kstride)));
        auto s = scores.leftCols(static_cast<Eigen::Index>(kn));
        s.noalias() = qmat * kmat.transpose();
        for (std::size_t i = 0; i < qn; ++i) {
          const float* srow = scores.data() + i * kb;
          topk_selector& t = sel[i];
          for (std::size_t j = 0; j < kn; ++j) {
            const float v = std::isnan(srow[j]) ? -std::numeric_limits<float>::infinity() : srow[j];
            const auto id = static_cast<id_t>(k0 + j);
            if (t.accepts(v, id)) t.push(v, id);
          }
        }
      }
      for (std::size_t i = 0; i < qn; ++i) {
        const auto& best = sel[i].sorted();
        for (std::size_t j = 0; j < best.size(); ++j) {
          out.ids[(q0 + i) * k + j] = best[j].id;
          out.scores[(q0 + i) * k + j] = best[j].key;
        }
      }
    });
    return out;
  }

 private:
  cpu_knn_params params_{};
};

static_assert(KnnEngine<cpu_knn_engine>);

}  // namespace kvsift
