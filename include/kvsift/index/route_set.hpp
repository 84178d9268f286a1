#pragma once
// Routing sets: seeds for cold decode searches from the build's training queries.
//
// A decode query tends to want what the prefill queries that resemble it wanted, and the build
// already knows those: its training queries' exact best keys. A routing set keeps `rows` of the
// training queries (unit norm) with their best `list_len` keys. A query is routed by scoring it
// against every routing vector (cosine), and the lists of the best `top` become its search's
// seeds (`beam_search`'s extra_entries, `cuda::decode_queries::seeds`), with an expand limit so
// the walk stops once the seeds' neighbourhood is settled: a warm start for a query with no
// previous step. How much it saves depends on how clustered the queries are
// (docs/decode_search.md, "Routed seeds" and "Clustered routing"): at recall@100 0.95, 3.6x
// fewer keys scored on the synthetic decode benchmark (whose queries share topics with the
// training queries), 1.34-1.35x on real Gemma-3 keys with a clustered set of every training
// query. `stack_route_sets` lays many sets out for `cuda::route_seeds`.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/element.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/index/knn_engine.hpp"

namespace kvsift {

/// Routing vectors and their lists. Plain data: copy it to the device as
/// `cuda::route_set_ref` (one set per graph, concatenated, with per-graph offsets).
///
/// Clustered (`cluster_routes`): the rows are grouped by cluster, cluster c holding rows
/// [cluster_rows[c], cluster_rows[c + 1]), and `centroids` holds one unit vector per cluster.
/// A query then scores the centroids and only the rows of its best `probe` clusters: the
/// routing pass reads about clusters + probe x rows / clusters vectors instead of rows, so
/// more routing rows (better seeds) cost little more to route.
struct route_set {
  std::size_t dim = 0;
  std::size_t list_len = 0;
  std::vector<float> vectors;    ///< [rows][dim], unit norm (a zero query stays zero)
  std::vector<id_t> lists;       ///< [rows][list_len] key ids best first, invalid_id padded
  std::vector<float> centroids;  ///< [clusters][dim]; empty: not clustered
  std::vector<std::size_t> cluster_rows;  ///< [clusters + 1] row bounds; empty: not clustered
  [[nodiscard]] std::size_t rows() const noexcept { return dim == 0 ? 0 : vectors.size() / dim; }
  [[nodiscard]] std::size_t clusters() const noexcept {
    return cluster_rows.empty() ? 0 : cluster_rows.size() - 1;
  }
};

/// Routing set of `rows` evenly spaced rows of `queries` (row floor(i * m / rows), so the rows
/// span all m queries, the latest included, whatever rows / m), each scaled
/// to unit norm, with its best `list_len` keys by inner product from `engine` (exact for the
/// library's engines; fewer keys than list_len leave invalid_id padding).
/// Complexity: one engine.search of rows queries over the keys, O(rows * n * dim) for a flat
/// engine. Thread safety: pure function (as safe as `engine.search`).
/// @throw invalid_argument rows or list_len zero, rows above queries.rows(), no keys;
///        dimension_mismatch queries and keys differ in dimension; non_finite_value NaN or Inf
///        in the keys or the queries taken; what engine.search throws
template <KnnEngine E, Element T>
route_set make_route_set(matrix_view<const float> queries, matrix_view<const T> keys,
                         std::size_t rows, std::size_t list_len, const E& engine) {
  detail::require(rows >= 1 && rows <= queries.rows(),
                  "make_route_set: expected 1 <= rows <= ", queries.rows(),
                  " (the queries given), got ", rows);
  detail::require(list_len >= 1, "make_route_set: expected list_len >= 1, got 0");
  detail::require(keys.rows() >= 1, "make_route_set: expected at least one key, got 0");
  require_dim(keys.cols(), queries.cols(), "make_route_set: query dimension vs key dimension");
  const std::size_t d = queries.cols();
  const std::size_t m = queries.rows();
  (void)checked_mul(rows, m, "make_route_set: rows x queries");
  // floor(i * m / rows): with a step of floor(m / rows) instead, rows > m / 2 took the first
  // rows queries only, never the latest (nearest the decode), which lost recall on real keys.
  auto source = [&](std::size_t i) { return i * m / rows; };
  // Not every engine checks its inputs (the flat CPU engine ranks NaN last): a NaN would
  // route every query to the same list.
  require_finite(keys, "make_route_set: keys");
  for (std::size_t i = 0; i < rows; ++i) {
    require_finite(queries.row_range(source(i), 1), "make_route_set: queries");
  }
  route_set rs;
  rs.dim = d;
  rs.list_len = list_len;
  rs.vectors.resize(checked_mul(rows, d, "make_route_set: rows x dim"));
  rs.lists.assign(checked_mul(rows, list_len, "make_route_set: rows x list_len"), invalid_id);
  for (std::size_t i = 0; i < rows; ++i) {
    const float* src = queries.row(source(i));
    double norm = 0;
    for (std::size_t c = 0; c < d; ++c) norm += static_cast<double>(src[c]) * src[c];
    const double inv = norm > 0 ? 1.0 / std::sqrt(norm) : 0.0;
    for (std::size_t c = 0; c < d; ++c) {
      rs.vectors[i * d + c] = static_cast<float>(src[c] * inv);
    }
  }
  const std::size_t k = std::min(list_len, keys.rows());
  const knn_result best =
      engine.search(matrix_view<const float>(rs.vectors.data(), rows, d), keys, k);
  for (std::size_t i = 0; i < rows; ++i) {
    const auto ids = best.row_ids(i);
    std::copy(ids.begin(), ids.end(), rs.lists.begin() + static_cast<std::ptrdiff_t>(i * list_len));
  }
  return rs;
}

/// Groups the routing rows of `rs` into at most `clusters` clusters by spherical k-means:
/// centroids start at rows i * floor(rows / clusters); `iterations` rounds each assign every row
/// to its centroid of highest inner product (ties to the lower cluster) and set each centroid to
/// its members' mean at unit norm (a cluster left empty keeps its centroid). A last assignment
/// fixes the clusters; empty ones are dropped, the rows and their lists are reordered by cluster
/// (within a cluster in their old order) and each centroid is its final members' mean at unit
/// norm. Deterministic. A clustered set is clustered again from its rows' current order.
/// Complexity: O((iterations + 1) * rows * clusters * dim). Thread safety: modifies `rs`.
/// @throw invalid_argument clusters zero or above rs.rows(); a set whose arrays do not match
///        its rows (vectors not rows x dim, lists not rows x list_len). Nothing changes then.
inline void cluster_routes(route_set& rs, std::size_t clusters, std::size_t iterations = 10) {
  const std::size_t n = rs.rows(), d = rs.dim;
  detail::require(clusters >= 1 && clusters <= n, "cluster_routes: expected 1 <= clusters <= ", n,
                  " (the routing rows), got ", clusters);
  detail::require(rs.vectors.size() == n * d && rs.lists.size() == n * rs.list_len,
                  "cluster_routes: expected vectors of rows x dim = ", n * d,
                  " and lists of rows x list_len = ", n * rs.list_len, " entries, got ",
                  rs.vectors.size(), " and ", rs.lists.size());
  std::vector<float> cent(clusters * d);
  const std::size_t step = n / clusters;
  for (std::size_t c = 0; c < clusters; ++c) {
    std::copy_n(rs.vectors.begin() + static_cast<std::ptrdiff_t>(c * step * d), d,
                cent.begin() + static_cast<std::ptrdiff_t>(c * d));
  }
  std::vector<std::size_t> of(n);
  std::vector<double> sum(clusters * d);
  std::vector<std::size_t> count(clusters);
  auto assign = [&] {
    for (std::size_t r = 0; r < n; ++r) {
      const float* v = rs.vectors.data() + r * d;
      float best = -std::numeric_limits<float>::infinity();
      std::size_t at = 0;
      for (std::size_t c = 0; c < clusters; ++c) {
        float s = 0.0f;
        for (std::size_t i = 0; i < d; ++i) s += v[i] * cent[c * d + i];
        if (s > best) {
          best = s;
          at = c;
        }
      }
      of[r] = at;
    }
  };
  // Sets the centroid of every non-empty cluster to its members' mean at unit norm.
  auto update = [&] {
    std::fill(sum.begin(), sum.end(), 0.0);
    std::fill(count.begin(), count.end(), std::size_t{0});
    for (std::size_t r = 0; r < n; ++r) {
      ++count[of[r]];
      for (std::size_t i = 0; i < d; ++i) sum[of[r] * d + i] += rs.vectors[r * d + i];
    }
    for (std::size_t c = 0; c < clusters; ++c) {
      if (count[c] == 0) continue;
      double norm = 0;
      for (std::size_t i = 0; i < d; ++i) norm += sum[c * d + i] * sum[c * d + i];
      const double inv = norm > 0 ? 1.0 / std::sqrt(norm) : 0.0;
      for (std::size_t i = 0; i < d; ++i)
        cent[c * d + i] = static_cast<float>(sum[c * d + i] * inv);
    }
  };
  for (std::size_t it = 0; it < iterations; ++it) {
    assign();
    update();
  }
  assign();
  update();
  // Reorder: rows by cluster (stable), empty clusters dropped.
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return of[a] < of[b]; });
  std::vector<float> vectors(n * d), centroids;
  std::vector<id_t> lists(n * rs.list_len);
  std::vector<std::size_t> bounds{0};
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t r = order[i];
    std::copy_n(rs.vectors.begin() + static_cast<std::ptrdiff_t>(r * d), d,
                vectors.begin() + static_cast<std::ptrdiff_t>(i * d));
    std::copy_n(rs.lists.begin() + static_cast<std::ptrdiff_t>(r * rs.list_len), rs.list_len,
                lists.begin() + static_cast<std::ptrdiff_t>(i * rs.list_len));
  }
  for (std::size_t c = 0; c < clusters; ++c) {
    if (count[c] == 0) continue;
    centroids.insert(centroids.end(), cent.begin() + static_cast<std::ptrdiff_t>(c * d),
                     cent.begin() + static_cast<std::ptrdiff_t>((c + 1) * d));
    bounds.push_back(bounds.back() + count[c]);
  }
  rs.vectors = std::move(vectors);
  rs.lists = std::move(lists);
  rs.centroids = std::move(centroids);
  rs.cluster_rows = std::move(bounds);
}

