// Python bindings of kvsift (pybind11): indexes built over NumPy arrays without copying them,
// top-k / DIPR / filtered search, sparse and dense attention into mergeable partial states.
//
// Memory: every array the C++ side reads is borrowed, never copied. An array is accepted when
// its layout is one kvsift's views can describe (innermost axis contiguous, other strides
// whole elements); anything else is rejected with a message saying how to fix it, so a large
// copy never happens silently. Indexes keep a reference to their key array, so the keys stay
// alive as long as the index does. Computation runs with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kvsift/attention/merge.hpp"
#include "kvsift/attention/partial_state.hpp"
#include "kvsift/attention/sparse_attention.hpp"
#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/core/parallel_for.hpp"
#include "kvsift/core/vector_store.hpp"
#include "kvsift/index/block_index.hpp"
#include "kvsift/index/flat_index.hpp"
#include "kvsift/index/gqa_sampling.hpp"
#include "kvsift/index/roargraph_builder.hpp"
#include "kvsift/index/shared_insertable_graph.hpp"
#include "kvsift/search/beam_search.hpp"
#include "kvsift/search/dipr_search.hpp"
#include "kvsift/search/planner.hpp"
#include "kvsift/search/predicate.hpp"
#include "kvsift/search/search_workspace.hpp"
#include "tensor.hpp"

namespace py = pybind11;
using kvsift::id_t;

namespace {

using kvsift::detail::fail;
using kvsift::detail::require;

// ----------------------------------------------------------------------------- array checks

using kvsift_python::tensor;
using kvsift_python::tensor_of;

// Which dtypes an argument takes: queries and attention inputs are f32 only (the C++ API takes
// f32 queries); stored vectors are f32, f16 (numpy float16 is IEEE binary16, as kvsift::half) or
// bf16 (torch.bfloat16, ml_dtypes.bfloat16; kvsift::bfloat16).
enum class dtypes { f32, stored };

/// Rejects a non-native byte order: kvsift reads the raw bytes, so a big-endian `>f2`/`>f4`
/// array on a little-endian machine would be read as garbage values. Only NumPy arrays can
/// have one (DLPack is native by definition). O(1).
void require_native_order(const tensor& t, const char* what) {
  if (t.native_order) return;
  fail<kvsift::invalid_argument>(what, ": expected native byte order, got dtype ",
                                 kvsift_python::dtype_name(t), " (convert with .astype('",
                                 t.itemsize == 2 ? "<f2" : "<f4",
                                 "') or .astype(x.dtype.newbyteorder('=')); kvsift does not copy "
                                 "silently)");
}

void require_dtype(const tensor& t, dtypes allowed, const char* what) {
  // Byte order first: '>f4' is not float32, and the generic dtype message below would not say
  // what is wrong with it.
  require_native_order(t, what);
  if (t.is_f32() || (allowed == dtypes::stored && (t.is_f16() || t.is_bf16()))) return;
  // fail, not require: require would format the dtype name (a Python call) on every success.
  fail<kvsift::invalid_argument>(
      what, ": expected dtype ",
      allowed == dtypes::f32 ? "float32" : "float32, float16 or bfloat16", ", got ",
      kvsift_python::dtype_name(t), " (convert with ", kvsift_python::dtype_fix(t, "float32"),
      "; kvsift does not copy silently)");
}

/// Element reads through a T* need the address aligned to T (an unaligned float load is
/// undefined behaviour, and NumPy can make such arrays from a byte buffer).
void require_aligned(const tensor& t, const char* what) {
  require(reinterpret_cast<std::uintptr_t>(t.data) % std::max<std::size_t>(t.itemsize, 1) == 0,
          what, ": expected data aligned to the item size ", t.itemsize,
          " bytes (pass a copy made with ", kvsift_python::layout_fix(t), ")");
}

/// Stride of axis `axis` in elements; rejects zero, negative or non-whole strides. Only called
/// for axes of length > 1, where a zero stride means a broadcast (np.broadcast_to, torch
/// expand): every index along the axis aliases one element, a layout kvsift's views cannot
/// describe (a view stride of 0 would be replaced by a default and read past the array).
std::size_t stride_elems(const tensor& t, std::int64_t axis, const char* what) {
  const std::int64_t s = t.strides[static_cast<std::size_t>(axis)];
  const auto item = static_cast<std::int64_t>(t.itemsize);
  require(s > 0 && s % item == 0, what, ": expected a positive stride that is a multiple of ",
          "the item size ", item, " on axis ", axis, ", got ", s,
          " bytes (a broadcast, reversed or byte-offset view; pass ", kvsift_python::layout_fix(t),
          ": kvsift does not copy silently)");
  return static_cast<std::size_t>(s / item);
}

/// A borrowed matrix_view over a 2-D tensor whose rows are contiguous (any row stride).
template <class T>
kvsift::matrix_view<const T> matrix_of(const tensor& a, const char* what) {
  require<kvsift::dimension_mismatch>(a.ndim() == 2, what, ": expected a 2-D array (rows x dim), ",
                                      "got ", a.ndim(), " dimension(s)");
  const auto rows = static_cast<std::size_t>(a.shape[0]);
  const auto cols = static_cast<std::size_t>(a.shape[1]);
  // numpy reports arbitrary strides for empty arrays; there is nothing to view.
  if (rows == 0 || cols == 0)
    return kvsift::matrix_view<const T>(nullptr, rows, cols, std::max<std::size_t>(cols, 1));
  require_aligned(a, what);
  require(cols <= 1 || stride_elems(a, 1, what) == 1, what,
          ": expected contiguous rows (last-axis stride = item size), got stride ", a.strides[1],
          " (pass ", kvsift_python::layout_fix(a), "; kvsift does not copy silently)");
  const std::size_t row_stride = rows <= 1 ? cols : stride_elems(a, 0, what);
  require(row_stride >= cols, what, ": expected a row stride >= ", cols, " elements, got ",
          row_stride);
  return kvsift::matrix_view<const T>(reinterpret_cast<const T*>(a.data), rows, cols,
                                      row_stride == 0 ? 1 : row_stride);
}

/// matrix_of<float> for the inputs that accept only f32 (queries, training queries, states):
/// the dtype check first, so a wrong dtype names the fix instead of a layout error.
kvsift::matrix_view<const float> f32_matrix_of(const tensor& a, const char* what) {
  require_dtype(a, dtypes::f32, what);
  return matrix_of<float>(a, what);
}

/// A 1-D f32 vector (contiguous), borrowed from `t`.
std::span<const float> vector_of(const tensor& a, const char* what) {
  require_dtype(a, dtypes::f32, what);
  require<kvsift::dimension_mismatch>(a.ndim() == 1, what, ": expected a 1-D array, got ", a.ndim(),
                                      " dimension(s)");
  if (a.shape[0] == 0) return {};
  require_aligned(a, what);
  require(a.shape[0] <= 1 || a.strides[0] == 4, what, ": expected a contiguous vector, got stride ",
          a.strides[0], " (pass ", kvsift_python::layout_fix(a), ")");
  return {reinterpret_cast<const float*>(a.data), static_cast<std::size_t>(a.shape[0])};
}

/// A 1-D f32 vector and the tensor that keeps its memory alive (a DLPack export may be the only
/// owner of what the span points to).
struct f32_vector {
  tensor t;
  std::span<const float> s;
};

f32_vector vector_of(const py::handle& h, const char* what) {
  f32_vector v{tensor_of(h, what), {}};
  v.s = vector_of(v.t, what);
  return v;
}

/// Entry i of a 1-D integer tensor as int64 (any stride: ids are copied anyway). Unsigned
/// values beyond int64 saturate, so range checks still reject them.
std::int64_t int_at(const tensor& t, std::int64_t i) {
  const std::byte* p = t.data + i * t.strides[0];
  auto rd = [p]<class I>(I) {
    I v;
    std::memcpy(&v, p, sizeof(I));  // any alignment
    return v;
  };
  if (t.kind == 'i') {
    switch (t.itemsize) {
      case 1:
        return rd(std::int8_t{});
      case 2:
        return rd(std::int16_t{});
      case 4:
        return rd(std::int32_t{});
      default:
        return rd(std::int64_t{});
    }
  }
  switch (t.itemsize) {
    case 1:
      return rd(std::uint8_t{});
    case 2:
      return rd(std::uint16_t{});
    case 4:
      return rd(std::uint32_t{});
    default: {
      const std::uint64_t v = rd(std::uint64_t{});
      return v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())
                 ? std::numeric_limits<std::int64_t>::max()
                 : static_cast<std::int64_t>(v);
    }
  }
}

