#pragma once
// DIPR: dynamic inner-product range query (AlayaDB). Instead of a fixed k, return every key
// whose score is within beta of the best score of the whole context: how many tokens a query
// needs varies by head and step, and DIPR lets the data decide.
//
// DIPRS (the graph search, AlayaDB Algorithm 1) keeps a candidate list with a capacity
// threshold l0: below it every visited neighbour is kept (exploration), above it only
// neighbours within beta of the best score seen so far. Here the exploration part is a
// bounded beam of the l0 best candidates (so a DIPR search explores at least as well as a
// top-l0 beam search), and the in-range part is an unbounded max-heap. The walk expands the
// best unexpanded candidate of either part and stops when the beam is exhausted and no
// unexpanded candidate is within beta of the best. Every scored key within beta of the final
// best is returned. `max_candidates` bounds the in-range part so a pathological query (a flat
// score landscape) cannot run away; `max_hops` bounds the walk itself.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include "kvsift/core/error.hpp"
#include "kvsift/core/metric_concept.hpp"
#include "kvsift/core/topk.hpp"
#include "kvsift/search/detail/dipr_answer.hpp"
#include "kvsift/search/detail/graph_walk.hpp"
#include "kvsift/search/graph.hpp"
#include "kvsift/search/predicate.hpp"
#include "kvsift/search/search_params.hpp"
#include "kvsift/search/search_workspace.hpp"

namespace kvsift {

/// DIPRS over a graph index: every key with score within beta of the best (of the index and
/// `seed_score`), as found by the graph walk. With a predicate only passing ids are
/// considered. Complexity: O(hops * max_degree * d + r log r) for r results.
/// Thread safety: safe concurrently on one index with one workspace per thread.
/// A query holding NaN or Inf yields an empty result (no ids, count 0) and a best_score of
/// seed_score if one was given, else the metric's worst (checked once at the entry, O(d)).
/// @throw invalid_argument for beta < 0 or non-finite, l0 == 0, max_candidates < l0, an
///        infinite seed_score; dimension_mismatch for a wrong query length; out_of_range for
///        bad entry ids (invalid_id among extra_entries is padding, skipped) or predicate ids.
template <Graph G, Predicate P = no_filter>
void dipr_search(const G& g, std::span<const float> query, const dipr_params& params,
                 search_workspace& ws, dipr_result& out, const P& pred = {},
                 std::span<const id_t> extra_entries = {}) {
  using M = typename G::metric_type;
  detail::validate_dipr(params, "dipr_search");
  detail::validate_query(query, g.dim(), "dipr_search");
  detail::validate_entries(extra_entries, g.size(), "dipr_search");
  validate_predicate(pred, g.size());

  out.stats = {};
  out.capped = false;
  const bool seeded = !std::isnan(params.seed_score);
  float best = seeded ? to_key<M>(params.seed_score) : -std::numeric_limits<float>::infinity();
  // 64 * l0 saturates instead of wrapping (a wrapped cap of 0 stopped every search at once).
  const std::size_t cap = params.max_candidates != 0 ? params.max_candidates
                          : params.l0 > std::numeric_limits<std::size_t>::max() / 64
                              ? std::numeric_limits<std::size_t>::max()
                              : 64 * params.l0;
  auto& scored = ws.list;        // every scored key: the answer is filtered from it
  auto& in_range = ws.frontier;  // max-heap of keys that were within beta when scored
  scored.clear();
  in_range.clear();
  std::size_t in_range_total = 0;
  // ranks_before as "less" would make a min-heap; swap the arguments for a max-heap.
  auto heap_less = [](const scored_id& a, const scored_id& b) { return ranks_before(b, a); };

  if (g.size() != 0 && detail::finite_query(query)) {
    ws.visited.reset(g.size());
    ws.expanded.reset(g.size());
    ws.pool.reset(std::min(params.l0, g.size()));  // a beam beyond n holds the same
    auto visit = [&](id_t id) {
      if (out.capped) return;
      ++out.stats.distance_computations;
      const float key = to_key<M>(g.score(query.data(), id));
      best = std::max(best, key);
      scored.push_back({key, id});
      ws.pool.insert(key, id);
      if (key >= best - params.beta) {
        in_range.push_back({key, id});
        std::push_heap(in_range.begin(), in_range.end(), heap_less);
        // A flat score landscape puts everything in range: stop rather than scan the index.
        out.capped = ++in_range_total >= cap;
      }
    };
    detail::seed(g, extra_entries, pred, params.l0, params.degree_cap, ws, visit,
                 params.entry_prefix);
    while (!out.capped) {
      const bool beam = ws.pool.has_unexpanded();
      const bool range = !in_range.empty() && in_range.front().key >= best - params.beta;
      id_t next;
      if (beam && (!range || ws.pool.peek_unexpanded().key >= in_range.front().key)) {
        next = ws.pool.pop_unexpanded().id;
      } else if (range) {
        next = in_range.front().id;
        std::pop_heap(in_range.begin(), in_range.end(), heap_less);
        in_range.pop_back();
      } else {
        break;
      }
      if (!ws.expanded.try_insert(next)) continue;  // reached through both parts
      if (params.max_hops != 0 && out.stats.hops >= params.max_hops) {
        out.capped = true;  // more to expand than the hop cap allows
        break;
      }
      ++out.stats.hops;
      detail::expand(g, next, pred, params.degree_cap, params.walk_through, ws, visit);
    }
  }
  detail::emit_dipr<M>(scored, best, params.beta, seeded, out);
  if (out.ids.size() > cap) {  // capped: keep the best max_candidates
    out.ids.resize(cap);
    out.scores.resize(cap);
    out.stats.count = cap;
  }
}

}  // namespace kvsift
