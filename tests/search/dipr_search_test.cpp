#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "kvsift/index/flat_index.hpp"
#include "kvsift/index/roargraph_builder.hpp"
#include "kvsift/search/beam_search.hpp"
#include "kvsift/search/dipr_search.hpp"
#include "kvsift/testing/ood_generator.hpp"
#include "search_fixture.hpp"

namespace {

using namespace kvsift_test;  // NOLINT(google-build-using-namespace): fixture, fx, message_of

}  // namespace

TEST_CASE("dipr_search: range property and recall of the exact DIPR set", "[search][dipr]") {
  const auto& f = fx();
  const kvsift::dipr_params p{.beta = 2.0f, .l0 = 64};
  const auto exact = kvsift::exact_dipr(f.flat, f.eval, p, 2);
  kvsift::search_workspace ws;
  kvsift::dipr_result r;
  std::size_t hit = 0, total = 0;
  for (std::size_t i = 0; i < f.eval.rows(); ++i) {
    kvsift::dipr_search(f.graph, f.eval.row_span(i), p, ws, r);
    REQUIRE(r.ids.size() == r.scores.size());
    CHECK(r.stats.count == r.ids.size());
    CHECK(r.best_score <= exact[i].best_score);
    std::set<id_t> uniq(r.ids.begin(), r.ids.end());
    CHECK(uniq.size() == r.ids.size());
    for (std::size_t j = 0; j < r.ids.size(); ++j) {
      REQUIRE(r.scores[j] >= r.best_score - p.beta);
      REQUIRE(r.scores[j] ==
              kvsift::inner_product::score(f.eval.row(i), f.store.row(r.ids[j]), 32));
    }
    for (id_t id : exact[i].ids) hit += uniq.count(id);
    total += exact[i].ids.size();
  }
  const double recall = static_cast<double>(hit) / static_cast<double>(total);
  WARN("dipr recall (beta 2, l0 64): " << recall << " over " << total << " exact ids");
  CHECK(recall >= 0.97);  // measured 0.992
}

TEST_CASE("dipr_search: window seeding and capping", "[search][dipr]") {
  const auto& f = fx();
  kvsift::search_workspace ws;
  kvsift::dipr_result plain, seeded, above, capped, ex;
  for (std::size_t i = 0; i < 10; ++i) {
    const auto q = f.eval.row_span(i);
    f.flat.dipr(q, {.beta = 2.0f}, ws, ex);
    kvsift::dipr_search(f.graph, q, {.beta = 2.0f, .l0 = 64}, ws, plain);
    kvsift::dipr_search(f.graph, q, {.beta = 2.0f, .l0 = 64, .seed_score = ex.best_score}, ws,
                        seeded);
    const std::set<id_t> ps(plain.ids.begin(), plain.ids.end());
    for (id_t id : seeded.ids) CHECK(ps.count(id) == 1);
    kvsift::dipr_search(f.graph, q, {.beta = 2.0f, .l0 = 64, .seed_score = ex.best_score + 100}, ws,
                        above);
    CHECK(above.ids.empty());
    CHECK(above.best_score == ex.best_score + 100);
    kvsift::dipr_search(f.graph, q, {.beta = 1000.0f, .l0 = 4, .max_candidates = 8}, ws, capped);
    CHECK(capped.capped);
    CHECK(capped.ids.size() <= 8);
  }
  std::vector<float> nanq(32, std::numeric_limits<float>::quiet_NaN());
  CHECK_NOTHROW(kvsift::dipr_search(f.graph, nanq, {}, ws, plain));
  CHECK(plain.ids.empty());
}

TEST_CASE("dipr_search: max_hops stops the walk and marks it capped", "[search][dipr]") {
  // A cap at or above a search's own hops changes nothing; below them the search expands
  // exactly max_hops nodes, scores fewer keys, and is capped.
  const auto& f = fx();
  kvsift::search_workspace ws;
  kvsift::dipr_result plain, capped;
  std::size_t cut = 0;
  for (std::size_t i = 0; i < 20; ++i) {
    const auto q = f.eval.row_span(i);
    const kvsift::dipr_params p{.beta = 2.0f, .l0 = 32};
    kvsift::dipr_search(f.graph, q, p, ws, plain);
    REQUIRE_FALSE(plain.capped);
    kvsift::dipr_params at = p;
    at.max_hops = plain.stats.hops;
    kvsift::dipr_search(f.graph, q, at, ws, capped);
    CHECK_FALSE(capped.capped);
    CHECK(capped.ids == plain.ids);
    CHECK(capped.stats.hops == plain.stats.hops);
    at.max_hops = plain.stats.hops / 2;
    if (at.max_hops == 0) continue;
    kvsift::dipr_search(f.graph, q, at, ws, capped);
    CHECK(capped.capped);
    CHECK(capped.stats.hops == at.max_hops);
    CHECK(capped.stats.distance_computations < plain.stats.distance_computations);
    ++cut;
  }
  CHECK(cut >= 10);
}

