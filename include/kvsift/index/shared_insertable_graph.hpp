#pragma once
// The concurrency rule of an insertable graph, enforced: searches share, inserts are exclusive.
//
// Why a reader-writer lock and not a finer rule: an insert appends to the key and adjacency
// arrays (a reallocation moves them) and rewrites up to `degree` other rows in place
// (reverse edges, re-pruning). A search reading a row while it is rewritten would see a torn
// row, and one reading the arrays while they move would read freed memory. Making that safe
// without a lock needs preallocated arrays and per-row atomics (or RCU), which cost every
// search hop; an insert takes tens of microseconds, a decode step inserts one key per head,
// so the exclusive section is short and rare and a shared_mutex costs searches almost nothing.

#include <mutex>
#include <shared_mutex>
#include <utility>

#include "kvsift/index/insertable_graph.hpp"

namespace kvsift {

/**
 * @brief An `insertable_graph` behind a `std::shared_mutex`: any number of threads search it
 *        through `read` at once; `insert` waits for the running searches, excludes them while
 *        it runs, and is not starved (searches that start after it wait for it).
 *
 * Thread safety: every member is safe to call concurrently from any thread. A search must
 * not keep spans or pointers into the graph (neighbors, rows) past its `read` callback.
 */
template <Element T, Metric M = inner_product>
class shared_insertable_graph {
 public:
  explicit shared_insertable_graph(insertable_graph<T, M> graph) : graph_(std::move(graph)) {}

  /// Calls `f(const insertable_graph<T, M>&)` under a shared lock and returns its result.
  /// Use it for searches (beam_search, dipr_search), with one workspace per thread.
  /// @throw what `f` throws (the lock is released)
  template <class F>
  decltype(auto) read(F&& f) const {
    { const std::lock_guard turn(gate_); }  // waits while an insert is waiting or running
    std::shared_lock lock(mutex_);
    return std::forward<F>(f)(std::as_const(graph_));
  }

  /// `insertable_graph::insert` under an exclusive lock; same result, cost and guarantees.
  id_t insert(matrix_view<const T> keys) {
    const std::lock_guard turn(gate_);
    std::unique_lock lock(mutex_);
    return graph_.insert(keys);
  }

  /// `insertable_graph::add_queries` (a search finds each query's lists) under an exclusive
  /// lock; same result, cost and guarantees.
  std::size_t add_queries(matrix_view<const float> queries, std::size_t pool = 200) {
    const std::lock_guard turn(gate_);
    std::unique_lock lock(mutex_);
    return graph_.add_queries(queries, pool);
  }

  /// `insertable_graph::add_queries` with the lists given, under an exclusive lock; same
  /// result, cost and guarantees.
  std::size_t add_queries(matrix_view<const float> queries, const knn_result& lists) {
    const std::lock_guard turn(gate_);
    std::unique_lock lock(mutex_);
    return graph_.add_queries(queries, lists);
  }

  /// Size now (may change right after the call returns when another thread inserts).
  [[nodiscard]] std::size_t size() const {
    std::shared_lock lock(mutex_);
    return graph_.size();
  }

 private:
  // glibc's shared_mutex prefers readers: with searches back to back an insert never got the
  // lock (the concurrency test hung). Readers pass the gate one at a time before taking the
  // shared lock; an insert holds the gate while it waits, so new searches queue behind it.
  mutable std::mutex gate_;
  mutable std::shared_mutex mutex_;
  insertable_graph<T, M> graph_;
};

}  // namespace kvsift
