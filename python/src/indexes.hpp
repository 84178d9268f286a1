#pragma once
// The index objects of the Python module (FlatIndex, RoarGraphIndex, InsertableGraphIndex,
// BlockIndex) and the searches over them, declared here and defined in search.cpp, so the
// search instantiations and the builds compile in separate translation units.
#include <memory>

#include "common.hpp"
#include "kvsift/core/vector_store.hpp"
#include "kvsift/index/block_index.hpp"
#include "kvsift/index/flat_index.hpp"
#include "kvsift/index/graph_index.hpp"
#include "kvsift/index/shared_insertable_graph.hpp"

namespace kvsift_python {

// ----------------------------------------------------------------------------- indexes

template <class T>
using store_t = kvsift::view_store<T>;

struct build_info {
  double knn_seconds = 0, projection_seconds = 0, connectivity_seconds = 0, total_seconds = 0;
};

/// Holds the key array (keeps it alive) and an index over it of either element type.
template <template <class> class Index>
class py_index {
 public:
  using variant = std::variant<Index<float>, Index<kvsift::half>, Index<kvsift::bfloat16>>;

  py_index(py::object keys, tensor borrowed, variant index, build_info stats = {})
      : keys_(std::move(keys)),
        owner_(std::move(borrowed.owner)),
        index_(std::move(index)),
        stats_(stats) {}

  [[nodiscard]] std::size_t size() const {
    return std::visit([](const auto& i) { return i.size(); }, index_);
  }
  [[nodiscard]] std::size_t dim() const {
    return std::visit([](const auto& i) { return i.dim(); }, index_);
  }
  /// The key array's dtype as its framework names it (numpy.dtype, torch.dtype).
  [[nodiscard]] py::object dtype() const {
    if (!py::hasattr(keys_, "dtype")) return py::none();
    return keys_.attr("dtype");
  }
  /// The caller's key array itself (not a copy).
  [[nodiscard]] const py::object& keys() const { return keys_; }
  [[nodiscard]] const variant& index() const { return index_; }
  [[nodiscard]] const build_info& build_stats() const { return stats_; }

 private:
  py::object keys_;   ///< the caller's object, as passed
  py::object owner_;  ///< keeps the memory read alive (the array, or the DLPack export)
  variant index_;
  build_info stats_;  ///< build timings (RoarGraph); zero for a flat index
};

template <class T>
using flat_t = kvsift::flat_index<store_t<T>>;
template <class T>
using graph_t = kvsift::graph_index<store_t<T>>;
using py_flat = py_index<flat_t>;
// Three element types: the variant of every index has an alternative per type.
using py_graph = py_index<graph_t>;

/// Builds `make(view_store<T>)` for the element type of a 2-D key array.
template <class Variant, class Make>
Variant over_keys(const tensor& keys, Make&& make) {
  require_dtype(keys, dtypes::stored, "keys");
  if (keys.is_f32()) return Variant(make(store_t<float>(matrix_of<float>(keys, "keys"))));
  if (keys.is_f16()) {
    return Variant(make(store_t<kvsift::half>(matrix_of<kvsift::half>(keys, "keys"))));
  }
  return Variant(make(store_t<kvsift::bfloat16>(matrix_of<kvsift::bfloat16>(keys, "keys"))));
}

// ----------------------------------------------------------------------------- insertable graph

/// A RoarGraph index over float32 keys it owns (copied), into which decode-time keys are
/// inserted (insertable_graph). Searches share it, inserts are exclusive (a reader-writer
/// lock): both release the GIL.
using py_insertable = kvsift::shared_insertable_graph<float>;

// ----------------------------------------------------------------------------- block index

/// Coarse block index (Quest min/max summaries). Unlike the other indexes it keeps no reference
/// to the keys: the summaries (3 * d floats per block) are computed at build time and are all
/// it reads afterwards.
class py_block {
 public:
  /// @throw as kvsift::block_index (block_size 0, empty or non-finite keys) and for a wrong
  ///        dtype or layout of keys.
  py_block(const py::handle& keys_h, std::int64_t block_size) {
    // Checked here: a negative size would wrap to a huge size_t and pass the C++ check.
    require(block_size >= 0, "BlockIndex: expected block_size > 0, got ", block_size);
    const tensor keys = tensor_of(keys_h, "keys");
    const auto k = f32_matrix_of(keys, "keys");
    py::gil_scoped_release release;
    index_ = kvsift::block_index<>(k, static_cast<std::size_t>(block_size));
  }
  [[nodiscard]] const kvsift::block_index<>& index() const { return index_; }

 private:
  kvsift::block_index<> index_;
};

/// Blocks (best first), their scores and the number of blocks scored.
struct block_output {
  py::array_t<std::int64_t> blocks;
  py::array_t<float> scores;
  std::int64_t distance_computations = 0;
};

// ----------------------------------------------------------------------------- searches

/// Exact top-k of (d,) or (m, d) queries, multithreaded over queries.
search_result flat_topk(const py_flat& self, const py::handle& queries, std::size_t k,
                        const py::object& filter, std::size_t threads);
/// Beam search of (d,) or (m, d) queries (pool L), optionally filtered and with extra entries;
/// degree_cap > 0 expands only each node's first degree_cap neighbours; expand_limit > 0 expands
/// only the pool's best expand_limit entries; walk_through, entry_prefix as beam_search_params's.
search_result graph_search(const py_graph& self, const py::handle& queries, std::size_t k,
                           std::size_t L, const py::object& filter, const py::object& entries,
                           std::size_t threads, std::size_t degree_cap, std::size_t expand_limit,
                           bool walk_through, std::size_t entry_prefix);
/// Top-k of every query head of a decode step over one index per KV head (GQA); entries: None
/// or (H, m) extra entry points per query head (a warm start).
search_result search_heads(const py::list& indexes, const py::handle& queries, std::size_t k,
                           std::size_t L, const py::object& filter, std::size_t threads,
                           std::size_t degree_cap, bool shared_walk, std::size_t expand_limit,
                           const py::object& entries, bool walk_through, std::size_t entry_prefix);
/// Exact DIPR over a flat index / DIPRS over a graph.
dipr_output flat_dipr(const py_flat& self, const py::handle& query, float beta, std::size_t l0,
                      std::size_t max_candidates, std::optional<float> seed_score,
                      const py::object& filter, const py::object& entries);
dipr_output graph_dipr(const py_graph& self, const py::handle& query, float beta, std::size_t l0,
                       std::size_t max_candidates, std::optional<float> seed_score,
                       const py::object& filter, const py::object& entries, std::size_t degree_cap,
                       std::size_t max_hops, bool walk_through, std::size_t entry_prefix);
search_result insertable_search(const py_insertable& self, const py::handle& queries, std::size_t k,
                                std::size_t L, std::size_t threads);
/// Block-index searches: the k best blocks, block-level DIPR, and the tokens of blocks.
block_output block_topk(const py_block& self, const py::handle& query, std::size_t k,
                        const py::object& filter);
block_output block_dipr(const py_block& self, const py::handle& query, float beta,
                        const py::object& filter);
py::array_t<std::int64_t> block_tokens(const py_block& self, const py::handle& blocks_h,
                                       const py::object& filter);

}  // namespace kvsift_python
