#pragma once
// Top-k best-first (beam) search over a graph index with a bounded pool of L candidates.
// Parameters are per call and scratch lives in the caller's workspace, so one index serves
// any number of threads with different settings.

#include <algorithm>
#include <cstddef>
#include <span>

#include "kvsift/core/error.hpp"
#include "kvsift/core/metric_concept.hpp"
#include "kvsift/search/detail/graph_walk.hpp"
#include "kvsift/search/detail/query_checks.hpp"
#include "kvsift/search/graph.hpp"
#include "kvsift/search/predicate.hpp"
#include "kvsift/search/search_params.hpp"
#include "kvsift/search/search_workspace.hpp"

namespace kvsift {

/// Finds the (approximately) k best keys for `query`. Writes up to k results best-first into
/// out_ids / out_scores (raw metric scores); the rest is padded with invalid_id and the
/// metric's worst score. With a predicate only passing ids are returned (ACORN 2-hop walk).
/// `extra_entries` seed the search next to the graph's entry point; invalid_id among them is
/// skipped (the padding of a previous answer or of `route_seeds`' lists).
/// Complexity: O(hops * D * d) (O(hops * D^2 * d) filtered worst case), D = the max degree or
/// params.degree_cap if smaller.
/// Thread safety: safe concurrently on one index with one workspace per thread.
/// A query holding NaN or Inf returns no results: count 0, every id invalid_id, every score the
/// metric's worst (checked once at the entry, O(d); its scores would rank arbitrary keys).
/// params.max_hops > 0 stops the walk after that many expansions.
/// @throw invalid_argument if k == 0, L < k, expand_limit > L, or the outputs are shorter than k;
///        dimension_mismatch for a wrong query length; out_of_range for bad entry ids (ids >= the
///        index's size other than invalid_id) or a predicate referring to ids beyond the index.
template <Graph G, Predicate P = no_filter>
search_stats beam_search(const G& g, std::span<const float> query, const beam_search_params& params,
                         search_workspace& ws, std::span<id_t> out_ids, std::span<float> out_scores,
                         const P& pred = {}, std::span<const id_t> extra_entries = {}) {
  using M = typename G::metric_type;
  detail::validate_beam(params, "beam_search");
  detail::require(out_ids.size() >= params.k && out_scores.size() >= params.k,
                  "beam_search: expected outputs of at least k = ", params.k, " entries, got ",
                  out_ids.size(), " ids and ", out_scores.size(), " scores");
  detail::validate_query(query, g.dim(), "beam_search");
  detail::validate_entries(extra_entries, g.size(), "beam_search");
  validate_predicate(pred, g.size());

  search_stats stats;
  std::fill_n(out_ids.begin(), params.k, invalid_id);
  std::fill_n(out_scores.begin(), params.k, worst_score<M>());
  if (g.size() == 0 || !detail::finite_query(query)) return stats;

  ws.visited.reset(g.size());
  ws.pool.reset(std::min(params.L, g.size()));  // a pool beyond n holds the same: no oversize
  // An expansion's scored neighbours enter the pool together, after the expansion: the pool
  // ends the same as with one insert each, but its tail moves once per expansion instead of once
  // per insert (the inserts' memmoves were 8% of a build's CPU time at L = 500). A small pool
  // keeps one insert each: its moves are short, and batching cost more than it saved there.
  constexpr std::size_t batch_from = 16;
  const bool batched = ws.pool.capacity() >= batch_from;
  ws.scored.clear();
  auto visit = [&](id_t id) {
    ++stats.distance_computations;
    const float key = to_key<M>(g.score(query.data(), id));
    if (!batched) {
      ws.pool.insert(key, id);
    } else if (ws.pool.admits(key, id)) {
      ws.scored.push_back({key, id, false});
    }
  };
  auto flush = [&] {
    ws.pool.insert_batch(ws.scored);
    ws.scored.clear();
  };
  detail::seed(g, extra_entries, pred, params.L, params.degree_cap, ws, visit, params.entry_prefix);
  flush();
  const std::size_t limit = params.expand_limit != 0 ? params.expand_limit : params.L;
  while (ws.pool.has_unexpanded(limit) && (params.max_hops == 0 || stats.hops < params.max_hops)) {
    const candidate c = ws.pool.pop_unexpanded();
    // A graph that can prefetch a node's adjacency row (the builder's growing graph: a row
    // there is a separately allocated list) gets the next expansion's row fetched while this
    // expansion scores its neighbours (docs/algorithms.md).
    if constexpr (requires { g.prefetch_neighbors(c.id); }) {
      if (ws.pool.has_unexpanded(limit)) g.prefetch_neighbors(ws.pool.peek_unexpanded().id);
    }
    ++stats.hops;
    detail::expand(g, c.id, pred, params.degree_cap, params.walk_through, ws, visit);
    flush();
  }
  stats.count = std::min(params.k, ws.pool.size());
  for (std::size_t i = 0; i < stats.count; ++i) {
    out_ids[i] = ws.pool[i].id;
    out_scores[i] = from_key<M>(ws.pool[i].key);
  }
  return stats;
}

}  // namespace kvsift
