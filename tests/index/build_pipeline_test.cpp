// The builder's progress callback, the split build (training_knn + build_from_knn) and the
// multi-head pipeline, all against the one-call build as the oracle.

#include "kvsift/index/build_pipeline.hpp"

#include <catch2/catch.hpp>

#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "../test_support.hpp"
#include "kvsift/index/roargraph_builder.hpp"
#include "kvsift/testing/ood_generator.hpp"

namespace {

using Catch::Matchers::Contains;
using kvsift::id_t;
using kvsift_test::message_of;

const kvsift::testing::ood_data& data() {
  static const auto d = kvsift::testing::make_ood({.keys = 1200, .queries = 800, .dim = 16});
  return d;
}

kvsift::roargraph_params params() {
  kvsift::roargraph_params p;
  p.nq = 20;
  p.M = 8;
  p.L = 40;
  p.threads = 2;
  return p;
}

template <class G>
void require_same_graph(const G& a, const G& b) {
  REQUIRE(a.size() == b.size());
  REQUIRE(a.entry_point() == b.entry_point());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto x = a.neighbors(static_cast<id_t>(i));
    const auto y = b.neighbors(static_cast<id_t>(i));
    INFO("node " << i);
    REQUIRE(std::vector<id_t>(x.begin(), x.end()) == std::vector<id_t>(y.begin(), y.end()));
  }
}

}  // namespace

TEST_CASE("roargraph_builder reports progress after every step", "[index][progress]") {
  const kvsift::view_store<float> store(data().key_view());
  const auto train = data().query_view().row_range(0, 200);
  std::vector<kvsift::build_progress> seen;
  std::vector<std::string> phases;
  kvsift::roargraph_build_stats stats;
  const auto g = kvsift::roargraph_builder<>(params()).build(store, train, &stats,
                                                             [&](const kvsift::build_progress& p) {
                                                               seen.push_back(p);
                                                               phases.emplace_back(p.phase);
                                                             });
  // 1200 keys in connectivity rounds of 32, 64, 128, 256, 512, 1024 (cumulative 2016 >= 1200):
  // kNN + projection + 6 rounds + repair = 9 steps.
  REQUIRE(seen.size() == 9);
  for (std::size_t i = 0; i < seen.size(); ++i) {
    CHECK(seen[i].done == i + 1);
    CHECK(seen[i].total == 9);
    if (i > 0) CHECK(seen[i].elapsed_seconds >= seen[i - 1].elapsed_seconds);
  }
  CHECK(phases == std::vector<std::string>{"knn", "projection", "connectivity", "connectivity",
                                           "connectivity", "connectivity", "connectivity",
                                           "connectivity", "repair"});
  CHECK(seen.back().elapsed_seconds <= stats.total_seconds);
  require_same_graph(g, kvsift::roargraph_builder<>(params()).build(store, train));

  SECTION("without connectivity the steps are kNN and projection") {
    auto p = params();
    p.connectivity = false;
    std::size_t calls = 0, total = 0;
    (void)kvsift::roargraph_builder<>(p).build(store, train, nullptr,
                                               [&](const kvsift::build_progress& s) {
                                                 ++calls;
                                                 total = s.total;
                                               });
    CHECK(calls == 2);
    CHECK(total == 2);
  }
  SECTION("an exception from the callback abandons the build") {
    std::size_t calls = 0;
    auto stop = [&](const kvsift::build_progress& s) {
      ++calls;
      if (s.phase == "projection") throw std::runtime_error("cancelled by the user");
    };
    CHECK_THROWS_WITH(kvsift::roargraph_builder<>(params()).build(store, train, nullptr, stop),
                      "cancelled by the user");
    CHECK(calls == 2);
  }
}

TEST_CASE("build_from_knn gives the graph build gives", "[index][progress]") {
  const kvsift::view_store<float> store(data().key_view());
  const auto train = data().query_view().row_range(0, 200);
  const kvsift::roargraph_builder<> b(params());
  const auto knn = b.training_knn(store.view(), train);
  CHECK(knn.rows == 200);
  CHECK(knn.k == 20);
  std::size_t last_total = 0;
  const auto g = b.build_from_knn(store, knn, nullptr,
                                  [&](const kvsift::build_progress& p) { last_total = p.total; });
  CHECK(last_total == 8);  // the build's 9 steps without the kNN
  require_same_graph(g, b.build(store, train));

  SECTION("l2 goes through the augmented inner product in both paths") {
    const kvsift::roargraph_builder<kvsift::l2> bl(params());
    require_same_graph(bl.build_from_knn(store, bl.training_knn(store.view(), train)),
                       bl.build(store, train));
  }
}

