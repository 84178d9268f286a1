// plan_executor: each built-in plan executed equals the hand-written composition of the
// library's calls (id for id, the same output state); with a budget covering every token the
// executed step equals dense attention (double-precision oracle); user-registered kinds run;
// bad input throws before any search.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "../attention/attention_reference.hpp"
#include "../search/search_fixture.hpp"
#include "kvsift/attention/merge.hpp"
#include "kvsift/core/dense_matrix.hpp"
#include "kvsift/decode/plan_executor.hpp"
#include "kvsift/index/block_index.hpp"
#include "kvsift/search/beam_search.hpp"
#include "kvsift/search/dipr_search.hpp"

namespace {

using namespace kvsift_test;
using kvsift::id_range;
using kvsift::invalid_id;

constexpr std::size_t block = 16;

struct env {
  kvsift::dense_matrix<float> values;
  kvsift::kv_view<float> kv;
  kvsift::block_index<> coarse;
  kvsift::default_plan_resources res;
};

const env& ev() {
  static const env e = [] {
    const auto& f = fx();
    env out;
    const std::size_t n = f.data.key_view().rows(), d = f.data.key_view().cols();
    out.values = kvsift::dense_matrix<float>(n, d);
    std::mt19937 rng(3);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < d; ++j) out.values.row(i)[j] = dist(rng);
    out.kv = kvsift::kv_view<float>(f.data.key_view(), out.values.cview());
    out.coarse = kvsift::block_index<>(f.data.key_view(), block);
    return out;
  }();
  return e;
}

kvsift::default_plan_resources resources() {
  return {.flat = &fx().flat, .graph = &fx().graph, .coarse = &ev().coarse};
}

kvsift::plan make_plan(const std::string& index, const std::string& query) {
  kvsift::plan p;
  p.index = index;
  p.query = query;
  return p;
}

/// The composition written out by hand: what a caller without the executor did.
struct by_hand {
  std::vector<kvsift::id_t> ids;
  kvsift::partial_state state;
};

by_hand compose(const kvsift::plan& p, std::span<const float> q,
                const kvsift::plan_step_params& prm) {
  const auto& f = fx();
  const auto& e = ev();
  kvsift::search_workspace ws;
  by_hand out;
  const std::size_t ctx = prm.context, w0 = prm.window.initial, w1 = prm.window.recent;
  if (p.index == "full") {
    out.state = kvsift::dense_attention(q, 0, 0, ctx, e.kv);
    return out;
  }
  std::size_t last = ctx - w1;
  if (p.filter_prefix) last = std::min(last, *p.filter_prefix);
  const id_range r{w0, last};
  const float beta =
      p.params.count("beta") ? static_cast<float>(p.params.at("beta")) : prm.dipr.beta;
  float seed = -std::numeric_limits<float>::infinity();
  for (std::size_t t = 0; t < ctx; ++t)
    if (t < w0 || t >= ctx - w1)
      seed = std::max(seed,
                      kvsift::inner_product::score(q.data(), f.data.key_view().row(t), q.size()));
  const kvsift::dipr_params dp{
      .beta = beta,
      .l0 = 32,
      .max_candidates = 0,
      .seed_score = prm.seed_from_window ? seed : std::numeric_limits<float>::quiet_NaN(),
      .walk_through = prm.dipr.walk_through,
      .entry_prefix = prm.dipr.entry_prefix};
  if (p.index == "coarse") {
    kvsift::block_result br;
    if (p.query == "topk")
      e.coarse.topk(q, static_cast<std::size_t>(p.params.at("k_blocks")), ws, br, r);
    else
      e.coarse.dipr(q, beta, ws, br, r);
    e.coarse.tokens(br.blocks, out.ids, r);
  } else if (p.query == "topk") {
    std::vector<kvsift::id_t> ids(prm.budget);
    std::vector<float> sc(prm.budget);
    if (p.index == "flat")
      f.flat.topk(q, prm.budget, ws, ids, sc, r);
    else
      kvsift::beam_search(f.graph, q,
                          {.k = prm.budget,
                           .L = 100,
                           .walk_through = prm.walk_through,
                           .entry_prefix = prm.entry_prefix},
                          ws, std::span<kvsift::id_t>(ids), std::span<float>(sc), r);
    std::erase(ids, invalid_id);
    out.ids = ids;
  } else {
    kvsift::dipr_result dr;
    if (p.index == "flat")
      f.flat.dipr(q, dp, ws, dr, r);
    else
      kvsift::dipr_search(f.graph, q, dp, ws, dr, r);
    out.ids = dr.ids;
  }
  if (prm.budget != 0 && out.ids.size() > prm.budget) out.ids.resize(prm.budget);
  out.state = kvsift::dense_attention(q, 0, 0, w0, e.kv);
  kvsift::merge_into(out.state, kvsift::dense_attention(q, 0, ctx - w1, ctx, e.kv));
  kvsift::merge_into(out.state, kvsift::sparse_attention(q, 0, out.ids, e.kv));
  return out;
}

