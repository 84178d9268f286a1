// gqa_beam_search: one walk for a group of queries over one graph (the query heads of a GQA
// group). Held to beam_search where they must agree (one query; several copies of one query),
// and to a walk per head on recall and keys scored where they differ.

#include "kvsift/search/gqa_search.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "kvsift/search/beam_search.hpp"
#include "search_fixture.hpp"

using namespace kvsift_test;

namespace {

struct group_result {
  std::vector<id_t> ids;
  std::vector<float> scores;
  std::vector<std::size_t> counts;
  kvsift::search_stats stats;
};

template <class P = kvsift::no_filter>
group_result run_group(const std::vector<float>& rows, std::size_t H,
                       const kvsift::beam_search_params& p, kvsift::search_workspace& ws,
                       const P& pred = {}, std::span<const id_t> extra = {}) {
  group_result r;
  r.ids.assign(H * p.k, 7);
  r.scores.assign(H * p.k, 1.0f);
  r.counts.assign(H, 99);
  r.stats =
      kvsift::gqa_beam_search(fx().graph, kvsift::matrix_view<const float>(rows.data(), H, 32), p,
                              ws, std::span<id_t>(r.ids), std::span<float>(r.scores),
                              std::span<std::size_t>(r.counts), pred, extra);
  return r;
}

std::vector<float> rows_of(std::initializer_list<std::size_t> eval_rows) {
  std::vector<float> out;
  for (const std::size_t i : eval_rows)
    out.insert(out.end(), fx().eval.row(i), fx().eval.row(i) + 32);
  return out;
}

}  // namespace

TEST_CASE("gqa_beam_search with one query is beam_search", "[search][gqa]") {
  const auto& f = fx();
  kvsift::search_workspace ws, ws1;
  const kvsift::id_below prefix{1200};
  const std::vector<id_t> extra = {5, 1999};
  for (std::size_t e = 0; e < 20; ++e) {
    const auto q = rows_of({e});
    for (const kvsift::beam_search_params p :
         {kvsift::beam_search_params{10, 10}, kvsift::beam_search_params{10, 40, 8, 0},
          kvsift::beam_search_params{20, 60, 0, 15}, kvsift::beam_search_params{10, 50, 0, 0, 9}}) {
      INFO("eval " << e << " k " << p.k << " L " << p.L << " cap " << p.degree_cap << " E "
                   << p.expand_limit << " hops " << p.max_hops);
      std::vector<id_t> ids(p.k);
      std::vector<float> sc(p.k);
      const auto want = kvsift::beam_search(f.graph, q, p, ws1, ids, sc);
      const auto got = run_group(q, 1, p, ws);
      CHECK(got.ids == ids);
      CHECK(got.scores == sc);
      CHECK(got.counts[0] == want.count);
      CHECK(got.stats.count == want.count);
      CHECK(got.stats.distance_computations == want.distance_computations);
      CHECK(got.stats.hops == want.hops);
      // filtered, with extra entries
      const auto want_f = kvsift::beam_search(f.graph, q, p, ws1, ids, sc, prefix, extra);
      const auto got_f = run_group(q, 1, p, ws, prefix, extra);
      CHECK(got_f.ids == ids);
      CHECK(got_f.stats.distance_computations == want_f.distance_computations);
      CHECK(got_f.stats.hops == want_f.hops);
    }
  }
}

// Copies of one query: the heads' pools are the same at every step, so an entry one head
// expands is the entry every other head would expand next: it is passed over, and the walk is
// that query's beam search (same expansions, same keys scored), each head returning its results.
TEST_CASE("gqa_beam_search over copies of one query walks once", "[search][gqa]") {
  const auto& f = fx();
  kvsift::search_workspace ws, ws1;
  for (std::size_t e = 0; e < 10; ++e) {
    const auto one = rows_of({e});
    const auto four = rows_of({e, e, e, e});
    std::vector<id_t> ids(10);
    std::vector<float> sc(10);
    const auto want = kvsift::beam_search(f.graph, one, {10, 40}, ws1, ids, sc);
    const auto got = run_group(four, 4, {10, 40}, ws);
    CHECK(got.stats.hops == want.hops);
    CHECK(got.stats.distance_computations == want.distance_computations);
    CHECK(got.stats.count == 4 * want.count);
    for (std::size_t h = 0; h < 4; ++h) {
      CHECK(std::vector<id_t>(got.ids.begin() + h * 10, got.ids.begin() + h * 10 + 10) == ids);
    }
  }
}

// Different queries: each head sees every key the walk scores, so the group's recall is about
// its heads' own walks' or better at the same pool, from fewer keys than one walk per head.
TEST_CASE("gqa_beam_search: recall and keys scored against a walk per head", "[search][gqa]") {
  const auto& f = fx();
  kvsift::search_workspace ws, ws1;
  constexpr std::size_t k = 10, L = 20, H = 4;
  std::size_t hit_group = 0, hit_heads = 0, scored_group = 0, scored_heads = 0;
  for (std::size_t gi = 0; gi < 25; ++gi) {
    const auto q = rows_of({4 * gi, 4 * gi + 1, 4 * gi + 2, 4 * gi + 3});
    const auto got = run_group(q, H, {k, L}, ws);
    scored_group += got.stats.distance_computations;
    for (std::size_t h = 0; h < H; ++h) {
      const std::span<const float> qh(q.data() + h * 32, 32);
      std::vector<id_t> ids(k), exact(k);
      std::vector<float> sc(k), esc(k);
      scored_heads += kvsift::beam_search(f.graph, qh, {k, L}, ws1, ids, sc).distance_computations;
      f.flat.topk(qh, k, ws1, exact, esc);
      std::sort(exact.begin(), exact.end());
      for (std::size_t i = 0; i < k; ++i) {
        hit_group += std::binary_search(exact.begin(), exact.end(), got.ids[h * k + i]);
        hit_heads += std::binary_search(exact.begin(), exact.end(), ids[i]);
      }
    }
  }
  const double r_group = double(hit_group) / (100.0 * k), r_heads = double(hit_heads) / (100.0 * k);
  INFO("recall group " << r_group << " heads " << r_heads << ", keys scored " << scored_group
                       << " vs " << scored_heads);
  CHECK(r_group >= r_heads);
  CHECK(scored_group < scored_heads);
}

