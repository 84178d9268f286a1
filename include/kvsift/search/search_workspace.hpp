#pragma once
// Per-thread scratch for graph and flat searches. Keeping it outside the index is what makes
// `const` searches safe to run concurrently: one workspace per thread, reused across calls so
// the hot path does not allocate.

#include <cstddef>
#include <vector>

#include "kvsift/core/candidate_pool.hpp"
#include "kvsift/core/topk.hpp"
#include "kvsift/core/visited_set.hpp"

namespace kvsift {

/// Counters reported by every search.
struct search_stats {
  std::size_t count = 0;                  ///< results written
  std::size_t distance_computations = 0;  ///< vectors scored
  std::size_t hops = 0;                   ///< nodes expanded
};

/// Scratch memory for one thread's searches. Not thread-safe; cheap to keep one per thread.
/// Sized lazily by the searches that use it.
class search_workspace {
 public:
  visited_set visited;
  visited_set expanded;  ///< DIPR: nodes already expanded
  candidate_pool pool;
  topk_selector topk;
  std::vector<scored_id> list;              ///< DIPR: scored candidates
  std::vector<scored_id> frontier;          ///< DIPR: max-heap of in-range candidates
  std::vector<float> query;                 ///< a widened vector (builders search with stored keys)
  std::vector<id_t> fresh;                  ///< beam search: unvisited neighbours of one expansion
  std::vector<candidate> scored;            ///< beam search: one expansion's admitted candidates
  std::vector<candidate_pool> pools;        ///< gqa_beam_search: one pool per query head
  std::vector<const float*> group_queries;  ///< gqa_beam_search: live heads' queries (or null)
};

}  // namespace kvsift
