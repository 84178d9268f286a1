#pragma once
// The `Graph` concept: what beam_search, dipr_search and the shared neighbourhood walk need of
// a graph. Models: graph_index (index/graph_index.hpp), the builder's projection graph
// (index/detail/), and test views over a padded adjacency; each has a static_assert beside it.

#include <concepts>
#include <cstddef>
#include <span>

#include "kvsift/core/ids.hpp"
#include "kvsift/core/metric_concept.hpp"

namespace kvsift {

/// A searchable graph over n vectors of dimension d:
/// - `G::metric_type`, a `Metric`: how `score` ranks;
/// - `g.size()`, `g.dim()`;
/// - `g.neighbors(u)`: the out-neighbours of node u, convertible to `std::span<const id_t>`;
/// - `g.score(q, i)`: raw metric score of the f32 query q (dim() floats) against node i;
/// - `g.entry_point()` (invalid_id when empty) or `g.entry_points()` (every seed).
/// Optional: `g.prefetch(i)`, a hint the walk issues for every fresh neighbour before scoring
/// any of them; or `g.prefetch_ahead(i)` with `G::prefetch_distance` = D, a hint it issues for
/// the neighbour D places ahead of the one it scores (a bounded number of rows in flight);
/// `g.prefetch_neighbors(u)`, a hint `beam_search` issues for the next node it expects to
/// expand while it scores the current one's neighbours.
/// Searches call these from several threads at once on one const graph.
template <class G>
concept Graph = Metric<typename G::metric_type> && requires(const G& g, id_t u, const float* q) {
  { g.size() } -> std::convertible_to<std::size_t>;
  { g.dim() } -> std::convertible_to<std::size_t>;
  { g.neighbors(u) } -> std::convertible_to<std::span<const id_t>>;
  { g.score(q, u) } -> std::convertible_to<float>;
} &&(
    requires(const G& g) {
      { g.entry_point() } -> std::convertible_to<id_t>;
    } ||
    requires(const G& g) {
      { g.entry_points() } -> std::convertible_to<std::span<const id_t>>;
    });

}  // namespace kvsift
