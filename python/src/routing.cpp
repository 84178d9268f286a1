// Routing sets of the Python module: make_route_set and RouteSet (cluster, seeds), seeds for cold
// decode searches from the build's training queries (include/kvsift/index/route_set.hpp).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "common.hpp"
#include "kvsift/core/checked_size.hpp"
#include "kvsift/index/knn.hpp"
#include "kvsift/index/route_set.hpp"

namespace kvsift_python {
namespace {

template <class T>
py::array_t<T> matrix_copy(const std::vector<T>& v, std::size_t rows, std::size_t cols) {
  py::array_t<T> out({static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(cols)});
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

/// v as a 1-D int64 array (row bounds and offsets).
template <class T>
py::array_t<std::int64_t> int64_copy(const std::vector<T>& v) {
  py::array_t<std::int64_t> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

kvsift::route_set make_routes(const py::handle& queries_h, const py::handle& keys_h,
                              std::size_t rows, std::size_t list_len) {
  const tensor tq = tensor_of(queries_h, "queries");
  const tensor tk = tensor_of(keys_h, "keys");
  const auto q = f32_matrix_of(tq, "queries");
  const auto k = f32_matrix_of(tk, "keys");
  py::gil_scoped_release release;
  return kvsift::make_route_set(q, k, rows, list_len, kvsift::cpu_knn_engine{});
}

/// Seeds of (d,) or (m, d) float32 queries: (top * list_len,) or (m, top * list_len) uint32.
/// With `reads`, also the routing vectors each query scored: (seeds, reads) with reads an int
/// (1-D query) or (m,) uint32.
py::object route_seeds(const kvsift::route_set& rs, const py::handle& queries_h, std::size_t top,
                       std::size_t probe, bool reads) {
  const tensor tq = tensor_of(queries_h, "queries");
  const bool one = tq.ndim() == 1;
  require<kvsift::dimension_mismatch>(
      one || tq.ndim() == 2, "queries: expected (d,) or (m, d), got ", tq.ndim(), " dimension(s)");
  const auto qs = one ? kvsift::matrix_view<const float>() : f32_matrix_of(tq, "queries");
  const std::span<const float> q1 = one ? vector_of(tq, "queries") : std::span<const float>();
  const std::size_t m = one ? 1 : qs.rows();
  // The library's own checks, before the output is sized (route_seeds repeats them per query).
  const std::size_t ld = kvsift::detail::check_route_seeds(
      rs, one ? q1.size() : qs.cols(), top, std::numeric_limits<std::size_t>::max(), probe);
  (void)kvsift::checked_mul(m, ld, "route_seeds: queries x top x list_len");
  py::array_t<std::uint32_t> out =
      one ? py::array_t<std::uint32_t>(static_cast<py::ssize_t>(ld))
          : py::array_t<std::uint32_t>({static_cast<py::ssize_t>(m), static_cast<py::ssize_t>(ld)});
  py::array_t<std::uint32_t> read(static_cast<py::ssize_t>(m));
  std::uint32_t* dst = out.mutable_data();
  std::uint32_t* r = read.mutable_data();
  {
    py::gil_scoped_release release;
    for (std::size_t i = 0; i < m; ++i) {
      const std::span<const float> q = one ? q1 : std::span<const float>(qs.row(i), qs.cols());
      // At most rows + clusters: fits, as both are counts of a set held in memory.
      r[i] = static_cast<std::uint32_t>(
          kvsift::route_seeds(rs, q, top, std::span<kvsift::id_t>(dst + i * ld, ld), probe));
    }
  }
  if (!reads) return std::move(out);
  // Two statements, not ?: : newer pybind11 types each make_tuple by its arguments.
  if (one) return py::make_tuple(out, r[0]);
  return py::make_tuple(out, read);
}

/// kvsift::stack_route_sets of RouteSet objects, as a tuple of NumPy arrays and the maxima
/// (kvsift.route_stack wraps it in a RouteStack).
py::tuple stack_sets(const py::sequence& sets_h) {
  std::vector<const kvsift::route_set*> sets;
  sets.reserve(py::len(sets_h));
  for (const py::handle h : sets_h) {
    require<kvsift::invalid_argument>(py::isinstance<kvsift::route_set>(h),
                                      "route_stack: expected RouteSet objects, got ",
                                      std::string(py::str(py::type::of(h).attr("__name__"))));
    sets.push_back(&h.cast<const kvsift::route_set&>());
  }
  kvsift::route_set_stack st;
  {
    py::gil_scoped_release release;
    st = kvsift::stack_route_sets(sets);
  }
  const std::size_t rows = static_cast<std::size_t>(st.offset.back());
  py::object none = py::none();
  return py::make_tuple(
      matrix_copy(st.vectors, rows, st.dim), matrix_copy(st.lists, rows, st.list_len),
      int64_copy(st.offset),
      st.clustered()
          ? py::object(matrix_copy(st.centroids,
                                   st.centroids.size() / std::max<std::size_t>(st.dim, 1), st.dim))
          : none,
      st.clustered() ? py::object(int64_copy(st.cluster_offset)) : none,
      st.clustered() ? py::object(int64_copy(st.cluster_rows)) : none, st.max_rows, st.max_clusters,
      st.max_cluster_rows);
}

}  // namespace

void bind_routing(py::module_& m) {
  py::class_<kvsift::route_set>(
      m, "RouteSet",
      "Routing rows (unit-norm training queries) with their exact best keys: seeds for cold "
      "decode searches (kvsift::route_set). Make it with make_route_set; cluster() it so that a "
      "query scores the centroids and the rows of its best `probe` clusters only.")
      .def_property_readonly("dim", [](const kvsift::route_set& r) { return r.dim; })
      .def_property_readonly("list_len", [](const kvsift::route_set& r) { return r.list_len; })
      .def_property_readonly("rows", &kvsift::route_set::rows)
      .def_property_readonly("clusters", &kvsift::route_set::clusters, "0 until cluster() ran.")
      .def_property_readonly(
          "vectors",
          [](const kvsift::route_set& r) { return matrix_copy(r.vectors, r.rows(), r.dim); },
          "(rows, dim) float32 copy, unit norm, grouped by cluster once clustered.")
      .def_property_readonly(
          "lists",
          [](const kvsift::route_set& r) { return matrix_copy(r.lists, r.rows(), r.list_len); },
          "(rows, list_len) uint32 copy: each row's best keys, best first, INVALID_ID padded.")
      .def_property_readonly(
          "centroids",
          [](const kvsift::route_set& r) { return matrix_copy(r.centroids, r.clusters(), r.dim); },
          "(clusters, dim) float32 copy, unit norm.")
      .def_property_readonly(
          "cluster_rows", [](const kvsift::route_set& r) { return int64_copy(r.cluster_rows); },
          "(clusters + 1,) int64 row bounds: cluster c holds rows [cluster_rows[c], "
          "cluster_rows[c + 1]).")
      .def(
          "cluster",
          [](kvsift::route_set& r, std::size_t clusters, std::size_t iterations) {
            py::gil_scoped_release release;
            kvsift::cluster_routes(r, clusters, iterations);
          },
          py::arg("clusters"), py::kw_only(), py::arg("iterations") = 10,
          "Groups the rows into at most `clusters` clusters (spherical k-means, deterministic; "
          "empty clusters dropped) and reorders them by cluster, in place. "
          "O((iterations + 1) rows clusters dim).")
      .def("seeds", &route_seeds, py::arg("queries"), py::kw_only(), py::arg("top") = 4,
           py::arg("probe") = 0, py::arg("reads") = false,
           "Seeds of (d,) or (m, d) float32 queries: the lists of each query's `top` best rows "
           "(inner product, ties to the lower row), concatenated: (top * list_len,) or (m, top * "
           "list_len) uint32, INVALID_ID padded (searches skip the padding). probe > 0 (a "
           "clustered set): only the rows of the best `probe` clusters compete. Pass them as "
           "`entries` of a search with an expand_limit, or as kvsift.cuda.decode_search's "
           "seeds. A query holding NaN or Inf gets no seeds. reads=True also returns the routing "
           "vectors each query scored (rows, or centroids + probed rows; 0 for NaN): (seeds, "
           "reads), reads an int or (m,) uint32.")
      .def("__repr__", [](const kvsift::route_set& r) {
        return "RouteSet(rows=" + std::to_string(r.rows()) + ", dim=" + std::to_string(r.dim) +
               ", list_len=" + std::to_string(r.list_len) +
               ", clusters=" + std::to_string(r.clusters()) + ")";
      });

  m.def("_stack_route_sets", &stack_sets, py::arg("sets"),
        "Low level: kvsift::stack_route_sets as (vectors, lists, offset, centroids, "
        "cluster_offset, cluster_rows, max_rows, max_clusters, max_cluster_rows). Use "
        "kvsift.route_stack.");

  m.def("make_route_set", &make_routes, py::arg("queries"), py::arg("keys"), py::arg("rows"),
        py::kw_only(), py::arg("list_len") = 100,
        "RouteSet of `rows` evenly spaced rows of the (m, d) float32 training queries (unit norm), "
        "each with its exact best `list_len` keys among the (n, d) float32 keys by inner "
        "product (a flat CPU kNN: O(rows n d)). Raises for rows outside [1, m], list_len 0, no "
        "keys, dimensions that differ, NaN or Inf.");
}

}  // namespace kvsift_python
