#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "kvsift/index/knn.hpp"
#include "kvsift/index/roargraph_builder.hpp"
#include "kvsift/index/route_set.hpp"
#include "kvsift/search/beam_search.hpp"
#include "ood_fixture.hpp"

using namespace kvsift;
using Catch::Matchers::Contains;

namespace {

/// Small integers: every dot product is exact in f32 whatever the order (ties included).
std::vector<float> integers(std::size_t rows, std::size_t d, std::uint64_t seed) {
  std::vector<float> v(rows * d);
  std::uint64_t x = seed;
  for (auto& e : v) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    e = static_cast<float>(static_cast<int>((x >> 33) % 5) - 2);
  }
  return v;
}

/// d x 1/4 entries of either sign: with d = 16 every row is exactly unit norm and every dot
/// product of two rows is a multiple of 1/16 computed exactly in f32 (ties included).
std::vector<float> quarters(std::size_t rows, std::size_t d, std::uint64_t seed) {
  auto v = integers(rows, d, seed);
  for (auto& e : v) e = e < 0 ? -0.25f : 0.25f;
  return v;
}

/// Rows near `groups` random quarter patterns (each row flips 0-3 of the pattern's signs),
/// shuffled: clusters that k-means separates in a few rounds.
std::vector<float> grouped_quarters(std::size_t rows, std::size_t groups, std::uint64_t seed) {
  constexpr std::size_t d = 16;
  const auto base = quarters(groups, d, seed);
  std::vector<float> v(rows * d);
  std::uint64_t x = seed * 7919 + 1;
  auto next = [&] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x >> 33;
  };
  for (std::size_t r = 0; r < rows; ++r) {
    const std::size_t g = next() % groups;
    std::copy_n(base.begin() + std::ptrdiff_t(g * d), d, v.begin() + std::ptrdiff_t(r * d));
    for (std::uint64_t f = next() % 4; f > 0; --f) v[r * d + next() % d] *= -1.0f;
  }
  return v;
}

/// A routing set over `vectors` whose row r holds the list 1000 r, 1000 r + 1, ...: a row's
/// list names the row it came from.
route_set tagged_set(std::vector<float> vectors, std::size_t d, std::size_t list_len) {
  route_set rs;
  rs.dim = d;
  rs.list_len = list_len;
  rs.vectors = std::move(vectors);
  for (std::size_t r = 0; r < rs.rows(); ++r) {
    for (std::size_t j = 0; j < list_len; ++j) rs.lists.push_back(id_t(1000 * r + j));
  }
  return rs;
}

bool same_set(const route_set& a, const route_set& b) {
  return a.dim == b.dim && a.list_len == b.list_len && a.vectors == b.vectors &&
         a.lists == b.lists && a.centroids == b.centroids && a.cluster_rows == b.cluster_rows;
}

double dot(const float* a, const float* b, std::size_t d) {
  double s = 0;
  for (std::size_t c = 0; c < d; ++c) s += double(a[c]) * b[c];
  return s;
}

/// Every row of the clustered `rs` against the set `before` it was made from: the rows are a
/// permutation of the old (vector, list) pairs, grouped by cluster in their old order, the
/// bounds cover the rows with no empty cluster, and each centroid is its members' mean at unit
/// norm.
void check_clustered(const route_set& rs, const route_set& before) {
  const std::size_t n = before.rows(), d = before.dim, L = before.list_len;
  REQUIRE(rs.rows() == n);
  REQUIRE(rs.lists.size() == before.lists.size());
  REQUIRE(rs.clusters() >= 1);
  REQUIRE(rs.centroids.size() == rs.clusters() * d);
  CHECK(rs.cluster_rows.front() == 0);
  CHECK(rs.cluster_rows.back() == n);
  for (std::size_t c = 0; c < rs.clusters(); ++c) {
    CHECK(rs.cluster_rows[c] < rs.cluster_rows[c + 1]);
  }
  std::vector<int> seen(n, 0);
  std::size_t prev_old = 0;
  std::size_t c = 0;
  for (std::size_t i = 0; i < n; ++i) {
    while (c + 1 < rs.clusters() && i >= rs.cluster_rows[c + 1]) ++c;
    const std::size_t old = rs.lists[i * L] / 1000;
    REQUIRE(old < n);
    ++seen[old];
    for (std::size_t j = 0; j < L; ++j) CHECK(rs.lists[i * L + j] == before.lists[old * L + j]);
    for (std::size_t k = 0; k < d; ++k) CHECK(rs.vectors[i * d + k] == before.vectors[old * d + k]);
    // Stable: within a cluster the old order.
    if (i > rs.cluster_rows[c]) CHECK(old > prev_old);
    prev_old = old;
  }
  CHECK(std::count(seen.begin(), seen.end(), 1) == std::ptrdiff_t(n));
  for (c = 0; c < rs.clusters(); ++c) {
    std::vector<double> mean(d, 0.0);
    for (std::size_t i = rs.cluster_rows[c]; i < rs.cluster_rows[c + 1]; ++i) {
      for (std::size_t k = 0; k < d; ++k) mean[k] += rs.vectors[i * d + k];
    }
    double norm = 0;
    for (const double m : mean) norm += m * m;
    for (std::size_t k = 0; k < d; ++k) {
      CHECK(rs.centroids[c * d + k] == Approx(mean[k] / std::sqrt(norm)).margin(1e-6));
    }
  }
}