void check_same_state(const kvsift::partial_state& got, const kvsift::partial_state& want) {
  REQUIRE(got.dim() == want.dim());
  CHECK(got.lse == Approx(want.lse).epsilon(1e-6));
  for (std::size_t j = 0; j < got.dim(); ++j) CHECK(got.o[j] == Approx(want.o[j]).margin(1e-6));
}

}  // namespace

TEST_CASE("each built-in plan executed equals the hand-written composition",
          "[plan_executor][decode]") {
  const auto& f = fx();
  const auto res = resources();
  kvsift::search_workspace ws;
  kvsift::plan_step_output out;
  const std::vector<std::pair<std::string, std::string>> kinds{
      {"full", "full"},  {"flat", "topk"},   {"flat", "dipr"},  {"graph", "topk"},
      {"graph", "dipr"}, {"coarse", "topk"}, {"coarse", "dipr"}};
  std::size_t retrieved = 0, cut = 0;
  for (const auto& [index, query] : kinds) {
    for (const int variant : {0, 1, 2, 3}) {
      // With and without a prefix filter; with and without walking through the excluded ids
      // (and then entering the walk at the sinks, the window's first 16 tokens).
      const bool prefix = variant % 2 == 1;
      const bool walk_through = variant < 2;
      const std::size_t sinks = walk_through ? 0 : 16;
      auto p = make_plan(index, query);
      p.params["k_blocks"] = 6;
      p.params["beta"] = 6.0;
      p.params["l0"] = 32;
      if (prefix) p.filter_prefix = 900;
      for (std::size_t i = 0; i < 20; ++i) {
        const auto q = f.eval.row_span(i);
        const kvsift::plan_step_params prm{
            .context = 1500 + 20 * i,
            .window = {16, 64},
            .budget = 60,
            .dipr = {.beta = 1.0f, .l0 = 7, .walk_through = walk_through, .entry_prefix = sinks},
            .seed_from_window = true,
            .walk_through = walk_through,
            .entry_prefix = sinks};
        INFO(p.name() << " query " << i << " walk_through " << walk_through);
        kvsift::execute_plan(p, res, q, ev().kv, 0, prm, ws, out);
        const auto want = compose(p, q, prm);
        CHECK(out.retrieval.everything == (index == "full"));
        CHECK(out.retrieval.ids == want.ids);
        check_same_state(out.state, want.state);
        for (auto id : out.retrieval.ids) {
          CHECK(id >= 16);
          CHECK(id < (prefix ? 900u : prm.context - 64));
        }
        retrieved += out.retrieval.ids.size();
        cut += out.retrieval.ids.size() == prm.budget ? 1 : 0;
      }
    }
  }
  // Guards the test itself: retrieval returned ids, and the budget cut acted on some answers.
  CHECK(retrieved > 1000);
  CHECK(cut > 20);
}