TEST_CASE("gqa_beam_search: a non-finite head returns nothing, the others are unaffected",
          "[search][gqa][rel]") {
  kvsift::search_workspace ws;
  auto q = rows_of({0, 1, 2});
  const auto two = rows_of({0, 2});
  const auto want = run_group(two, 2, {10, 30}, ws);
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    q[32 + 5] = bad;
    const auto got = run_group(q, 3, {10, 30}, ws);
    CHECK(got.counts == std::vector<std::size_t>{want.counts[0], 0, want.counts[1]});
    CHECK(std::vector<id_t>(got.ids.begin(), got.ids.begin() + 10) ==
          std::vector<id_t>(want.ids.begin(), want.ids.begin() + 10));
    CHECK(std::vector<id_t>(got.ids.begin() + 20, got.ids.end()) ==
          std::vector<id_t>(want.ids.begin() + 10, want.ids.end()));
    CHECK(std::all_of(got.ids.begin() + 10, got.ids.begin() + 20,
                      [](id_t i) { return i == kvsift::invalid_id; }));
    CHECK(std::all_of(got.scores.begin() + 10, got.scores.begin() + 20,
                      [](float s) { return s == -std::numeric_limits<float>::infinity(); }));
    CHECK(got.stats.distance_computations == want.stats.distance_computations);
  }
  // Every head non-finite: nothing at all.
  std::vector<float> nan(64, std::numeric_limits<float>::quiet_NaN());
  const auto none = run_group(nan, 2, {10, 30}, ws);
  CHECK(none.stats.distance_computations == 0);
  CHECK(none.counts == std::vector<std::size_t>{0, 0});
}

TEST_CASE("gqa_beam_search rejects bad input", "[search][gqa]") {
  const auto& f = fx();
  kvsift::search_workspace ws;
  const auto q = rows_of({0, 1});
  const kvsift::matrix_view<const float> two(q.data(), 2, 32);
  std::vector<id_t> ids(20);
  std::vector<float> sc(20);
  std::vector<std::size_t> counts(2);
  auto call = [&](kvsift::matrix_view<const float> qs, kvsift::beam_search_params p,
                  std::span<id_t> i, std::span<float> s, std::span<std::size_t> c,
                  std::span<const id_t> extra = {}) {
    kvsift::gqa_beam_search(f.graph, qs, p, ws, i, s, c, kvsift::no_filter{}, extra);
  };
  auto msg = message_of<kvsift::invalid_argument>([&] {
    call(kvsift::matrix_view<const float>(q.data(), 0, 32), {10, 20}, ids, sc, counts);
  });
  CHECK_THAT(msg, Contains("at least one query"));
  msg = message_of<kvsift::invalid_argument>([&] { call(two, {0, 20}, ids, sc, counts); });
  CHECK_THAT(msg, Contains("got 0"));
  msg = message_of<kvsift::invalid_argument>([&] { call(two, {10, 7}, ids, sc, counts); });
  CHECK_THAT(msg, Contains("k = 10") && Contains("L = 7"));
  msg = message_of<kvsift::invalid_argument>([&] { call(two, {10, 20, 0, 21}, ids, sc, counts); });
  CHECK_THAT(msg, Contains("expand_limit") && Contains("21"));
  msg = message_of<kvsift::dimension_mismatch>([&] {
    call(kvsift::matrix_view<const float>(q.data(), 2, 31), {10, 20}, ids, sc, counts);
  });
  CHECK_THAT(msg, Contains("32") && Contains("31"));
  msg = message_of<kvsift::invalid_argument>([&] {
    call(two, {10, 20}, std::span<id_t>(ids).first(19), sc, counts);
  });
  CHECK_THAT(msg, Contains("20") && Contains("19 ids"));
  msg = message_of<kvsift::invalid_argument>([&] {
    call(two, {10, 20}, ids, sc, std::span<std::size_t>(counts).first(1));
  });
  CHECK_THAT(msg, Contains("2 counts") && Contains("got 1"));
  const std::vector<id_t> bad = {3, 2000};
  msg = message_of<kvsift::out_of_range>([&] { call(two, {10, 20}, ids, sc, counts, bad); });
  CHECK_THAT(msg, Contains("2000"));
  // queries x k overflows: refused before any output or workspace is touched.
  const kvsift::matrix_view<const float> huge(q.data(), std::size_t{1} << 40, 32);
  const std::size_t big_k = std::size_t{1} << 30;
  msg = message_of<kvsift::invalid_argument>([&] { call(huge, {big_k, big_k}, ids, sc, counts); });
  CHECK_THAT(msg, Contains("queries x k") && Contains("overflows"));
  CHECK(ws.pools.empty());
}
