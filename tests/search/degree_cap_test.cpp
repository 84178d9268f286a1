// degree_cap (beam_search_params, dipr_params): a search with cap D must be the same search
// as over the graph whose rows are cut to their first D neighbours, for top-k and DIPR, with
// and without a filter; and it must score fewer vectors than the uncapped search.
#include <catch2/catch.hpp>

#include <algorithm>
#include <span>
#include <vector>

#include "kvsift/search/beam_search.hpp"
#include "kvsift/search/dipr_search.hpp"
#include "search_fixture.hpp"

namespace {

using namespace kvsift_test;  // NOLINT(google-build-using-namespace): fixture, fx

/// The oracle: the fixture's graph with every row cut to its first `cap` neighbours.
template <class G>
struct first_neighbours {
  using metric_type = typename G::metric_type;
  const G& g;
  std::size_t cap;
  [[nodiscard]] std::size_t size() const { return g.size(); }
  [[nodiscard]] std::size_t dim() const { return g.dim(); }
  [[nodiscard]] std::span<const id_t> entry_points() const { return g.entry_points(); }
  [[nodiscard]] std::span<const id_t> neighbors(id_t u) const {
    const auto n = g.neighbors(u);
    return n.first(std::min(cap, n.size()));
  }
  [[nodiscard]] float score(const float* q, id_t i) const { return g.score(q, i); }
};
static_assert(kvsift::Graph<first_neighbours<kvsift::graph_index<store_t>>>);

std::size_t max_degree(const kvsift::graph_index<store_t>& g) {
  std::size_t m = 0;
  for (std::size_t u = 0; u < g.size(); ++u)
    m = std::max(m, g.neighbors(static_cast<id_t>(u)).size());
  return m;
}

}  // namespace

TEST_CASE("degree_cap: top-k equals the search over rows cut to the cap", "[search][beam][cap]") {
  const auto& f = fx();
  const std::size_t k = 10;
  kvsift::search_workspace ws;
  std::vector<id_t> a(k), b(k);
  std::vector<float> sa(k), sb(k);
  const kvsift::id_range filter{200, 1700};
  for (const std::size_t cap : {2ul, 5ul, 12ul}) {
    REQUIRE(cap < max_degree(f.graph));  // else the cap would not cut anything
    const first_neighbours<kvsift::graph_index<store_t>> cut{f.graph, cap};
    std::size_t capped_scored = 0, full_scored = 0;
    for (std::size_t i = 0; i < f.eval.rows(); ++i) {
      const auto q = f.eval.row_span(i);
      const auto sc =
          kvsift::beam_search(f.graph, q, {.k = k, .L = 20, .degree_cap = cap}, ws, a, sa);
      const auto so = kvsift::beam_search(cut, q, {.k = k, .L = 20}, ws, b, sb);
      REQUIRE(a == b);
      REQUIRE(sa == sb);
      CHECK(sc.distance_computations == so.distance_computations);
      capped_scored += sc.distance_computations;
      full_scored +=
          kvsift::beam_search(f.graph, q, {.k = k, .L = 20}, ws, b, sb).distance_computations;
      kvsift::beam_search(f.graph, q, {.k = k, .L = 20, .degree_cap = cap}, ws, a, sa, filter);
      kvsift::beam_search(cut, q, {.k = k, .L = 20}, ws, b, sb, filter);
      REQUIRE(a == b);
    }
    CHECK(capped_scored < full_scored);
  }
}

TEST_CASE("degree_cap: 0 or a cap at the max degree changes nothing", "[search][beam][cap]") {
  const auto& f = fx();
  kvsift::search_workspace ws;
  std::vector<id_t> a(10), b(10), c(10);
  std::vector<float> sa(10), sb(10), sc(10);
  const std::size_t dmax = max_degree(f.graph);
  for (std::size_t i = 0; i < f.eval.rows(); ++i) {
    const auto q = f.eval.row_span(i);
    kvsift::beam_search(f.graph, q, {.k = 10, .L = 30}, ws, a, sa);
    kvsift::beam_search(f.graph, q, {.k = 10, .L = 30, .degree_cap = dmax}, ws, b, sb);
    kvsift::beam_search(f.graph, q, {.k = 10, .L = 30, .degree_cap = 0}, ws, c, sc);
    REQUIRE(a == b);
    REQUIRE(a == c);
  }
}

TEST_CASE("degree_cap: DIPR equals the search over rows cut to the cap", "[search][dipr][cap]") {
  const auto& f = fx();
  kvsift::search_workspace ws;
  kvsift::dipr_result r, o;
  const std::size_t cap = 6;
  const first_neighbours<kvsift::graph_index<store_t>> cut{f.graph, cap};
  std::size_t capped_scored = 0, full_scored = 0;
  for (std::size_t i = 0; i < f.eval.rows(); ++i) {
    const auto q = f.eval.row_span(i);
    kvsift::dipr_search(f.graph, q, {.beta = 2.0f, .l0 = 16, .degree_cap = cap}, ws, r);
    kvsift::dipr_search(cut, q, {.beta = 2.0f, .l0 = 16}, ws, o);
    REQUIRE(r.ids == o.ids);
    REQUIRE(r.scores == o.scores);
    capped_scored += r.stats.distance_computations;
    kvsift::dipr_search(f.graph, q, {.beta = 2.0f, .l0 = 16}, ws, o);
    full_scored += o.stats.distance_computations;
  }
  CHECK(capped_scored < full_scored);
}
