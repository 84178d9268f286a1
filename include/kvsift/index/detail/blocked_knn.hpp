#pragma once
// The shared body of the CPU kNN engines: query blocks in parallel, key blocks in sequence, a
// block product into a per-thread score block, then a bounded top-k per query row. The engines
// differ only in the block product (kvsift's packed GEMM, or Eigen's in knn_eigen.hpp).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/element.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/core/parallel_for.hpp"
#include "kvsift/core/topk.hpp"
#include "kvsift/index/knn_engine.hpp"
#include "kvsift/index/knn_result.hpp"

namespace kvsift::detail {

/// `make_block(queries_of_block)` returns, per query block and thread, a callable
/// `product(k0, kn, scores, ldc)` that writes scores[i * ldc + j] = <query i, key k0 + j>.
/// `query_block` / `key_block` / `threads` as in cpu_knn_params; `max_block_floats` caps the
/// score block.
template <Element T, class MakeBlock>
[[nodiscard]] knn_result blocked_knn(matrix_view<const float> queries, matrix_view<const T> keys,
                                     std::size_t k, std::size_t query_block, std::size_t key_block,
                                     std::size_t threads, std::size_t max_block_floats,
                                     MakeBlock make_block) {
  validate_knn(queries, keys.rows(), keys.cols(), k);
  const std::size_t m = queries.rows(), n = keys.rows();
  const std::size_t results_per_query = std::min(k, n);
  knn_result out;
  out.rows = m;
  out.k = k;
  out.ids.assign(m * k, invalid_id);  // m * k checked by validate_knn
  out.scores.assign(m * k, -std::numeric_limits<float>::infinity());

  const std::size_t qb = std::clamp<std::size_t>(query_block, 1, m);
  const std::size_t kb = std::clamp<std::size_t>(
      key_block, 1, std::min(n, std::max<std::size_t>(1, max_block_floats / qb)));
  const std::size_t nblocks = checked_ceil_div(m, qb, "knn: query blocks");

  parallel_for(nblocks, threads, [&](std::size_t b, std::size_t) {
    const std::size_t q0 = b * qb, qn = std::min(qb, m - q0);
    auto product = make_block(queries.row_range(q0, qn));
    std::vector<float> scores(qn * kb);  // qn * kb <= max_block_floats
    std::vector<topk_selector> sel(qn, topk_selector(results_per_query));
    for (std::size_t k0 = 0; k0 < n; k0 += kb) {
      const std::size_t kn = std::min(kb, n - k0);
      product(k0, kn, scores.data(), kb);
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

}  // namespace kvsift::detail