/// A 1-D integer tensor (any integer dtype of 1-8 bytes, native order), as a checked reader.
tensor int_vector_of(const py::handle& h, const char* what, const char* of_what) {
  tensor t = tensor_of(h, what);
  if ((t.kind != 'i' && t.kind != 'u') || t.itemsize > 8 || (t.itemsize & (t.itemsize - 1)) != 0) {
    fail<kvsift::invalid_argument>(what, ": expected an integer array of ", of_what, ", got dtype ",
                                   kvsift_python::dtype_name(t));
  }
  require_native_order(t, what);
  require<kvsift::dimension_mismatch>(t.ndim() == 1, what, ": expected a 1-D array, got ", t.ndim(),
                                      " dimension(s)");
  return t;
}

std::vector<id_t> ids_of(const py::handle& h, const char* what) {
  const tensor t = int_vector_of(h, what, "token ids");
  // Ids are small (one per retrieved token), so converting them is cheap; it also catches
  // negative values, which would wrap around in a cast to id_t.
  std::vector<id_t> out(static_cast<std::size_t>(t.shape[0]));
  for (std::int64_t i = 0; i < t.shape[0]; ++i) {
    const std::int64_t v = int_at(t, i);
    require<kvsift::out_of_range>(v >= 0 && v < static_cast<std::int64_t>(kvsift::invalid_id), what,
                                  ": expected ids in [0, ", kvsift::invalid_id, "), got ", v,
                                  " at position ", i);
    out[static_cast<std::size_t>(i)] = static_cast<id_t>(v);
  }
  return out;
}

/// A count parameter (M, L, nq, l0, ...) bounded by the largest index: any value beyond it is
/// meaningless (ids are 32-bit) and, left to the library, sizes buffers from it (n x M
/// adjacency, an L-entry pool) that overflow or exhaust memory. Python ints beyond size_t are
/// refused by pybind11 itself (TypeError); this catches the ones that fit. O(1).
std::size_t bounded_count(std::size_t v, const char* what) {
  require<kvsift::out_of_range>(v <= kvsift::max_index_size, what, ": expected at most ",
                                kvsift::max_index_size, " (ids are 32-bit), got ", v);
  return v;
}

