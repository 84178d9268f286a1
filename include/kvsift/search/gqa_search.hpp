#pragma once
// One graph walk for a group of queries that share a graph: the query heads of a GQA group,
// whose KV head's keys one GQA-shared index covers. Each head keeps its own pool of L; every key
// the walk visits is scored against all of the group's queries, so its row is read once for the
// group instead of once per head, and each step expands the best unexpanded entry of each head's
// pool in turn (an entry another head has expanded already is not expanded again). On Gemma-3
// 32K (4 query heads per KV head) the walk read 2.3-2.6x fewer key rows than a walk per head at
// equal recall@100 (docs/algorithms.md, "One walk per GQA group").

#include <algorithm>
#include <cstddef>
#include <span>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/search/detail/graph_walk.hpp"
#include "kvsift/search/detail/query_checks.hpp"
#include "kvsift/search/graph.hpp"
#include "kvsift/search/predicate.hpp"
#include "kvsift/search/search_params.hpp"
#include "kvsift/search/search_workspace.hpp"

namespace kvsift {

/// Top-k graph search for H queries over one graph in one walk (the query heads of a GQA group).
/// Per head the parameters mean what they mean to `beam_search`: a pool of `params.L`, the `k`
/// best returned, expansions from the best `params.expand_limit` (0 = L) entries of the pool,
/// rows cut to `params.degree_cap`; `params.max_hops` bounds the walk's expansions in all. With
/// H = 1 the results, scores and counters equal `beam_search`'s. Each head sees every key the
/// walk scores, so its recall is at least about that of its own walk at the same L, at fewer
/// key rows read than H walks (docs/algorithms.md). A head whose query holds NaN or Inf takes
/// no part and returns no results (as `beam_search`); the others are unaffected.
///
/// Outputs: row h of `out_ids` / `out_scores` (entries [h * k, h * k + k)) holds head h's
/// results, best first, padded with invalid_id and the metric's worst score; `out_counts[h]`
/// how many it got. Stats: `count` sums the heads' counts, `distance_computations` counts keys
/// scored (each key once for the whole group; H scores each), `hops` the walk's expansions.
///
/// Complexity: O(H * keys scored * dim + expansions * degree). Thread safety: `const` on the
/// graph; one workspace per thread (it holds H pools).
/// @throw invalid_argument if there is no query, k == 0, L < k, expand_limit > L, H * k
///        overflows, or an output is shorter than H * k (ids, scores) or H (counts), all before
///        the walk touches the workspace; dimension_mismatch if the queries' width is not the
///        graph's dimension; out_of_range for bad entry ids (invalid_id among extra_entries is
///        padding, skipped) or a predicate beyond the index.
template <Graph G, Predicate P = no_filter>
search_stats gqa_beam_search(const G& g, matrix_view<const float> queries,
                             const beam_search_params& params, search_workspace& ws,
                             std::span<id_t> out_ids, std::span<float> out_scores,
                             std::span<std::size_t> out_counts, const P& pred = {},
                             std::span<const id_t> extra_entries = {}) {
  using M = typename G::metric_type;
  constexpr const char* who = "gqa_beam_search";
  const std::size_t H = queries.rows();
  detail::require(H > 0, who, ": expected at least one query, got 0");
  detail::validate_beam(params, who);
  detail::require<dimension_mismatch>(queries.cols() == g.dim(), who, ": expected queries of ",
                                      g.dim(), " columns (the graph's dimension), got ",
                                      queries.cols());
  const std::size_t slots = checked_mul(H, params.k, "gqa_beam_search: queries x k");
  detail::require(out_ids.size() >= slots && out_scores.size() >= slots, who,
                  ": expected outputs of at least queries x k = ", slots, " entries, got ",
                  out_ids.size(), " ids and ", out_scores.size(), " scores");
  detail::require(out_counts.size() >= H, who, ": expected at least ", H, " counts, got ",
                  out_counts.size());
  detail::validate_entries(extra_entries, g.size(), who);
  validate_predicate(pred, g.size());

  search_stats stats;
  std::fill_n(out_ids.begin(), slots, invalid_id);
  std::fill_n(out_scores.begin(), slots, worst_score<M>());
  std::fill_n(out_counts.begin(), H, std::size_t{0});
  // The live heads' queries; a non-finite one stays null and takes no part.
  auto& live = ws.group_queries;
  live.assign(H, nullptr);
  bool any = false;
  for (std::size_t h = 0; h < H; ++h) {
    if (detail::finite_query(std::span<const float>(queries.row(h), queries.cols()))) {
      live[h] = queries.row(h);
      any = true;
    }
  }
  if (g.size() == 0 || !any) return stats;

  if (ws.pools.size() < H) ws.pools.resize(H);
  for (std::size_t h = 0; h < H; ++h) ws.pools[h].reset(std::min(params.L, g.size()));
  ws.visited.reset(g.size());
  ws.expanded.reset(g.size());
  auto visit = [&](id_t id) {
    ++stats.distance_computations;
    for (std::size_t h = 0; h < H; ++h) {
      if (live[h] != nullptr) ws.pools[h].insert(to_key<M>(g.score(live[h], id)), id);
    }
  };
  detail::seed(g, extra_entries, pred, params.L, params.degree_cap, ws, visit, params.entry_prefix);
  const std::size_t limit = params.expand_limit != 0 ? params.expand_limit : params.L;
  // Round robin over the heads, one expansion each per turn, until no pool has an unexpanded
  // entry within its limit. An entry another head expanded is marked and passed over: its
  // neighbours have all been visited, expanding it again would score nothing.
  auto capped = [&] { return params.max_hops != 0 && stats.hops >= params.max_hops; };
  for (bool progressed = true; progressed && !capped();) {
    progressed = false;
    for (std::size_t h = 0; h < H && !capped(); ++h) {
      if (live[h] == nullptr) continue;
      auto& pool = ws.pools[h];
      while (pool.has_unexpanded(limit)) {
        const candidate c = pool.pop_unexpanded();
        if (!ws.expanded.try_insert(c.id)) continue;
        ++stats.hops;
        progressed = true;
        detail::expand(g, c.id, pred, params.degree_cap, params.walk_through, ws, visit);
        break;
      }
    }
  }
  for (std::size_t h = 0; h < H; ++h) {
    if (live[h] == nullptr) continue;
    const auto& pool = ws.pools[h];
    const std::size_t count = std::min(params.k, pool.size());
    for (std::size_t i = 0; i < count; ++i) {
      out_ids[h * params.k + i] = pool[i].id;
      out_scores[h * params.k + i] = from_key<M>(pool[i].key);
    }
    out_counts[h] = count;
    stats.count += count;
  }
  return stats;
}

}  // namespace kvsift