/// The OOD fixture's graph, built once for the routing tests.
const auto& ood_graph() {
  static const auto g =
      roargraph_builder<inner_product>(kvsift_test::ood_build_params())
          .build(view_store<float>(kvsift_test::ood().keys), kvsift_test::ood().train);
  return g;
}

/// recall@10 and keys scored per query on the OOD fixture's evaluation queries, each searched at
/// pool 20 with expand limit `limit` from the extra entries `seeds_of(query)` returns (empty:
/// the cold search).
template <class SeedsOf>
std::pair<double, double> ood_search(std::size_t limit, SeedsOf seeds_of) {
  const auto& f = kvsift_test::ood();
  search_workspace ws;
  std::vector<id_t> ids(10);
  std::vector<float> sc(10);
  double hit = 0, scored = 0;
  for (std::size_t e = 0; e < f.eval.rows(); ++e) {
    const std::span<const float> q(f.eval.row(e), f.eval.cols());
    const std::span<const id_t> extra = seeds_of(q);
    const auto st = beam_search(ood_graph(), q, beam_search_params{10, 20, 0, limit}, ws, ids, sc,
                                no_filter{}, extra);
    for (std::size_t i = 0; i < st.count; ++i) {
      hit += std::count(f.truth[e].begin(), f.truth[e].end(), ids[i]);
    }
    scored += double(st.distance_computations);
  }
  return {hit / double(f.eval.rows() * 10), scored / double(f.eval.rows())};
}

}  // namespace

TEST_CASE("make_route_set takes evenly spaced queries at unit norm with their exact lists",
          "[index][route]") {
  const std::size_t n = 300, d = 8, m = 103;
  const auto keys = integers(n, d, 1), queries = integers(m, d, 2);
  const matrix_view<const float> K(keys.data(), n, d), Q(queries.data(), m, d);
  const route_set rs = make_route_set(Q, K, 10, 7, cpu_knn_engine{});
  REQUIRE(rs.rows() == 10);
  REQUIRE(rs.list_len == 7);
  for (std::size_t i = 0; i < 10; ++i) {
    const float* src = Q.row(i * 103 / 10);  // spread over all 103, the last (92) included
    double norm = 0;
    for (std::size_t c = 0; c < d; ++c) norm += double(src[c]) * src[c];
    double got = 0;
    for (std::size_t c = 0; c < d; ++c) {
      CHECK(rs.vectors[i * d + c] == Approx(src[c] / std::sqrt(norm)).margin(1e-6));
      got += double(rs.vectors[i * d + c]) * rs.vectors[i * d + c];
    }
    CHECK(got == Approx(1.0).margin(1e-5));
    // The list: the 7 best keys by inner product with the routing vector. The normalised
    // vector's float scores may order equal integer scores either way, so the list's exact
    // scores are compared with the 7 best, in order.
    auto exact = [&](std::size_t k) {
      double s = 0;
      for (std::size_t c = 0; c < d; ++c) s += double(src[c]) * keys[k * d + c];
      return s;
    };
    std::vector<double> all;
    for (std::size_t k = 0; k < n; ++k) all.push_back(exact(k));
    std::sort(all.rbegin(), all.rend());
    for (std::size_t j = 0; j < 7; ++j) CHECK(exact(rs.lists[i * 7 + j]) == all[j]);
  }
  // More list slots than keys: padded.
  const route_set small =
      make_route_set(Q, matrix_view<const float>(keys.data(), 5, d), 3, 8, cpu_knn_engine{});
  for (std::size_t i = 0; i < 3; ++i) {
    for (std::size_t j = 0; j < 8; ++j) CHECK((small.lists[i * 8 + j] == invalid_id) == (j >= 5));
  }
}

TEST_CASE("route_seeds returns the best routes' lists, ties to the lower row", "[index][route]") {
  const std::size_t d = 6, rows = 40, list = 3;
  route_set rs;
  rs.dim = d;
  rs.list_len = list;
  rs.vectors = integers(rows, d, 3);
  for (std::size_t i = 0; i < rows * list; ++i) rs.lists.push_back(id_t(1000 + i));
  const auto queries = integers(50, d, 4);
  for (std::size_t e = 0; e < 50; ++e) {
    const std::span<const float> q(queries.data() + e * d, d);
    for (const std::size_t top : {1, 4, 9}) {
      std::vector<id_t> got(top * list + 2, 7);
      route_seeds(rs, q, top, got);
      std::vector<std::pair<float, std::size_t>> s;  // exact: small integers
      for (std::size_t r = 0; r < rows; ++r) {
        float x = 0;
        for (std::size_t c = 0; c < d; ++c) x += q[c] * rs.vectors[r * d + c];
        s.push_back({-x, r});
      }
      std::sort(s.begin(), s.end());
      for (std::size_t t = 0; t < top; ++t) {
        for (std::size_t j = 0; j < list; ++j) {
          CHECK(got[t * list + j] == rs.lists[s[t].second * list + j]);
        }
      }
      CHECK(got[top * list] == 7);  // nothing written past top * list_len
    }
  }
  // Fewer rows than top: padding; a non-finite query: no seeds.
  std::vector<id_t> out(45 * list);
  route_seeds(rs, std::span<const float>(queries.data(), d), 45, out);
  CHECK(std::count(out.begin(), out.end(), invalid_id) == std::ptrdiff_t(5 * list));
  std::vector<float> bad(queries.begin(), queries.begin() + std::ptrdiff_t(d));
  bad[2] = std::numeric_limits<float>::quiet_NaN();
  route_seeds(rs, bad, 4, out);
  CHECK(std::all_of(out.begin(), out.begin() + 4 * list, [](id_t x) { return x == invalid_id; }));
}

