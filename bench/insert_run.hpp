#pragma once
// kvsift-bench --insert-fraction F: the index of a prefill of the first (1 - F) of the keys,
// receiving the remaining keys one at a time in position order, as generated tokens during
// decode (insertable_graph). The CLI measures its recall next to the full rebuild of the
// same run.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

#include "kvsift/index/insertable_graph.hpp"
#include "kvsift/index/roargraph_builder.hpp"

namespace kvsift_bench {

template <class M>
struct insert_run {
  kvsift::insertable_graph<float, M> graph;
  std::size_t base_keys = 0, base_train = 0, inserted = 0;
  double build_seconds = 0;
  double mean_us = 0, p50_us = 0, p99_us = 0;  ///< insert time per key, one thread
  std::size_t queries_added = 0;               ///< add_queries calls (--insert-query-stride)
  double query_mean_us = 0;                    ///< time per added query, one thread
};

/// Builds on keys [0, base) from the training queries of those positions, then inserts keys
/// [base, n) one by one, timing each. `positional_train`: training row i is the query of
/// position i (--train-fraction over a per-position dump), so the rows < base are kept;
/// otherwise the first (1 - fraction) of the training rows are. With `query_stride` S > 0
/// (positional only), the training query of every S-th inserted position below train.rows()
/// is added after its key (add_queries, lists by a search of pool 200), timed apart.
template <class M>
insert_run<M> build_then_insert(kvsift::matrix_view<const float> keys,
                                kvsift::matrix_view<const float> train, double fraction,
                                bool positional_train, const kvsift::roargraph_params& build,
                                const kvsift::graph_insert_params& params = {},
                                std::size_t query_stride = 0) {
  using clock = std::chrono::steady_clock;
  const std::size_t n = keys.rows();
  const auto keep = [&](std::size_t rows) {
    return std::clamp<std::size_t>(
        static_cast<std::size_t>((1.0 - fraction) * static_cast<double>(rows)), 1, rows);
  };
  insert_run<M> r;
  r.base_keys = std::min(keep(n), n - 1);
  r.base_train =
      positional_train ? std::clamp<std::size_t>(r.base_keys, 1, train.rows()) : keep(train.rows());
  r.inserted = n - r.base_keys;
  const auto t0 = clock::now();
  r.graph =
      kvsift::build_insertable(kvsift::roargraph_builder<M>(build), keys.row_range(0, r.base_keys),
                               train.row_range(0, r.base_train), params);
  r.build_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  std::vector<double> us;
  us.reserve(r.inserted);
  double query_us = 0;
  for (std::size_t i = r.base_keys; i < n; ++i) {
    const auto t = clock::now();
    r.graph.insert(keys.row_range(i, 1));
    us.push_back(std::chrono::duration<double, std::micro>(clock::now() - t).count());
    if (positional_train && query_stride > 0 && (i - r.base_keys) % query_stride == 0 &&
        i < train.rows()) {
      const auto tq = clock::now();
      r.graph.add_queries(train.row_range(i, 1));
      query_us += std::chrono::duration<double, std::micro>(clock::now() - tq).count();
      ++r.queries_added;
    }
  }
  if (r.queries_added > 0) r.query_mean_us = query_us / static_cast<double>(r.queries_added);
  double total = 0;
  for (const double u : us) total += u;
  r.mean_us = total / static_cast<double>(us.size());
  std::sort(us.begin(), us.end());
  r.p50_us = us[us.size() / 2];
  r.p99_us = us[std::min(us.size() - 1, static_cast<std::size_t>(0.99 * us.size()))];
  return r;
}

}  // namespace kvsift_bench