TEST_CASE("an index over fewer tokens than the context retrieves only indexed tokens",
          "[plan_executor][decode]") {
  // Decode-time tokens not yet indexed: the retrieval range is clipped to the index's size
  // (the window still covers the newest tokens).
  const auto& f = fx();
  const auto keys = f.data.key_view().row_range(0, 1200);
  const kvsift::flat_index<kvsift::view_store<float>> flat{kvsift::view_store<float>(keys)};
  const kvsift::block_index<> coarse(keys, block);
  const kvsift::default_plan_resources res{.flat = &flat, .coarse = &coarse};
  kvsift::search_workspace ws;
  kvsift::plan_step_output out;
  auto p = make_plan("coarse", "dipr");
  p.params["beta"] = 1e9;
  for (const char* index : {"flat", "coarse"}) {
    p.index = index;
    kvsift::execute_plan(p, res, f.eval.row_span(0), ev().kv, 0,
                         {.context = 1500, .window = {16, 64}, .dipr = {.beta = 1e9f}}, ws, out);
    INFO(index);
    CHECK(out.retrieval.ids.size() == 1200 - 16);
    CHECK(out.retrieval.range.last == 1500 - 64);  // the request; the index clips it
    for (auto id : out.retrieval.ids) CHECK((id >= 16 && id < 1200));
  }
}

TEST_CASE("window seeding prunes DIPR with the window's best score", "[plan_executor][decode]") {
  const auto& f = fx();
  const auto res = resources();
  kvsift::search_workspace ws;
  kvsift::plan_step_output seeded, plain;
  std::size_t pruned = 0, cases = 0;
  for (std::size_t i = 0; i < 100; ++i) {
    const auto q = f.eval.row_span(i);
    // The query's best key: put it at the end of the context, inside the recent window.
    std::size_t best = 0;
    for (std::size_t t = 1; t < f.flat.size(); ++t)
      if (kvsift::inner_product::score(q.data(), f.flat.store().row(t), q.size()) >
          kvsift::inner_product::score(q.data(), f.flat.store().row(best), q.size()))
        best = t;
    if (best < 400) continue;
    ++cases;
    for (const char* index : {"flat", "graph"}) {
      auto p = make_plan(index, "dipr");
      p.params["beta"] = 1.0;  // raw scores here spread over ~6
      p.params["l0"] = 32;
      kvsift::plan_step_params prm{.context = best + 10, .window = {16, 64}};
      prm.seed_from_window = true;
      kvsift::execute_plan(p, res, q, ev().kv, 0, prm, ws, seeded);
      const auto want = compose(p, q, prm);
      CHECK(seeded.retrieval.ids == want.ids);
      check_same_state(seeded.state, want.state);
      prm.seed_from_window = false;
      kvsift::execute_plan(p, res, q, ev().kv, 0, prm, ws, plain);
      CHECK(plain.retrieval.ids == compose(p, q, prm).ids);
      CHECK(seeded.retrieval.ids.size() <= plain.retrieval.ids.size());
      pruned += seeded.retrieval.ids.size() < plain.retrieval.ids.size() ? 1 : 0;
    }
  }
  INFO(cases << " queries with the best key late in the context");
  CHECK(cases >= 10);
  CHECK(pruned >= cases);
}

TEST_CASE("a step whose retrieval covers every token equals dense attention",
          "[plan_executor][decode]") {
  const auto& f = fx();
  const auto res = resources();
  kvsift::search_workspace ws;
  kvsift::plan_step_output out;
  const std::size_t ctx = 1700;
  struct kase {
    const char* index;
    const char* query;
  };
  for (const auto& k : {kase{"full", "full"}, kase{"flat", "topk"}, kase{"flat", "dipr"},
                        kase{"coarse", "topk"}, kase{"coarse", "dipr"}}) {
    auto p = make_plan(k.index, k.query);
    p.params["k_blocks"] = 1000;  // every block
    p.params["beta"] = 1e9;       // every token is within beta of the best
    for (std::size_t i = 0; i < 10; ++i) {
      const auto q = f.eval.row_span(i);
      INFO(p.name() << " query " << i);
      kvsift::execute_plan(p, res, q, ev().kv, 0,
                           {.context = ctx, .window = {32, 100}, .budget = 0, .topk = ctx}, ws,
                           out);
      if (!out.retrieval.everything) CHECK(out.retrieval.ids.size() == ctx - 132);
      std::vector<kvsift::id_t> all(ctx);
      for (std::size_t t = 0; t < ctx; ++t) all[t] = static_cast<kvsift::id_t>(t);
      check_close(out.state,
                  reference_attention(q, 0, all, ev().kv, 1.0 / std::sqrt(double(q.size()))), 1e-5);
    }
  }
}

