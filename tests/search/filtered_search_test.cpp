#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
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

namespace {

template <class P>
void check_filtered(const P& pred, const char* name, double min_topk, double min_dipr) {
  const auto& f = fx();
  kvsift::search_workspace ws;
  std::vector<id_t> ids(10), tids(10);
  std::vector<float> sc(10), tsc(10);
  kvsift::dipr_result r, ex;
  std::size_t hit = 0, total = 0, dhit = 0, dtotal = 0;
  for (std::size_t i = 0; i < f.eval.rows(); ++i) {
    const auto q = f.eval.row_span(i);
    kvsift::beam_search(f.graph, q, {10, 100}, ws, ids, sc, pred);
    f.flat.topk(q, 10, ws, tids, tsc, pred);
    for (id_t id : ids) {
      REQUIRE(id != kvsift::invalid_id);
      REQUIRE(pred(id));
      hit += std::find(tids.begin(), tids.end(), id) != tids.end();
    }
    total += 10;
    kvsift::dipr_search(f.graph, q, {.beta = 2.0f, .l0 = 64}, ws, r, pred);
    f.flat.dipr(q, {.beta = 2.0f}, ws, ex, pred);
    const std::set<id_t> got(r.ids.begin(), r.ids.end());
    for (id_t id : r.ids) REQUIRE(pred(id));
    for (id_t id : ex.ids) dhit += got.count(id);
    dtotal += ex.ids.size();
  }
  const double rt = static_cast<double>(hit) / static_cast<double>(total);
  const double rd = static_cast<double>(dhit) / static_cast<double>(dtotal);
  WARN(name << ": filtered beam recall@10 " << rt << ", filtered dipr recall " << rd);
  CHECK(rt >= min_topk);
  CHECK(rd >= min_dipr);
}

}  // namespace

TEST_CASE("filtered search with id_below (prefix reuse)", "[search][filtered]") {
  check_filtered(kvsift::id_below{600}, "id_below 30%", 0.97, 0.97);  // measured 1.0 and 0.9997+
}

TEST_CASE("filtered search with a random 10% allow list", "[search][filtered]") {
  std::mt19937 rng(4);
  std::vector<id_t> all(2000);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<id_t>(i);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(200);
  check_filtered(kvsift::id_allow_list(all, 2000), "allow list 10%", 0.97,
                 0.97);  // measured 1.0 and 0.9997+
}

TEST_CASE("filtered search with a borrowed 10% byte mask equals the allow list",
          "[search][filtered]") {
  std::mt19937 rng(5);
  std::vector<id_t> all(2000);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<id_t>(i);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(200);
  std::vector<std::uint8_t> mask(2000, 0);
  // Any nonzero byte passes (a uint8 mask need not be 0/1).
  for (id_t id : all) mask[id] = static_cast<std::uint8_t>(1 + id % 200);
  const kvsift::id_mask m{std::span<const std::uint8_t>(mask)};
  const kvsift::id_allow_list list(all, 2000);
  for (id_t id = 0; id < 2100; ++id) REQUIRE(m(id) == list(id));
  check_filtered(m, "byte mask 10%", 0.97, 0.97);
}

TEST_CASE("filtered search rejects bad predicates", "[search][filtered]") {
  const auto& f = fx();
  kvsift::search_workspace ws;
  std::vector<float> q(32, 0.5f);
  std::vector<id_t> ids(10);
  std::vector<float> sc(10);
  kvsift::dipr_result r;
  CHECK_THAT(message_of<kvsift::out_of_range>([&] {
               kvsift::beam_search(f.graph, q, {10, 20}, ws, ids, sc, kvsift::id_below{0});
             }),
             Contains("got 0"));
  CHECK_THAT(message_of<kvsift::out_of_range>([&] {
               kvsift::beam_search(f.graph, q, {10, 20}, ws, ids, sc, kvsift::id_below{2001});
             }),
             Contains("2001") && Contains("2000"));
  CHECK_THAT(message_of<kvsift::out_of_range>(
                 [&] { kvsift::dipr_search(f.graph, q, {}, ws, r, kvsift::id_below{2001}); }),
             Contains("2001"));
  CHECK_THAT(message_of<kvsift::out_of_range>([] {
               kvsift::id_allow_list({1, 2000}, 2000);
             }),
             Contains("2000"));
  CHECK_THAT(message_of<kvsift::out_of_range>([&] {
               kvsift::dipr_search(f.graph, q, {}, ws, r, kvsift::id_allow_list({1}, 1999));
             }),
             Contains("1999"));
  const std::vector<std::uint8_t> short_mask(1999, 1);
  CHECK_THAT(message_of<kvsift::dimension_mismatch>([&] {
               kvsift::beam_search(f.graph, q, {10, 20}, ws, ids, sc,
                                   kvsift::id_mask{std::span<const std::uint8_t>(short_mask)});
             }),
             Contains("2000") && Contains("1999"));
}

TEST_CASE("filtered walk scores at most max_degree nodes per expansion (ACORN cap)",
          "[search][filter]") {
  const auto& f = fx();
  kvsift::search_workspace ws;
  std::vector<id_t> ids(10);
  std::vector<float> scores(10);
  kvsift::dipr_result r;
  const std::size_t R = f.graph.max_degree();
  for (std::size_t prefix : {200u, 1000u}) {
    for (std::size_t i = 0; i < f.eval.rows(); ++i) {
      const auto s = kvsift::beam_search(f.graph, f.eval.row_span(i), {10, 64}, ws, std::span(ids),
                                         std::span(scores), kvsift::id_below{prefix});
      // Seeds contribute at most the entry's fan-out; every hop at most R more.
      CHECK(s.distance_computations <= R + s.hops * R);
      kvsift::dipr_search(f.graph, f.eval.row_span(i), {.beta = 1.0f, .l0 = 32}, ws, r,
                          kvsift::id_below{prefix});
      CHECK(r.stats.distance_computations <= R + r.stats.hops * R);
    }
  }
}

TEST_CASE("exact oracles take a predicate", "[search][filter]") {
  const auto& f = fx();
  const kvsift::id_below pred{700};
  const auto topk = kvsift::exact_topk(f.flat, f.eval, 10, 2, pred);
  const auto dipr = kvsift::exact_dipr(f.flat, f.eval, {.beta = 1.0f}, 2, pred);
  kvsift::search_workspace ws;
  std::vector<id_t> ids(10);
  std::vector<float> scores(10);
  kvsift::dipr_result r;
  for (std::size_t i = 0; i < f.eval.rows(); ++i) {
    f.flat.topk(f.eval.row_span(i), 10, ws, std::span(ids), std::span(scores), pred);
    CHECK(std::equal(ids.begin(), ids.end(), topk.row_ids(i).begin()));
    f.flat.dipr(f.eval.row_span(i), {.beta = 1.0f}, ws, r, pred);
    CHECK(r.ids == dipr[i].ids);
    for (id_t id : dipr[i].ids) CHECK(id < 700);
  }
  CHECK_THROWS_AS(kvsift::exact_topk(f.flat, f.eval, 10, 2, kvsift::id_below{5000}),
                  kvsift::out_of_range);
  CHECK_THROWS_AS(kvsift::exact_dipr(f.flat, f.eval, {.beta = -1.0f}), kvsift::invalid_argument);
}
