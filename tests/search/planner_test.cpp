#include <catch2/catch.hpp>

#include <limits>
#include <string>

#include "../test_support.hpp"
#include "kvsift/search/planner.hpp"

namespace {

using Catch::Matchers::Contains;
using kvsift_test::message_of;

kvsift::plan_inputs inputs(std::size_t context, std::size_t prefix, std::size_t layer,
                           double budget) {
  return {.context = context,
          .reused_prefix = prefix,
          .layer = layer,
          .gpu_budget_bytes = budget,
          .latency_budget_us = std::nullopt};
}

}  // namespace

TEST_CASE("planner: default rules, one decision per rule", "[planner]") {
  const kvsift::planner pl;  // short_context 4096, head_dim 128, 64 x 16 coarse blocks
  const double coarse_32k = pl.gpu_bytes("coarse", inputs(32768, 0, 3, 0));
  // 512 blocks * 3 * 128 * 4 B of summaries + 1024 tokens * 512 B of K/V.
  CHECK(coarse_32k == Approx(512.0 * 3 * 128 * 4 + 1024.0 * 512));

  SECTION("short context -> full attention, whatever the budget and prefix") {
    const auto p = pl.choose(inputs(4096, 1000, 7, 0));
    CHECK(p.name() == "full-full");
    CHECK(p.decided_by == "short_context");
    CHECK_THAT(p.explain(), Contains("context 4096 <= 4096"));
  }
  SECTION("budget sufficient -> coarse block top-k") {
    const auto p = pl.choose(inputs(32768, 0, 3, coarse_32k));
    CHECK(p.name() == "coarse-topk");
    CHECK(p.decided_by == "coarse_if_budget");
    CHECK(p.params.at("k_blocks") == 16);
    CHECK(p.gpu_bytes == coarse_32k);
  }
  SECTION("tight budget, layer 0 -> DIPR on the flat index") {
    const auto p = pl.choose(inputs(32768, 0, 0, coarse_32k - 1));
    CHECK(p.name() == "flat-dipr");
    CHECK(p.decided_by == "dipr_flat_layer0");
    CHECK_THAT(p.explain(), Contains("coarse index needs"));
  }
  SECTION("tight budget, other layers -> DIPR on the graph index") {
    const auto p = pl.choose(inputs(32768, 0, 1, 0));
    CHECK(p.name() == "graph-dipr");
    CHECK(p.decided_by == "dipr_graph");
    CHECK(p.params.at("beta") == 8.0);
  }
  SECTION("partial prefix reuse adds id_below(prefix) to the chosen plan") {
    const auto p = pl.choose(inputs(32768, 20000, 5, 0));
    CHECK(p.name() == "graph-dipr+id_below(20000)");
    CHECK_THAT(p.explain(), Contains("id_below(20000)"));
    const auto c = pl.choose(inputs(32768, 20000, 5, 1e12));
    CHECK(c.name() == "coarse-topk+id_below(20000)");
    // A fully reused prefix needs no filter.
    CHECK(!pl.choose(inputs(32768, 32768, 5, 0)).filter_prefix);
  }
}

TEST_CASE("planner: rules are ordered and user-extensible", "[planner]") {
  kvsift::planner pl;
  REQUIRE(pl.rules().size() == 5);
  CHECK(pl.rules().front().name == "short_context");
  // A new index kind and a rule using the latency budget, placed before the graph fallback.
  pl.add_index_kind({"ivf", "clustered keys", [](const kvsift::plan_inputs&) { return 1.0; }});
  pl.add_query_kind({"topp", "top-p mass"});
  pl.add_rule({"fast_ivf",
               [](const kvsift::plan_inputs& in, const kvsift::planner&, kvsift::plan& p) {
                 if (!in.latency_budget_us || *in.latency_budget_us > 50)
                   return kvsift::rule_outcome::pass;
                 p.index = "ivf";
                 p.query = "topp";
                 p.reasons.push_back("latency budget under 50 us");
                 return kvsift::rule_outcome::decide;
               }},
              "dipr_flat_layer0");
  auto in = inputs(32768, 0, 0, 0);
  CHECK(pl.choose(in).name() == "flat-dipr");  // no latency budget: the rule passes
  in.latency_budget_us = 20;
  const auto p = pl.choose(in);
  CHECK(p.name() == "ivf-topp");
  CHECK(p.gpu_bytes == 1.0);
  CHECK(pl.rules()[3].name == "fast_ivf");
  // Removing the short-context rule sends short contexts down the other rules.
  pl.remove_rule("short_context");
  CHECK(pl.choose(inputs(100, 0, 2, 1e12)).name() == "coarse-topk");
  CHECK(pl.parse_name("ivf-topp")->first == "ivf");
  CHECK(!pl.parse_name("auto"));
}

TEST_CASE("planner: bad input", "[planner]") {
  kvsift::planner pl;
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { (void)pl.choose(inputs(100, 0, 0, -1)); }),
             Contains("budget >= 0 bytes, got -1"));
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] {
               (void)pl.choose(inputs(100, 0, 0, std::numeric_limits<double>::quiet_NaN()));
             }),
             Contains("budget >= 0"));
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { (void)pl.choose(inputs(100, 101, 0, 0)); }),
             Contains("prefix of 101 tokens is longer than the context of 100"));
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { (void)pl.choose(inputs(0, 0, 0, 0)); }),
             Contains("context > 0"));
  auto neg = inputs(100, 0, 0, 0);
  neg.latency_budget_us = -5;
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { (void)pl.choose(neg); }),
             Contains("latency budget >= 0 us, got -5"));
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { (void)pl.parse_name("hnsw-topk"); }),
             Contains("unknown index kind 'hnsw'; registered: coarse, flat, full, graph"));
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { (void)pl.parse_name("graph-knn"); }),
             Contains("unknown query kind 'knn'"));
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { (void)pl.parse_name("magic"); }),
             Contains("got 'magic'"));
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { pl.remove_rule("nope"); }),
             Contains("unknown rule 'nope'"));
  CHECK_THAT(
      message_of<kvsift::invalid_argument>([&] {
        pl.add_rule({"short_context", [](const kvsift::plan_inputs&, const kvsift::planner&,
                                         kvsift::plan&) { return kvsift::rule_outcome::pass; }});
      }),
      Contains("exists already"));
  CHECK_THAT(message_of<kvsift::invalid_argument>([] {
               kvsift::planner_params p;
               p.block_size = 0;
               kvsift::planner{p};
             }),
             Contains("block_size"));
  // A rule naming an unregistered kind is caught when it decides.
  pl.add_rule({"typo",
               [](const kvsift::plan_inputs&, const kvsift::planner&, kvsift::plan& p) {
                 p.index = "grpah";
                 p.query = "dipr";
                 return kvsift::rule_outcome::decide;
               }},
              "short_context");
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { (void)pl.choose(inputs(100, 0, 0, 0)); }),
             Contains("unknown index kind 'grpah'"));
  // No rule deciding is an error, not an empty plan.
  kvsift::planner empty;
  for (const char* r :
       {"short_context", "prefix_filter", "coarse_if_budget", "dipr_flat_layer0", "dipr_graph"})
    empty.remove_rule(r);
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { (void)empty.choose(inputs(9, 0, 0, 0)); }),
             Contains("no rule decided"));
}
