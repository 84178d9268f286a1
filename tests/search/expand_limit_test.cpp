// beam_search_params::expand_limit: only the best E entries of the pool are expanded. Checked
// against a model of that rule written out plainly (a sorted vector, no cursor), id for id, score
// for score, hops and vectors scored, seeded and not; E = L must be the classic search; seeds
// holding the exact answer must return it whatever E. beam_search_params::max_hops (the walk
// stops after that many expansions) against the same model.
#include <catch2/catch.hpp>

#include <algorithm>
#include <span>
#include <vector>

#include "kvsift/index/flat_index.hpp"
#include "kvsift/search/beam_search.hpp"
#include "search_fixture.hpp"

namespace {

using namespace kvsift_test;  // NOLINT(google-build-using-namespace): fixture, fx, message_of

struct model_result {
  std::vector<id_t> ids;
  std::vector<float> scores;
  std::size_t hops = 0, scored = 0;
};

/// The rule: visit the entry points, then the seeds; then, while one of the best `limit` pool
/// entries is unexpanded, expand the best such (visit its unvisited neighbours). The pool holds
/// the best L entries visited (higher score first, ties to the lower id).
template <class G>
model_result model(const G& g, std::span<const float> q, std::size_t k, std::size_t L,
                   std::size_t limit, std::span<const id_t> seeds, std::size_t max_hops = 0) {
  struct entry {
    float score;
    id_t id;
    bool expanded;
  };
  std::vector<entry> pool;
  std::vector<bool> visited(g.size(), false);
  model_result r;
  auto visit = [&](id_t v) {
    if (visited[v]) return;
    visited[v] = true;
    ++r.scored;
    pool.push_back({g.score(q.data(), v), v, false});
    std::sort(pool.begin(), pool.end(), [](const entry& a, const entry& b) {
      return a.score != b.score ? a.score > b.score : a.id < b.id;
    });
    if (pool.size() > L) pool.pop_back();
  };
  for (const id_t e : g.entry_points()) visit(e);
  for (const id_t s : seeds) visit(s);
  while (max_hops == 0 || r.hops < max_hops) {
    entry* next = nullptr;
    for (std::size_t i = 0; i < std::min(limit, pool.size()) && next == nullptr; ++i) {
      if (!pool[i].expanded) next = &pool[i];
    }
    if (next == nullptr) break;
    next->expanded = true;
    ++r.hops;
    const id_t u = next->id;  // `next` dangles once visit() sorts the pool
    for (const id_t v : g.neighbors(u)) visit(v);
  }
  for (std::size_t i = 0; i < std::min(k, pool.size()); ++i) {
    r.ids.push_back(pool[i].id);
    r.scores.push_back(pool[i].score);
  }
  return r;
}

}  // namespace

TEST_CASE("expand_limit: beam_search equals the model of the rule", "[search][beam][expand]") {
  const auto& f = fx();
  const std::size_t k = 10, L = 40;
  const auto truth = kvsift::exact_topk(f.flat, f.eval, k, 2);
  kvsift::search_workspace ws;
  std::vector<id_t> ids(k);
  std::vector<float> sc(k);
  for (const std::size_t limit : {1ul, 4ul, 10ul, 25ul, 40ul}) {
    for (const bool seeded : {false, true}) {
      std::size_t differ = 0, hops = 0;
      for (std::size_t i = 0; i < f.eval.rows(); ++i) {
        const auto q = f.eval.row_span(i);
        // Seeds as a decode step would have them: the previous query's answer.
        const auto prev = truth.row_ids(i == 0 ? f.eval.rows() - 1 : i - 1);
        const std::span<const id_t> seeds =
            seeded ? std::span<const id_t>(prev.data(), prev.size()) : std::span<const id_t>{};
        const auto st = kvsift::beam_search(f.graph, q, {.k = k, .L = L, .expand_limit = limit}, ws,
                                            ids, sc, kvsift::no_filter{}, seeds);
        const model_result m = model(f.graph, q, k, L, limit, seeds);
        const bool same = st.count == m.ids.size() && st.hops == m.hops &&
                          st.distance_computations == m.scored &&
                          std::equal(m.ids.begin(), m.ids.end(), ids.begin()) &&
                          std::equal(m.scores.begin(), m.scores.end(), sc.begin());
        differ += same ? 0 : 1;
        hops += st.hops;
      }
      INFO("expand_limit " << limit << ", seeded " << seeded);
      CHECK(differ == 0);
      // The limit is what bounds the walk: far fewer hops than a full pool's at small limits.
      if (limit <= 4) CHECK(hops < f.eval.rows() * L / 2);
    }
  }
}

