#pragma once
// The policy point through which a kNN engine can also run step 3 of the RoarGraph build (the
// connectivity searches). On the CPU that step dominates a build; an engine that owns a GPU can
// run the searches there. `roargraph_builder` uses it when the engine offers one
// (`ConnectivityEngine`) and `roargraph_params::engine_connectivity` is set.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvsift/core/ids.hpp"
#include "kvsift/core/matrix_view.hpp"

namespace kvsift {

/// Result of one batch of connectivity searches: query i's pruned neighbours are
/// kept[i * degree, i * degree + counts[i]), best first.
struct connectivity_batch {
  std::size_t degree = 0;
  std::vector<id_t> kept;
  std::vector<std::uint32_t> counts;
  std::size_t scored = 0;  ///< vectors scored by the batch's searches (statistics)
};

/// A step-3 searcher over one key set and an n x width adjacency it keeps a copy of:
/// - `set_rows(rows, padded)`: row rows[i] becomes padded[i * width, (i + 1) * width), padded with
///   invalid_id;
/// - `search(rows, entry, L, degree, out)`: for each key row x, a best-first search with key x
///   as the l2 query, pool L, from `entry`, over the rows as set; the pool minus x, best first,
///   RNG-pruned around x (l2) to `degree` with fill, as the CPU step 3 does.
template <class S>
concept ConnectivitySearcher = requires(S& s, std::span<const id_t> ids, id_t entry, std::size_t z,
                                        connectivity_batch& out) {
  s.set_rows(ids, ids);
  s.search(ids, entry, z, z, out);
};

/// A step-3 searcher that also merges each batch's results into the adjacency it keeps, so that
/// a build's rounds need no host work between them (the CPU merge was the larger half of a GPU
/// build's step 3 at 131072 keys):
/// - `search_and_merge(rows, entry, L, degree, fill)`: `search`, then for each i in order and
///   each kept neighbour y of x = rows[i], in order: y joins row x, then x joins row y (appended
///   unless the row holds it or it is the row's own id); every row longer than the width is
///   then RNG-pruned around its key (l2, ranked best first, ties to the lower id) to the width,
///   with fill if `fill`. Returns the vectors the searches scored. Rows equal what the builder's
///   own merge makes of the same search results.
/// - `get_rows(rows)`: every row, without padding (`rows` is resized to n).
template <class S>
concept MergingConnectivitySearcher = ConnectivitySearcher<S> &&
    requires(S& s, std::span<const id_t> ids, id_t entry, std::size_t z,
             std::vector<std::vector<id_t>>& rows) {
  { s.search_and_merge(ids, entry, z, z, true) } -> std::convertible_to<std::size_t>;
  s.get_rows(rows);
};

/// A step-3 searcher that can limit its searches' expansions: after `set_expand_limit(E)` its
/// searches (and those of `search_and_merge`) expand only the best E entries of their pool, as
/// `beam_search_params::expand_limit` (0 = L, every entry). The builder needs it for
/// `roargraph_params::connectivity_expand_fraction` below 1 and otherwise runs such a build on the
/// CPU.
template <class S>
concept ExpandLimitingSearcher = ConnectivitySearcher<S> && requires(S& s, std::size_t z) {
  s.set_expand_limit(z);
};

/// A merging step-3 searcher that also runs step 2 (the projection) where its rows live, so
/// that a build's rows go to the engine once:
/// - `project(knn_ids, k, degree)`: `knn_ids` holds m lists of k ids (the training queries'
///   nearest keys, best first, invalid_id padded at the end); every row becomes what
///   `roargraph_builder`'s own step 2 makes of them at pivot degree `degree`: each list's first
///   id (its pivot) gets the other ids of the lists it heads, ranked by l2 distance to it (ties
///   to the lower id) and RNG-pruned with fill; then each row x appends, in ascending order,
///   the pivots whose list kept x, and is ranked and pruned again if longer than `degree`.
template <class S>
concept ProjectingConnectivitySearcher = MergingConnectivitySearcher<S> &&
    requires(S& s, std::span<const id_t> ids, std::size_t z) {
  s.project(ids, z, z);
};

/// An engine that creates step-3 searchers for keys of element type T and adjacency width R.
template <class E, class T>
concept ConnectivityEngine = requires(const E& e, matrix_view<const T> keys, std::size_t width) {
  { e.make_connectivity_searcher(keys, width) } -> ConnectivitySearcher;
};

}  // namespace kvsift