namespace detail {

/// Offers (score s, index i) to `best`, sorted by higher score then lower index, kept to `top`
/// entries. O(top).
inline void offer_route(std::vector<std::pair<float, std::size_t>>& best, std::size_t top, float s,
                        std::size_t i) {
  const auto at = std::find_if(best.begin(), best.end(), [&](const auto& b) {
    return s > b.first || (s == b.first && i < b.second);
  });
  if (best.size() < top || at != best.end()) {
    best.insert(at, {s, i});
    if (best.size() > top) best.pop_back();
  }
}

inline float route_score(std::span<const float> q, const float* v) {
  float s = 0.0f;
  for (std::size_t c = 0; c < q.size(); ++c) s += q[c] * v[c];
  return s;
}

/// Checks that the arrays of `rs` agree with each other: vectors a whole number of rows of dim
/// floats, lists rows x list_len ids (list_len >= 1 when there are rows), and, when clustered,
/// clusters x dim centroid floats and row bounds ascending from 0 to rows. O(clusters).
/// @throw invalid_argument naming `who`, the expected and the actual sizes
inline void check_route_set(const route_set& rs, const char* who) {
  require(rs.dim > 0 ? rs.vectors.size() % rs.dim == 0 : rs.vectors.empty(), who,
          ": expected vectors of a whole number of rows of dim = ", rs.dim, " floats, got ",
          rs.vectors.size());
  const std::size_t n = rs.rows();
  require(n == 0 || rs.list_len >= 1, who, ": expected list_len >= 1 for ", n, " rows, got 0");
  require(rs.lists.size() == checked_mul(n, rs.list_len, "route_set: rows x list_len"), who,
          ": expected lists of rows x list_len = ", n, " x ", rs.list_len, " ids, got ",
          rs.lists.size());
  if (rs.cluster_rows.empty()) {
    require(rs.centroids.empty(), who, ": expected no centroids without cluster bounds, got ",
            rs.centroids.size(), " floats");
    return;
  }
  const std::size_t c = rs.clusters();
  // A hand-made or loaded set: bounds that do not tile the rows would read past them.
  require(rs.centroids.size() == checked_mul(c, rs.dim, "route_set: clusters x dim") &&
              rs.cluster_rows.front() == 0 && rs.cluster_rows.back() == n &&
              std::is_sorted(rs.cluster_rows.begin(), rs.cluster_rows.end()),
          who, ": expected ", c, " centroids of ", rs.dim,
          " floats and cluster bounds ascending from 0 to ", n, ", got ", rs.centroids.size(),
          " floats and bounds from ", rs.cluster_rows.front(), " to ", rs.cluster_rows.back());
}

/// The argument checks of `route_seeds` (the set's arrays included) without routing: what a
/// caller sizing its output first (a binding) calls. Returns top x list_len, the ids written
/// per query. O(clusters).
/// @throw invalid_argument / dimension_mismatch as `route_seeds`
inline std::size_t check_route_seeds(const route_set& rs, std::size_t query_len, std::size_t top,
                                     std::size_t out_size, std::size_t probe) {
  require(top >= 1, "route_seeds: expected top >= 1, got 0");
  check_route_set(rs, "route_seeds");
  require_dim(rs.dim, query_len, "route_seeds: query length");
  const std::size_t need = checked_mul(top, rs.list_len, "route_seeds: top x list_len");
  require(out_size >= need, "route_seeds: expected an output of at least top x list_len = ", need,
          " ids, got ", out_size);
  require(probe == 0 || rs.clusters() > 0, "route_seeds: probe ", probe,
          " needs a clustered set (cluster_routes)");
  return need;
}

}  // namespace detail

