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
#include "kvsift/search/gqa_search.hpp"
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

namespace {

/// fx().graph with the ids that fail `pred` deleted from every row (row order kept): by
/// beam_search_params::walk_through's contract, the graph that a search without the
/// walk-through walks. Searched with the filter and the walk-through, a failing seed is
/// walked through the same passing neighbours, and no expansion meets a failing id.
struct pruned_rows_graph {
  using metric_type = kvsift::graph_index<store_t>::metric_type;
  const kvsift::graph_index<store_t>* g = nullptr;
  std::vector<std::vector<id_t>> rows;
  [[nodiscard]] std::size_t size() const { return g->size(); }
  [[nodiscard]] std::size_t dim() const { return g->dim(); }
  [[nodiscard]] std::span<const id_t> neighbors(id_t u) const { return rows[u]; }
  [[nodiscard]] float score(const float* q, id_t u) const { return g->score(q, u); }
  [[nodiscard]] std::span<const id_t> entry_points() const { return g->entry_points(); }
};

template <class P>
pruned_rows_graph without_failing(const P& pred) {
  const auto& g = fx().graph;
  pruned_rows_graph out{&g, std::vector<std::vector<id_t>>(g.size())};
  for (std::size_t u = 0; u < g.size(); ++u) {
    for (const id_t v : g.neighbors(static_cast<id_t>(u))) {
      if (pred(v)) out.rows[u].push_back(v);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("without the walk-through a filtered search walks the graph with the failing ids deleted",
          "[search][filtered]") {
  const auto& f = fx();
  const std::size_t n = f.graph.size();
  // A decode step's filter (sinks and window excluded), a 50% random mask, and a mask that
  // excludes the entry points (their seeds are walked through in both modes).
  std::mt19937 rng(11);
  std::vector<std::uint8_t> half(n), no_entry(n, 1);
  for (auto& b : half) b = static_cast<std::uint8_t>(rng() % 2);
  for (const id_t e : f.graph.entry_points()) no_entry[e] = half[e] = 0;
  const auto check = [&](const auto& pred, const char* name, bool walks_differ) {
    const pruned_rows_graph pruned = without_failing(pred);
    kvsift::search_workspace ws;
    std::vector<id_t> ids(10), want_ids(10);
    std::vector<float> sc(10), want_sc(10);
    kvsift::dipr_result r, want_r;
    std::size_t differs = 0;
    for (std::size_t i = 0; i < f.eval.rows(); ++i) {
      INFO(name << " query " << i);
      const auto q = f.eval.row_span(i);
      const auto s = kvsift::beam_search(f.graph, q, {.k = 10, .L = 40, .walk_through = false}, ws,
                                         std::span(ids), std::span(sc), pred);
      const auto w = kvsift::beam_search(pruned, q, {.k = 10, .L = 40}, ws, std::span(want_ids),
                                         std::span(want_sc), pred);
      CHECK(ids == want_ids);
      CHECK(sc == want_sc);
      CHECK(s.distance_computations == w.distance_computations);
      CHECK(s.hops == w.hops);
      kvsift::dipr_search(f.graph, q, {.beta = 2.0f, .l0 = 16, .walk_through = false}, ws, r, pred);
      kvsift::dipr_search(pruned, q, {.beta = 2.0f, .l0 = 16}, ws, want_r, pred);
      CHECK(r.ids == want_r.ids);
      CHECK(r.stats.distance_computations == want_r.stats.distance_computations);
      // Guards the test: the walk-through changes the walk on this filter.
      const auto t = kvsift::beam_search(f.graph, q, {.k = 10, .L = 40}, ws, std::span(want_ids),
                                         std::span(want_sc), pred);
      differs += t.distance_computations != s.distance_computations;
    }
    WARN(name << ": walks that the walk-through changes " << differs << " of " << f.eval.rows());
    if (walks_differ) {
      CHECK(differs > f.eval.rows() / 4);
    } else {
      CHECK(differs == 0);  // only seeds fail, and seeds are walked through in both modes
    }
  };
  check(kvsift::id_range{4, n - 64}, "sinks and window excluded", true);
  check(kvsift::id_mask{std::span<const std::uint8_t>(half)}, "50% mask, entries excluded", true);
  check(kvsift::id_mask{std::span<const std::uint8_t>(no_entry)}, "entries excluded", false);
}

TEST_CASE("gqa_beam_search without the walk-through is beam_search without it, head by head",
          "[search][filtered][gqa]") {
  const auto& f = fx();
  const kvsift::id_range pred{4, f.graph.size() - 64};
  kvsift::search_workspace ws;
  const kvsift::beam_search_params p{.k = 10, .L = 40, .walk_through = false};
  std::vector<id_t> ids(10), group_ids(10);
  std::vector<float> sc(10), group_sc(10);
  std::vector<std::size_t> counts(1);
  for (std::size_t i = 0; i < f.eval.rows(); ++i) {
    const auto q = f.eval.row_span(i);
    kvsift::beam_search(f.graph, q, p, ws, std::span(ids), std::span(sc), pred);
    kvsift::gqa_beam_search(f.graph, kvsift::matrix_view<const float>(q.data(), 1, q.size()), p, ws,
                            std::span(group_ids), std::span(group_sc), std::span(counts), pred);
    CHECK(group_ids == ids);
  }
}

TEST_CASE("entry_prefix enters the walk at the first ids, after the caller's extra entries",
          "[search][filtered]") {
  const auto& f = fx();
  const std::size_t n = f.graph.size();
  const kvsift::id_range window{4, n - 64};
  kvsift::search_workspace ws;
  std::vector<id_t> ids(10), want_ids(10);
  std::vector<float> sc(10), want_sc(10);
  kvsift::dipr_result r, want_r;
  const std::vector<id_t> extra{17, 900};
  std::size_t changed = 0;
  for (const std::size_t prefix : {std::size_t{4}, std::size_t{9}, n + 5}) {
    // The same entries spelled out: the caller's, then [0, min(prefix, n)).
    std::vector<id_t> spelled = extra;
    for (std::size_t i = 0; i < std::min(prefix, n); ++i) spelled.push_back(id_t(i));
    for (std::size_t i = 0; i < f.eval.rows(); i += 5) {
      INFO("prefix " << prefix << " query " << i);
      const auto q = f.eval.row_span(i);
      for (const bool through : {true, false}) {
        const auto s = kvsift::beam_search(
            f.graph, q, {.k = 10, .L = 40, .walk_through = through, .entry_prefix = prefix}, ws,
            std::span(ids), std::span(sc), window, std::span<const id_t>(extra));
        const auto w = kvsift::beam_search(f.graph, q, {.k = 10, .L = 40, .walk_through = through},
                                           ws, std::span(want_ids), std::span(want_sc), window,
                                           std::span<const id_t>(spelled));
        CHECK(ids == want_ids);
        CHECK(s.distance_computations == w.distance_computations);
        const auto plain = kvsift::beam_search(
            f.graph, q, {.k = 10, .L = 40, .walk_through = through}, ws, std::span(want_ids),
            std::span(want_sc), window, std::span<const id_t>(extra));
        changed += plain.distance_computations != s.distance_computations;
      }
      kvsift::dipr_search(f.graph, q, {.beta = 2.0f, .l0 = 16, .entry_prefix = prefix}, ws, r,
                          window, std::span<const id_t>(extra));
      kvsift::dipr_search(f.graph, q, {.beta = 2.0f, .l0 = 16}, ws, want_r, window,
                          std::span<const id_t>(spelled));
      CHECK(r.ids == want_r.ids);
      CHECK(r.stats.distance_computations == want_r.stats.distance_computations);
    }
  }
  CHECK(changed > 0);  // guards the test: the prefix changes walks
}