TEST_CASE("routed seeds let an expand-limited search score fewer keys at equal recall",
          "[index][route]") {
  // The OOD fixture's topics are shared by training and evaluation queries, so a query's nearest
  // training queries want much of what it wants. Seeded from the best 4 routes' lists and
  // expanding only the pool's best 12 entries, a pool-20 search must find at least the cold
  // pool-20 search's recall@10 while scoring at least a quarter fewer keys. Routing by the worst
  // routes instead (or no seeds with the same limit) must not manage both.
  const auto& f = kvsift_test::ood();
  const route_set rs = make_route_set(f.train, f.keys, 500, 10, cpu_knn_engine{});
  std::vector<id_t> seeds(40);
  auto measure = [&](bool routed, bool worst, std::size_t limit) {
    return ood_search(limit, [&](std::span<const float> q) -> std::span<const id_t> {
      if (!routed) return {};
      if (worst) {
        std::vector<float> neg(q.begin(), q.end());
        for (auto& x : neg) x = -x;
        route_seeds(rs, neg, 4, seeds);
      } else {
        route_seeds(rs, q, 4, seeds);
      }
      return seeds;
    });
  };
  const auto [cold_recall, cold_scored] = measure(false, false, 0);
  const auto [recall, scored] = measure(true, false, 12);
  const auto [worst_recall, worst_scored] = measure(true, true, 12);
  const auto [bare_recall, bare_scored] = measure(false, false, 12);
  INFO("cold " << cold_recall << " / " << cold_scored << ", routed " << recall << " / " << scored
               << ", worst routes " << worst_recall << " / " << worst_scored << ", limit only "
               << bare_recall << " / " << bare_scored);
  CHECK(recall >= cold_recall);
  CHECK(scored <= 0.75 * cold_scored);
  CHECK_FALSE((worst_recall >= cold_recall && worst_scored <= 0.75 * cold_scored));
  CHECK_FALSE((bare_recall >= cold_recall && bare_scored <= 0.75 * cold_scored));
}

TEST_CASE("route sets reject bad input before any work", "[index][route]") {
  const auto keys = integers(20, 4, 5), queries = integers(10, 4, 6);
  const matrix_view<const float> K(keys.data(), 20, 4), Q(queries.data(), 10, 4);
  CHECK_THROWS_WITH(make_route_set(Q, K, 0, 3, cpu_knn_engine{}),
                    Contains("expected 1 <= rows <= 10 (the queries given), got 0"));
  CHECK_THROWS_WITH(make_route_set(Q, K, 11, 3, cpu_knn_engine{}), Contains("got 11"));
  CHECK_THROWS_WITH(make_route_set(Q, K, 2, 0, cpu_knn_engine{}),
                    Contains("expected list_len >= 1, got 0"));
  CHECK_THROWS_WITH(
      make_route_set(Q, matrix_view<const float>(keys.data(), 0, 4), 2, 3, cpu_knn_engine{}),
      Contains("at least one key, got 0"));
  CHECK_THROWS_AS(
      make_route_set(Q, matrix_view<const float>(keys.data(), 10, 8), 2, 3, cpu_knn_engine{}),
      dimension_mismatch);
  std::vector<float> nan_keys(keys);
  nan_keys[7] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_AS(
      make_route_set(Q, matrix_view<const float>(nan_keys.data(), 20, 4), 2, 3, cpu_knn_engine{}),
      non_finite_value);
  CHECK_THROWS_WITH(
      make_route_set(Q, K, 2, std::numeric_limits<std::size_t>::max(), cpu_knn_engine{}),
      Contains("overflows"));
  const route_set rs = make_route_set(Q, K, 4, 3, cpu_knn_engine{});
  std::vector<id_t> out(12);
  CHECK_THROWS_WITH(route_seeds(rs, std::span<const float>(queries.data(), 4), 0, out),
                    Contains("expected top >= 1, got 0"));
  CHECK_THROWS_WITH(route_seeds(rs, std::span<const float>(queries.data(), 4), 5, out),
                    Contains("at least top x list_len = 15 ids, got 12"));
  CHECK_THROWS_AS(route_seeds(rs, std::span<const float>(queries.data(), 3), 2, out),
                  dimension_mismatch);
  CHECK_THROWS_WITH(route_seeds(rs, std::span<const float>(queries.data(), 4),
                                std::numeric_limits<std::size_t>::max(), out),
                    Contains("overflows"));
}