/// Writes the lists of the `top` routing vectors with the highest inner product with `query`
/// (ties to the lower row), best first, into out[0, top * list_len); missing routes (fewer
/// rows, or rows in the probed clusters, than top) and a query holding NaN or Inf give
/// invalid_id (which `beam_search` skips among its extra entries). With `probe` > 0 and a
/// clustered set, only the rows of the `probe` clusters whose centroids score highest (ties to
/// the lower cluster) compete. The routes of `cuda::route_seeds` over one graph's set (up to
/// the scores' summation order, which can swap near-ties).
/// Returns the routing vectors scored (the routing pass's reads): rows, or with probe the
/// centroids plus the probed clusters' rows; 0 for a query holding NaN or Inf.
/// Complexity: O(rows * (dim + top)), or with probe O(clusters * (dim + probe) + probed rows
/// * (dim + top)); the set's arrays are checked per call, O(clusters). Thread safety: const on
/// `rs`, safe concurrently.
/// @throw invalid_argument top zero, out shorter than top * list_len, arrays of `rs` that do
///        not agree (`detail::check_route_set`), probe > 0 on a set that is not clustered;
///        dimension_mismatch query length is not rs.dim
inline std::size_t route_seeds(const route_set& rs, std::span<const float> query, std::size_t top,
                               std::span<id_t> out, std::size_t probe = 0) {
  const std::size_t need = detail::check_route_seeds(rs, query.size(), top, out.size(), probe);
  std::fill_n(out.begin(), need, invalid_id);
  if (!std::all_of(query.begin(), query.end(), [](float x) { return std::isfinite(x); })) return 0;
  // Small per-call lists (top + 1 and probe + 1 entries): their allocation is noise next to the
  // rows x dim scoring.
  std::vector<std::pair<float, std::size_t>> best;  // (score, row), best first
  best.reserve(top + 1);
  std::size_t scored = 0;
  auto offer_rows = [&](std::size_t begin, std::size_t end) {
    for (std::size_t r = begin; r < end; ++r) {
      detail::offer_route(best, top, detail::route_score(query, rs.vectors.data() + r * rs.dim), r);
    }
    scored += end - begin;
  };
  if (probe == 0) {
    offer_rows(0, rs.rows());
  } else {
    std::vector<std::pair<float, std::size_t>> near;  // (score, cluster), best first
    near.reserve(probe + 1);
    for (std::size_t c = 0; c < rs.clusters(); ++c) {
      detail::offer_route(near, probe, detail::route_score(query, rs.centroids.data() + c * rs.dim),
                          c);
    }
    scored += rs.clusters();
    // Rows in ascending order, so that ties go to the lower row as in the flat scan.
    std::sort(near.begin(), near.end(),
              [](const auto& a, const auto& b) { return a.second < b.second; });
    for (const auto& [s, c] : near) offer_rows(rs.cluster_rows[c], rs.cluster_rows[c + 1]);
  }
  for (std::size_t t = 0; t < best.size(); ++t) {
    const id_t* list = rs.lists.data() + best[t].second * rs.list_len;
    std::copy_n(list, rs.list_len, out.begin() + static_cast<std::ptrdiff_t>(t * rs.list_len));
  }
  return scored;
}