TEST_CASE("a budget too small for the context leaves a measurable error",
          "[plan_executor][decode]") {
  // The guard of the test above: a step that drops tokens must not pass as dense.
  const auto& f = fx();
  kvsift::search_workspace ws;
  kvsift::plan_step_output out;
  const auto q = f.eval.row_span(0);
  kvsift::execute_plan(make_plan("flat", "topk"), resources(), q, ev().kv, 0,
                       {.context = 1700, .window = {32, 100}, .budget = 10}, ws, out);
  std::vector<kvsift::id_t> all(1700);
  for (std::size_t t = 0; t < all.size(); ++t) all[t] = static_cast<kvsift::id_t>(t);
  const auto ref = reference_attention(q, 0, all, ev().kv, 1.0 / std::sqrt(double(q.size())));
  double worst = 0;
  for (std::size_t j = 0; j < ref.o.size(); ++j)
    worst = std::max(worst, std::abs(out.state.o[j] - ref.o[j]));
  CHECK(worst > 1e-3);
}

TEST_CASE("a user-registered plan kind runs through the executor", "[plan_executor][decode]") {
  const auto& f = fx();
  kvsift::plan_executor<kvsift::default_plan_resources> ex;
  auto p = make_plan("every_third", "topk");
  CHECK_FALSE(ex.can_run("every_third", "topk"));
  const auto msg = message_of<kvsift::invalid_argument>([&] {
    kvsift::search_workspace ws;
    kvsift::plan_step_output out;
    ex.execute(p, resources(), f.eval.row_span(0), ev().kv, 0, {.context = 100}, ws, out);
  });
  CHECK_THAT(
      msg, Contains("every_third-topk") && Contains("flat-dipr") && Contains("plan_executor::add"));
  ex.add("every_third", "topk",
         [](const kvsift::default_plan_resources&, const kvsift::plan_request& rq,
            kvsift::search_workspace&, kvsift::plan_retrieval& out) {
           for (std::size_t t = rq.range.first; t < rq.range.last; t += 3)
             out.ids.push_back(static_cast<kvsift::id_t>(t));
         });
  REQUIRE(ex.can_run("every_third", "topk"));
  kvsift::search_workspace ws;
  kvsift::plan_step_output out;
  const auto q = f.eval.row_span(1);
  ex.execute(p, resources(), q, ev().kv, 0, {.context = 100, .window = {4, 6}}, ws, out);
  std::vector<kvsift::id_t> want;
  for (kvsift::id_t t = 4; t < 94; t += 3) want.push_back(t);
  CHECK(out.retrieval.ids == want);
  auto attended = kvsift::attended_tokens(100, want, {4, 6});
  check_close(out.state,
              reference_attention(q, 0, attended, ev().kv, 1.0 / std::sqrt(double(q.size()))),
              1e-5);
}

