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
#include "kvsift_bench/measure.hpp"

namespace kvsift_bench {

template <class M>
struct insert_run {
  kvsift::insertable_graph<float, M> graph;
  std::size_t base_keys = 0, base_train = 0, inserted = 0;
  double build_seconds = 0;
  timing_summary insert;          ///< insert time per key, one thread
  std::size_t queries_added = 0;  ///< add_queries calls (--insert-query-stride)
  double query_mean_us = 0;       ///< time per added query, one thread
};

/// The keys a run of `fraction` builds on: the first (1 - fraction) of n, at least one and at
/// least one key fewer than n. The peers' insert runs start from the same prefix.
inline std::size_t insert_base_keys(std::size_t n, double fraction) {
  const auto base = std::clamp<std::size_t>(
      static_cast<std::size_t>((1.0 - fraction) * static_cast<double>(n)), 1, n);
  return std::min(base, n - 1);
}

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
  const std::size_t n = keys.rows();
  insert_run<M> r;
  r.base_keys = insert_base_keys(n, fraction);
  const auto first_rows = static_cast<std::size_t>((1.0 - fraction) * double(train.rows()));
  r.base_train =
      std::clamp<std::size_t>(positional_train ? r.base_keys : first_rows, 1, train.rows());
  r.inserted = n - r.base_keys;
  const auto t0 = clock_type::now();
  r.graph =
      kvsift::build_insertable(kvsift::roargraph_builder<M>(build), keys.row_range(0, r.base_keys),
                               train.row_range(0, r.base_train), params);
  r.build_seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  timing per_key;
  per_key.us.reserve(r.inserted);
  double query_us = 0;
  for (std::size_t i = r.base_keys; i < n; ++i) {
    const auto t = clock_type::now();
    r.graph.insert(keys.row_range(i, 1));
    per_key.add(t);
    if (positional_train && query_stride > 0 && (i - r.base_keys) % query_stride == 0 &&
        i < train.rows()) {
      const auto tq = clock_type::now();
      r.graph.add_queries(train.row_range(i, 1));
      query_us += std::chrono::duration<double, std::micro>(clock_type::now() - tq).count();
      ++r.queries_added;
    }
  }
  if (r.queries_added > 0) r.query_mean_us = query_us / static_cast<double>(r.queries_added);
  r.insert = per_key.summary();
  return r;
}

}  // namespace kvsift_bench
