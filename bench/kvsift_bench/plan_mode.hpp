#pragma once
// kvsift-bench --plan: the planner's choice against fixed plans on per-layer dumps, at equal GPU
// memory.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kvsift/attention/quality.hpp"
#include "kvsift/decode/plan_executor.hpp"
#include "kvsift/index/block_index.hpp"
#include "kvsift/kvsift.hpp"
#include "kvsift/search/planner.hpp"
#include "kvsift_bench/options.hpp"

namespace kvsift_bench {

/// --plan: tokens attended and attention-output error of coarse top-k, DIPR-flat, DIPR-graph
/// and the planner's plan on real dumps, per layer and GPU budget, at equal GPU memory: the
/// static window (128 + 512) is resident for all; on top of it a budget of B tokens of f16 K+V
/// holds the retrieved tokens, and for the coarse index also its summaries (3 * d f32 per
/// block, 3 tokens' worth), so coarse top-k fetches (B - summaries) / block_size blocks. DIPR
/// answers are cut to their best B tokens. Query t attends causally to tokens [0, t].
inline int run_plan(const options& o) {
  namespace fs = std::filesystem;
  using store_t = kvsift::view_store<float>;
  const fs::path dir = o.plan_dump;
  auto file = [&](std::size_t l, char kind, std::size_t h) {
    return dir / ("L" + std::to_string(l) + "_" + kind + std::to_string(h) + ".fbin");
  };
  std::vector<std::size_t> layers;
  for (std::size_t l = 0; l < 512; ++l)
    if (fs::exists(file(l, 'k', 0))) layers.push_back(l);
  if (layers.empty()) throw kvsift::io_error("--plan-dump: no L<layer>_k0.fbin in " + dir.string());
  std::size_t kv_heads = 0, q_heads = 0;
  while (fs::exists(file(layers[0], 'k', kv_heads))) ++kv_heads;
  while (fs::exists(file(layers[0], 'q', q_heads))) ++q_heads;
  const std::size_t group = std::max<std::size_t>(1, q_heads / kv_heads), bs = 64;
  const auto forced = kvsift::planner().parse_name(o.plan);
  const std::vector<std::string> methods{"coarse-topk", "flat-dipr", "graph-dipr", o.plan};
  struct acc {
    double tokens = 0, recovery = 0, error = 0, n = 0;
    std::set<std::string> plans;
  };
  std::map<std::tuple<std::size_t, std::size_t, std::size_t>, acc> table;  // layer, budget, m
  std::printf("kvsift-bench --plan %s: %s, layers", o.plan.c_str(), dir.c_str());
  for (auto l : layers) std::printf(" %zu", l);
  std::printf(", %zu KV heads (KV head h: query head %zu h, the first of its group)\n", kv_heads,
              group);
  for (std::size_t l : layers) {
    for (std::size_t h = 0; h < kv_heads; ++h) {
      const auto K = kvsift::read_vectors(file(l, 'k', h)),
                 V = kvsift::read_vectors(file(l, 'v', h));
      const auto Q = kvsift::read_vectors(file(l, 'q', h * group));
      // Query t is row t of Q (token t attends to [0, t]), V is read beside K, and the
      // training/held-out split needs two rows: check all of that before any row is read (a Q
      // shorter than K was read past its end).
      auto where = [&](char kind, std::size_t head) { return file(l, kind, head).string(); };
      kvsift::detail::require<kvsift::dimension_mismatch>(
          K.rows() >= 2, "--plan-dump: expected at least 2 keys in ", where('k', h), ", got ",
          K.rows());
      kvsift::detail::require<kvsift::dimension_mismatch>(
          V.rows() == K.rows() && V.cols() == K.cols(), "--plan-dump: expected ", where('v', h),
          " of ", K.rows(), " x ", K.cols(), " (as ", where('k', h), "), got ", V.rows(), " x ",
          V.cols());
      kvsift::detail::require<kvsift::dimension_mismatch>(
          Q.rows() >= K.rows() && Q.cols() == K.cols(), "--plan-dump: expected ",
          where('q', h * group), " of at least ", K.rows(), " rows x ", K.cols(),
          " (one query per key position of ", where('k', h), "), got ", Q.rows(), " x ", Q.cols());
      const std::size_t n = K.rows(), d = K.cols(), first = n - std::max<std::size_t>(1, n / 20);
      const std::size_t evals = o.eval ? std::min(o.eval, n - first) : n - first;
      const kvsift::kv_view<float> kv(K.cview(), V.cview());
      const store_t store(K.cview());
      const kvsift::flat_index<store_t> flat(store);
      const kvsift::block_index<> coarse(K.cview(), bs);
      std::fprintf(stderr, "layer %zu head %zu: building RoarGraph from %zu queries...\n", l, h,
                   first);
      const auto graph =
          kvsift::roargraph_builder<>(o.build).build(store, Q.cview().row_range(0, first));
      kvsift::planner_params pp;
      pp.head_dim = d;
      pp.block_size = bs;
      pp.dipr_beta = 5.0 * std::sqrt(static_cast<double>(d));  // weights down to e^-5 of the best
      const kvsift::planner pl(pp);
      const double token_bytes = pp.kv_bytes_per_token();
      const double summary_tokens = static_cast<double>(coarse.summary_bytes()) / token_bytes;
      const float beta = static_cast<float>(pp.dipr_beta);
      using resources_t =
          kvsift::plan_resources<kvsift::flat_index<store_t>, std::remove_cvref_t<decltype(graph)>>;
      const resources_t indexes{.flat = &flat, .graph = &graph, .coarse = &coarse};
      const auto& exec = kvsift::default_plan_executor<resources_t>();
      std::vector<kvsift::search_workspace> ws(o.build.threads ? o.build.threads
                                                               : kvsift::default_thread_count());
      const std::size_t cells = o.plan_budget.size() * methods.size();
      std::vector<std::array<double, 3>> res(evals * cells);
      std::vector<std::string> chosen(evals * cells);
      kvsift::parallel_for(evals, ws.size(), [&](std::size_t e, std::size_t th) {
        const std::size_t t = first + e * (n - first) / evals, context = t + 1;
        const auto q = Q.cview().row_span(t);
        // Full attention over the causal context is the baseline of every (budget, method)
        // cell of this query: computed once here, not once per cell.
        const auto full = kvsift::dense_attention(q, 0, 0, context, kv);
        kvsift::plan_retrieval got;
        for (std::size_t b = 0; b < o.plan_budget.size(); ++b) {
          const std::size_t budget = o.plan_budget[b];
          const auto equal_blocks = static_cast<std::size_t>(std::max(
              1.0, (static_cast<double>(budget) - summary_tokens) / static_cast<double>(bs)));
          for (std::size_t m = 0; m < methods.size(); ++m) {
            kvsift::plan p;
            const auto dash = methods[m].find('-');
            p.index = methods[m].substr(0, dash);
            p.query = methods[m].substr(dash + 1);
            p.params["k_blocks"] = static_cast<double>(equal_blocks);
            if (m + 1 == methods.size() && !forced) {
              p = pl.choose({.context = context,
                             .reused_prefix = 0,
                             .layer = l,
                             .gpu_budget_bytes = static_cast<double>(budget) * token_bytes,
                             .latency_budget_us = std::nullopt});
            }
            // The library's one dispatch: the search the plan names, restricted to the
            // causal context, cut to the best B (full attention is never cut).
            exec.retrieve(p, indexes, q,
                          {.context = context,
                           .budget = budget,
                           .k_blocks = equal_blocks,
                           .dipr = {.beta = beta, .l0 = pp.dipr_l0}},
                          ws[th], got);
            std::vector<kvsift::id_t> ids = got.ids;
            if (got.everything) {
              ids.resize(context);
              std::iota(ids.begin(), ids.end(), kvsift::id_t{0});
            }
            const auto att = kvsift::attended_tokens(context, ids);
            const auto qual = kvsift::compare_states(full, kvsift::sparse_attention(q, 0, att, kv));
            res[e * cells + b * methods.size() + m] = {static_cast<double>(att.size()),
                                                       qual.recovery, qual.rel_l2_error};
            chosen[e * cells + b * methods.size() + m] = p.name();
            if (m + 1 == methods.size() && e == 0 && h == 0 && !forced) {
              std::printf("  layer %zu, budget %zu tokens: %s\n", l, budget, p.explain().c_str());
            }
          }
        }
      });
      for (std::size_t e = 0; e < evals; ++e)
        for (std::size_t b = 0; b < o.plan_budget.size(); ++b)
          for (std::size_t m = 0; m < methods.size(); ++m) {
            const std::size_t c = e * cells + b * methods.size() + m;
            auto& a = table[{l, b, m}];
            a.tokens += res[c][0];
            a.recovery += res[c][1];
            a.error += res[c][2];
            a.n += 1;
            a.plans.insert(chosen[c]);
          }
    }
  }
  std::printf(
      "\nmean over held-out queries and KV heads; tokens = attended (window + retrieved)\n");
  std::printf("%-6s %-7s %-12s %-28s %9s %9s %10s\n", "layer", "budget", "method", "plan", "tokens",
              "recovery", "rel_l2_err");
  for (const auto& [key, a] : table) {
    const auto [l, b, m] = key;
    std::string plans;
    for (const auto& p : a.plans) plans += (plans.empty() ? "" : ",") + p;
    std::printf("%-6zu %-7zu %-12s %-28s %9.1f %9.4f %10.4f\n", l, o.plan_budget[b],
                methods[m].c_str(), plans.c_str(), a.tokens / a.n, a.recovery / a.n, a.error / a.n);
  }
  return 0;
}

}  // namespace kvsift_bench