TEST_CASE("build_from_knn and training_knn reject bad input", "[index][progress]") {
  const kvsift::view_store<float> store(data().key_view());
  const kvsift::roargraph_builder<> b(params());
  auto knn = b.training_knn(store.view(), data().query_view().row_range(0, 10));
  auto bad = knn;
  bad.ids[13] = 1200;
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { (void)b.build_from_knn(store, bad); }),
             Contains("holds id 1200, expected < 1200"));
  bad = knn;
  bad.ids[2 * bad.k] = kvsift::invalid_id;
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { (void)b.build_from_knn(store, bad); }),
             Contains("kNN row 2 has no neighbour"));
  bad = knn;
  bad.ids.pop_back();
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { (void)b.build_from_knn(store, bad); }),
             Contains("expected 200"));
  CHECK_THROWS_AS(b.build_from_knn(store, kvsift::knn_result{}), kvsift::invalid_argument);
  const kvsift::view_store<float> empty(kvsift::matrix_view<const float>(nullptr, 0, 16));
  CHECK_THROWS_AS(b.build_from_knn(empty, knn), kvsift::invalid_argument);
  std::vector<float> nan_keys(data().keys);
  nan_keys[5] = std::numeric_limits<float>::quiet_NaN();
  const kvsift::view_store<float> nan_store(
      kvsift::matrix_view<const float>(nan_keys.data(), 1200, 16));
  CHECK_THROWS_AS(b.build_from_knn(nan_store, knn), kvsift::non_finite_value);
  CHECK_THROWS_AS(b.training_knn(nan_store.view(), data().query_view()), kvsift::non_finite_value);
  CHECK_THROWS_AS(b.training_knn(store.view(), data().query_view().row_range(0, 0)),
                  kvsift::invalid_argument);
  CHECK_THROWS_AS(
      b.training_knn(store.view(), kvsift::matrix_view<const float>(data().queries.data(), 10, 15)),
      kvsift::dimension_mismatch);
}

TEST_CASE("build_heads equals one GQA-shared build per KV head", "[index][progress]") {
  // Two KV heads (the second with other keys) of a GQA group of 3 query heads each.
  const auto other = kvsift::testing::make_ood({.keys = 900, .queries = 10, .dim = 16, .seed = 5});
  const auto q = data().query_view();
  std::vector<kvsift::kv_head_job<kvsift::view_store<float>>> jobs{
      {kvsift::view_store<float>(data().key_view()),
       {q.row_range(0, 200), q.row_range(200, 200), q.row_range(400, 200)}},
      {kvsift::view_store<float>(other.key_view()),
       {q.row_range(600, 100), q.row_range(700, 100), q.row_range(0, 100)}}};
  const kvsift::roargraph_builder<> b(params());
  std::vector<kvsift::roargraph_build_stats> stats;
  std::vector<kvsift::build_progress> seen;
  const auto graphs =
      kvsift::build_heads(b, std::span<const kvsift::kv_head_job<kvsift::view_store<float>>>(jobs),
                          {.sample_ratio = 0.25, .seed = 3}, &stats,
                          [&](const kvsift::build_progress& p) { seen.push_back(p); });
  REQUIRE(graphs.size() == 2);
  for (std::size_t h = 0; h < 2; ++h) {
    const auto train = kvsift::sample_gqa_queries(
        std::span<const kvsift::matrix_view<const float>>(jobs[h].query_heads), 0.25, 3);
    CHECK(train.rows() == (h == 0 ? 150u : 75u));
    require_same_graph(graphs[h], b.build(jobs[h].keys, train.view()));
    CHECK(stats[h].knn_seconds > 0);
    CHECK(stats[h].total_seconds >= stats[h].knn_seconds + stats[h].projection_seconds);
  }
  REQUIRE(seen.size() == 2);
  CHECK(seen[0].done == 1);
  CHECK(seen[1].done == 2);
  CHECK(seen[1].total == 2);
  CHECK(seen[1].phase == "head");
  CHECK(kvsift::build_heads(b, std::span<const kvsift::kv_head_job<kvsift::view_store<float>>>())
            .empty());

  using jobs_span = std::span<const kvsift::kv_head_job<kvsift::view_store<float>>>;
  CHECK_THAT(message_of<kvsift::invalid_argument>(
                 [&] { (void)kvsift::build_heads(b, jobs_span(jobs), {.sample_ratio = 0.0}); }),
             Contains("expected sample_ratio in (0, 1], got 0"));
  jobs[1].query_heads.clear();
  CHECK_THAT(
      message_of<kvsift::invalid_argument>([&] { (void)kvsift::build_heads(b, jobs_span(jobs)); }),
      Contains("KV head 1 has no query heads"));
}