TEST_CASE("offer_route keeps the best scores, ties to the lower index, in any offering order",
          "[index][route]") {
  // route_seeds offers rows in ascending order, where the first offered wins a tie anyway: the
  // rule is checked here with the offers shuffled (the routing of a probe's clusters, or a
  // future caller, need not offer in index order).
  std::mt19937_64 rng(5);
  for (std::uint64_t trial = 0; trial < 60; ++trial) {
    const std::size_t n = 24;
    const auto scores = integers(n, 1, 100 + trial);  // -2..2: many ties
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::pair<float, std::size_t>> model;
    for (std::size_t i = 0; i < n; ++i) model.push_back({scores[i], i});
    std::sort(model.begin(), model.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    for (const std::size_t top : {1, 5, 30}) {
      std::vector<std::pair<float, std::size_t>> best;
      for (const std::size_t i : order) detail::offer_route(best, top, scores[i], i);
      const std::vector<std::pair<float, std::size_t>> want(
          model.begin(), model.begin() + std::ptrdiff_t(std::min(top, n)));
      CHECK(best == want);
    }
  }
}

TEST_CASE(
    "cluster_routes without rounds: each row to its nearest starting row, ties to the lower "
    "cluster, empty clusters dropped",
    "[index][route]") {
  // Quarter data: every score against a starting row (a row itself) is exact, ties included.
  constexpr std::size_t d = 16, n = 90, list = 3, clusters = 7, step = n / clusters;  // 12
  auto v = quarters(n, d, 21);
  // Cluster 2 starts at a copy of cluster 0's start: every row scores the two equally, so
  // cluster 2 stays empty and is dropped.
  std::copy_n(v.begin(), d, v.begin() + std::ptrdiff_t(2 * step * d));
  const route_set before = tagged_set(v, d, list);
  route_set rs = before;
  cluster_routes(rs, clusters, 0);
  std::vector<std::size_t> of(n), count(clusters, 0);
  std::size_t ties = 0;  // rows whose best score two clusters share (besides the copied start)
  for (std::size_t r = 0; r < n; ++r) {
    double best = -2;
    std::size_t at = 0, shared = 0;
    for (std::size_t c = 0; c < clusters; ++c) {
      const double s = dot(&v[r * d], &v[c * step * d], d);
      if (s > best) {
        best = s;
        at = c;
        shared = 0;
      } else if (s == best && c != 2) {
        ++shared;
      }
    }
    of[r] = at;
    ++count[at];
    ties += shared > 0 ? 1 : 0;
  }
  INFO(ties << " rows with a tie");
  REQUIRE(count[2] == 0);
  CHECK(ties >= 10);
  std::vector<std::size_t> order(n), bounds{0};
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return of[a] < of[b]; });
  for (const std::size_t k : count) {
    if (k > 0) bounds.push_back(bounds.back() + k);
  }
  CHECK(rs.clusters() == clusters - 1);
  CHECK(rs.cluster_rows == bounds);
  for (std::size_t i = 0; i < n; ++i) CHECK(rs.lists[i * list] == before.lists[order[i] * list]);
  check_clustered(rs, before);
}

TEST_CASE("cluster_routes groups the rows by their best centroid, stably and deterministically",
          "[index][route]") {
  constexpr std::size_t d = 16;
  struct setting {
    const char* name;
    std::vector<float> rows;
    std::size_t clusters, iterations;
  };
  const setting settings[] = {{"8 groups, 8 clusters", grouped_quarters(400, 8, 41), 8, 10},
                              {"12 groups, 20 clusters", grouped_quarters(400, 12, 42), 20, 10},
                              {"no groups, 10 clusters, 100 rounds", quarters(300, d, 43), 10, 100},
                              {"one cluster", quarters(50, d, 44), 1, 10},
                              {"a cluster per row", quarters(40, d, 45), 40, 10}};
  for (const auto& st : settings) {
    INFO(st.name);
    const route_set before = tagged_set(st.rows, d, 4);
    route_set rs = before;
    cluster_routes(rs, st.clusters, st.iterations);
    check_clustered(rs, before);
    CHECK(rs.clusters() <= st.clusters);
    // Each row's cluster scores it highest: k-means has settled (the data and rounds are chosen
    // for it), so the last assignment holds against the final centroids; float sums leave
    // near-ties either way, hence the margin.
    std::size_t c = 0, wrong = 0;
    for (std::size_t i = 0; i < rs.rows(); ++i) {
      while (i >= rs.cluster_rows[c + 1]) ++c;
      const double own = dot(&rs.vectors[i * d], &rs.centroids[c * d], d);
      for (std::size_t o = 0; o < rs.clusters(); ++o) {
        wrong += dot(&rs.vectors[i * d], &rs.centroids[o * d], d) > own + 1e-5 ? 1 : 0;
      }
    }
    CHECK(wrong == 0);
    route_set again = before;
    cluster_routes(again, st.clusters, st.iterations);
    CHECK(same_set(rs, again));
    // A clustered set is clustered again from its current row order, as a flat one would be.
    route_set flat = rs;
    flat.centroids.clear();
    flat.cluster_rows.clear();
    cluster_routes(flat, 1 + st.clusters / 2, st.iterations);
    again = rs;
    cluster_routes(again, 1 + st.clusters / 2, st.iterations);
    CHECK(same_set(flat, again));
    // Probing every cluster is the flat routing, id for id.
    const auto queries = quarters(40, d, 46);
    for (std::size_t e = 0; e < 40; ++e) {
      const std::span<const float> q(queries.data() + e * d, d);
      std::vector<id_t> want(5 * 4), got(5 * 4);
      route_seeds(rs, q, 5, want);
      route_seeds(rs, q, 5, got, rs.clusters());
      CHECK(got == want);
      route_seeds(rs, q, 5, got, rs.clusters() + 3);
      CHECK(got == want);
    }
  }
}

