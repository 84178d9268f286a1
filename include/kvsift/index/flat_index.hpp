#pragma once
// Exhaustive scan: exact top-k and exact DIPR. The oracle every recall figure is measured
// against, and the right index for layer 0 and short contexts, where attention is too
// diffuse for a graph to help.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/core/metric.hpp"
#include "kvsift/core/parallel_for.hpp"
#include "kvsift/core/vector_store.hpp"
#include "kvsift/index/knn_result.hpp"
#include "kvsift/search/detail/dipr_answer.hpp"
#include "kvsift/search/vocabulary.hpp"

namespace kvsift {

/// Exact index over a store. Thread safety: const members safe concurrently (one workspace
/// per thread).
template <VectorStore Store, Metric M = inner_product>
class flat_index {
 public:
  using store_type = Store;
  using metric_type = M;

  flat_index() = default;
  /// O(1). @throw out_of_range for more than max_index_size vectors (positions become 32-bit
  /// ids; a larger store would alias invalid_id); invalid_argument for vectors of dimension 0.
  explicit flat_index(Store store) : store_(std::move(store)) {
    require_indexable(store_.size(), "flat_index");
    require_vector_dim(store_.size(), store_.dim(), "flat_index");
  }

  [[nodiscard]] const Store& store() const noexcept { return store_; }
  [[nodiscard]] std::size_t size() const noexcept { return store_.size(); }
  [[nodiscard]] std::size_t dim() const noexcept { return store_.dim(); }

  /// Exact k best (ties: lower id first) among ids passing `pred`, padded with invalid_id and
  /// the worst score when fewer exist. O(n * d + n log k). NaN scores rank last; a query
  /// holding NaN or Inf returns no results (count 0, all padding).
  /// @throw invalid_argument if k == 0 or outputs shorter than k; dimension_mismatch for a
  ///        wrong query length; out_of_range for a predicate beyond the index.
  template <Predicate P = no_filter>
  search_stats topk(std::span<const float> query, std::size_t k, search_workspace& ws,
                    std::span<id_t> out_ids, std::span<float> out_scores,
                    const P& pred = {}) const {
    detail::require(k > 0, "flat_index::topk: k must be > 0, got 0");
    detail::require(out_ids.size() >= k && out_scores.size() >= k,
                    "flat_index::topk: expected outputs of at least k = ", k, " entries, got ",
                    out_ids.size(), " ids and ", out_scores.size(), " scores");
    detail::validate_query(query, dim(), "flat_index::topk");
    validate_predicate(pred, size());
    search_stats stats;
    // The selector never holds more than n entries: a larger k reserves nothing more.
    ws.topk.reset(std::min(k, size()));
    const std::size_t n = detail::finite_query(query) ? size() : 0;
    for (std::size_t i = 0; i < n; ++i) {
      const auto id = static_cast<id_t>(i);
      if (!pred(id)) continue;
      ++stats.distance_computations;
      const float key = to_key<M>(M::score(query.data(), store_.row(i), dim()));
      if (ws.topk.accepts(key, id)) ws.topk.push(key, id);
    }
    const auto& best = ws.topk.sorted();
    stats.count = best.size();
    for (std::size_t j = 0; j < k; ++j) {
      out_ids[j] = j < best.size() ? best[j].id : invalid_id;
      out_scores[j] = j < best.size() ? from_key<M>(best[j].key) : worst_score<M>();
    }
    return stats;
  }

  /// Exact DIPR: every passing id with score within beta of the best passing score (or of
  /// params.seed_score when better). l0 / max_candidates are ignored (nothing to explore).
  /// A query holding NaN or Inf gives an empty answer (as dipr_search).
  /// O(n * d + r log r). @throw as dipr_search.
  template <Predicate P = no_filter>
  void dipr(std::span<const float> query, const dipr_params& params, search_workspace& ws,
            dipr_result& out, const P& pred = {}) const {
    detail::validate_dipr(params, "flat_index::dipr");
    detail::validate_query(query, dim(), "flat_index::dipr");
    validate_predicate(pred, size());
    out.stats = {};
    out.capped = false;
    const bool seeded = !std::isnan(params.seed_score);
    float best = seeded ? to_key<M>(params.seed_score) : -std::numeric_limits<float>::infinity();
    auto& list = ws.list;
    list.clear();
    const std::size_t n = detail::finite_query(query) ? size() : 0;
    for (std::size_t i = 0; i < n; ++i) {
      const auto id = static_cast<id_t>(i);
      if (!pred(id)) continue;
      ++out.stats.distance_computations;
      const float key = to_key<M>(M::score(query.data(), store_.row(i), dim()));
      best = std::max(best, key);
      // Keys already outside the range of the best so far can never re-enter it.
      if (key >= best - params.beta) list.push_back({key, id});
    }
    detail::emit_dipr<M>(list, best, params.beta, seeded, out);
  }

 private:
  Store store_{};
};

/// Exact top-k for a batch of queries (row-major), multithreaded over queries: the oracle for
/// recall; with a predicate, among passing ids only. O(m * n * d). Thread safety: const, safe
/// concurrently.
/// @throw as flat_index::topk, plus dimension_mismatch for query rows of the wrong length.
template <VectorStore Store, Metric M, Predicate P = no_filter>
knn_result exact_topk(const flat_index<Store, M>& index, matrix_view<const float> queries,
                      std::size_t k, std::size_t threads = 0, const P& pred = {}) {
  detail::require(k > 0, "exact_topk: k must be > 0, got 0");
  require_dim(index.dim(), queries.cols(), "exact_topk: query dimension");
  validate_predicate(pred, index.size());
  const std::size_t total = checked_mul(queries.rows(), k, "exact_topk: queries x k");
  knn_result out;
  out.rows = queries.rows();
  out.k = k;
  out.ids.resize(total);
  out.scores.resize(total);
  std::vector<search_workspace> ws(threads == 0 ? default_thread_count() : threads);
  parallel_for(queries.rows(), ws.size(), [&](std::size_t i, std::size_t t) {
    index.topk(queries.row_span(i), k, ws[t], std::span<id_t>(out.ids).subspan(i * k, k),
               std::span<float>(out.scores).subspan(i * k, k), pred);
  });
  return out;
}

/// Exact DIPR for a batch of queries (among ids passing `pred`), multithreaded. O(m * n * d).
template <VectorStore Store, Metric M, Predicate P = no_filter>
std::vector<dipr_result> exact_dipr(const flat_index<Store, M>& index,
                                    matrix_view<const float> queries, const dipr_params& params,
                                    std::size_t threads = 0, const P& pred = {}) {
  require_dim(index.dim(), queries.cols(), "exact_dipr: query dimension");
  detail::validate_dipr(params, "exact_dipr");
  validate_predicate(pred, index.size());
  std::vector<dipr_result> out(queries.rows());
  std::vector<search_workspace> ws(threads == 0 ? default_thread_count() : threads);
  parallel_for(queries.rows(), ws.size(), [&](std::size_t i, std::size_t t) {
    index.dipr(queries.row_span(i), params, ws[t], out[i], pred);
  });
  return out;
}

}  // namespace kvsift
