#pragma once
// Proximity graph over stored vectors with a fixed maximum out-degree, in one flat adjacency
// array (n x max_degree, padded with invalid_id): one allocation, cache-friendly, and a file
// format that is a straight dump.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/detail/prefetch.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/core/metric.hpp"
#include "kvsift/core/vector_store.hpp"
#include "kvsift/search/graph.hpp"

namespace kvsift {

/// Largest max_degree a graph may have: the degrees are kept as 32-bit counts and the graph
/// file format (graph_io.hpp) refuses larger ones as corrupted, so a built graph always loads.
inline constexpr std::size_t max_graph_degree = (std::size_t{1} << 20) - 1;

/// Most entry points a graph_index holds (each costs one scored row per search).
inline constexpr std::size_t max_entry_points = 64;

/// Out-degree summary of a graph.
struct degree_stats {
  std::size_t min = 0;
  std::size_t max = 0;
  double mean = 0.0;
  std::size_t zero_degree = 0;  ///< nodes without out-edges
};

/// Memory held by a graph_index's structure, in bytes (sizes, not capacities). The keys are
/// not counted: they belong to the store (in a decode engine, the KV cache itself).
struct graph_index_memory {
  std::size_t adjacency = 0;  ///< n x max_degree ids: the padded rows a search reads
  std::size_t degrees = 0;    ///< n row lengths
  std::size_t entries = 0;    ///< the entry points
  std::size_t edges = 0;      ///< edges held (the sum of the degrees); not bytes
  std::size_t rows = 0;       ///< nodes (n); not bytes
  /// What the index holds: adjacency + degrees + entries.
  [[nodiscard]] std::size_t total() const noexcept { return adjacency + degrees + entries; }
  /// The bytes of the same edges without padding (CSR: n + 1 offsets and one id per edge),
  /// what a compacted copy for storage or transfer would take.
  [[nodiscard]] std::size_t compact() const noexcept {
    return (rows + 1) * sizeof(std::uint64_t) + edges * sizeof(id_t);
  }
};

/// A graph index over a vector store. Does not own the vectors (the store may borrow them).
/// Thread safety: const members are safe to call concurrently; nothing mutates after
/// construction except assignment.
template <VectorStore Store, Metric M = inner_product>
class graph_index {
 public:
  using store_type = Store;
  using metric_type = M;

  graph_index() = default;

  /// Takes an adjacency of store.size() x max_degree ids; each row is its neighbours followed
  /// by invalid_id padding. O(n * max_degree) validation; the shape is checked before any
  /// element is read.
  /// @throw invalid_argument if max_degree == 0 or > max_graph_degree, the store holds rows of
  ///        dimension 0, the adjacency size is not n * max_degree (checked, so a product that
  ///        would wrap is an error, not a pass), a neighbour id >= n, a valid id follows
  ///        padding; out_of_range if n > max_index_size or entry >= n (for n > 0).
  graph_index(Store store, std::size_t max_degree, std::vector<id_t> adjacency, id_t entry)
      : graph_index(std::move(store), max_degree, std::move(adjacency), std::vector<id_t>{entry}) {}

