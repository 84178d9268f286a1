#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <span>
#include <string>
#include <utility>
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

TEST_CASE("beam_search recall against exact_topk", "[search][beam]") {
  const auto& f = fx();
  const auto truth = kvsift::exact_topk(f.flat, f.eval, 10, 2);
  kvsift::search_workspace ws;
  std::vector<id_t> ids(10);
  std::vector<float> sc(10);
  std::size_t hit = 0;
  for (std::size_t i = 0; i < f.eval.rows(); ++i) {
    const auto st = kvsift::beam_search(f.graph, f.eval.row_span(i), {10, 100}, ws, ids, sc);
    CHECK(st.count == 10);
    CHECK(std::is_sorted(sc.rbegin(), sc.rend()));
    for (std::size_t j = 0; j < 10; ++j) {
      REQUIRE(sc[j] == kvsift::inner_product::score(f.eval.row(i), f.store.row(ids[j]), 32));
      const auto t = truth.row_ids(i);
      hit += std::find(t.begin(), t.end(), ids[j]) != t.end();
    }
  }
  const double recall = static_cast<double>(hit) / 1000.0;
  WARN("beam_search recall@10 L=100: " << recall);
  CHECK(recall >= 0.97);  // measured 0.994
}

TEST_CASE("beam_search pads, handles NaN and extra entries", "[search][beam]") {
  const auto& f = fx();
  kvsift::search_workspace ws;
  std::vector<float> dup = {1, 0, 0, 1};
  const kvsift::graph_index<store_t> tiny(store_t({dup.data(), 2, 2}), 1, {1, 0}, 0);
  std::vector<float> q = {1, 0};
  std::vector<id_t> ids(4);
  std::vector<float> sc(4);
  const auto st = kvsift::beam_search(tiny, q, {4, 4}, ws, ids, sc);
  CHECK(st.count == 2);
  CHECK(ids[0] == 0);
  CHECK(ids[1] == 1);
  CHECK(ids[2] == kvsift::invalid_id);
  CHECK(sc[3] == -std::numeric_limits<float>::infinity());

  std::vector<float> nanq(32, std::numeric_limits<float>::quiet_NaN());
  std::vector<id_t> ni(10);
  std::vector<float> ns(10);
  CHECK_NOTHROW(kvsift::beam_search(f.graph, nanq, {10, 20}, ws, ni, ns));
  for (std::size_t j = 0; j < 10; ++j) {
    CHECK((ni[j] == kvsift::invalid_id || ns[j] == -std::numeric_limits<float>::infinity()));
  }
  const std::vector<id_t> extra = {5, 1999};
  CHECK_NOTHROW(kvsift::beam_search(f.graph, f.eval.row_span(0), {10, 50}, ws, ni, ns,
                                    kvsift::no_filter{}, extra));
  // invalid_id among the extra entries is padding (a short previous answer, a routed seed
  // list): skipped, the same search as without it.
  std::vector<id_t> pi(10), pj(10);
  std::vector<float> ps(10), pt(10);
  const auto with_pad =
      kvsift::beam_search(f.graph, f.eval.row_span(1), {10, 20}, ws, pi, ps, kvsift::no_filter{},
                          std::vector<id_t>{kvsift::invalid_id, 5, kvsift::invalid_id});
  const auto without = kvsift::beam_search(f.graph, f.eval.row_span(1), {10, 20}, ws, pj, pt,
                                           kvsift::no_filter{}, std::vector<id_t>{5});
  CHECK(pi == pj);
  CHECK(ps == pt);
  CHECK(with_pad.distance_computations == without.distance_computations);
}