TEST_CASE("dipr_search rejects bad input", "[search][dipr]") {
  const auto& f = fx();
  kvsift::search_workspace ws;
  kvsift::dipr_result r;
  std::vector<float> q(32, 0.5f);
  auto run = [&](kvsift::dipr_params p) { kvsift::dipr_search(f.graph, q, p, ws, r); };
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { run({.beta = -0.5f}); }), Contains("-0.5"));
  CHECK_THAT(message_of<kvsift::invalid_argument>(
                 [&] { run({.beta = std::numeric_limits<float>::quiet_NaN()}); }),
             Contains("nan"));
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { run({.l0 = 0}); }), Contains("got 0"));
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { run({.l0 = 16, .max_candidates = 8}); }),
             Contains("16") && Contains("got 8"));
  CHECK_THAT(message_of<kvsift::dimension_mismatch>([&] {
               kvsift::dipr_search(f.graph, std::span<const float>(q).first(3), {}, ws, r);
             }),
             Contains("32") && Contains("got 3"));
  const std::vector<id_t> bad = {4000};
  CHECK_THAT(message_of<kvsift::out_of_range>(
                 [&] { kvsift::dipr_search(f.graph, q, {}, ws, r, kvsift::no_filter{}, bad); }),
             Contains("4000"));
}

// Contract: a query holding NaN or Inf yields an empty answer, with a worst best_score
// (or the seed when one was given), unfiltered and filtered, graph and flat alike.
TEST_CASE("dipr_search: a non-finite query returns an empty answer", "[search][dipr][rel]") {
  const auto& f = fx();
  kvsift::search_workspace ws;
  kvsift::dipr_result r;
  const kvsift::id_below prefix{1000};
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity()}) {
    std::vector<float> q(f.eval.row(0), f.eval.row(0) + 32);
    q[3] = bad;
    kvsift::dipr_search(f.graph, q, {.beta = 5.0f}, ws, r);
    CHECK(r.ids.empty());
    CHECK(r.scores.empty());
    CHECK(r.stats.count == 0);
    CHECK(r.best_score == -std::numeric_limits<float>::infinity());
    kvsift::dipr_search(f.graph, q, {.beta = 5.0f}, ws, r, prefix);
    CHECK(r.ids.empty());
    kvsift::dipr_search(f.graph, q, {.beta = 5.0f, .seed_score = 2.5f}, ws, r);
    CHECK(r.ids.empty());
    CHECK(r.best_score == 2.5f);
    f.flat.dipr(q, {.beta = 5.0f}, ws, r);
    CHECK(r.ids.empty());
    CHECK(r.best_score == -std::numeric_limits<float>::infinity());
  }
}

// Regression: best_score came back -inf whenever the best key was infinite, +inf included.
TEST_CASE("dipr_search: an infinite best score is reported as +inf", "[search][dipr][rel]") {
  std::vector<float> keys = {3e38f, 1.0f, 2.0f};  // 3 keys of dimension 1
  const store_t s(kvsift::matrix_view<const float>(keys.data(), 3, 1));
  const kvsift::graph_index<store_t> g(s, 2, {1, 2, 0, 2, 0, 1}, 1);
  const kvsift::flat_index<store_t> flat(s);
  const std::vector<float> q = {10.0f};  // 10 * 3e38 overflows to +inf: a real, infinite score
  kvsift::search_workspace ws;
  kvsift::dipr_result r;
  kvsift::dipr_search(g, q, {.beta = 1.0f, .l0 = 2}, ws, r);
  CHECK(r.best_score == std::numeric_limits<float>::infinity());
  REQUIRE(r.ids.size() == 1);
  CHECK(r.ids[0] == 0);
  flat.dipr(q, {.beta = 1.0f}, ws, r);
  CHECK(r.best_score == std::numeric_limits<float>::infinity());
}

// Regression: l0 and the automatic cap 64 * l0 were used unclamped: a huge l0 reserved
// (or threw length_error) and 64 * l0 could wrap to a cap of 0.
TEST_CASE("dipr_search: a huge l0 behaves as l0 = n", "[search][dipr][rel]") {
  const auto& f = fx();
  kvsift::search_workspace ws;
  kvsift::dipr_result a, b;
  const auto q = f.eval.row_span(1);
  kvsift::dipr_search(f.graph, q, {.beta = 3.0f, .l0 = std::size_t{1} << 58}, ws, a);
  kvsift::dipr_search(f.graph, q, {.beta = 3.0f, .l0 = 2000}, ws, b);
  CHECK_FALSE(a.capped);
  CHECK_FALSE(a.ids.empty());
  CHECK(a.ids == b.ids);
}
