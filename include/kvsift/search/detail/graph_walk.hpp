#pragma once
// The neighbourhood walk shared by top-k and DIPR graph search, including the ACORN 2-hop
// rule for filtered search: a neighbour that fails the predicate is not scored, but its own
// neighbours are considered, so the walk crosses filtered-out regions.

#include <cstddef>
#include <span>
#include <type_traits>

#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/search/predicate.hpp"
#include "kvsift/search/search_workspace.hpp"

namespace kvsift::detail {

/// @throw dimension_mismatch if the query length differs from the index dimension.
inline void validate_query(std::span<const float> query, std::size_t dim, const char* who) {
  require<dimension_mismatch>(query.size() == dim, who, ": expected query dimension ", dim,
                              ", got ", query.size());
}

/// @throw out_of_range if an extra entry id is >= n.
inline void validate_entries(std::span<const id_t> entries, std::size_t n, const char* who) {
  for (id_t e : entries) {
    require<out_of_range>(e < n, who, ": expected entry ids < ", n, ", got ", e);
  }
}

/// Calls `visit(id)` for every not-yet-visited neighbour of `u` that passes `pred`; with a
/// real filter, failing neighbours are walked through to their own neighbours (2 hops).
template <class Graph, Predicate P, class Visit>
void expand(const Graph& g, id_t u, const P& pred, search_workspace& ws, Visit&& visit) {
  for (id_t v : g.neighbors(u)) {
    if constexpr (std::is_same_v<P, no_filter>) {
      if (ws.visited.try_insert(v)) visit(v);
    } else {
      if (ws.visited.contains(v)) continue;
      if (pred(v)) {
        ws.visited.insert(v);
        visit(v);
        continue;
      }
      // Failing node: mark it so its 2-hop fan-out happens once, then score passing
      // neighbours-of-neighbour. Failing second-hop nodes stay unmarked: they may still be
      // reached as a direct neighbour later and be walked through then.
      ws.visited.insert(v);
      for (id_t w : g.neighbors(v)) {
        if (!ws.visited.contains(w) && pred(w)) {
          ws.visited.insert(w);
          visit(w);
        }
      }
    }
  }
}

/// Seeds a search: the graph's entry point plus `extra` ids. Seeds failing the predicate are
/// walked through like failing neighbours. If no seed yields a passing node (a filter that
/// excludes the whole neighbourhood of the entry), the first passing ids in id order are
/// used, so a satisfiable filter never returns an empty answer by accident.
template <class Graph, Predicate P, class Visit>
void seed(const Graph& g, std::span<const id_t> extra, const P& pred, std::size_t fallback,
          search_workspace& ws, Visit&& visit) {
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
      for (id_t w : g.neighbors(s)) {
        if (!ws.visited.contains(w) && pred(w)) {
          ws.visited.insert(w);
          counted(w);
        }
      }
    }
  };
  if (g.entry_point() != invalid_id) one(g.entry_point());
  for (id_t e : extra) one(e);
  if constexpr (!std::is_same_v<P, no_filter>) {
    for (std::size_t id = 0; seeded == 0 && id < g.size(); ++id) {
      const auto i = static_cast<id_t>(id);
      if (pred(i) && ws.visited.try_insert(i)) {
        counted(i);
        for (std::size_t more = id + 1; seeded < fallback && more < g.size(); ++more) {
          const auto j = static_cast<id_t>(more);
          if (pred(j) && ws.visited.try_insert(j)) counted(j);
        }
      }
    }
  }
}

}  // namespace kvsift::detail