py::array_t<float> to_numpy(const std::vector<float>& v) {
  py::array_t<float> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

/// Ids as int64, the index type of torch (index_select, gather) and numpy; missing results keep
/// the value INVALID_ID (2**32 - 1), which any indexing into a shorter array rejects.
py::array_t<std::int64_t> ids_to_numpy(std::span<const id_t> ids) {
  py::array_t<std::int64_t> out(static_cast<py::ssize_t>(ids.size()));
  std::copy(ids.begin(), ids.end(), out.mutable_data());
  return out;
}

// ----------------------------------------------------------------------------- predicates

using filter_t = std::variant<kvsift::no_filter, kvsift::id_below, kvsift::id_range>;

filter_t filter_of(const py::object& f) {
  if (f.is_none()) return kvsift::no_filter{};
  if (py::isinstance<kvsift::id_below>(f)) return f.cast<kvsift::id_below>();
  if (py::isinstance<kvsift::id_range>(f)) return f.cast<kvsift::id_range>();
  throw py::type_error("filter: expected None, kvsift.IdBelow or kvsift.IdRange, got " +
                       std::string(py::str(py::type::of(f).attr("__name__"))));
}

// ----------------------------------------------------------------------------- results

/// Top-k results: ids / scores of shape (k,) for one query or (m, k) for m queries; ids of
/// missing results are 2**32 - 1 (kvsift.INVALID_ID) with the metric's worst score.
struct search_result {
  py::array_t<std::int64_t> ids;
  py::array_t<float> scores;
  py::array_t<std::int64_t> distance_computations;  ///< keys scored, per query
  py::array_t<std::int64_t> hops;
};

struct dipr_output {
  py::array_t<std::int64_t> ids;
  py::array_t<float> scores;
  float best_score = 0;
  bool capped = false;
  std::int64_t distance_computations = 0;
  std::int64_t hops = 0;
};

dipr_output to_python(const kvsift::dipr_result& r) {
  dipr_output out;
  out.ids = ids_to_numpy(r.ids);
  out.scores = to_numpy(r.scores);
  out.best_score = r.best_score;
  out.capped = r.capped;
  out.distance_computations = static_cast<std::int64_t>(r.stats.distance_computations);
  out.hops = static_cast<std::int64_t>(r.stats.hops);
  return out;
}

kvsift::dipr_params dipr_params_of(float beta, std::size_t l0, std::size_t max_candidates,
                                   std::optional<float> seed_score) {
  kvsift::dipr_params p;
  p.beta = beta;
  p.l0 = bounded_count(l0, "dipr: l0");
  p.max_candidates = bounded_count(max_candidates, "dipr: max_candidates");
  if (seed_score) p.seed_score = *seed_score;
  return p;
}

/// Runs `one(i, query_span, ws, ids, scores) -> search_stats` for a (d,) or (m, d) query array,
/// over queries in parallel (one workspace per thread), with the GIL released.
template <class One>
search_result batched_topk(const py::handle& queries_h, std::size_t k, std::size_t threads,
                           One&& one) {
  const tensor qa = tensor_of(queries_h, "queries");
  require_dtype(qa, dtypes::f32, "queries");
  require<kvsift::dimension_mismatch>(qa.ndim() == 1 || qa.ndim() == 2,
                                      "queries: expected a 1-D (dim) or 2-D (m x dim) array, got ",
                                      qa.ndim(), " dimension(s)");
  require(k > 0, "k must be > 0, got 0");
  // k beyond the largest index only pads, and m x k results are allocated here before any
  // search runs: bound k and check the products so a huge k is a clear error, not a wrapped
  // size (m x k overflowing) or an out-of-bounds write through ids + i * k.
  require<kvsift::out_of_range>(k <= kvsift::max_index_size, "k: expected at most ",
                                kvsift::max_index_size, " (ids are 32-bit), got ", k);
  const bool single = qa.ndim() == 1;
  const kvsift::matrix_view<const float> q =
      single ? kvsift::matrix_view<const float>(vector_of(qa, "queries").data(), 1,
                                                static_cast<std::size_t>(qa.shape[0]))
             : matrix_of<float>(qa, "queries");
  const std::size_t m = q.rows();
  const std::size_t cells = kvsift::checked_mul(m, k, "queries x k results");
  const std::size_t bytes = kvsift::checked_bytes<std::int64_t>(cells, "queries x k results");
  require(bytes <= static_cast<std::size_t>(std::numeric_limits<py::ssize_t>::max()),
          "queries x k results: ", m, " x ", k, " ids need ", bytes,
          " bytes, more than an array can hold");
  search_result out;
  std::vector<py::ssize_t> shape =
      single ? std::vector<py::ssize_t>{static_cast<py::ssize_t>(k)}
             : std::vector<py::ssize_t>{static_cast<py::ssize_t>(m), static_cast<py::ssize_t>(k)};
  out.ids = py::array_t<std::int64_t>(shape);
  out.scores = py::array_t<float>(shape);
  out.distance_computations = py::array_t<std::int64_t>(static_cast<py::ssize_t>(m));
  out.hops = py::array_t<std::int64_t>(static_cast<py::ssize_t>(m));
  std::int64_t* ids = out.ids.mutable_data();
  float* scores = out.scores.mutable_data();
  std::int64_t* dist = out.distance_computations.mutable_data();
  std::int64_t* hops = out.hops.mutable_data();
  {
    py::gil_scoped_release release;
    const std::size_t t = std::min(m, threads == 0 ? kvsift::default_thread_count() : threads);
    std::vector<kvsift::search_workspace> ws(std::max<std::size_t>(t, 1));
    // The library writes 32-bit ids; each worker widens its query's row to int64.
    std::vector<std::vector<id_t>> ids32(ws.size());
    kvsift::parallel_for(m, ws.size(), [&](std::size_t i, std::size_t w) {
      ids32[w].resize(k);
      const kvsift::search_stats s = one(i, q.row_span(i), ws[w], std::span<id_t>(ids32[w]),
                                         std::span<float>(scores + i * k, k));
      std::copy(ids32[w].begin(), ids32[w].end(), ids + i * k);
      dist[i] = static_cast<std::int64_t>(s.distance_computations);
      hops[i] = static_cast<std::int64_t>(s.hops);
    });
  }
  return out;
}

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

py_flat make_flat(const py::handle& keys_h) {
  tensor keys = tensor_of(keys_h, "keys");
  auto index = over_keys<py_flat::variant>(
      keys, [](auto store) { return kvsift::flat_index<decltype(store)>(store); });
  return {py::reinterpret_borrow<py::object>(keys_h), std::move(keys), std::move(index)};
}

py_graph make_roargraph(const py::handle& keys_h, const py::handle& train_h,
                        const kvsift::roargraph_params& params) {
  tensor keys = tensor_of(keys_h, "keys");
  const tensor train = tensor_of(train_h, "train_queries");
  const auto tq = f32_matrix_of(train, "train_queries");
  kvsift::roargraph_build_stats st;
  auto index = over_keys<py_graph::variant>(keys, [&](auto store) {
    py::gil_scoped_release release;
    return kvsift::roargraph_builder<>(params).build(store, tq, &st);
  });
  return {py::reinterpret_borrow<py::object>(keys_h),
          std::move(keys),
          std::move(index),
          {st.knn_seconds, st.projection_seconds, st.connectivity_seconds, st.total_seconds}};
}

search_result flat_topk(const py_flat& self, const py::handle& queries, std::size_t k,
                        const py::object& filter, std::size_t threads) {
  const filter_t f = filter_of(filter);
  return std::visit(
      [&](const auto& index, const auto& pred) {
        return batched_topk(queries, k, threads,
                            [&](std::size_t, auto q, auto& ws, auto ids, auto scores) {
                              return index.topk(q, k, ws, ids, scores, pred);
                            });
      },
      self.index(), f);
}

search_result graph_search(const py_graph& self, const py::handle& queries, std::size_t k,
                           std::size_t L, const py::object& filter, const py::object& entries,
                           std::size_t threads) {
  const filter_t f = filter_of(filter);
  const std::vector<id_t> extra =
      entries.is_none() ? std::vector<id_t>{} : ids_of(entries, "entries");
  const kvsift::beam_search_params p{.k = k, .L = bounded_count(L, "search: L")};
  return std::visit(
      [&](const auto& index, const auto& pred) {
        return batched_topk(queries, k, threads,
                            [&](std::size_t, auto q, auto& ws, auto ids, auto scores) {
                              return kvsift::beam_search(index, q, p, ws, ids, scores, pred,
                                                         std::span<const id_t>(extra));
                            });
      },
      self.index(), f);
}

/// Top-k of query head h of `queries` (H, d) in `indexes[h / (H / len(indexes))]`: one call
/// for the query heads of a decode step over the per-KV-head indexes (GQA), heads in parallel.
search_result search_heads(const py::list& indexes, const py::handle& queries, std::size_t k,
                           std::size_t L, const py::object& filter, std::size_t threads) {
  using one_index = std::variant<const py_graph*, const py_flat*>;
  std::vector<one_index> idx;
  for (const auto& h : indexes) {
    if (py::isinstance<py_graph>(h)) {
      idx.emplace_back(&h.cast<const py_graph&>());
    } else if (py::isinstance<py_flat>(h)) {
      idx.emplace_back(&h.cast<const py_flat&>());
    } else {
      throw py::type_error("search_heads: expected a list of RoarGraphIndex or FlatIndex, got " +
                           std::string(py::str(py::type::of(h).attr("__name__"))));
    }
  }
  const tensor qt = tensor_of(queries, "queries");
  const std::int64_t heads = qt.ndim() == 2 ? qt.shape[0] : -1;
  require<kvsift::dimension_mismatch>(
      !idx.empty() && heads >= 0 && static_cast<std::size_t>(heads) % idx.size() == 0,
      "search_heads: expected (H, d) queries with H a multiple of the ", idx.size(),
      " indexes (one per KV head), got ", qt.ndim(), "-D queries of ", heads, " rows");
  const std::size_t group = static_cast<std::size_t>(heads) / idx.size();
  const filter_t f = filter_of(filter);
  const kvsift::beam_search_params p{.k = k, .L = bounded_count(L, "search_heads: L")};
  return std::visit(
      [&](const auto& pred) {
        return batched_topk(
            queries, k, threads, [&](std::size_t h, auto q, auto& ws, auto ids, auto scores) {
              return std::visit(
                  [&](const auto* index) {
                    return std::visit(
                        [&](const auto& i) -> kvsift::search_stats {
                          if constexpr (std::is_same_v<decltype(index), const py_flat*>) {
                            return i.topk(q, k, ws, ids, scores, pred);
                          } else {
                            return kvsift::beam_search(i, q, p, ws, ids, scores, pred);
                          }
                        },
                        index->index());
                  },
                  idx[h / group]);
            });
      },
      f);
}

// One workspace per Python thread: single-query calls allocate nothing once warmed up.
kvsift::search_workspace& thread_workspace() {
  thread_local kvsift::search_workspace ws;
  return ws;
}

template <class Index>
dipr_output run_dipr(const Index& self, const py::handle& query_h, float beta, std::size_t l0,
                     std::size_t max_candidates, std::optional<float> seed_score,
                     const py::object& filter, const py::object& entries) {
  const auto qv = vector_of(query_h, "query");
  const std::span<const float> q = qv.s;
  const auto p = dipr_params_of(beta, l0, max_candidates, seed_score);
  const filter_t f = filter_of(filter);
  const std::vector<id_t> extra =
      entries.is_none() ? std::vector<id_t>{} : ids_of(entries, "entries");
  kvsift::dipr_result r;
  {
    py::gil_scoped_release release;
    std::visit(
        [&](const auto& index, const auto& pred) {
          if constexpr (std::is_same_v<Index, py_flat>) {
            require(extra.empty(), "FlatIndex.dipr: entries are meaningless for a flat scan");
            index.dipr(q, p, thread_workspace(), r, pred);
          } else {
            kvsift::dipr_search(index, q, p, thread_workspace(), r, pred,
                                std::span<const id_t>(extra));
          }
        },
        self.index(), f);
  }
  return to_python(r);
}

// ----------------------------------------------------------------------------- insertable graph

/// A RoarGraph index over float32 keys it owns (copied), into which decode-time keys are
/// inserted (insertable_graph). Searches share it, inserts are exclusive (a reader-writer
/// lock): both release the GIL.
using py_insertable = kvsift::shared_insertable_graph<float>;

std::unique_ptr<py_insertable> make_insertable(const py::handle& keys_h, const py::handle& train_h,
                                               const kvsift::roargraph_params& p,
                                               const kvsift::graph_insert_params& ip) {
  const tensor keys = tensor_of(keys_h, "keys");
  const tensor train = tensor_of(train_h, "train_queries");
  const auto k = f32_matrix_of(keys, "keys");
  const auto t = f32_matrix_of(train, "train_queries");
  py::gil_scoped_release release;
  return std::make_unique<py_insertable>(
      kvsift::build_insertable(kvsift::roargraph_builder<>(p), k, t, ip));
}

id_t insertable_insert(py_insertable& self, const py::handle& keys_h) {
  const tensor keys = tensor_of(keys_h, "keys");
  const auto k = f32_matrix_of(keys, "keys");
  py::gil_scoped_release release;
  return self.insert(k);
}

search_result insertable_search(const py_insertable& self, const py::handle& queries, std::size_t k,
                                std::size_t L, std::size_t threads) {
  const kvsift::beam_search_params p{.k = k, .L = bounded_count(L, "search: L")};
  return batched_topk(
      queries, k, threads, [&](std::size_t, auto q, auto& ws, auto ids, auto scores) {
        return self.read(
            [&](const auto& g) { return kvsift::beam_search(g, q, p, ws, ids, scores); });
      });
}

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

/// Runs `search(index, q, ws, result, pred)` with the GIL released and converts the result.
template <class Search>
block_output block_search(const py_block& self, const py::handle& query_h, const py::object& filter,
                          Search&& search) {
  const auto qv = vector_of(query_h, "query");
  const std::span<const float> q = qv.s;
  // block_index does not check queries for NaN/Inf (a NaN score just ranks last), so a NaN
  // query would silently return arbitrary blocks: rejected here. O(d).
  for (std::size_t i = 0; i < q.size(); ++i) {
    require<kvsift::non_finite_value>(
        std::isfinite(q[i]), "BlockIndex: expected a finite query, got ", q[i], " at position ", i);
  }
  const filter_t f = filter_of(filter);
  kvsift::block_result r;
  {
    py::gil_scoped_release release;
    std::visit([&](const auto& pred) { search(self.index(), q, thread_workspace(), r, pred); }, f);
  }
  block_output out;
  out.blocks = py::array_t<std::int64_t>(static_cast<py::ssize_t>(r.blocks.size()));
  std::copy(r.blocks.begin(), r.blocks.end(), out.blocks.mutable_data());
  out.scores = to_numpy(r.scores);
  out.distance_computations = static_cast<std::int64_t>(r.stats.distance_computations);
  return out;
}

/// Token ids (int64, block order) of the given blocks that pass the filter.
py::array_t<std::int64_t> block_tokens(const py_block& self, const py::handle& blocks_h,
                                       const py::object& filter) {
  const tensor a = int_vector_of(blocks_h, "blocks", "block ids");
  std::vector<std::size_t> blocks(static_cast<std::size_t>(a.shape[0]));
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const std::int64_t b = int_at(a, static_cast<std::int64_t>(i));
    // Negative values would wrap to huge ones; the C++ call checks the upper end.
    require<kvsift::out_of_range>(b >= 0, "blocks: expected block ids >= 0, got ", b,
                                  " at position ", i);
    blocks[i] = static_cast<std::size_t>(b);
  }
  const filter_t f = filter_of(filter);
  std::vector<id_t> ids;
  std::visit([&](const auto& pred) { self.index().tokens(blocks, ids, pred); }, f);
  return ids_to_numpy(ids);
}

