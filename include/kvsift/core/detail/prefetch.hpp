#pragma once
// A software prefetch of one stored vector, shared by the graphs that let a search request the
// rows it is about to score (graph_index, insertable_graph, the build's building_graph).

#include <cstddef>

namespace kvsift::detail {

/// Requests every 64-byte cache line of the `bytes` bytes at `row`. O(bytes / 64); only a hint:
/// no fault, no effect on results.
inline void prefetch_row(const void* row, std::size_t bytes) noexcept {
  const char* p = static_cast<const char*>(row);
  for (std::size_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off);
}

}  // namespace kvsift::detail
