// The insert rule of DESIGN.md's contract, run: searches share an insertable graph, inserts are
// exclusive (shared_insertable_graph). Reader threads search through `read` while a writer
// inserts keys one at a time; under ThreadSanitizer (kvsift_concurrency_tests) any access to
// the graph outside the lock is reported. The final graph must equal the one a single thread
// builds by the same inserts (no search disturbs an insert), and every answer a reader saw must
// hold only ids that existed when it searched. The writer also adds a decode query every 30
// keys (add_queries, exclusive as well), which later inserts read.
//
// Catch2 v2 assertions are not thread-safe: threads only count problems, checked after join.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

#include "kvsift/index/insertable_graph.hpp"
#include "kvsift/index/shared_insertable_graph.hpp"
#include "kvsift/search/beam_search.hpp"
#include "kvsift/testing/ood_generator.hpp"

namespace {

using kvsift::id_t;

constexpr std::size_t n_keys = 900, n_base = 600, dim = 16, k = 8, readers = 3;

const kvsift::testing::ood_data& data() {
  static const auto d =
      kvsift::testing::make_ood({.keys = n_keys, .queries = 120, .dim = dim, .seed = 13});
  return d;
}

kvsift::insertable_graph<float> base_graph() {
  kvsift::roargraph_params p;
  p.nq = 20;
  p.M = 6;
  p.L = 32;
  p.threads = 1;
  p.batch = 64;
  return kvsift::build_insertable(kvsift::roargraph_builder<>(p),
                                  data().key_view().row_range(0, n_base),
                                  data().query_view().row_range(0, 80));
}

}  // namespace

TEST_CASE("insert: searches share, inserts are exclusive (shared_insertable_graph)",
          "[concurrency][insert]") {
  kvsift::shared_insertable_graph<float> shared(base_graph());
  const auto queries = data().query_view().row_range(80, 40);
  std::atomic<bool> done{false};
  std::vector<std::size_t> bad(readers, 0), searches(readers, 0);
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < readers; ++t) {
    pool.emplace_back([&, t] {
      kvsift::search_workspace ws;
      std::vector<id_t> ids(k);
      std::vector<float> scores(k);
      for (std::size_t i = 0; !done.load() || i < queries.rows(); ++i) {
        const auto q = queries.row_span(i % queries.rows());
        const std::size_t n = shared.read([&](const auto& g) {
          kvsift::beam_search(g, q, {k, 32}, ws, std::span<id_t>(ids), std::span<float>(scores));
          return g.size();
        });
        ++searches[t];
        for (const id_t id : ids) bad[t] += (id == kvsift::invalid_id || id >= n) ? 1 : 0;
      }
    });
  }
  // Key i, then (every 30 keys) training query 80 + (i - n_base) / 30, as a decode step adds
  // its query after its key.
  const auto writes = [](auto& g) {
    for (std::size_t i = n_base; i < n_keys; ++i) {
      g.insert(data().key_view().row_range(i, 1));
      if ((i - n_base) % 30 == 0)
        g.add_queries(data().query_view().row_range(80 + (i - n_base) / 30, 1));
    }
  };
  writes(shared);
  done = true;
  for (auto& th : pool) th.join();
  for (std::size_t t = 0; t < readers; ++t) {
    CHECK(bad[t] == 0);
    CHECK(searches[t] >= queries.rows());
  }
  REQUIRE(shared.size() == n_keys);

  auto alone = base_graph();
  writes(alone);
  REQUIRE(alone.training_queries().rows() == 90);
  const auto expected = alone.snapshot();
  const auto expected_lists = alone.query_knn();
  shared.read([&](const auto& g) {
    CHECK(g.query_knn().ids == expected_lists.ids);
    const auto got = g.snapshot();
    CHECK(std::equal(got.adjacency().begin(), got.adjacency().end(), expected.adjacency().begin(),
                     expected.adjacency().end()));
    return 0;
  });
}