TEST_CASE("beam_search rejects bad input", "[search][beam]") {
  const auto& f = fx();
  kvsift::search_workspace ws;
  std::vector<float> q(32, 0.5f);
  std::vector<id_t> ids(10);
  std::vector<float> sc(10);
  auto msg = message_of<kvsift::invalid_argument>([&] {
    kvsift::beam_search(f.graph, q, {0, 10}, ws, ids, sc);
  });
  CHECK_THAT(msg, Contains("got 0"));
  msg = message_of<kvsift::invalid_argument>([&] {
    kvsift::beam_search(f.graph, q, {10, 7}, ws, ids, sc);
  });
  CHECK_THAT(msg, Contains("k = 10") && Contains("L = 7"));
  msg = message_of<kvsift::invalid_argument>([&] {
    kvsift::beam_search(f.graph, q, {10, 20}, ws, std::span<id_t>(ids).first(9), sc);
  });
  CHECK_THAT(msg, Contains("9 ids"));
  msg = message_of<kvsift::dimension_mismatch>([&] {
    kvsift::beam_search(f.graph, std::span<const float>(q).first(30), {10, 20}, ws, ids, sc);
  });
  CHECK_THAT(msg, Contains("32") && Contains("30"));
  const std::vector<id_t> bad = {3, 2000};
  msg = message_of<kvsift::out_of_range>([&] {
    kvsift::beam_search(f.graph, q, {10, 20}, ws, ids, sc, kvsift::no_filter{}, bad);
  });
  CHECK_THAT(msg, Contains("2000"));
}

// Contract: a query holding NaN or Inf returns no results: count 0,
// every id invalid_id, every score the metric's worst, unfiltered and filtered alike. The old
// behaviour returned real ids in walk order with -inf scores.
TEST_CASE("beam_search: a non-finite query returns no results", "[search][beam][rel]") {
  const auto& f = fx();
  kvsift::search_workspace ws;
  const kvsift::id_below prefix{1000};
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity()}) {
    std::vector<float> q(f.eval.row(0), f.eval.row(0) + 32);
    q[11] = bad;
    std::vector<id_t> ids(10, 7);
    std::vector<float> sc(10, 1.0f);
    auto st = kvsift::beam_search(f.graph, q, {10, 20}, ws, ids, sc);
    CHECK(st.count == 0);
    CHECK(std::all_of(ids.begin(), ids.end(), [](id_t i) { return i == kvsift::invalid_id; }));
    CHECK(std::all_of(sc.begin(), sc.end(),
                      [](float s) { return s == -std::numeric_limits<float>::infinity(); }));
    std::fill(ids.begin(), ids.end(), 7);
    st = kvsift::beam_search(f.graph, q, {10, 20}, ws, ids, sc, prefix);
    CHECK(st.count == 0);
    CHECK(std::all_of(ids.begin(), ids.end(), [](id_t i) { return i == kvsift::invalid_id; }));
  }
}

// Regression: the pool was reserved at L before anything bounded it by n, so a huge L
// threw length_error (or reserved gigabytes) instead of searching: a pool beyond n holds n.
TEST_CASE("beam_search: a pool far larger than the index equals a pool of n",
          "[search][beam][rel]") {
  const auto& f = fx();
  kvsift::search_workspace ws;
  std::vector<id_t> a(10), b(10);
  std::vector<float> sa(10), sb(10);
  const auto big = std::size_t{1} << 61;  // 2^61 candidates x 12 bytes: beyond any vector
  const auto s1 = kvsift::beam_search(f.graph, f.eval.row_span(0), {10, big}, ws, a, sa);
  const auto s2 = kvsift::beam_search(f.graph, f.eval.row_span(0), {10, 2000}, ws, b, sb);
  CHECK(s1.count == 10);
  CHECK(a == b);
  CHECK(sa == sb);
  CHECK(s1.distance_computations == s2.distance_computations);
}

