#pragma once
// The RoarGraph build's graph under construction: adjacency lists, the `Graph` view the build's
// beam searches walk, and the reachability marking the repair step uses.

#include <cstddef>
#include <span>
#include <vector>

#include "kvsift/core/detail/clock.hpp"
#include "kvsift/core/detail/prefetch.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/core/metric.hpp"
#include "kvsift/core/vector_store.hpp"
#include "kvsift/search/graph.hpp"

namespace kvsift::detail {

/// Adjacency under construction: n rows of at most `cap` ids.
struct adjacency_lists {
  std::vector<std::vector<id_t>> rows;
  std::span<const id_t> neighbors(id_t i) const { return rows[i]; }
};

/// Minimal graph view over adjacency lists, so beam_search runs on the projection graph.
template <VectorStore S, Metric M>
struct building_graph {
  using metric_type = M;
  const S& store;
  const adjacency_lists& adj;
  id_t entry;
  std::size_t size() const { return store.size(); }
  std::size_t dim() const { return store.dim(); }
  id_t entry_point() const { return entry; }
  std::span<const id_t> neighbors(id_t i) const { return adj.neighbors(i); }
  // No prefetch() here: prefetching every fresh neighbour's row before scoring any (as
  // graph_index does at query time) cut step 3's CPU time to 0.71x with one thread on the
  // development machine but made the 16-thread build on the H200 host 1.15-1.28x slower (same
  // graph). Requesting the row two places ahead of the one being scored instead keeps a few
  // rows in flight per thread: the same graph, faster at 16 threads (docs/algorithms.md).
  static constexpr std::size_t prefetch_distance = 2;
  void prefetch_ahead(id_t i) const noexcept {
    prefetch_row(store.row(i), store.dim() * sizeof(typename S::value_type));
  }
  float score(const float* q, id_t i) const { return M::score(q, store.row(i), store.dim()); }
  // The search is a chain of dependent loads (candidate, its row's header, the row, the
  // neighbours' vectors); `beam_search` calls this for the next candidate while the current
  // one's neighbours are scored, taking one link out of the chain. Same graph; step 3 of an
  // OOD 131072 build took 0.88x and 0.93x the time with 16 threads on the H200 host (means of
  // 3 alternated runs, two device sessions). At query time (`graph_index`, one flat array)
  // the same prefetch was neutral to 10% slower at pools <= 50, so only this graph has it.
  void prefetch_neighbors(id_t i) const noexcept { __builtin_prefetch(adj.rows[i].data()); }
};
static_assert(Graph<building_graph<view_store<float>, l2>>);

/// Marks every node reachable from `start` in `reached` (left marked from earlier calls, so the
/// repair can grow one reachable set) and returns how many it newly marked. O(n + edges).
inline std::size_t mark_reachable(const adjacency_lists& adj, id_t start,
                                  std::vector<char>& reached, std::vector<id_t>& stack) {
  if (reached[start]) return 0;
  stack.assign(1, start);
  reached[start] = 1;
  std::size_t marked = 1;
  while (!stack.empty()) {
    const id_t u = stack.back();
    stack.pop_back();
    for (const id_t v : adj.rows[u]) {
      if (!reached[v]) {
        reached[v] = 1;
        ++marked;
        stack.push_back(v);
      }
    }
  }
  return marked;
}

/// Marks the builder's own (CPU) step-3 searches.
struct no_searcher {};

}  // namespace kvsift::detail
