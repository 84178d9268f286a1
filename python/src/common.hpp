#pragma once
// Shared pieces of the Python module's translation units: the checks that turn a borrowed
// tensor into a kvsift view (dtype, byte order, alignment, strides), id and count intake,
// result types and the batched top-k driver every index's search goes through.
//
// Memory: every array the C++ side reads is borrowed, never copied. An array is accepted when
// its layout is one kvsift's views can describe (innermost axis contiguous, other strides
// whole elements); anything else is rejected with a message saying how to fix it, so a large
// copy never happens silently.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/core/parallel_for.hpp"
#include "kvsift/search/dipr_search.hpp"
#include "kvsift/search/predicate.hpp"
#include "kvsift/search/search_workspace.hpp"
#include "tensor.hpp"

namespace kvsift_python {

using kvsift::id_t;
using kvsift::detail::fail;
using kvsift::detail::require;

// ----------------------------------------------------------------------------- array checks

// Which dtypes an argument takes: queries and attention inputs are f32 only (the C++ API takes
// f32 queries); stored vectors are f32, f16 (numpy float16 is IEEE binary16, as kvsift::half) or
// bf16 (torch.bfloat16, ml_dtypes.bfloat16; kvsift::bfloat16).
enum class dtypes { f32, stored };

/// Rejects a non-native byte order: kvsift reads the raw bytes, so a big-endian `>f2`/`>f4`
/// array on a little-endian machine would be read as garbage values. Only NumPy arrays can
/// have one (DLPack is native by definition). O(1).
inline void require_native_order(const tensor& t, const char* what) {
  if (t.native_order) return;
  fail<kvsift::invalid_argument>(what, ": expected native byte order, got dtype ",
                                 kvsift_python::dtype_name(t), " (convert with .astype('",
                                 t.itemsize == 2 ? "<f2" : "<f4",
                                 "') or .astype(x.dtype.newbyteorder('=')); kvsift does not copy "
                                 "silently)");
}

inline void require_dtype(const tensor& t, dtypes allowed, const char* what) {
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
inline void require_aligned(const tensor& t, const char* what) {
  require(reinterpret_cast<std::uintptr_t>(t.data) % std::max<std::size_t>(t.itemsize, 1) == 0,
          what, ": expected data aligned to the item size ", t.itemsize,
          " bytes (pass a copy made with ", kvsift_python::layout_fix(t), ")");
}

/// Stride of axis `axis` in elements; rejects zero, negative or non-whole strides. Only called
/// for axes of length > 1, where a zero stride means a broadcast (np.broadcast_to, torch
/// expand): every index along the axis aliases one element, a layout kvsift's views cannot
/// describe (a view stride of 0 would be replaced by a default and read past the array).
inline std::size_t stride_elems(const tensor& t, std::int64_t axis, const char* what) {
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
inline kvsift::matrix_view<const float> f32_matrix_of(const tensor& a, const char* what) {
  require_dtype(a, dtypes::f32, what);
  return matrix_of<float>(a, what);
}

/// A 1-D f32 vector (contiguous), borrowed from `t`.
inline std::span<const float> vector_of(const tensor& a, const char* what) {
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

inline f32_vector vector_of(const py::handle& h, const char* what) {
  f32_vector v{tensor_of(h, what), {}};
  v.s = vector_of(v.t, what);
  return v;
}

/// Entry i of a 1-D integer tensor as int64 (any stride: ids are copied anyway). Unsigned
/// values beyond int64 saturate, so range checks still reject them.
inline std::int64_t int_at(const tensor& t, std::int64_t i) {
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
inline tensor int_vector_of(const py::handle& h, const char* what, const char* of_what) {
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

/// Ids of a 1-D integer array, each in [0, INVALID_ID). With `padding`, INVALID_ID entries are
/// padding and skipped (search entry points: a short previous answer, a RouteSet's lists, as the
/// C++ searches skip them); without, they are refused with the rest. `what` names the argument
/// in errors. O(n).
inline std::vector<id_t> ids_of(const py::handle& h, const char* what, bool padding = false) {
  const tensor t = int_vector_of(h, what, "token ids");
  // Ids are small (one per retrieved token), so converting them is cheap; it also catches
  // negative values, which would wrap around in a cast to id_t.
  std::vector<id_t> out;
  out.reserve(static_cast<std::size_t>(t.shape[0]));
  for (std::int64_t i = 0; i < t.shape[0]; ++i) {
    const std::int64_t v = int_at(t, i);
    if (padding && v == static_cast<std::int64_t>(kvsift::invalid_id)) continue;
    require<kvsift::out_of_range>(v >= 0 && v < static_cast<std::int64_t>(kvsift::invalid_id), what,
                                  ": expected ids in [0, ", kvsift::invalid_id, ")",
                                  padding ? " or INVALID_ID (padding, skipped)" : "", ", got ", v,
                                  " at position ", i);
    out.push_back(static_cast<id_t>(v));
  }
  return out;
}

/// Search entry points: ids_of with INVALID_ID padding skipped.
inline std::vector<id_t> entry_ids_of(const py::handle& h, const char* what) {
  return ids_of(h, what, /*padding=*/true);
}

/// Id lists of a (H, m) integer array, one row per query head (what a batched search returns):
/// INVALID_ID entries are padding and skipped, other values must be valid ids. `what` names the
/// argument in errors. -> flat ids and row starts (H + 1). O(H m).
inline std::pair<std::vector<id_t>, std::vector<std::size_t>> token_rows_of(const py::handle& h,
                                                                            std::size_t heads,
                                                                            const char* what) {
  tensor t = tensor_of(h, what);
  if ((t.kind != 'i' && t.kind != 'u') || t.itemsize > 8 || (t.itemsize & (t.itemsize - 1)) != 0) {
    fail<kvsift::invalid_argument>(what, ": expected an integer array of token ids, got dtype ",
                                   kvsift_python::dtype_name(t));
  }
  require_native_order(t, what);
  require<kvsift::dimension_mismatch>(
      t.ndim() == 2 && t.shape[0] == static_cast<std::int64_t>(heads), what,
      ": expected a 2-D array (", heads, " query heads x k), got ", t.ndim(), " dimension(s) of ",
      t.ndim() > 0 ? t.shape[0] : 0, " rows");
  const auto k = static_cast<std::size_t>(t.shape[1]);
  std::vector<id_t> ids;
  ids.reserve(kvsift::checked_mul(heads, k, "token rows: heads x k"));
  std::vector<std::size_t> starts{0};
  for (std::size_t r = 0; r < heads; ++r) {
    for (std::size_t c = 0; c < k; ++c) {
      tensor one = {};
      one.data = t.data + static_cast<std::int64_t>(r) * t.strides[0] +
                 static_cast<std::int64_t>(c) * t.strides[1];
      one.kind = t.kind;
      one.itemsize = t.itemsize;
      one.strides = {0};
      const std::int64_t v = int_at(one, 0);
      if (v == static_cast<std::int64_t>(kvsift::invalid_id)) continue;
      require<kvsift::out_of_range>(v >= 0 && v < static_cast<std::int64_t>(kvsift::invalid_id),
                                    what, ": expected ids in [0, ", kvsift::invalid_id,
                                    ") or INVALID_ID, got ", v, " at (", r, ", ", c, ")");
      ids.push_back(static_cast<id_t>(v));
    }
    starts.push_back(ids.size());
  }
  return {std::move(ids), std::move(starts)};
}

/// A count parameter (M, L, nq, l0, ...) bounded by the largest index: any value beyond it is
/// meaningless (ids are 32-bit) and, left to the library, sizes buffers from it (n x M
/// adjacency, an L-entry pool) that overflow or exhaust memory. Python ints beyond size_t are
/// refused by pybind11 itself (TypeError); this catches the ones that fit. O(1).
inline std::size_t bounded_count(std::size_t v, const char* what) {
  require<kvsift::out_of_range>(v <= kvsift::max_index_size, what, ": expected at most ",
                                kvsift::max_index_size, " (ids are 32-bit), got ", v);
  return v;
}

/// A Python integer that must not be negative, as a size: "<who>: expected <what> >= 0, got v"
/// (pybind11's unsigned casters would reject a negative value with a TypeError that names
/// neither the argument nor the value). O(1).
inline std::size_t non_negative(std::int64_t v, const char* who, const char* what) {
  require(v >= 0, who, ": expected ", what, " >= 0, got ", v);
  return static_cast<std::size_t>(v);
}

inline py::array_t<float> to_numpy(const std::vector<float>& v) {
  py::array_t<float> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

/// Ids as int64, the index type of torch (index_select, gather) and numpy; missing results keep
/// the value INVALID_ID (2**32 - 1), which any indexing into a shorter array rejects.
inline py::array_t<std::int64_t> ids_to_numpy(std::span<const id_t> ids) {
  py::array_t<std::int64_t> out(static_cast<py::ssize_t>(ids.size()));
  std::copy(ids.begin(), ids.end(), out.mutable_data());
  return out;
}

// ----------------------------------------------------------------------------- predicates

/// kvsift.IdMask: a borrowed 1-D bool (or uint8) array with one entry per key; nonzero entries
/// pass. The tensor keeps the memory alive; searches read it through kvsift::id_mask.
struct id_mask_filter {
  tensor t;
  std::span<const std::uint8_t> bytes;
};

/// kvsift.IdList: ids checked at construction (non-negative, below INVALID_ID); each search
/// turns them into a kvsift::id_allow_list over the index's size (O(n / 8 + len(ids))), which
/// rejects ids beyond the index.
struct id_list_filter {
  std::vector<id_t> ids;
};

inline id_mask_filter id_mask_of(const py::handle& h) {
  id_mask_filter f{tensor_of(h, "mask"), {}};
  const tensor& t = f.t;
  if (!(t.kind == 'b' || (t.kind == 'u' && t.itemsize == 1)) || t.itemsize != 1) {
    fail<kvsift::invalid_argument>("IdMask: expected a bool or uint8 array, got dtype ",
                                   kvsift_python::dtype_name(t), " (convert with ",
                                   kvsift_python::dtype_fix(t, "bool"), ")");
  }
  require<kvsift::dimension_mismatch>(t.ndim() == 1, "IdMask: expected a 1-D array, got ", t.ndim(),
                                      " dimension(s)");
  const auto n = static_cast<std::size_t>(t.shape[0]);
  require(n <= 1 || t.strides[0] == 1, "IdMask: expected a contiguous mask, got stride ",
          n > 1 ? t.strides[0] : 0, " bytes (pass ", kvsift_python::layout_fix(t),
          "; kvsift does not copy silently)");
  f.bytes = {reinterpret_cast<const std::uint8_t*>(t.data), n};
  return f;
}

using filter_t = std::variant<kvsift::no_filter, kvsift::id_below, kvsift::id_range,
                              kvsift::id_mask, kvsift::id_allow_list>;

/// The predicate of a Python filter for an index of n keys. Every predicate is validated
/// against n by the search itself (a mask of another length, an id >= n raise there or here).
inline filter_t filter_of(const py::object& f, std::size_t n) {
  if (f.is_none()) return kvsift::no_filter{};
  if (py::isinstance<kvsift::id_below>(f)) return f.cast<kvsift::id_below>();
  if (py::isinstance<kvsift::id_range>(f)) return f.cast<kvsift::id_range>();
  if (py::isinstance<id_mask_filter>(f))
    return kvsift::id_mask(f.cast<const id_mask_filter&>().bytes);
  if (py::isinstance<id_list_filter>(f)) {
    return kvsift::id_allow_list(f.cast<const id_list_filter&>().ids, n);
  }
  throw py::type_error(
      "filter: expected None, kvsift.IdBelow, kvsift.IdRange, kvsift.IdMask or kvsift.IdList, "
      "got " +
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

inline dipr_output to_python(const kvsift::dipr_result& r) {
  dipr_output out;
  out.ids = ids_to_numpy(r.ids);
  out.scores = to_numpy(r.scores);
  out.best_score = r.best_score;
  out.capped = r.capped;
  out.distance_computations = static_cast<std::int64_t>(r.stats.distance_computations);
  out.hops = static_cast<std::int64_t>(r.stats.hops);
  return out;
}

inline kvsift::dipr_params dipr_params_of(float beta, std::size_t l0, std::size_t max_candidates,
                                          std::optional<float> seed_score) {
  kvsift::dipr_params p;
  p.beta = beta;
  p.l0 = bounded_count(l0, "dipr: l0");
  p.max_candidates = bounded_count(max_candidates, "dipr: max_candidates");
  if (seed_score) p.seed_score = *seed_score;
  return p;
}

/// Runs `one(u, rows, ws, ids, scores, counts) -> search_stats` for each unit u of `group`
/// consecutive rows of a (d,) or (m, d) f32 query array (m a multiple of group; the caller
/// checks), the units in parallel (one workspace per thread) with the GIL released: one search
/// serves a unit's rows (a group x d view), writes their group x k ids and scores (and their
/// counts, scratch the caller does not return), and every row of the unit reports its stats.
/// group = 1 is a search per query (batched_topk); larger groups are one walk per GQA group.
template <class One>
search_result batched_groups(const py::handle& queries_h, std::size_t k, std::size_t threads,
                             std::size_t group, One&& one) {
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
  const std::size_t m = q.rows(), units = m / group;
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
    const std::size_t t = std::min(units, threads == 0 ? kvsift::default_thread_count() : threads);
    std::vector<kvsift::search_workspace> ws(std::max<std::size_t>(t, 1));
    // The library writes 32-bit ids; each worker widens its unit's rows to int64.
    std::vector<std::vector<id_t>> ids32(ws.size());
    std::vector<std::vector<std::size_t>> counts(ws.size());
    kvsift::parallel_for(units, ws.size(), [&](std::size_t u, std::size_t w) {
      ids32[w].resize(group * k);
      counts[w].resize(group);
      const std::size_t r0 = u * group;
      const kvsift::matrix_view<const float> rows(q.row(r0), group, q.cols());
      const kvsift::search_stats s =
          one(u, rows, ws[w], std::span<id_t>(ids32[w]),
              std::span<float>(scores + r0 * k, group * k), std::span<std::size_t>(counts[w]));
      std::copy(ids32[w].begin(), ids32[w].end(), ids + r0 * k);
      for (std::size_t r = r0; r < r0 + group; ++r) {
        dist[r] = static_cast<std::int64_t>(s.distance_computations);
        hops[r] = static_cast<std::int64_t>(s.hops);
      }
    });
  }
  return out;
}

/// Runs `one(i, query_span, ws, ids, scores) -> search_stats` for a (d,) or (m, d) query array,
/// over queries in parallel (one workspace per thread), with the GIL released.
template <class One>
search_result batched_topk(const py::handle& queries_h, std::size_t k, std::size_t threads,
                           One&& one) {
  return batched_groups(
      queries_h, k, threads, 1,
      [&](std::size_t i, kvsift::matrix_view<const float> rows, kvsift::search_workspace& ws,
          std::span<id_t> ids, std::span<float> scores,
          std::span<std::size_t>) { return one(i, rows.row_span(0), ws, ids, scores); });
}

// One workspace per Python thread: single-query calls allocate nothing once warmed up.
inline kvsift::search_workspace& thread_workspace() {
  thread_local kvsift::search_workspace ws;
  return ws;
}

}  // namespace kvsift_python