/// The routing sets of many graphs (set g for graph g) in the layout `cuda::route_set_ref` reads:
/// graph g owns rows [offset[g], offset[g + 1]) of `vectors` and `lists`; when the sets are
/// clustered, graph g's clusters are centroid rows [cluster_offset[g], cluster_offset[g + 1])
/// and cluster c holds the (global) rows [cluster_rows[c], cluster_rows[c + 1]). Upload the
/// arrays (vectors and centroids in the element type to route in) and copy the maxima into the
/// handle's fields of the same names.
struct route_set_stack {
  std::size_t dim = 0;
  std::size_t list_len = 0;                  ///< the longest set's; shorter lists invalid_id padded
  std::vector<float> vectors;                ///< [offset.back()][dim]
  std::vector<id_t> lists;                   ///< [offset.back()][list_len]
  std::vector<std::int64_t> offset;          ///< [graphs + 1], from 0
  std::vector<float> centroids;              ///< [cluster_offset.back()][dim]; empty: flat
  std::vector<std::int64_t> cluster_offset;  ///< [graphs + 1]; empty: flat
  std::vector<std::int64_t> cluster_rows;    ///< [cluster_offset.back() + 1]; empty: flat
  std::size_t max_rows = 0;                  ///< most rows of one graph
  std::size_t max_clusters = 0;              ///< most clusters of one graph (0: flat)
  std::size_t max_cluster_rows = 0;          ///< most rows of one cluster (0: flat)
  [[nodiscard]] std::size_t graphs() const noexcept {
    return offset.empty() ? 0 : offset.size() - 1;
  }
  [[nodiscard]] bool clustered() const noexcept { return !cluster_offset.empty(); }
};