TEST_CASE(
    "route_seeds with probe routes among the best clusters' rows, ties to the lower "
    "cluster and row",
    "[index][route]") {
  constexpr std::size_t d = 5, rows = 30, list = 2, clusters = 6;
  route_set rs = tagged_set(integers(rows, d, 31), d, list);
  rs.cluster_rows = {0, 4, 4, 11, 12, 20, 30};  // cluster 1 empty, cluster 3 a single row
  rs.centroids = integers(clusters, d, 32);
  // Exact ties the rules must break: cluster 4's centroid is cluster 2's; row 25 (cluster 5)
  // is row 5 (cluster 2) and row 13 (cluster 4) is row 3 (cluster 0).
  std::copy_n(rs.centroids.begin() + 2 * d, d, rs.centroids.begin() + 4 * d);
  std::copy_n(rs.vectors.begin() + 5 * d, d, rs.vectors.begin() + 25 * d);
  std::copy_n(rs.vectors.begin() + 3 * d, d, rs.vectors.begin() + 13 * d);
  auto score = [&](const float* q, const float* v) {
    float s = 0;  // small integers: exact in any order
    for (std::size_t c = 0; c < d; ++c) s += q[c] * v[c];
    return s;
  };
  const auto queries = integers(120, d, 33);
  std::size_t cluster_ties = 0, row_ties = 0;  // a tie at the cut decided the result
  for (std::size_t e = 0; e < 120; ++e) {
    const float* q = queries.data() + e * d;
    const std::span<const float> qs(q, d);
    std::vector<std::pair<float, std::size_t>> cs;  // (-score, cluster): ascending = best first
    for (std::size_t c = 0; c < clusters; ++c) cs.push_back({-score(q, &rs.centroids[c * d]), c});
    std::sort(cs.begin(), cs.end());
    std::vector<id_t> flat(9 * list);
    CHECK(route_seeds(rs, qs, 9, flat) == rows);
    for (const std::size_t probe : {1, 2, 3, 5, 6, 9}) {
      const std::size_t taken = std::min(probe, clusters);
      if (taken < clusters && cs[taken - 1].first == cs[taken].first) ++cluster_ties;
      std::vector<std::pair<float, std::size_t>> rsc;  // (-score, row) of the probed rows
      for (std::size_t t = 0; t < taken; ++t) {
        const std::size_t c = cs[t].second;
        for (std::size_t r = rs.cluster_rows[c]; r < rs.cluster_rows[c + 1]; ++r) {
          rsc.push_back({-score(q, &rs.vectors[r * d]), r});
        }
      }
      std::sort(rsc.begin(), rsc.end());
      for (const std::size_t top : {1, 3, 9}) {
        if (top < rsc.size() && rsc[top - 1].first == rsc[top].first) ++row_ties;
        std::vector<id_t> want(top * list + 1, invalid_id), got(top * list + 1, 7);
        want[top * list] = 7;  // nothing written past top * list_len
        for (std::size_t t = 0; t < std::min(top, rsc.size()); ++t) {
          for (std::size_t j = 0; j < list; ++j) {
            want[t * list + j] = rs.lists[rsc[t].second * list + j];
          }
        }
        // The reads it reports: every centroid, then the probed clusters' rows.
        CHECK(route_seeds(rs, qs, top, got, probe) == clusters + rsc.size());
        CHECK(got == want);
        if (probe >= clusters) {
          CHECK(std::equal(got.begin(), got.begin() + std::ptrdiff_t(top * list), flat.begin()));
        }
      }
    }
  }
  INFO(cluster_ties << " cluster ties, " << row_ties << " row ties at the cut");
  CHECK(cluster_ties >= 20);
  CHECK(row_ties >= 20);
  // A non-finite query: no seeds, probed or not.
  std::vector<float> bad(queries.begin(), queries.begin() + std::ptrdiff_t(d));
  bad[1] = std::numeric_limits<float>::quiet_NaN();
  std::vector<id_t> out(4 * list, 7);
  CHECK(route_seeds(rs, bad, 4, out, 2) == 0);
  CHECK(std::all_of(out.begin(), out.end(), [](id_t x) { return x == invalid_id; }));
  // Probing needs clusters.
  route_set plain = rs;
  plain.centroids.clear();
  plain.cluster_rows.clear();
  CHECK_THROWS_AS(route_seeds(plain, std::span<const float>(queries.data(), d), 2, out, 1),
                  invalid_argument);
  CHECK_THROWS_WITH(route_seeds(plain, std::span<const float>(queries.data(), d), 2, out, 3),
                    Contains("probe 3 needs a clustered set"));
  route_seeds(plain, std::span<const float>(queries.data(), d), 2, out, 0);  // flat: fine
}