namespace {

// A star: node 0 links to 1..5, which have no out-edges; 1-d vectors with node i at i, so an
// l2 query at 0 expands 0, 1, 2, ..., 5 in that order. Records what beam_search expands and
// which rows it asks to prefetch.
struct recording_star {
  using metric_type = kvsift::l2;
  std::vector<float> x{0, 1, 2, 3, 4, 5};
  std::vector<kvsift::id_t> star{1, 2, 3, 4, 5};
  mutable std::vector<kvsift::id_t> expanded, prefetched;
  [[nodiscard]] std::size_t size() const { return x.size(); }
  [[nodiscard]] std::size_t dim() const { return 1; }
  [[nodiscard]] kvsift::id_t entry_point() const { return 0; }
  [[nodiscard]] std::span<const kvsift::id_t> neighbors(kvsift::id_t u) const {
    expanded.push_back(u);
    return u == 0 ? std::span<const kvsift::id_t>(star) : std::span<const kvsift::id_t>();
  }
  void prefetch_neighbors(kvsift::id_t u) const { prefetched.push_back(u); }
  [[nodiscard]] float score(const float* q, kvsift::id_t i) const {
    return (q[0] - x[i]) * (q[0] - x[i]);
  }
};
static_assert(kvsift::Graph<recording_star>);

// Top-3 of an l2 query at 0 (pool 10) over a recording graph: its stats, its ids into `ids`.
template <class G>
kvsift::search_stats top3_at_zero(const G& g, std::vector<kvsift::id_t>& ids) {
  kvsift::search_workspace ws;
  ids.assign(3, kvsift::invalid_id);
  std::vector<float> scores(3);
  const float q = 0.0f;
  return kvsift::beam_search(g, std::span<const float>(&q, 1), {3, 10}, ws,
                             std::span<kvsift::id_t>(ids), std::span<float>(scores));
}

}  // namespace

TEST_CASE("beam_search prefetches the adjacency row of the node it expands next", "[beam_search]") {
  const recording_star g;
  std::vector<kvsift::id_t> ids;
  const auto s = top3_at_zero(g, ids);
  REQUIRE(s.count == 3);
  CHECK(ids == std::vector<kvsift::id_t>{0, 1, 2});
  REQUIRE(g.expanded == std::vector<kvsift::id_t>{0, 1, 2, 3, 4, 5});
  // Expanding 0 leaves nothing unexpanded (no hint); from then on, while node i is expanded
  // the hint names node i + 1, which is expanded next.
  CHECK(g.prefetched == std::vector<kvsift::id_t>{2, 3, 4, 5});
}

namespace {

// Node 0 links to 1..6 and back to itself (already visited when it is expanded); 1-d vectors
// with node i at i. Records, in order, the rows the walk asks to prefetch ('p') and scores ('s').
struct lookahead_star {
  using metric_type = kvsift::l2;
  static constexpr std::size_t prefetch_distance = 2;
  std::vector<float> x{0, 1, 2, 3, 4, 5, 6};
  std::vector<kvsift::id_t> star{1, 2, 3, 0, 4, 5, 6};
  mutable std::vector<std::pair<char, kvsift::id_t>> log;
  [[nodiscard]] std::size_t size() const { return x.size(); }
  [[nodiscard]] std::size_t dim() const { return 1; }
  [[nodiscard]] kvsift::id_t entry_point() const { return 0; }
  [[nodiscard]] std::span<const kvsift::id_t> neighbors(kvsift::id_t u) const {
    return u == 0 ? std::span<const kvsift::id_t>(star) : std::span<const kvsift::id_t>();
  }
  void prefetch_ahead(kvsift::id_t i) const { log.emplace_back('p', i); }
  [[nodiscard]] float score(const float* q, kvsift::id_t i) const {
    log.emplace_back('s', i);
    return (q[0] - x[i]) * (q[0] - x[i]);
  }
};
static_assert(kvsift::Graph<lookahead_star>);

}  // namespace

TEST_CASE("a prefetch_ahead graph gets each fresh row requested prefetch_distance rows early",
          "[beam_search]") {
  const lookahead_star g;
  std::vector<kvsift::id_t> ids;
  const auto s = top3_at_zero(g, ids);
  REQUIRE(s.count == 3);
  CHECK(ids == std::vector<kvsift::id_t>{0, 1, 2});
  CHECK(s.distance_computations == 7);
  // The entry is scored as a seed; expanding it, the fresh neighbours (0 is visited) are
  // scored in row order, each requested once, two rows before it is scored; the last two
  // are scored with nothing left to request.
  using e = std::pair<char, kvsift::id_t>;
  CHECK(g.log == std::vector<e>{{'s', 0},
                                {'p', 1},
                                {'p', 2},
                                {'p', 3},
                                {'s', 1},
                                {'p', 4},
                                {'s', 2},
                                {'p', 5},
                                {'s', 3},
                                {'p', 6},
                                {'s', 4},
                                {'s', 5},
                                {'s', 6}});
}