// ----------------------------------------------------------------------------- planner

/// Planner parameters from Python keywords; 0 and negative values are rejected by the planner
/// itself (negative integers are caught here, before they wrap around in a size_t).
kvsift::planner_params planner_params_of(std::int64_t short_context, std::int64_t head_dim,
                                         std::int64_t block_size, std::int64_t k_blocks,
                                         std::int64_t dipr_l0, double dipr_beta) {
  auto count = [](std::int64_t v, const char* what) {
    require(v >= 0, "Planner: expected ", what, " >= 0, got ", v);
    return static_cast<std::size_t>(v);
  };
  kvsift::planner_params p;
  p.short_context = count(short_context, "short_context");
  p.head_dim = count(head_dim, "head_dim");
  p.block_size = count(block_size, "block_size");
  p.k_blocks = count(k_blocks, "k_blocks");
  p.dipr_l0 = count(dipr_l0, "dipr_l0");
  p.dipr_beta = dipr_beta;
  return p;
}

kvsift::plan_inputs plan_inputs_of(std::int64_t context, std::int64_t reused_prefix,
                                   std::int64_t layer, double gpu_budget_bytes,
                                   std::optional<double> latency_budget_us) {
  // The planner checks context > 0, prefix <= context and the budgets; only the signs of the
  // integers need checking here.
  require(context >= 0 && reused_prefix >= 0 && layer >= 0,
          "Planner.plan: expected context, reused_prefix and layer >= 0, got ", context, ", ",
          reused_prefix, ", ", layer);
  kvsift::plan_inputs in;
  in.context = static_cast<std::size_t>(context);
  in.reused_prefix = static_cast<std::size_t>(reused_prefix);
  in.layer = static_cast<std::size_t>(layer);
  in.gpu_budget_bytes = gpu_budget_bytes;
  in.latency_budget_us = latency_budget_us;
  return in;
}

// ----------------------------------------------------------------------------- attention

/// K/V tensors as a kv_view: (tokens, dim) for one KV head, or (tokens, kv_heads, dim) in any
/// layout whose innermost axis is contiguous (e.g. a slice of a preallocated cache).
template <class T>
kvsift::kv_view<T> kv_of(const tensor& k, const tensor& v) {
  require<kvsift::dimension_mismatch>(
      k.ndim() == v.ndim() && (k.ndim() == 2 || k.ndim() == 3),
      "keys/values: expected both 2-D (tokens x dim) or both 3-D (tokens x kv_heads x dim), got ",
      k.ndim(), "-D keys and ", v.ndim(), "-D values");
  for (std::size_t ax = 0; ax < k.shape.size(); ++ax) {
    require<kvsift::dimension_mismatch>(k.shape[ax] == v.shape[ax],
                                        "keys/values: expected equal shapes, got ", k.shape[ax],
                                        " and ", v.shape[ax], " on axis ", ax);
  }
  if (k.ndim() == 2) return kvsift::kv_view<T>(matrix_of<T>(k, "keys"), matrix_of<T>(v, "values"));
  auto head_matrix = [](const tensor& a, const char* what) {
    const auto n = static_cast<std::size_t>(a.shape[0]);
    const auto d = static_cast<std::size_t>(a.shape[2]);
    if (n > 0 && d > 0 && a.shape[1] > 0) require_aligned(a, what);
    require(d <= 1 || stride_elems(a, 2, what) == 1, what,
            ": expected a contiguous last axis, got stride ", a.strides[2], " (pass ",
            kvsift_python::layout_fix(a), "; kvsift does not copy silently)");
    // The strides are passed through unchanged: kvsift must read exactly the elements numpy
    // would. Replacing a stride (a broadcast's 0 by d, as this once did) reads past the buffer.
    const std::size_t rs = n <= 1
                               ? std::max<std::size_t>(d * static_cast<std::size_t>(a.shape[1]), 1)
                               : stride_elems(a, 0, what);
    require(n <= 1 || rs >= d, what, ": expected a token stride >= ", d,
            " elements (rows must not overlap), got ", rs, " (pass ", kvsift_python::layout_fix(a),
            "; kvsift does not copy silently)");
    const std::size_t hs = a.shape[1] <= 1 ? d : stride_elems(a, 1, what);
    return std::pair(kvsift::matrix_view<const T>(reinterpret_cast<const T*>(a.data), n, d,
                                                  std::max<std::size_t>({rs, d, 1})),
                     hs);
  };
  const auto [km, khs] = head_matrix(k, "keys");
  const auto [vm, vhs] = head_matrix(v, "values");
  require(khs == vhs, "keys/values: expected the same head stride, got ", khs, " and ", vhs,
          " elements");
  return kvsift::kv_view<T>(km, vm, static_cast<std::size_t>(k.shape[1]), khs);
}

std::vector<float> bias_of(const py::object& bias) {
  if (bias.is_none()) return {};
  const auto b = vector_of(bias, "bias");
  return {b.s.begin(), b.s.end()};
}

