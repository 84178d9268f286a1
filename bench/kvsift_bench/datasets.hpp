#pragma once
// kvsift-bench's workload: keys, training and evaluation queries (and values) read from files
// or generated (--demo), all owned here.

#include <algorithm>
#include <cstddef>
#include <sstream>
#include <string>

#include "kvsift/kvsift.hpp"
#include "kvsift/testing/ood_generator.hpp"
#include "kvsift_bench/options.hpp"

namespace kvsift_bench {

/// Keys, training queries and evaluation queries, all owned here.
struct workload {
  kvsift::dense_matrix<float> keys, train, eval, values;
  std::size_t eval_first = 0;  ///< position (row of --queries) of the first evaluation query
  std::string source;
};

inline kvsift::dense_matrix<float> copy_rows(kvsift::matrix_view<const float> m, std::size_t first,
                                             std::size_t count) {
  return kvsift::convert<float>(m.row_range(first, count));
}

inline workload load(const options& o) {
  workload w;
  if (o.demo) {
    kvsift::testing::ood_params p;
    p.keys = o.n;
    p.dim = o.dim;
    p.norm_spread = o.spread;
    const std::size_t train = std::max<std::size_t>(1, o.n / 10), eval = o.eval ? o.eval : 200;
    p.queries = train + eval;
    const auto d = kvsift::testing::make_ood(p);
    w.keys = copy_rows(d.key_view(), 0, o.n);
    w.train = copy_rows(d.query_view(), 0, train);
    w.eval = copy_rows(d.query_view(), train, eval);
    std::ostringstream src;
    src << "synthetic OOD (key norm spread " << o.spread << ")";
    w.source = src.str();
    return w;
  }
  w.keys = kvsift::read_vectors(o.keys);
  auto q = kvsift::read_vectors(o.queries);
  kvsift::require_dim(w.keys.cols(), q.cols(), "kvsift-bench: --queries dimension vs --keys");
  std::size_t first_eval = 0;
  if (!o.train.empty()) {
    w.train = kvsift::read_vectors(o.train);
    kvsift::require_dim(w.keys.cols(), w.train.cols(), "kvsift-bench: --train dimension vs --keys");
  } else if (o.train_fraction > 0) {
    first_eval = static_cast<std::size_t>(o.train_fraction * static_cast<double>(q.rows()));
    w.train = copy_rows(q.cview(), 0, first_eval);
  }
  const std::size_t eval = std::min(q.rows() - first_eval, o.eval ? o.eval : q.rows());
  // Every table row is a mean over evaluation queries; with none there is nothing to measure
  // (the timing read element 0 of an empty vector before this check).
  if (eval == 0) {
    kvsift::detail::fail("kvsift-bench: no evaluation queries: --queries '", o.queries, "' has ",
                         q.rows(), " rows", first_eval ? " and all of them train the index" : "",
                         "; expected at least 1");
  }
  w.eval = copy_rows(q.cview(), first_eval, eval);
  w.eval_first = first_eval;
  if (!o.values.empty()) {
    w.values = kvsift::read_vectors(o.values);
    kvsift::detail::require<kvsift::dimension_mismatch>(
        w.values.rows() == w.keys.rows() && w.values.cols() == w.keys.cols(),
        "kvsift-bench: expected --values of ", w.keys.rows(), " x ", w.keys.cols(),
        " (as --keys), got ", w.values.rows(), " x ", w.values.cols());
    // Causal attention needs each query's position: row p of --queries is token p.
    kvsift::detail::require<kvsift::dimension_mismatch>(
        q.rows() == w.keys.rows(), "kvsift-bench: --values expects one query per key position (",
        w.keys.rows(), " rows), got ", q.rows(), " queries");
  }
  w.source = o.keys + " / " + o.queries;
  return w;
}

}  // namespace kvsift_bench
