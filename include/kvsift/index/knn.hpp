#pragma once
// Exact maximum-inner-product kNN on the CPU: a packed GEMM per (query block x key block)
// followed by a per-row bounded top-k merge. This is step 1 of the RoarGraph build and the
// training-time oracle; a CUDA engine models the same `KnnEngine` concept
// (<kvsift/index/knn_engine.hpp>). The GEMM is kvsift's own (index/detail/knn_gemm.hpp), so
// this header needs no linear-algebra library; <kvsift/index/knn_eigen.hpp> has the same
// engine over Eigen's GEMM, as a peer to measure against (bench/index/knn_bench.cpp).

#include <cstddef>
#include <vector>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/element.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/index/detail/blocked_knn.hpp"
#include "kvsift/index/detail/knn_gemm.hpp"
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

/// Largest score block (floats) one CPU kNN thread allocates: 256 MiB. Without the cap a
/// key_block of SIZE_MAX clamped to the keys allocated query_block x n floats.
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
    const std::size_t d = keys.cols();
    return detail::blocked_knn(
        queries, keys, k, params_.query_block, params_.key_block, params_.threads,
        cpu_knn_max_block_floats, [&](matrix_view<const float> qblock) {
          // Per query block and thread: the queries packed once, the key block packed per
          // key block (one O(kn * d) pass per O(qn * kn * d) product).
          std::vector<float> apack(detail::packed_floats(qblock.rows(), detail::gemm_mr, d));
          detail::pack_panels(qblock.data(), qblock.rows(), d, qblock.stride(), detail::gemm_mr,
                              apack.data());
          return [&keys, d, qn = qblock.rows(), apack = std::move(apack),
                  bpack = std::vector<float>()](std::size_t k0, std::size_t kn, float* scores,
                                                std::size_t ldc) mutable {
            bpack.resize(detail::packed_floats(kn, detail::gemm_nr, d));
            detail::pack_panels(keys.row(k0), kn, d, keys.stride(), detail::gemm_nr, bpack.data());
            detail::gemm_packed(apack.data(), qn, bpack.data(), kn, d, scores, ldc);
          };
        });
  }

 private:
  cpu_knn_params params_{};
};

static_assert(KnnEngine<cpu_knn_engine>);

}  // namespace kvsift