/// Calls `fn(kv_view<T>)` for the K/V element type (f32, f16, bf16); the tensors stay alive for
/// the call. The GIL is the caller's business (fn may build Python results).
template <class Fn>
decltype(auto) visit_kv(const py::handle& keys_h, const py::handle& values_h, Fn&& fn) {
  const tensor k = tensor_of(keys_h, "keys");
  const tensor v = tensor_of(values_h, "values");
  require_dtype(k, dtypes::stored, "keys");
  require_dtype(v, dtypes::stored, "values");
  if (k.kind != v.kind || k.itemsize != v.itemsize) {
    fail<kvsift::invalid_argument>("values: expected the dtype of keys (",
                                   kvsift_python::dtype_name(k), "), got ",
                                   kvsift_python::dtype_name(v));
  }
  if (k.is_f32()) return fn(kv_of<float>(k, v));
  if (k.is_f16()) return fn(kv_of<kvsift::half>(k, v));
  return fn(kv_of<kvsift::bfloat16>(k, v));
}

/// One partial state from `fn(kv, state)`, computed with the GIL released.
template <class Fn>
std::pair<py::array_t<float>, float> with_kv(const py::handle& keys_h, const py::handle& values_h,
                                             Fn&& fn) {
  kvsift::partial_state st;
  visit_kv(keys_h, values_h, [&](const auto& kv) {
    py::gil_scoped_release release;
    fn(kv, st);
  });
  return {to_numpy(st.o), st.lse};
}

// ----------------------------------------------------------------------------- batched heads

/// Runs `one(q_row, q_head, kv_head, kv, state)` for every query head of q (H, d) over K/V with
/// kv_heads KV heads: the GQA mapping, query head h reads KV head h / (H / kv_heads). Heads run
/// on `threads` threads (0 = all) with the GIL released -> (o (H, d), lse (H,)).
template <class One>
std::pair<py::array_t<float>, py::array_t<float>> over_heads(const py::handle& q_h,
                                                             const py::handle& keys_h,
                                                             const py::handle& values_h,
                                                             std::size_t threads, One&& one) {
  const tensor qt = tensor_of(q_h, "q");
  const auto q = f32_matrix_of(qt, "q");
  return visit_kv(keys_h, values_h, [&](const auto& kv) {
    const std::size_t heads = q.rows();
    const std::size_t d = q.cols();
    const std::size_t hkv = kv.kv_heads();
    require<kvsift::dimension_mismatch>(d == kv.head_dim(), "q: expected head dim ", kv.head_dim(),
                                        " (that of keys), got ", d);
    require<kvsift::dimension_mismatch>(
        hkv > 0 && heads % hkv == 0, "q: expected a number of query heads that is a multiple of ",
        "the ", hkv, " KV heads (GQA groups), got ", heads);
    const std::size_t group = heads / hkv;
    py::array_t<float> o(
        std::vector<py::ssize_t>{static_cast<py::ssize_t>(heads), static_cast<py::ssize_t>(d)});
    py::array_t<float> lse(static_cast<py::ssize_t>(heads));
    float* op = o.mutable_data();
    float* lp = lse.mutable_data();
    {
      py::gil_scoped_release release;
      const std::size_t t =
          std::min(heads, threads == 0 ? kvsift::default_thread_count() : threads);
      std::vector<kvsift::partial_state> st(std::max<std::size_t>(t, 1));
      kvsift::parallel_for(heads, st.size(), [&](std::size_t h, std::size_t w) {
        one(q.row_span(h), h, h / group, kv, st[w]);
        std::copy(st[w].o.begin(), st[w].o.end(), op + h * d);
        lp[h] = st[w].lse;
      });
    }
    return std::pair(std::move(o), std::move(lse));
  });
}

/// Token lists of a (H, k) integer array, one row per query head (what a batched search
/// returns): INVALID_ID entries are padding and skipped, other values must be valid ids.
/// -> flat ids and row starts (H + 1). O(H k).
std::pair<std::vector<id_t>, std::vector<std::size_t>> token_rows_of(const py::handle& h,
                                                                     std::size_t heads) {
  tensor t = tensor_of(h, "tokens");
  if ((t.kind != 'i' && t.kind != 'u') || t.itemsize > 8 || (t.itemsize & (t.itemsize - 1)) != 0) {
    fail<kvsift::invalid_argument>("tokens: expected an integer array of token ids, got dtype ",
                                   kvsift_python::dtype_name(t));
  }
  require_native_order(t, "tokens");
  require<kvsift::dimension_mismatch>(
      t.ndim() == 2 && t.shape[0] == static_cast<std::int64_t>(heads),
      "tokens: expected a 2-D array (", heads, " query heads x k), got ", t.ndim(),
      " dimension(s) of ", t.ndim() > 0 ? t.shape[0] : 0, " rows");
  const auto k = static_cast<std::size_t>(t.shape[1]);
  std::vector<id_t> ids;
  ids.reserve(kvsift::checked_mul(heads, k, "tokens: heads x k"));
  std::vector<std::size_t> starts{0};
  for (std::size_t r = 0; r < heads; ++r) {
    for (std::size_t c = 0; c < k; ++c) {
      const std::byte* p = t.data + static_cast<std::int64_t>(r) * t.strides[0] +
                           static_cast<std::int64_t>(c) * t.strides[1];
      tensor one = {};
      one.data = p;
      one.kind = t.kind;
      one.itemsize = t.itemsize;
      one.strides = {0};
      const std::int64_t v = int_at(one, 0);
      if (v == static_cast<std::int64_t>(kvsift::invalid_id)) continue;
      require<kvsift::out_of_range>(v >= 0 && v < static_cast<std::int64_t>(kvsift::invalid_id),
                                    "tokens: expected ids in [0, ", kvsift::invalid_id,
                                    ") or INVALID_ID, got ", v, " at (", r, ", ", c, ")");
      ids.push_back(static_cast<id_t>(v));
    }
    starts.push_back(ids.size());
  }
  return {std::move(ids), std::move(starts)};
}

/// Elementwise merge of H partial states: (o_a, lse_a) and (o_b, lse_b) of shapes (H, d), (H,).
std::pair<py::array_t<float>, py::array_t<float>> merge_states(const py::handle& o_a_h,
                                                               const py::handle& lse_a_h,
                                                               const py::handle& o_b_h,
                                                               const py::handle& lse_b_h) {
  const tensor ta = tensor_of(o_a_h, "o_a");
  const tensor tb = tensor_of(o_b_h, "o_b");
  const auto a = f32_matrix_of(ta, "o_a");
  const auto b = f32_matrix_of(tb, "o_b");
  const auto la = vector_of(lse_a_h, "lse_a");
  const auto lb = vector_of(lse_b_h, "lse_b");
  require<kvsift::dimension_mismatch>(a.rows() == b.rows() && a.cols() == b.cols(),
                                      "merge_states: expected o_a and o_b of one shape, got (",
                                      a.rows(), ", ", a.cols(), ") and (", b.rows(), ", ", b.cols(),
                                      ")");
  require<kvsift::dimension_mismatch>(
      la.s.size() == a.rows() && lb.s.size() == a.rows(), "merge_states: expected ", a.rows(),
      " lse values per side (one per state), got ", la.s.size(), " and ", lb.s.size());
  const std::size_t heads = a.rows();
  const std::size_t d = a.cols();
  py::array_t<float> o(
      std::vector<py::ssize_t>{static_cast<py::ssize_t>(heads), static_cast<py::ssize_t>(d)});
  py::array_t<float> lse(static_cast<py::ssize_t>(heads));
  float* op = o.mutable_data();
  float* lp = lse.mutable_data();
  for (std::size_t h = 0; h < heads; ++h) {
    std::copy_n(a.row(h), d, op + h * d);
    lp[h] = la.s[h];
    kvsift::merge_into(std::span<float>(op + h * d, d), lp[h], {b.row_span(h), lb.s[h]});
  }
  return {std::move(o), std::move(lse)};
}

}  // namespace

