#pragma once
// The algorithm-specific half of the partition pipeline (Spin): an algorithm supplies
//   index  (prompt keys -> partitions + whatever summaries it selects with)
//   select (query + index -> ids of the critical partitions),
// and the memory layer supplies the shared offload and retrieve steps
// (<kvsift/memory/offload.hpp>). A block index, a cluster index and token-level graph
// retrieval (<kvsift/decode/graph_token_retrieval.hpp>) are all SparseAlgorithms; see
// tests/memory/pipeline_test.cpp for a user-written one.
//
// decode/ is where the layers are composed: it may include index/, search/ and memory/,
// none of which includes it (docs/architecture.md).

#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

#include "kvsift/core/ids.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/memory/offload.hpp"
#include "kvsift/search/search_workspace.hpp"

namespace kvsift {

/// The algorithm-specific half of the pipeline. `index` builds an `index_type` from the
/// prompt's keys of one KV head (its `partitions()` tells offload how to lay the tokens out);
/// `select` writes the ids of the partitions to fetch for a query, at most `budget` of them,
/// using the caller's per-thread workspace. select must be safe to call concurrently.
template <class A>
concept SparseAlgorithm = requires(const A& a, matrix_view<const float> keys,
                                   const typename A::index_type& idx, std::span<const float> q,
                                   std::size_t budget, search_workspace& ws,
                                   std::vector<id_t>& out) {
  { a.index(keys) } -> std::same_as<typename A::index_type>;
  { idx.partitions() } -> std::convertible_to<const partitioning&>;
  { a.select(idx, q, budget, ws, out) } -> std::same_as<void>;
};

}  // namespace kvsift