TEST_CASE("cluster_routes rejects bad input and leaves the set unchanged", "[index][route]") {
  route_set rs = tagged_set(quarters(10, 16, 51), 16, 3);
  cluster_routes(rs, 2);  // clustered already: a failed call must not drop its clusters
  const route_set kept = rs;
  CHECK_THROWS_WITH(cluster_routes(rs, 0),
                    Contains("expected 1 <= clusters <= 10 (the routing rows), got 0"));
  CHECK(same_set(rs, kept));
  CHECK_THROWS_WITH(cluster_routes(rs, 11), Contains("got 11"));
  CHECK(same_set(rs, kept));
  route_set bad = kept;
  bad.vectors.push_back(0.25f);  // not rows x dim
  const route_set bad_kept = bad;
  CHECK_THROWS_WITH(cluster_routes(bad, 2), Contains("expected vectors of rows x dim = 160"));
  CHECK(same_set(bad, bad_kept));
  bad = kept;
  bad.lists.pop_back();  // not rows x list_len
  const route_set short_lists = bad;
  CHECK_THROWS_AS(cluster_routes(bad, 2), invalid_argument);
  CHECK(same_set(bad, short_lists));
  route_set empty;
  CHECK_THROWS_AS(cluster_routes(empty, 1), invalid_argument);
  CHECK(same_set(empty, route_set{}));
}

TEST_CASE("clustered routes find the flat routes' seeds reading a fraction of the rows",
          "[index][route]") {
  // All 2000 training queries as routes, clustered into 45 (about sqrt(rows)): probing the best
  // 4 clusters reads about 256 vectors, yet must pick the flat scan's best 4 routes for at least
  // 75% of the evaluation queries, and its seeds must hold more of the exact top-10 than those
  // of a flat set of 500 rows (which reads 500). Measured: 84% of the queries, seeds holding
  // 0.808 of the top-10 against 0.759. Rows assigned to clusters by index instead of by
  // centroid: 0% and 0.717; the worst clusters probed: 0% and 0.29. Probing one cluster must
  // cost seed quality (0.766 against 0.808 for all 45): a probe that ignored the clusters would
  // not. The search from the probed seeds passes the flat routes' test above (cold recall with
  // a quarter fewer keys scored; measured 0.934 / 211 keys against 0.729 / 359).
  const auto& f = kvsift_test::ood();
  const route_set flat = make_route_set(f.train, f.keys, 2000, 10, cpu_knn_engine{});
  const route_set small = make_route_set(f.train, f.keys, 500, 10, cpu_knn_engine{});
  route_set rs = flat;
  cluster_routes(rs, 45);
  REQUIRE(rs.clusters() >= 40);  // at most a few empty clusters dropped
  const std::size_t d = f.eval.cols();
  struct routing {
    double agree = 0, seed_recall = 0, read = 0;
  };
  std::vector<id_t> seeds(40), flat_seeds(40);
  auto route = [&](const route_set& set, std::size_t probe) {
    routing o;
    for (std::size_t e = 0; e < f.eval.rows(); ++e) {
      const std::span<const float> q(f.eval.row(e), d);
      route_seeds(set, q, 4, seeds, probe);
      route_seeds(flat, q, 4, flat_seeds);
      o.agree += seeds == flat_seeds ? 1 : 0;
      for (const id_t t : f.truth[e]) {
        o.seed_recall += std::find(seeds.begin(), seeds.end(), t) != seeds.end() ? 1 : 0;
      }
      if (probe == 0) {
        o.read += double(set.rows());
        continue;
      }
      std::vector<std::pair<double, std::size_t>> cs;  // (-score, cluster)
      for (std::size_t c = 0; c < set.clusters(); ++c) {
        cs.push_back({-dot(q.data(), &set.centroids[c * d], d), c});
      }
      std::sort(cs.begin(), cs.end());
      o.read += double(set.clusters());
      for (std::size_t t = 0; t < std::min(probe, cs.size()); ++t) {
        o.read += double(set.cluster_rows[cs[t].second + 1] - set.cluster_rows[cs[t].second]);
      }
    }
    const double m = double(f.eval.rows());
    o.agree /= m;
    o.seed_recall /= m * 10;
    o.read /= m;
    return o;
  };
  const routing p1 = route(rs, 1), p4 = route(rs, 4), all = route(rs, rs.clusters());
  const routing r500 = route(small, 0);
  INFO("probe 1: routes " << p1.agree << ", seeds " << p1.seed_recall << ", read " << p1.read
                          << "; probe 4: " << p4.agree << ", " << p4.seed_recall << ", " << p4.read
                          << "; all: " << all.agree << ", " << all.seed_recall
                          << "; flat 500: seeds " << r500.seed_recall);
  CHECK(all.agree == 1.0);
  CHECK(p4.agree >= 0.75);
  CHECK(p4.read <= 0.2 * double(flat.rows()));
  CHECK(p4.seed_recall > r500.seed_recall + 0.02);
  CHECK(p4.read < r500.read);
  CHECK(p1.seed_recall < all.seed_recall - 0.02);
  CHECK(p1.agree < p4.agree);

  // Probed clusters may hold fewer than 4 rows: the padding (invalid_id) is skipped by the
  // search.
  auto search = [&](std::size_t probe, std::size_t limit) {
    return ood_search(limit, [&](std::span<const float> q) -> std::span<const id_t> {
      if (probe == 0) return {};
      route_seeds(rs, q, 4, seeds, probe);
      return seeds;
    });
  };
  const auto [cold_recall, cold_scored] = search(0, 0);
  const auto [recall, scored] = search(4, 12);
  INFO("cold " << cold_recall << " / " << cold_scored << ", probe 4 " << recall << " / " << scored);
  CHECK(recall >= cold_recall);
  CHECK(scored <= 0.75 * cold_scored);
}

