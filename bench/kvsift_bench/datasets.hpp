#pragma once
// kvsift-bench's workload: keys, training and evaluation queries (and values) read from files
// or generated (--demo), all owned here.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "kvsift/kvsift.hpp"
#include "kvsift/testing/ood_generator.hpp"
#include "kvsift_bench/ground_truth.hpp"
#include "kvsift_bench/hdf5_dataset.hpp"
#include "kvsift_bench/options.hpp"

namespace kvsift_bench {

/// Keys, training queries and evaluation queries, all owned here.
struct workload {
  kvsift::dense_matrix<float> keys, train, eval, values;
  std::size_t eval_first = 0;  ///< position (row of --queries) of the first evaluation query
  std::string source;
  std::string metric;  ///< ip or l2: --metric, or what an --hdf5 file's distance maps to
  /// The exact answers from a file (--gt, or --hdf5's neighbors), one list per evaluation query,
  /// best first; empty optional: computed by the run (measure.hpp's exact_rankings).
  std::optional<std::vector<std::vector<kvsift::scored_id>>> given_exact;
  std::string given_exact_source;
};

/// Scales every row to unit length (rows of norm 0 stay 0): ann-benchmarks' angular distance
/// ranks as the inner product of normalised vectors.
inline void normalize_rows(kvsift::dense_matrix<float>& m) {
  for (std::size_t i = 0; i < m.rows(); ++i) {
    float* r = m.row(i);
    double s = 0;
    for (std::size_t j = 0; j < m.cols(); ++j) s += static_cast<double>(r[j]) * r[j];
    if (s == 0) continue;
    const auto inv = static_cast<float>(1.0 / std::sqrt(s));
    for (std::size_t j = 0; j < m.cols(); ++j) r[j] *= inv;
  }
}

/// ann-benchmarks' distance attribute as kvsift's metric: euclidean -> l2, angular -> ip (the
/// vectors are normalised by load()).
/// @throw invalid_argument for any other distance (hamming, jaccard: other vector types).
inline std::string metric_of_distance(const std::string& path, const std::string& distance) {
  if (distance == "euclidean") return "l2";
  if (distance == "angular") return "ip";
  kvsift::detail::fail("--hdf5 '", path, "': expected distance euclidean or angular, got '",
                       distance, "'");
}

/// --gt: read once the evaluation queries are known (its rows must match them), before any
/// measurement.
inline void read_given_gt(const options& o, workload& w) {
  if (o.gt.empty()) return;
  const std::size_t max_k = *std::max_element(o.k.begin(), o.k.end());
  const auto gt = read_big_ann_gt(o.gt, w.eval.rows(), max_k, w.keys.rows());
  w.given_exact = exact_from_gt(gt, 0, w.eval.rows());
  w.given_exact_source = "--gt " + o.gt;
}

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
    w.metric = o.metric;
    read_given_gt(o, w);
    std::ostringstream src;
    src << "synthetic OOD (key norm spread " << o.spread << ")";
    w.source = src.str();
    return w;
  }
  kvsift::dense_matrix<float> q;
  std::optional<ann_dataset> ann;
  w.metric = o.metric;
  if (!o.hdf5.empty()) {
    ann = read_ann_hdf5(o.hdf5);
    w.metric = metric_of_distance(o.hdf5, ann->distance);
    w.keys = std::move(ann->train);
    q = std::move(ann->test);
    if (ann->distance == "angular") {
      normalize_rows(w.keys);
      normalize_rows(q);
    }
  } else {
    w.keys = kvsift::read_vectors(o.keys);
    q = kvsift::read_vectors(o.queries);
    kvsift::require_dim(w.keys.cols(), q.cols(), "kvsift-bench: --queries dimension vs --keys");
  }
  const std::string queries_name = o.hdf5.empty() ? o.queries : o.hdf5 + "'s test";
  std::size_t first_eval = 0;
  if (!o.train.empty()) {
    w.train = kvsift::read_vectors(o.train);
    kvsift::require_dim(w.keys.cols(), w.train.cols(), "kvsift-bench: --train dimension vs --keys");
    if (ann && ann->distance == "angular") normalize_rows(w.train);
  } else if (o.train_fraction > 0) {
    first_eval = static_cast<std::size_t>(o.train_fraction * static_cast<double>(q.rows()));
    w.train = copy_rows(q.cview(), 0, first_eval);
  }
  const std::size_t eval = std::min(q.rows() - first_eval, o.eval ? o.eval : q.rows());
  // Every table row is a mean over evaluation queries; with none there is nothing to measure
  // (the timing read element 0 of an empty vector before this check).
  if (eval == 0) {
    kvsift::detail::fail("kvsift-bench: no evaluation queries: --queries '", queries_name, "' has ",
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
  w.source = o.hdf5.empty() ? o.keys + " / " + o.queries
                            : o.hdf5 + " (ann-benchmarks, " + ann->distance + ")";
  if (ann) {
    // Row i of neighbors answers test query i; the evaluation queries are rows
    // [first_eval, first_eval + eval) of test.
    const std::size_t max_k = *std::max_element(o.k.begin(), o.k.end());
    require_gt_shape("--hdf5 '" + o.hdf5 + "': neighbors", ann->neighbors.rows, ann->neighbors.cols,
                     q.rows(), max_k);
    w.given_exact = exact_from_gt(ann->neighbors, first_eval, eval);
    w.given_exact_source = "--hdf5 neighbors";
  }
  read_given_gt(o, w);
  return w;
}

}  // namespace kvsift_bench
