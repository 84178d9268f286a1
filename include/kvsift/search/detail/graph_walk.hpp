#pragma once
// The neighbourhood walk shared by top-k and DIPR graph search, including the ACORN 2-hop
// rule for filtered search: a neighbour that fails the predicate is not scored, but its own
// neighbours are considered, so the walk crosses filtered-out regions (unless the search asks
// for no walk-through).

#include <algorithm>
#include <cstddef>
#include <span>
#include <type_traits>

#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/search/detail/query_checks.hpp"
#include "kvsift/search/graph.hpp"
#include "kvsift/search/predicate.hpp"
#include "kvsift/search/search_workspace.hpp"

namespace kvsift::detail {

/// The first `degree_cap` (0 = all) out-neighbours of u: the rows every step of a capped walk
/// sees, so a capped search is the search over the graph with its rows cut to the cap.
template <Graph G>
std::span<const id_t> capped_neighbors(const G& g, id_t u, std::size_t degree_cap) {
  const std::span<const id_t> nbrs = g.neighbors(u);
  return degree_cap != 0 && nbrs.size() > degree_cap ? nbrs.first(degree_cap) : nbrs;
}

/// Calls `visit(id)` for every not-yet-visited neighbour of `u` among its first `degree_cap`
/// (0 = all) that passes `pred`. With a real filter and `walk_through`, failing neighbours are
/// walked through to their own neighbours (2 hops), and, as in ACORN, the passing nodes
/// gathered per expansion are truncated to u's degree: without the cap a selective filter makes
/// every expansion score up to degree^2 nodes, and the walk degenerates into scoring nearly
/// every passing key. Without `walk_through` a failing neighbour is marked visited and dropped:
/// the walk over the graph with the failing ids deleted from every row, whose expansions are
/// one batch of row requests, as unfiltered ones are.
template <Graph G, Predicate P, class Visit>
void expand(const G& g, id_t u, const P& pred, std::size_t degree_cap, bool walk_through,
            search_workspace& ws, Visit&& visit) {
  const auto nbrs = capped_neighbors(g, u, degree_cap);
  if (std::is_same_v<P, no_filter> || !walk_through) {
    constexpr bool all_at_once = requires { g.prefetch(u); };
    constexpr bool lookahead = requires { g.prefetch_ahead(u); };
    if constexpr (all_at_once || lookahead) {
      // First the visited-set tests (cheap, cached), collecting the fresh neighbours, then the
      // scoring, with their rows requested ahead of it: either all of them during the tests, so
      // the rows of one expansion are in flight together instead of one cache miss at a time,
      // or a bounded lookahead, the row `prefetch_distance` places ahead of the one scored
      // (with 16 threads building, all at once was slower than no prefetch at all).
      auto& fresh = ws.fresh;
      fresh.clear();
      for (id_t v : nbrs) {
        if (ws.visited.try_insert(v) && pred(v)) {
          if constexpr (all_at_once) g.prefetch(v);
          fresh.push_back(v);
        }
      }
      if constexpr (all_at_once) {
        for (id_t v : fresh) visit(v);
      } else {
        constexpr std::size_t ahead = G::prefetch_distance;
        for (std::size_t i = 0; i < ahead && i < fresh.size(); ++i) g.prefetch_ahead(fresh[i]);
        for (std::size_t i = 0; i < fresh.size(); ++i) {
          if (i + ahead < fresh.size()) g.prefetch_ahead(fresh[i + ahead]);
          visit(fresh[i]);
        }
      }
    } else {
      for (id_t v : nbrs) {
        if (ws.visited.try_insert(v) && pred(v)) visit(v);
      }
    }
  } else {
    const std::size_t cap = nbrs.size();
    std::size_t gathered = 0;
    for (std::size_t i = 0; i < nbrs.size() && gathered < cap; ++i) {
      const id_t v = nbrs[i];
      if (ws.visited.contains(v)) continue;
      ws.visited.insert(v);
      if (pred(v)) {
        ++gathered;
        visit(v);
        continue;
      }
      // Failing node: marked, so its fan-out happens once. Failing second-hop nodes stay
      // unmarked: they may still be reached as a direct neighbour and be walked through then.
      for (id_t w : capped_neighbors(g, v, degree_cap)) {
        if (gathered >= cap) break;
        if (!ws.visited.contains(w) && pred(w)) {
          ws.visited.insert(w);
          ++gathered;
          visit(w);
        }
      }
    }
  }
}

/// Seeds a search: the graph's entry points, then `extra` ids, then ids [0, prefix) (those below
/// the graph's size). Seeds failing the predicate are walked through like failing neighbours
/// (their first `degree_cap` ones, 0 = all). If no seed yields a passing node (a filter that
/// excludes the whole neighbourhood of the entry), the first passing ids in id order are used,
/// so a satisfiable filter never returns an empty answer by accident.
template <Graph G, Predicate P, class Visit>
void seed(const G& g, std::span<const id_t> extra, const P& pred, std::size_t fallback,
          std::size_t degree_cap, search_workspace& ws, Visit&& visit, std::size_t prefix = 0) {
  std::size_t seeded = 0;
  auto counted = [&](id_t id) {
    ++seeded;
    visit(id);
  };
  auto one = [&](id_t s) {
    if (ws.visited.contains(s)) return;
    if (pred(s)) {
      ws.visited.insert(s);
      counted(s);
    } else {
      ws.visited.insert(s);
      for (id_t w : capped_neighbors(g, s, degree_cap)) {
        if (!ws.visited.contains(w) && pred(w)) {
          ws.visited.insert(w);
          counted(w);
        }
      }
    }
  };
  if constexpr (requires { g.entry_points(); }) {
    for (const id_t e : g.entry_points()) one(e);
  } else if (g.entry_point() != invalid_id) {
    one(g.entry_point());
  }
  for (id_t e : extra) {
    if (e != invalid_id) one(e);
  }
  for (std::size_t id = 0; id < std::min(prefix, g.size()); ++id) one(static_cast<id_t>(id));
  if constexpr (!std::is_same_v<P, no_filter>) {
    if (seeded == 0) {
      const std::size_t want = std::max<std::size_t>(fallback, 1);
      for (std::size_t id = 0; seeded < want && id < g.size(); ++id) {
        const auto i = static_cast<id_t>(id);
        if (pred(i) && ws.visited.try_insert(i)) counted(i);
      }
    }
  }
}

}  // namespace kvsift::detail