TEST_CASE("route_seeds refuses a set whose arrays disagree, probed or not", "[index][route]") {
  constexpr std::size_t d = 4, list = 3;
  route_set good = tagged_set(integers(12, d, 61), d, list);
  good.cluster_rows = {0, 5, 12};
  good.centroids = integers(2, d, 62);
  const auto q = integers(1, d, 63);
  std::vector<id_t> out(2 * list);
  for (const std::size_t probe : {0, 1}) {
    INFO("probe " << probe);
    CHECK(route_seeds(good, q, 2, out, probe) > 0);
    CHECK(detail::check_route_seeds(good, d, 2, out.size(), probe) == 2 * list);
    auto refused = [&](auto mend, const char* message) {
      route_set bad = good;
      mend(bad);
      INFO(message);
      std::fill(out.begin(), out.end(), id_t{7});
      CHECK_THROWS_WITH(route_seeds(bad, q, 2, out, probe), Contains(message));
      CHECK(std::all_of(out.begin(), out.end(), [](id_t x) { return x == 7; }));
      CHECK_THROWS_WITH(detail::check_route_seeds(bad, d, 2, out.size(), probe), Contains(message));
    };
    // Lists shorter than rows x list_len: the best row's list would be read past their end.
    refused([](route_set& r) { r.lists.resize(r.lists.size() - 1); },
            "expected lists of rows x list_len = 12 x 3 ids, got 35");
    refused([](route_set& r) { r.vectors.push_back(1.0f); },
            "expected vectors of a whole number of rows of dim = 4 floats, got 49");
    refused(
        [](route_set& r) {
          r.list_len = 0;
          r.lists.clear();
        },
        "expected list_len >= 1 for 12 rows, got 0");
    refused(
        [](route_set& r) {
          r.cluster_rows = {0, 5, 11};
        },
        "expected 2 centroids of 4 floats and cluster bounds ascending from 0 to 12, got 8 "
        "floats and bounds from 0 to 11");
    refused([](route_set& r) { r.cluster_rows = {0, 13, 12}; }, "cluster bounds ascending");
    refused([](route_set& r) { r.centroids.pop_back(); }, "got 7 floats");
    refused([](route_set& r) { r.cluster_rows.clear(); },
            "expected no centroids without cluster bounds, got 8 floats");
  }
  CHECK_THROWS_WITH(detail::check_route_seeds(good, d, 3, out.size(), 0),
                    Contains("at least top x list_len = 9 ids, got 6"));
  CHECK_THROWS_AS(detail::check_route_seeds(good, d + 1, 2, out.size(), 0), dimension_mismatch);
}

namespace {

/// Graph g's set read back from a stack (lists cut to `list_len`): the inverse of stacking.
route_set unstacked(const route_set_stack& st, std::size_t g, std::size_t list_len) {
  route_set rs;
  const auto r0 = std::size_t(st.offset[g]), r1 = std::size_t(st.offset[g + 1]);
  rs.dim = r1 > r0 ? st.dim : 0;
  rs.list_len = list_len;
  rs.vectors.assign(st.vectors.begin() + std::ptrdiff_t(r0 * st.dim),
                    st.vectors.begin() + std::ptrdiff_t(r1 * st.dim));
  for (std::size_t r = r0; r < r1; ++r) {
    const auto row = st.lists.begin() + std::ptrdiff_t(r * st.list_len);
    rs.lists.insert(rs.lists.end(), row, row + std::ptrdiff_t(list_len));
    // Past the set's own list_len: padding only.
    CHECK(std::all_of(row + std::ptrdiff_t(list_len), row + std::ptrdiff_t(st.list_len),
                      [](id_t x) { return x == invalid_id; }));
  }
  if (st.clustered() && st.cluster_offset[g + 1] > st.cluster_offset[g]) {
    const auto c0 = std::size_t(st.cluster_offset[g]), c1 = std::size_t(st.cluster_offset[g + 1]);
    rs.centroids.assign(st.centroids.begin() + std::ptrdiff_t(c0 * st.dim),
                        st.centroids.begin() + std::ptrdiff_t(c1 * st.dim));
    for (std::size_t c = c0; c <= c1; ++c) rs.cluster_rows.push_back(st.cluster_rows[c] - r0);
  }
  return rs;
}

/// Checks `st` against the sets it stacked: each graph's rows, lists, centroids and bounds
/// read back equal its set, and the maxima are those of the sets.
void check_stack(const route_set_stack& st, const std::vector<const route_set*>& sets) {
  REQUIRE(st.graphs() == sets.size());
  CHECK(st.offset.front() == 0);
  std::size_t max_rows = 0, max_clusters = 0, max_cluster_rows = 0, list_len = 0;
  for (std::size_t g = 0; g < sets.size(); ++g) {
    INFO("graph " << g);
    const route_set& rs = *sets[g];
    route_set want = rs;
    if (rs.rows() == 0) want = route_set{0, rs.list_len, {}, {}, {}, {}};
    CHECK(same_set(unstacked(st, g, rs.list_len), want));
    max_rows = std::max(max_rows, rs.rows());
    max_clusters = std::max(max_clusters, rs.clusters());
    for (std::size_t c = 0; c < rs.clusters(); ++c) {
      max_cluster_rows = std::max(max_cluster_rows, rs.cluster_rows[c + 1] - rs.cluster_rows[c]);
    }
    list_len = std::max(list_len, rs.list_len);
  }
  CHECK(st.list_len == list_len);
  CHECK(st.vectors.size() == std::size_t(st.offset.back()) * st.dim);
  CHECK(st.lists.size() == std::size_t(st.offset.back()) * st.list_len);
  CHECK(st.max_rows == max_rows);
  CHECK(st.max_clusters == max_clusters);
  CHECK(st.max_cluster_rows == max_cluster_rows);
  if (st.clustered()) {
    CHECK(st.cluster_rows.size() == std::size_t(st.cluster_offset.back()) + 1);
    CHECK(st.cluster_rows.back() == st.offset.back());
    CHECK(std::is_sorted(st.cluster_rows.begin(), st.cluster_rows.end()));
  }
}

}  // namespace