PYBIND11_MODULE(kvsift, m) {
  m.doc() =
      "kvsift: retrieval-based sparse attention (RoarGraph / flat indexes, top-k, DIPR and "
      "filtered search, sparse attention with log-sum-exp merge). Arrays are borrowed, never "
      "copied: keys must be float32 or float16 with contiguous rows, queries float32.";

  // pybind11 < 2.12 reads NumPy's dtype struct at the NumPy 1.x offsets; under NumPy 2 every
  // itemsize and stride check would then read garbage (a float32 of item size 0). Refuse to load.
  if (py::dtype::of<float>().itemsize() != 4) {
    throw py::import_error(
        "kvsift: this module was built with pybind11 < 2.12, which does not support the NumPy 2 "
        "found at run time; rebuild it with pybind11 >= 2.12 (pip install ./python does)");
  }

  // Exceptions: kvsift's error tiers become ValueError subclasses (matched most-derived first:
  // pybind11 tries the translators registered last first).
  auto& invalid =
      py::register_exception<kvsift::invalid_argument>(m, "InvalidArgument", PyExc_ValueError);
  py::register_exception<kvsift::dimension_mismatch>(m, "DimensionMismatch", invalid.ptr());
  py::register_exception<kvsift::out_of_range>(m, "OutOfRange", invalid.ptr());
  py::register_exception<kvsift::non_finite_value>(m, "NonFiniteValue", invalid.ptr());

#ifdef KVSIFT_PYTHON_VERSION
  m.attr("__version__") = KVSIFT_PYTHON_VERSION;
#endif
  m.attr("INVALID_ID") = py::int_(kvsift::invalid_id);

  py::class_<kvsift::id_below>(m, "IdBelow", "Filter: only ids < prefix_len (prefix reuse).")
      .def(py::init([](std::size_t n) { return kvsift::id_below{n}; }), py::arg("prefix_len"))
      .def_readonly("prefix_len", &kvsift::id_below::prefix_len);
  py::class_<kvsift::id_range>(m, "IdRange", "Filter: only ids in [first, last).")
      .def(py::init([](std::size_t a, std::size_t b) {
             return kvsift::id_range{a, b};
           }),
           py::arg("first"), py::arg("last"))
      .def_readonly("first", &kvsift::id_range::first)
      .def_readonly("last", &kvsift::id_range::last);

  py::class_<search_result>(m, "SearchResult",
                            "Top-k result: ids/scores (k,) or (m, k), best first; missing "
                            "results are INVALID_ID with the worst score.")
      .def_readonly("ids", &search_result::ids)
      .def_readonly("scores", &search_result::scores)
      .def_readonly("distance_computations", &search_result::distance_computations)
      .def_readonly("hops", &search_result::hops);
  py::class_<dipr_output>(m, "DiprResult", "Every key within beta of the best score, best first.")
      .def_readonly("ids", &dipr_output::ids)
      .def_readonly("scores", &dipr_output::scores)
      .def_readonly("best_score", &dipr_output::best_score)
      .def_readonly("capped", &dipr_output::capped)
      .def_readonly("distance_computations", &dipr_output::distance_computations)
      .def_readonly("hops", &dipr_output::hops);
  py::class_<build_info>(m, "BuildStats", "Wall-clock seconds per RoarGraph build phase.")
      .def_readonly("knn_seconds", &build_info::knn_seconds)
      .def_readonly("projection_seconds", &build_info::projection_seconds)
      .def_readonly("connectivity_seconds", &build_info::connectivity_seconds)
      .def_readonly("total_seconds", &build_info::total_seconds);

  py::class_<py_flat>(m, "FlatIndex",
                      "Exact index (the oracle). FlatIndex(keys): keys (n, d) float32/float16 "
                      "with contiguous rows, borrowed (kept alive, not copied).")
      .def(py::init(&make_flat), py::arg("keys"))
      .def_property_readonly("size", &py_flat::size)
      .def_property_readonly("dim", &py_flat::dim)
      .def_property_readonly("dtype", &py_flat::dtype)
      .def_property_readonly("keys", &py_flat::keys,
                             "The caller's key array itself (borrowed, never a copy).")
      .def("topk", &flat_topk, py::arg("queries"), py::arg("k"), py::kw_only(),
           py::arg("filter") = py::none(), py::arg("threads") = 0,
           "Exact top-k of (d,) or (m, d) float32 queries, O(m n d), multithreaded over queries.")
      .def("dipr", &run_dipr<py_flat>, py::arg("query"), py::arg("beta"), py::kw_only(),
           py::arg("l0") = 64, py::arg("max_candidates") = 0, py::arg("seed_score") = py::none(),
           py::arg("filter") = py::none(), py::arg("entries") = py::none(),
           "Exact DIPR: every key with score >= best - beta. O(n d).");

  py::class_<py_graph>(m, "RoarGraphIndex",
                       "RoarGraph over keys (n, d) float32/float16 (borrowed, kept alive), built "
                       "from float32 training queries (m, d). Build: O(m n d) kNN + projection + "
                       "connectivity; the GIL is released.")
      .def(py::init([](const py::handle& keys, const py::handle& train, std::size_t nq,
                       std::size_t M, std::size_t L, std::size_t threads, std::uint64_t seed) {
             kvsift::roargraph_params p;
             p.nq = bounded_count(nq, "RoarGraphIndex: nq");
             p.M = bounded_count(M, "RoarGraphIndex: M");
             p.L = bounded_count(L, "RoarGraphIndex: L");
             p.threads = threads;
             p.seed = seed;
             return make_roargraph(keys, train, p);
           }),
           py::arg("keys"), py::arg("train_queries"), py::kw_only(), py::arg("nq") = 100,
           py::arg("M") = 35, py::arg("L") = 500, py::arg("threads") = 0, py::arg("seed") = 2024)
      .def_property_readonly("size", &py_graph::size)
      .def_property_readonly("dim", &py_graph::dim)
      .def_property_readonly("dtype", &py_graph::dtype)
      .def_property_readonly("keys", &py_graph::keys,
                             "The caller's key array itself (borrowed, never a copy).")
      .def_property_readonly("build_stats", &py_graph::build_stats)
      .def_property_readonly("max_degree",
                             [](const py_graph& g) {
                               return std::visit([](const auto& i) { return i.max_degree(); },
                                                 g.index());
                             })
      .def_property_readonly("entry_point",
                             [](const py_graph& g) {
                               return std::visit([](const auto& i) { return i.entry_point(); },
                                                 g.index());
                             })
      .def("search", &graph_search, py::arg("queries"), py::arg("k"), py::kw_only(),
           py::arg("L") = 100, py::arg("filter") = py::none(), py::arg("entries") = py::none(),
           py::arg("threads") = 0,
           "Approximate top-k (beam search, pool L >= k) of (d,) or (m, d) float32 queries; with "
           "a filter only passing ids are returned (2-hop walk).")
      .def("dipr", &run_dipr<py_graph>, py::arg("query"), py::arg("beta"), py::kw_only(),
           py::arg("l0") = 64, py::arg("max_candidates") = 0, py::arg("seed_score") = py::none(),
           py::arg("filter") = py::none(), py::arg("entries") = py::none(),
           "DIPRS graph search: keys with score >= best - beta; seed_score (e.g. the best "
           "window score) tightens pruning from the first hop.");

  py::class_<py_insertable>(m, "InsertableGraphIndex",
                            "RoarGraph over float32 keys (n, d), copied, that grows: insert() adds "
                            "decode-time keys by RoarGraph's update rule. Searches may run from "
                            "several threads; an insert waits for them and excludes them.")
      .def(py::init([](const py::handle& keys, const py::handle& train, std::size_t nq,
                       std::size_t M, std::size_t L, std::size_t threads, std::size_t insert_L,
                       std::size_t query_neighbors) {
             kvsift::roargraph_params p;
             p.nq = bounded_count(nq, "InsertableGraphIndex: nq");
             p.M = bounded_count(M, "InsertableGraphIndex: M");
             p.L = bounded_count(L, "InsertableGraphIndex: L");
             p.threads = threads;
             kvsift::graph_insert_params ip;
             ip.L = insert_L;
             ip.query_neighbors = query_neighbors;
             return make_insertable(keys, train, p, ip);
           }),
           py::arg("keys"), py::arg("train_queries"), py::kw_only(), py::arg("nq") = 100,
           py::arg("M") = 35, py::arg("L") = 500, py::arg("threads") = 0, py::arg("insert_L") = 32,
           py::arg("query_neighbors") = 4)
      .def_property_readonly("size", &py_insertable::size)
      .def("insert", &insertable_insert, py::arg("keys"),
           "Inserts float32 keys (count, d) in order; returns the id of the first. All keys are "
           "checked (dimension, NaN/Inf, id space) before any is inserted.")
      .def("search", &insertable_search, py::arg("queries"), py::arg("k"), py::kw_only(),
           py::arg("L") = 100, py::arg("threads") = 0,
           "Approximate top-k (beam search, pool L >= k) of (d,) or (m, d) float32 queries.");

  py::class_<block_output>(m, "BlockResult",
                           "Blocks of a block-index search, best first, with their scores.")
      .def_readonly("blocks", &block_output::blocks)
      .def_readonly("scores", &block_output::scores)
      .def_readonly("distance_computations", &block_output::distance_computations);

  py::class_<py_block>(m, "BlockIndex",
                       "Coarse block index (Quest min/max representative): BlockIndex(keys, "
                       "block_size) over float32 keys (n, d) with contiguous rows. Keeps only the "
                       "summaries (3 d floats per block; the keys are not referenced after the "
                       "build). Build O(n d), GIL released.")
      .def(py::init<const py::handle&, std::int64_t>(), py::arg("keys"), py::arg("block_size"))
      .def_property_readonly("size", [](const py_block& b) { return b.index().size(); })
      .def_property_readonly("dim", [](const py_block& b) { return b.index().dim(); })
      .def_property_readonly("block_size", [](const py_block& b) { return b.index().block_size(); })
      .def_property_readonly("blocks", [](const py_block& b) { return b.index().blocks(); })
      .def_property_readonly("summary_bytes",
                             [](const py_block& b) { return b.index().summary_bytes(); })
      .def(
          "tokens_of",
          [](const py_block& self, std::int64_t b) {
            require<kvsift::out_of_range>(b >= 0, "BlockIndex.tokens_of: expected block >= 0, got ",
                                          b);
            const auto r = self.index().tokens_of(static_cast<std::size_t>(b));
            return std::pair(r.first, r.last);
          },
          py::arg("block"), "Token range [first, last) of a block. O(1).")
      .def(
          "bounds",
          [](const py_block& self, const py::handle& q, std::int64_t b) {
            require<kvsift::out_of_range>(b >= 0, "BlockIndex.bounds: expected block >= 0, got ",
                                          b);
            const auto bb =
                self.index().bounds(vector_of(q, "query").s, static_cast<std::size_t>(b));
            return std::pair(bb.upper, bb.lower);
          },
          py::arg("query"), py::arg("block"),
          "(upper, lower) bounds of the block's best logit q.k. O(d).")
      .def(
          "topk",
          [](const py_block& self, const py::handle& q, std::size_t k, const py::object& filter) {
            return block_search(self, q, filter,
                                [k](const auto& idx, auto qs, auto& ws, auto& r, const auto& pred) {
                                  idx.topk(qs, k, ws, r, pred);
                                });
          },
          py::arg("query"), py::arg("k"), py::kw_only(), py::arg("filter") = py::none(),
          "The k blocks with the highest upper bounds among blocks with a token passing the "
          "filter. O(B d) for B blocks.")
      .def(
          "dipr",
          [](const py_block& self, const py::handle& q, float beta, const py::object& filter) {
            return block_search(self, q, filter,
                                [beta](const auto& idx, auto qs, auto& ws, auto& r,
                                       const auto& pred) { idx.dipr(qs, beta, ws, r, pred); });
          },
          py::arg("query"), py::arg("beta"), py::kw_only(), py::arg("filter") = py::none(),
          "Block-level DIPR: every block whose upper bound is >= (best lower bound) - beta; "
          "contains every passing token within beta of the best. O(B d + r log r).")
      .def("tokens", &block_tokens, py::arg("blocks"), py::kw_only(),
           py::arg("filter") = py::none(),
           "Token ids (uint32) of the blocks that pass the filter, in block order.");

  py::class_<kvsift::plan>(m, "Plan",
                           "A planner decision: index kind, query kind, optional prefix filter, "
                           "parameters and the reasons.")
      .def_readonly("index", &kvsift::plan::index)
      .def_readonly("query", &kvsift::plan::query)
      .def_readonly("filter_prefix", &kvsift::plan::filter_prefix)
      .def_readonly("params", &kvsift::plan::params)
      .def_readonly("reasons", &kvsift::plan::reasons)
      .def_readonly("decided_by", &kvsift::plan::decided_by)
      .def_readonly("gpu_bytes", &kvsift::plan::gpu_bytes)
      .def_property_readonly(
          "filter",
          [](const kvsift::plan& p) -> py::object {
            if (!p.filter_prefix) return py::none();
            return py::cast(kvsift::id_below{*p.filter_prefix});
          },
          "kvsift.IdBelow(filter_prefix) or None.")
      .def_property_readonly("name", &kvsift::plan::name)
      .def("explain", &kvsift::plan::explain)
      .def("__repr__", [](const kvsift::plan& p) { return "<kvsift.Plan " + p.name() + ">"; });

  py::class_<kvsift::planner>(m, "Planner",
                              "Rule-based query planner (AlayaDB rules: short_context, "
                              "prefix_filter, coarse_if_budget, dipr_flat_layer0, dipr_graph). "
                              "Planner(...) takes the cost-model parameters; plan() is "
                              "thread-safe.")
      .def(py::init([](std::int64_t short_context, std::int64_t head_dim, std::int64_t block_size,
                       std::int64_t k_blocks, std::int64_t dipr_l0, double dipr_beta) {
             return kvsift::planner(planner_params_of(short_context, head_dim, block_size, k_blocks,
                                                      dipr_l0, dipr_beta));
           }),
           py::kw_only(), py::arg("short_context") = 4096, py::arg("head_dim") = 128,
           py::arg("block_size") = 64, py::arg("k_blocks") = 16, py::arg("dipr_l0") = 64,
           py::arg("dipr_beta") = 8.0)
      .def(
          "plan",
          [](const kvsift::planner& self, std::int64_t context, std::int64_t reused_prefix,
             std::int64_t layer, double gpu_budget_bytes, std::optional<double> latency_us) {
            return self.choose(
                plan_inputs_of(context, reused_prefix, layer, gpu_budget_bytes, latency_us));
          },
          py::arg("context"), py::kw_only(), py::arg("reused_prefix") = 0, py::arg("layer") = 0,
          py::arg("gpu_budget_bytes") = 0.0, py::arg("latency_budget_us") = py::none(),
          "Runs the rules in order until one decides -> Plan. O(rules). Raises "
          "InvalidArgument for context 0, a prefix longer than the context, a negative or "
          "non-finite budget.")
      .def(
          "gpu_bytes",
          [](const kvsift::planner& self, const std::string& index, std::int64_t context) {
            return self.gpu_bytes(index, plan_inputs_of(context, 0, 0, 0.0, std::nullopt));
          },
          py::arg("index"), py::arg("context"),
          "GPU bytes index kind `index` needs at this context; unknown names raise.")
      .def(
          "parse_name",
          [](const kvsift::planner& self, const std::string& s) { return self.parse_name(s); },
          py::arg("name"),
          "None for 'auto', (index, query) for 'index-query'; unknown names raise.")
      .def_property_readonly("short_context",
                             [](const kvsift::planner& p) { return p.params().short_context; })
      .def_property_readonly("head_dim",
                             [](const kvsift::planner& p) { return p.params().head_dim; })
      .def_property_readonly("block_size",
                             [](const kvsift::planner& p) { return p.params().block_size; })
      .def_property_readonly("k_blocks",
                             [](const kvsift::planner& p) { return p.params().k_blocks; })
      .def_property_readonly("dipr_l0", [](const kvsift::planner& p) { return p.params().dipr_l0; })
      .def_property_readonly("dipr_beta",
                             [](const kvsift::planner& p) { return p.params().dipr_beta; })
      .def_property_readonly("rules",
                             [](const kvsift::planner& self) {
                               std::vector<std::string> names;
                               for (const auto& r : self.rules()) names.push_back(r.name);
                               return names;
                             })
      .def("remove_rule", &kvsift::planner::remove_rule, py::arg("name"),
           "Removes a rule by name; unknown names raise.");

  m.def(
      "sample_gqa_queries",
      [](const py::list& heads, double ratio, std::uint64_t seed) {
        std::vector<kvsift::matrix_view<const float>> views;
        std::vector<tensor> keep;
        keep.reserve(heads.size());  // views point into keep's elements' owners, not the vector
        for (const auto& h : heads) {
          keep.push_back(tensor_of(h, "heads"));
          views.push_back(f32_matrix_of(keep.back(), "heads"));
        }
        const auto s = kvsift::sample_gqa_queries(views, ratio, seed);
        py::array_t<float> out(
            {static_cast<py::ssize_t>(s.rows()), static_cast<py::ssize_t>(s.cols())});
        for (std::size_t i = 0; i < s.rows(); ++i) {
          std::copy_n(s.row(i), s.cols(), out.mutable_data() + i * s.cols());
        }
        return out;
      },
      py::arg("heads"), py::arg("ratio"), py::arg("seed") = 7,
      "Stacks round(ratio * rows) sampled queries of each query head of a GQA group (one "
      "index per KV head is built from them).");

  m.def(
      "sparse_attention",
      [](const py::handle& q, const py::handle& keys, const py::handle& values,
         const py::handle& tokens, std::size_t kv_head, float scale, const py::object& bias) {
        const auto qv = vector_of(q, "q");
        const std::span<const float> qs = qv.s;
        const auto ids = ids_of(tokens, "tokens");
        const auto b = bias_of(bias);
        return with_kv(keys, values, [&](const auto& kv, kvsift::partial_state& st) {
          kvsift::sparse_attention(qs, kv_head, ids, kv, {.scale = scale, .bias = b}, st);
        });
      },
      py::arg("q"), py::arg("keys"), py::arg("values"), py::arg("tokens"), py::kw_only(),
      py::arg("kv_head") = 0, py::arg("scale") = 0.0f, py::arg("bias") = py::none(),
      "Attention of q over the listed tokens -> (o, lse) (natural-log LSE of the scaled "
      "logits; the empty set gives (0, -inf)). keys/values: (n, d) or (n, kv_heads, d), "
      "float32 or float16, borrowed. scale 0 = 1/sqrt(d). O(len(tokens) d).");
  m.def(
      "dense_attention",
      [](const py::handle& q, const py::handle& keys, const py::handle& values, std::size_t first,
         std::size_t last, std::size_t kv_head, float scale, const py::object& bias) {
        const auto qv = vector_of(q, "q");
        const std::span<const float> qs = qv.s;
        const auto b = bias_of(bias);
        return with_kv(keys, values, [&](const auto& kv, kvsift::partial_state& st) {
          kvsift::dense_attention(qs, kv_head, first, last, kv, {.scale = scale, .bias = b}, st);
        });
      },
      py::arg("q"), py::arg("keys"), py::arg("values"), py::arg("first"), py::arg("last"),
      py::kw_only(), py::arg("kv_head") = 0, py::arg("scale") = 0.0f, py::arg("bias") = py::none(),
      "Attention of q over tokens [first, last) -> (o, lse); same path as sparse_attention.");
  m.def(
      "merge",
      [](const py::handle& o_a, float lse_a, const py::handle& o_b, float lse_b) {
        const auto a = vector_of(o_a, "o_a");
        const auto b = vector_of(o_b, "o_b");
        const auto st = kvsift::merge({a.s, lse_a}, {b.s, lse_b});
        return std::pair(to_numpy(st.o), st.lse);
      },
      py::arg("o_a"), py::arg("lse_a"), py::arg("o_b"), py::arg("lse_b"),
      "Log-sum-exp merge of two partial states over disjoint token sets -> (o, lse). O(d).");
  m.def(
      "dense_attention_heads",
      [](const py::handle& q, const py::handle& keys, const py::handle& values, std::size_t first,
         std::size_t last, float scale, std::size_t threads) {
        return over_heads(q, keys, values, threads,
                          [&](auto qs, std::size_t, std::size_t g, const auto& kv, auto& st) {
                            kvsift::dense_attention(qs, g, first, last, kv, {.scale = scale}, st);
                          });
      },
      py::arg("q"), py::arg("keys"), py::arg("values"), py::arg("first"), py::arg("last"),
      py::kw_only(), py::arg("scale") = 0.0f, py::arg("threads") = 1,
      "Attention of every query head of q (H, d) float32 over tokens [first, last) of K/V "
      "(n, kv_heads, d) (or (n, d), one KV head) -> (o (H, d), lse (H,)). GQA: query head h "
      "reads KV head h // (H // kv_heads). threads: heads in parallel (0 = all; 1 is fastest "
      "for one decode step of short lists). O(H (last - first) d).");
  m.def(
      "sparse_attention_heads",
      [](const py::handle& q, const py::handle& keys, const py::handle& values,
         const py::handle& tokens, float scale, std::size_t threads) {
        const tensor qt = tensor_of(q, "q");
        const std::size_t heads = qt.ndim() >= 1 ? static_cast<std::size_t>(qt.shape[0]) : 0;
        const auto [ids, starts] = token_rows_of(tokens, heads);
        return over_heads(q, keys, values, threads,
                          [&](auto qs, std::size_t h, std::size_t g, const auto& kv, auto& st) {
                            const std::span<const id_t> row(ids.data() + starts[h],
                                                            starts[h + 1] - starts[h]);
                            kvsift::sparse_attention(qs, g, row, kv, {.scale = scale}, st);
                          });
      },
      py::arg("q"), py::arg("keys"), py::arg("values"), py::arg("tokens"), py::kw_only(),
      py::arg("scale") = 0.0f, py::arg("threads") = 1,
      "Attention of every query head of q (H, d) over its own token list: row h of tokens "
      "(H, k) integer (what search_heads returns; INVALID_ID entries are padding and skipped). "
      "GQA mapping and result as dense_attention_heads. O(H k d).");
  m.def("merge_states", &merge_states, py::arg("o_a"), py::arg("lse_a"), py::arg("o_b"),
        py::arg("lse_b"),
        "Merges H pairs of partial states: o_a, o_b (H, d) float32, lse_a, lse_b (H,) -> "
        "(o (H, d), lse (H,)). Each pair is merge(). O(H d).");
  m.def("search_heads", &search_heads, py::arg("indexes"), py::arg("queries"), py::arg("k"),
        py::kw_only(), py::arg("L") = 100, py::arg("filter") = py::none(), py::arg("threads") = 1,
        "Top-k for every query head of a decode step: queries (H, d) float32, indexes one "
        "RoarGraphIndex or FlatIndex per KV head; query head h searches indexes[h // (H // "
        "len(indexes))] -> SearchResult with ids/scores (H, k). L: beam pool (graph only).");
  m.def(
      "merge_n",
      [](const py::handle& os_h, const py::handle& lses_h) {
        const tensor os = tensor_of(os_h, "os");
        const auto o = f32_matrix_of(os, "os");
        const auto lses = vector_of(lses_h, "lses");
        require<kvsift::dimension_mismatch>(lses.s.size() == o.rows(), "merge_n: expected ",
                                            o.rows(), " lse values (one per state), got ",
                                            lses.s.size());
        std::vector<kvsift::partial_state_view> views;
        for (std::size_t i = 0; i < o.rows(); ++i) views.push_back({o.row_span(i), lses.s[i]});
        const auto st = kvsift::merge_n(views, o.cols());
        return std::pair(to_numpy(st.o), st.lse);
      },
      py::arg("os"), py::arg("lses"),
      "Merges s partial states (os: (s, d) float32, lses: (s,)) in one pass -> (o, lse).");
}