/// Stacks `sets` (pointers, one per graph; a set may be named more than once, e.g. graphs that
/// share keys) into a `route_set_stack`. Sets may differ in list_len (the shorter lists are
/// padded with invalid_id, which the searches skip) and in rows (a set of no rows routes
/// nothing); they must share dim (a set of no rows may have any) and be either all clustered or
/// all flat.
/// Complexity: O(total rows * (dim + list_len) + total clusters * dim). Thread safety: reads
/// the sets, which must not change meanwhile.
/// @throw invalid_argument no sets, a null pointer, a set whose arrays do not agree
///        (`detail::check_route_set`), clustered and flat sets (with rows) mixed, sizes that
///        overflow; dimension_mismatch sets (with rows) of different dims. Checked before
///        anything is allocated.
inline route_set_stack stack_route_sets(std::span<const route_set* const> sets) {
  detail::require(!sets.empty(), "stack_route_sets: expected at least one routing set, got none");
  std::size_t dim = 0, list_len = 0, rows = 0, clusters = 0;
  std::size_t first = sets.size();  // the first set with rows: its dim and layout rule
  for (std::size_t g = 0; g < sets.size(); ++g) {
    detail::require(sets[g] != nullptr, "stack_route_sets: set ", g, " is null");
    const route_set& rs = *sets[g];
    detail::check_route_set(rs, "stack_route_sets");
    if (rs.rows() > 0) {
      if (first == sets.size()) {
        first = g;
        dim = rs.dim;
      }
      require_dim(dim, rs.dim, "stack_route_sets: dimension of a set vs the first set with rows");
      const bool c0 = sets[first]->clusters() > 0, c = rs.clusters() > 0;
      detail::require(c == c0, "stack_route_sets: expected every set with rows ",
                      c0 ? "clustered" : "flat", " as set ", first, ", set ", g, " is ",
                      c ? "clustered" : "flat");
    }
    list_len = std::max(list_len, rs.list_len);
    rows = checked_add(rows, rs.rows(), "stack_route_sets: total rows");
    clusters = checked_add(clusters, rs.clusters(), "stack_route_sets: total clusters");
  }
  route_set_stack st;
  st.dim = dim;
  st.list_len = list_len;
  const bool clustered = clusters > 0;
  st.vectors.reserve(checked_mul(rows, dim, "stack_route_sets: rows x dim"));
  st.lists.assign(checked_mul(rows, list_len, "stack_route_sets: rows x list_len"), invalid_id);
  st.offset.reserve(sets.size() + 1);
  st.offset.push_back(0);
  if (clustered) {
    st.centroids.reserve(checked_mul(clusters, dim, "stack_route_sets: clusters x dim"));
    st.cluster_offset.reserve(sets.size() + 1);
    st.cluster_offset.push_back(0);
    st.cluster_rows.reserve(clusters + 1);
    st.cluster_rows.push_back(0);
  }
  for (const route_set* p : sets) {
    const route_set& rs = *p;
    const auto base = static_cast<std::size_t>(st.offset.back());
    if (rs.rows() > 0) st.vectors.insert(st.vectors.end(), rs.vectors.begin(), rs.vectors.end());
    for (std::size_t r = 0; r < rs.rows(); ++r) {
      std::copy_n(rs.lists.begin() + static_cast<std::ptrdiff_t>(r * rs.list_len), rs.list_len,
                  st.lists.begin() + static_cast<std::ptrdiff_t>((base + r) * list_len));
    }
    st.offset.push_back(static_cast<std::int64_t>(base + rs.rows()));
    st.max_rows = std::max(st.max_rows, rs.rows());
    if (!clustered) continue;
    st.centroids.insert(st.centroids.end(), rs.centroids.begin(), rs.centroids.end());
    for (std::size_t c = 0; c < rs.clusters(); ++c) {
      st.cluster_rows.push_back(static_cast<std::int64_t>(base + rs.cluster_rows[c + 1]));
      st.max_cluster_rows =
          std::max(st.max_cluster_rows, rs.cluster_rows[c + 1] - rs.cluster_rows[c]);
    }
    st.cluster_offset.push_back(st.cluster_offset.back() +
                                static_cast<std::int64_t>(rs.clusters()));
    st.max_clusters = std::max(st.max_clusters, rs.clusters());
  }
  return st;
}

/// `stack_route_sets` of every set in `sets`, in order.
inline route_set_stack stack_route_sets(std::span<const route_set> sets) {
  std::vector<const route_set*> p(sets.size());
  for (std::size_t g = 0; g < sets.size(); ++g) p[g] = &sets[g];
  return stack_route_sets(std::span<const route_set* const>(p));
}

}  // namespace kvsift