TEST_CASE("max_hops: beam_search stops after that many expansions, as the model",
          "[search][beam][expand]") {
  const auto& f = fx();
  const std::size_t k = 10, L = 40;
  kvsift::search_workspace ws;
  std::vector<id_t> ids(k);
  std::vector<float> sc(k);
  for (const std::size_t cap : {1ul, 5ul, 20ul, 60ul}) {
    for (const std::size_t limit : {0ul, 10ul}) {
      std::size_t differ = 0, capped = 0;
      for (std::size_t i = 0; i < f.eval.rows(); ++i) {
        const auto q = f.eval.row_span(i);
        const auto free_walk =
            kvsift::beam_search(f.graph, q, {.k = k, .L = L, .expand_limit = limit}, ws, ids, sc);
        const auto st = kvsift::beam_search(
            f.graph, q, {.k = k, .L = L, .expand_limit = limit, .max_hops = cap}, ws, ids, sc);
        const model_result m = model(f.graph, q, k, L, limit != 0 ? limit : L, {}, cap);
        const bool same = st.count == m.ids.size() && st.hops == m.hops &&
                          st.distance_computations == m.scored &&
                          std::equal(m.ids.begin(), m.ids.end(), ids.begin()) &&
                          std::equal(m.scores.begin(), m.scores.end(), sc.begin());
        differ += same ? 0 : 1;
        CHECK(st.hops == std::min(cap, free_walk.hops));
        capped += free_walk.hops > cap ? 1 : 0;
      }
      INFO("max_hops " << cap << ", expand_limit " << limit);
      CHECK(differ == 0);
      if (cap <= 5) CHECK(capped == f.eval.rows());  // the cap binds for every query there
    }
  }
}

TEST_CASE("expand_limit: L is the classic search, filtered too", "[search][beam][expand]") {
  const auto& f = fx();
  const std::size_t k = 10, L = 30;
  kvsift::search_workspace ws;
  std::vector<id_t> a(k), b(k);
  std::vector<float> sa(k), sb(k);
  const kvsift::id_range filter{300, 1500};
  for (std::size_t i = 0; i < f.eval.rows(); ++i) {
    const auto q = f.eval.row_span(i);
    const auto s0 = kvsift::beam_search(f.graph, q, {.k = k, .L = L}, ws, a, sa, filter);
    const auto s1 =
        kvsift::beam_search(f.graph, q, {.k = k, .L = L, .expand_limit = L}, ws, b, sb, filter);
    REQUIRE(a == b);
    REQUIRE(sa == sb);
    REQUIRE(s0.hops == s1.hops);
    // A smaller limit never expands more, and still returns only passing ids.
    const auto s2 =
        kvsift::beam_search(f.graph, q, {.k = k, .L = L, .expand_limit = 5}, ws, b, sb, filter);
    CHECK(s2.hops <= s0.hops);
    for (std::size_t j = 0; j < s2.count; ++j) CHECK((b[j] >= 300 && b[j] < 1500));
  }
}

TEST_CASE("expand_limit: seeds holding the answer return it at any limit",
          "[search][beam][expand]") {
  const auto& f = fx();
  const std::size_t k = 10;
  const auto truth = kvsift::exact_topk(f.flat, f.eval, k, 2);
  kvsift::search_workspace ws;
  std::vector<id_t> ids(k);
  std::vector<float> sc(k);
  for (std::size_t i = 0; i < f.eval.rows(); ++i) {
    const auto t = truth.row_ids(i);
    const std::vector<id_t> seeds(t.begin(), t.end());
    const auto st =
        kvsift::beam_search(f.graph, f.eval.row_span(i), {.k = k, .L = k, .expand_limit = 1}, ws,
                            ids, sc, kvsift::no_filter{}, seeds);
    REQUIRE(st.count == k);
    CHECK(std::equal(t.begin(), t.end(), ids.begin()));
  }
}

TEST_CASE("expand_limit: above L is rejected", "[search][beam][expand]") {
  const auto& f = fx();
  kvsift::search_workspace ws;
  std::vector<float> q(32, 0.5f);
  std::vector<id_t> ids(10);
  std::vector<float> sc(10);
  const auto msg = message_of<kvsift::invalid_argument>([&] {
    kvsift::beam_search(f.graph, q, {.k = 10, .L = 20, .expand_limit = 21}, ws, ids, sc);
  });
  CHECK_THAT(msg, Contains("expand_limit <= L = 20") && Contains("got 21"));
}