TEST_CASE("plan_executor rejects bad input before any search", "[plan_executor][decode]") {
  const auto& f = fx();
  const auto res = resources();
  kvsift::search_workspace ws;
  kvsift::plan_step_output out;
  const auto q = f.eval.row_span(0);
  const kvsift::plan_step_params ok{.context = 1000, .window = {16, 64}, .budget = 20};
  auto run = [&](const kvsift::plan& p, std::span<const float> qq,
                 const kvsift::plan_step_params& prm, const kvsift::default_plan_resources& r,
                 std::size_t head = 0) {
    kvsift::execute_plan(p, r, qq, ev().kv, head, prm, ws, out);
  };
  SECTION("unknown kinds, and a registered kind with no executor") {
    CHECK_THAT(
        message_of<kvsift::invalid_argument>([&] { run(make_plan("hnsw", "topk"), q, ok, res); }),
        Contains("'hnsw-topk'") && Contains("graph-dipr"));
    CHECK_THAT(
        message_of<kvsift::invalid_argument>([&] { run(make_plan("flat", "full"), q, ok, res); }),
        Contains("'flat-full'"));
  }
  SECTION("a missing resource names it") {
    for (const char* idx : {"flat", "graph", "coarse"}) {
      auto r = res;
      if (std::string(idx) == "flat") r.flat = nullptr;
      if (std::string(idx) == "graph") r.graph = nullptr;
      if (std::string(idx) == "coarse") r.coarse = nullptr;
      CHECK_THAT(
          message_of<kvsift::invalid_argument>([&] { run(make_plan(idx, "dipr"), q, ok, r); }),
          Contains(std::string("plan_resources::") + idx));
    }
    // full attention needs no index at all
    CHECK_NOTHROW(run(make_plan("full", "full"), q, ok, {}));
  }
  SECTION("wrong shapes") {
    CHECK_THROWS_AS(run(make_plan("flat", "dipr"), q.first(31), ok, res),
                    kvsift::dimension_mismatch);
    CHECK_THROWS_AS(run(make_plan("flat", "dipr"), q, {.context = 2001}, res),
                    kvsift::out_of_range);
    CHECK_THROWS_AS(run(make_plan("flat", "dipr"), q, ok, res, 1), kvsift::out_of_range);
    CHECK_THAT(message_of<kvsift::invalid_argument>([&] {
                 run(make_plan("flat", "dipr"), q, {.context = 50, .window = {16, 64}}, res);
               }),
               Contains("at most the 50 tokens") && Contains("16 + 64"));
  }
  SECTION("NaN and Inf queries") {
    for (float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      std::vector<float> qq(q.begin(), q.end());
      qq[5] = bad;
      CHECK_THROWS_AS(run(make_plan("graph", "dipr"), qq, ok, res), kvsift::non_finite_value);
    }
  }
  SECTION("empty: context 0; a window covering the context retrieves nothing") {
    CHECK_THAT(message_of<kvsift::invalid_argument>(
                   [&] { run(make_plan("flat", "dipr"), q, {.context = 0}, res); }),
               Contains("context > 0"));
    run(make_plan("graph", "dipr"), q, {.context = 80, .window = {16, 64}}, res);
    CHECK(out.retrieval.ids.empty());
    check_close(out.state, kvsift::dense_attention(q, 0, 0, 80, ev().kv), 1e-6);
  }
  SECTION("out-of-range and overflow-sized parameters") {
    CHECK_THAT(message_of<kvsift::invalid_argument>(
                   [&] { run(make_plan("flat", "topk"), q, {.context = 1000, .budget = 0}, res); }),
               Contains("topk or budget > 0"));
    auto p = make_plan("coarse", "topk");
    for (double bad : {-1.0, 0.0, 2.5, std::numeric_limits<double>::quiet_NaN(), 1e300}) {
      p.params["k_blocks"] = bad;
      CHECK_THAT(message_of<kvsift::invalid_argument>([&] { run(p, q, ok, res); }),
                 Contains("k_blocks"));
    }
    auto d = make_plan("graph", "dipr");
    d.params["beta"] = -1;
    CHECK_THROWS_AS(run(d, q, ok, res), kvsift::invalid_argument);
    CHECK_THROWS_AS(
        run(make_plan("flat", "dipr"), q,
            {.context = 1000, .window = {std::numeric_limits<std::size_t>::max(), 2}}, res),
        kvsift::invalid_argument);
  }
}