TEST_CASE("stack_route_sets lays the sets out for the device, padding shorter lists",
          "[index][route]") {
  constexpr std::size_t d = 16;
  const route_set a = tagged_set(quarters(30, d, 71), d, 4);
  const route_set b = tagged_set(quarters(7, d, 72), d, 2);  // shorter lists: padded
  const route_set none{d, 4, {}, {}, {}, {}};                // a graph with no routes
  SECTION("flat") {
    const std::vector<const route_set*> sets{&a, &none, &b, &a};  // a named twice
    const route_set_stack st = stack_route_sets(sets);
    CHECK(!st.clustered());
    CHECK(st.offset == std::vector<std::int64_t>{0, 30, 30, 37, 67});
    CHECK(st.cluster_offset.empty());
    CHECK(st.centroids.empty());
    check_stack(st, sets);
  }
  SECTION("clustered") {
    route_set ca = a, cb = b;
    cluster_routes(ca, 5);
    cluster_routes(cb, 3);
    REQUIRE(ca.clusters() >= 2);
    const std::vector<const route_set*> sets{&ca, &cb, &none, &ca};
    const route_set_stack st = stack_route_sets(sets);
    CHECK(st.clustered());
    CHECK(st.cluster_offset ==
          std::vector<std::int64_t>{0, std::int64_t(ca.clusters()),
                                    std::int64_t(ca.clusters() + cb.clusters()),
                                    std::int64_t(ca.clusters() + cb.clusters()),
                                    std::int64_t(2 * ca.clusters() + cb.clusters())});
    check_stack(st, sets);
    // The span overload stacks every set in order.
    const std::vector<route_set> owned{ca, cb};
    check_stack(stack_route_sets(std::span<const route_set>(owned)), {&owned[0], &owned[1]});
  }
  SECTION("a set with no rows first takes no part in the dim or the layout") {
    const route_set odd{3, 1, {}, {}, {}, {}};
    const std::vector<const route_set*> sets{&odd, &a};
    check_stack(stack_route_sets(sets), sets);
  }
}

TEST_CASE("stack_route_sets refuses bad sets before allocating", "[index][route]") {
  constexpr std::size_t d = 16;
  const route_set a = tagged_set(quarters(30, d, 81), d, 4);
  route_set ca = a;
  cluster_routes(ca, 4);
  const route_set other = tagged_set(quarters(5, 8, 82), 8, 4);
  route_set broken = a;
  broken.lists.pop_back();
  using sets = std::vector<const route_set*>;
  CHECK_THROWS_WITH(stack_route_sets(sets{}), Contains("expected at least one routing set"));
  CHECK_THROWS_WITH(stack_route_sets(sets{&a, nullptr}), Contains("set 1 is null"));
  CHECK_THROWS_AS(stack_route_sets(sets{&a, &other}), dimension_mismatch);
  CHECK_THROWS_WITH(stack_route_sets(sets{&a, &ca}),
                    Contains("expected every set with rows flat as set 0, set 1 is clustered"));
  CHECK_THROWS_WITH(stack_route_sets(sets{&ca, &a}),
                    Contains("expected every set with rows clustered as set 0, set 1 is flat"));
  CHECK_THROWS_WITH(stack_route_sets(sets{&a, &broken}), Contains("expected lists of rows"));
  // Sizes that overflow are refused by the checked products, not allocated: a set's own lists,
  // and the stack's, padded to the longest list_len (that of a set with no rows).
  const route_set long_lists{1, std::numeric_limits<std::size_t>::max() / 2, {1, 2, 3, 4}, {}, {},
                             {}};
  CHECK_THROWS_WITH(stack_route_sets(sets{&long_lists}), Contains("overflows"));
  const route_set four{1, 1, {1, 2, 3, 4}, {0, 1, 2, 3}, {}, {}};
  const route_set empty_long{1, std::numeric_limits<std::size_t>::max() / 2, {}, {}, {}, {}};
  CHECK_THROWS_WITH(stack_route_sets(sets{&four, &empty_long}),
                    Contains("stack_route_sets: rows x list_len"));
}
