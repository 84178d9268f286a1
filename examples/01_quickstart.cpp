// kvsift in one page: build a RoarGraph index over attention-like keys from training queries,
// then answer held-out queries with top-k, DIPR and prefix-filtered search, and compare with
// the exact answer from a flat scan.
#include <cstdio>
#include <set>
#include <vector>

#include "kvsift/kvsift.hpp"
#include "kvsift/testing/ood_generator.hpp"

int main() {
  using namespace kvsift;
  // Keys and queries from different distributions, as in attention (see ood_generator.hpp).
  testing::ood_params p;
  p.keys = 5000;
  p.queries = 600;
  p.dim = 64;
  const auto data = testing::make_ood(p);
  const auto train = data.query_view().row_range(0, 500);  // "prefill" queries
  const auto query = data.query_view().row_span(550);      // a held-out "decode" query

  // The index borrows the keys: the engine keeps owning its KV memory.
  view_store<float> keys(data.key_view());
  roargraph_build_stats stats;
  const auto index = roargraph_builder<>({.nq = 50, .M = 24, .L = 200}).build(keys, train, &stats);
  const auto deg = index.degrees();
  std::printf("built %zu keys in %.2f s, mean degree %.1f\n", index.size(), stats.total_seconds,
              deg.mean);

  // Top-10 by graph search vs the exact answer.
  search_workspace ws;  // one per thread, reused across calls
  std::vector<id_t> ids(10), exact_ids(10);
  std::vector<float> scores(10), exact_scores(10);
  const auto s =
      beam_search(index, query, {.k = 10, .L = 64}, ws, std::span(ids), std::span(scores));
  const flat_index<view_store<float>> flat(keys);
  flat.topk(query, 10, ws, std::span(exact_ids), std::span(exact_scores));
  std::set<id_t> truth(exact_ids.begin(), exact_ids.end());
  std::size_t hits = 0;
  for (id_t id : ids) hits += truth.count(id);
  std::printf("top-10: recall %zu/10, scored %zu of %zu keys\n", hits, s.distance_computations,
              index.size());

  // DIPR: every key within beta of the best logit; the answer size adapts to the query.
  dipr_result r, exact;
  dipr_search(index, query, {.beta = 1.5f, .l0 = 64}, ws, r);
  flat.dipr(query, {.beta = 1.5f}, ws, exact);
  std::printf("DIPR beta=1.5: %zu keys found, %zu in the exact range, best score %.3f\n",
              r.ids.size(), exact.ids.size(), r.best_score);

  // Partial prefix reuse: only the first 2000 tokens are valid for this request.
  beam_search(index, query, {.k = 10, .L = 64}, ws, std::span(ids), std::span(scores),
              id_below{2000});
  bool all_in_prefix = true;
  for (id_t id : ids) all_in_prefix = all_in_prefix && id < 2000;
  std::printf("filtered top-10 all below 2000: %s\n", all_in_prefix ? "yes" : "no");

  // Bad input is an exception naming expected and actual values.
  try {
    beam_search(index, std::span<const float>(query.data(), 32), {}, ws, std::span(ids),
                std::span(scores));
  } catch (const kvsift::invalid_argument& e) {
    std::printf("rejected: %s\n", e.what());
  }
  return hits >= 8 && all_in_prefix ? 0 : 1;
}
