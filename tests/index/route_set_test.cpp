#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
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
    const float* src = Q.row(i * 10);  // floor(103 / 10) = 10
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
  static const auto g = roargraph_builder<inner_product>(kvsift_test::ood_build_params())
                            .build(view_store<float>(f.keys), f.train);
  const route_set rs = make_route_set(f.train, f.keys, 500, 10, cpu_knn_engine{});
  search_workspace ws;
  std::vector<id_t> ids(10), seeds(40);
  std::vector<float> sc(10);
  auto measure = [&](bool routed, bool worst, std::size_t limit) {
    double hit = 0, scored = 0;
    for (std::size_t e = 0; e < f.eval.rows(); ++e) {
      const std::span<const float> q(f.eval.row(e), f.eval.cols());
      std::span<const id_t> extra;
      if (routed) {
        if (worst) {
          std::vector<float> neg(q.begin(), q.end());
          for (auto& x : neg) x = -x;
          route_seeds(rs, neg, 4, seeds);
        } else {
          route_seeds(rs, q, 4, seeds);
        }
        extra = seeds;
      }
      const auto st =
          beam_search(g, q, beam_search_params{10, 20, 0, limit}, ws, ids, sc, no_filter{}, extra);
      for (std::size_t i = 0; i < st.count; ++i) {
        hit += std::count(f.truth[e].begin(), f.truth[e].end(), ids[i]);
      }
      scored += double(st.distance_computations);
    }
    return std::pair{hit / double(f.eval.rows() * 10), scored / double(f.eval.rows())};
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