TEST_CASE("build_heads rethrows an error of a head's kNN, which runs on a helper thread",
          "[index][progress]") {
  // Head 1's queries have another dimension than its keys: its training kNN throws on the
  // background thread that overlaps it with head 0's build, and build_heads must rethrow that
  // error (not return, not terminate) after head 0 was built.
  const auto narrow = kvsift::testing::make_ood({.keys = 300, .queries = 40, .dim = 8, .seed = 9});
  const auto q = data().query_view();
  std::vector<kvsift::kv_head_job<kvsift::view_store<float>>> jobs{
      {kvsift::view_store<float>(data().key_view()), {q.row_range(0, 200)}},
      {kvsift::view_store<float>(data().key_view()), {narrow.query_view()}}};
  const kvsift::roargraph_builder<> b(params());
  using jobs_span = std::span<const kvsift::kv_head_job<kvsift::view_store<float>>>;
  CHECK_THROWS_AS(kvsift::build_heads(b, jobs_span(jobs), {.sample_ratio = 0.5}),
                  kvsift::dimension_mismatch);
}

TEST_CASE("build_heads_sharded equals build_heads, in job order", "[index][progress]") {
  // Five KV heads over their own keys (sizes differ, so a head in the wrong place shows), cut
  // into shards of 2 + 3 heads (two builders) and of 1 + 1 + 1 + 1 + 1 (more builders than heads).
  std::vector<kvsift::testing::ood_data> keys;
  for (int h = 0; h < 5; ++h) {
    keys.push_back(kvsift::testing::make_ood({.keys = static_cast<std::size_t>(300 + 40 * h),
                                              .queries = 4,
                                              .dim = 16,
                                              .seed = static_cast<std::uint64_t>(20 + h)}));
  }
  const auto q = data().query_view();
  std::vector<kvsift::kv_head_job<kvsift::view_store<float>>> jobs;
  for (int h = 0; h < 5; ++h) {
    jobs.push_back({kvsift::view_store<float>(keys[h].key_view()),
                    {q.row_range(100 * h, 100), q.row_range(100 * h + 50, 100)}});
  }
  using jobs_span = std::span<const kvsift::kv_head_job<kvsift::view_store<float>>>;
  auto p = params();
  p.threads = 1;
  const kvsift::roargraph_builder<> one(p);
  const kvsift::build_pipeline_params bp{.sample_ratio = 0.5, .seed = 4};
  const auto expected = kvsift::build_heads(one, jobs_span(jobs), bp);
  for (const std::size_t count : {std::size_t{1}, std::size_t{2}, std::size_t{7}}) {
    const std::vector<kvsift::roargraph_builder<>> builders(count, one);
    std::vector<kvsift::roargraph_build_stats> stats;
    std::vector<std::size_t> done;
    const auto graphs = kvsift::build_heads_sharded(
        std::span<const kvsift::roargraph_builder<>>(builders), jobs_span(jobs), bp, &stats,
        [&](const kvsift::build_progress& pr) {
          CHECK(pr.total == 5);
          CHECK(pr.phase == "head");
          done.push_back(pr.done);
        });
    INFO(count << " builders");
    REQUIRE(graphs.size() == 5);
    for (std::size_t h = 0; h < 5; ++h) {
      INFO("head " << h);
      require_same_graph(graphs[h], expected[h]);
      CHECK(stats[h].knn_seconds > 0);
    }
    CHECK(done == std::vector<std::size_t>{1, 2, 3, 4, 5});  // one call at a time, counted
  }
  const std::vector<kvsift::roargraph_builder<>> two(2, one);
  const std::span<const kvsift::roargraph_builder<>> two_span(two);
  std::vector<kvsift::roargraph_build_stats> stats(3);
  CHECK(kvsift::build_heads_sharded(two_span, jobs_span(), bp, &stats).empty());
  CHECK(stats.empty());

  // Bad input is refused before any head is built.
  std::size_t calls = 0;
  const auto count_calls = [&](const kvsift::build_progress&) { ++calls; };
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] {
               (void)kvsift::build_heads_sharded(std::span<const kvsift::roargraph_builder<>>(),
                                                 jobs_span(jobs));
             }),
             Contains("expected at least 1 builder, got 0"));
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] {
               (void)kvsift::build_heads_sharded(two_span, jobs_span(jobs), {.sample_ratio = 1.5},
                                                 nullptr, count_calls);
             }),
             Contains("expected sample_ratio in (0, 1], got 1.5"));
  jobs[4].query_heads.clear();
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] {
               (void)kvsift::build_heads_sharded(two_span, jobs_span(jobs), bp, nullptr,
                                                 count_calls);
             }),
             Contains("KV head 4 has no query heads"));
  CHECK(calls == 0);

  // An error of the second builder's thread (its last head's queries have another dimension)
  // is rethrown after the first builder's heads were built.
  const auto narrow = kvsift::testing::make_ood({.keys = 300, .queries = 40, .dim = 8, .seed = 9});
  jobs[4].query_heads = {narrow.query_view()};
  CHECK_THROWS_AS(kvsift::build_heads_sharded(two_span, jobs_span(jobs), bp, nullptr, count_calls),
                  kvsift::dimension_mismatch);
  CHECK(calls >= 2);
}