  /// As above with several entry points: a search seeds all of them (the first is
  /// `entry_point()`). RoarGraph uses two: the key nearest the key centroid and the key that
  /// is the best key of the most training queries (an attention sink on real data), which
  /// Euclidean-pruned edges rarely lead to. O(n * max_degree + entries^2).
  /// @throw as above; invalid_argument for no entry (n > 0), more than max_entry_points, or a
  ///        repeated entry; out_of_range for an entry >= n
  graph_index(Store store, std::size_t max_degree, std::vector<id_t> adjacency,
              std::vector<id_t> entries)
      : store_(std::move(store)), max_degree_(max_degree), adjacency_(std::move(adjacency)) {
    const std::size_t n = store_.size();
    require_indexable(n, "graph_index");
    require_vector_dim(n, store_.dim(), "graph_index");
    detail::require(max_degree_ > 0, "graph_index: max_degree must be > 0, got 0");
    detail::require(max_degree_ <= max_graph_degree,
                    "graph_index: max_degree must be <= ", max_graph_degree, ", got ", max_degree_);
    const std::size_t expected =
        checked_mul(n, max_degree_, "graph_index: adjacency of n x degree");
    detail::require<dimension_mismatch>(
        adjacency_.size() == expected, "graph_index: expected adjacency of ", n, " x ", max_degree_,
        " = ", expected, " ids, got ", adjacency_.size());
    if (n > 0) {
      detail::require(!entries.empty() && entries.size() <= max_entry_points,
                      "graph_index: expected 1 to ", max_entry_points, " entry points, got ",
                      entries.size());
      for (std::size_t i = 0; i < entries.size(); ++i) {
        detail::require<out_of_range>(entries[i] < n, "graph_index: expected entry < ", n, ", got ",
                                      entries[i]);
        detail::require(std::find(entries.begin(), entries.begin() + static_cast<std::ptrdiff_t>(i),
                                  entries[i]) == entries.begin() + static_cast<std::ptrdiff_t>(i),
                        "graph_index: entry point ", entries[i], " given twice");
      }
    }
    degrees_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const id_t* row = adjacency_.data() + i * max_degree_;
      std::size_t deg = 0;
      while (deg < max_degree_ && row[deg] != invalid_id) ++deg;
      for (std::size_t j = 0; j < max_degree_; ++j) {
        detail::require<out_of_range>(
            j >= deg ? row[j] == invalid_id : row[j] < n, "graph_index: node ", i, " slot ", j,
            j >= deg ? ": expected padding after degree " : ": expected id < ", j >= deg ? deg : n,
            ", got ", row[j]);
      }
      degrees_[i] = static_cast<std::uint32_t>(deg);
    }
    if (n > 0) entries_ = std::move(entries);
  }

  [[nodiscard]] const Store& store() const noexcept { return store_; }
  [[nodiscard]] std::size_t size() const noexcept { return store_.size(); }
  [[nodiscard]] std::size_t dim() const noexcept { return store_.dim(); }
  [[nodiscard]] std::size_t max_degree() const noexcept { return max_degree_; }
  /// The first entry point (invalid_id for an empty graph).
  [[nodiscard]] id_t entry_point() const noexcept {
    return entries_.empty() ? invalid_id : entries_.front();
  }
  /// Every entry point, the first being entry_point(); empty for an empty graph.
  [[nodiscard]] std::span<const id_t> entry_points() const noexcept { return entries_; }

  /// Out-neighbours of node i (no bounds check: hot path). O(1).
  [[nodiscard]] std::span<const id_t> neighbors(id_t i) const noexcept {
    return {adjacency_.data() + static_cast<std::size_t>(i) * max_degree_, degrees_[i]};
  }

  /// The padded flat adjacency (n x max_degree).
  [[nodiscard]] std::span<const id_t> adjacency() const noexcept { return adjacency_; }

  /// O(n).
  [[nodiscard]] degree_stats degrees() const noexcept {
    degree_stats s;
    if (degrees_.empty()) return s;
    s.min = std::numeric_limits<std::size_t>::max();
    std::size_t total = 0;
    for (std::uint32_t d : degrees_) {
      s.min = std::min<std::size_t>(s.min, d);
      s.max = std::max<std::size_t>(s.max, d);
      s.zero_degree += d == 0 ? 1 : 0;
      total += d;
    }
    s.mean = static_cast<double>(total) / static_cast<double>(degrees_.size());
    return s;
  }

  /// The structure's memory (the keys excluded: see graph_index_memory). O(n) for the edge
  /// count; noexcept.
  [[nodiscard]] graph_index_memory memory() const noexcept {
    graph_index_memory m;
    m.adjacency = adjacency_.size() * sizeof(id_t);
    m.degrees = degrees_.size() * sizeof(std::uint32_t);
    m.entries = entries_.size() * sizeof(id_t);
    m.rows = degrees_.size();
    for (const std::uint32_t d : degrees_) m.edges += d;
    return m;
  }

  /// Hints the CPU to fetch stored vector i (a search about to score it). O(row bytes / 64).
  void prefetch(id_t i) const noexcept {
    detail::prefetch_row(store_.row(i), store_.dim() * sizeof(typename Store::value_type));
  }

  /// Raw metric score of a f32 query against stored vector i. O(d).
  [[nodiscard]] float score(const float* query, id_t i) const noexcept {
    return M::score(query, store_.row(i), store_.dim());
  }

 private:
  Store store_{};
  std::size_t max_degree_ = 0;
  std::vector<id_t> adjacency_;
  std::vector<std::uint32_t> degrees_;
  std::vector<id_t> entries_;
};

static_assert(Graph<graph_index<view_store<float>, inner_product>>);
static_assert(Graph<graph_index<owning_store<half>, l2>>);

}  // namespace kvsift
