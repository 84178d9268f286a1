// Routing sets of the Python module: make_route_set and RouteSet (cluster, seeds), seeds for cold
// decode searches from the build's training queries (include/kvsift/index/route_set.hpp).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <shared_mutex>
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

/// A RouteSet of the module. cluster() reorders the set with the GIL released, and seeds() and
/// route_stack read it with the GIL released, so the GIL does not order them: a lock does.
/// Deadlock-free because no thread waits for the GIL while it holds the lock (the lock is taken
/// and dropped inside the GIL-released scopes, or taken while holding the GIL and dropped
/// before giving it up), so whoever holds the lock can always finish.
struct py_route_set {
  kvsift::route_set rs;
  mutable std::shared_mutex mutex;
};

/// f(set) under a shared lock; the caller holds the GIL throughout (dim and list_len are never
/// written after make_route_set, so reading those needs no lock; the row count is the size of
/// `vectors`, which cluster() replaces, so it does).
template <class F>
auto read_locked(const py_route_set& s, F&& f) {
  std::shared_lock lock(s.mutex);
  return f(s.rs);
}

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

std::unique_ptr<py_route_set> make_routes(const py::handle& queries_h, const py::handle& keys_h,
                                          std::size_t rows, std::size_t list_len) {
  const tensor tq = tensor_of(queries_h, "queries");
  const tensor tk = tensor_of(keys_h, "keys");
  const auto q = f32_matrix_of(tq, "queries");
  const auto k = f32_matrix_of(tk, "keys");
  auto out = std::make_unique<py_route_set>();
  py::gil_scoped_release release;
  out->rs = kvsift::make_route_set(q, k, rows, list_len, kvsift::cpu_knn_engine{});
  return out;
}

/// Seeds of (d,) or (m, d) float32 queries: (top * list_len,) or (m, top * list_len) uint32.
/// With `reads`, also the routing vectors each query scored: (seeds, reads) with reads an int
/// (1-D query) or (m,) uint32.
py::object route_seeds(const py_route_set& self, const py::handle& queries_h, std::size_t top,
                       std::size_t probe, bool reads) {
  const tensor tq = tensor_of(queries_h, "queries");
  const bool one = tq.ndim() == 1;
  require<kvsift::dimension_mismatch>(
      one || tq.ndim() == 2, "queries: expected (d,) or (m, d), got ", tq.ndim(), " dimension(s)");
  const auto qs = one ? kvsift::matrix_view<const float>() : f32_matrix_of(tq, "queries");
  const std::span<const float> q1 = one ? vector_of(tq, "queries") : std::span<const float>();
  const std::size_t m = one ? 1 : qs.rows();
  // Checked, sized and filled under one shared lock without the GIL, so that a cluster() in
  // another thread cannot change the clusters between the check and the routing; the results
  // are copied into NumPy arrays after the lock is dropped (an array needs the GIL).
  std::size_t ld = 0;
  std::vector<kvsift::id_t> seeds;
  std::vector<std::uint32_t> read(m);
  {
    py::gil_scoped_release release;
    std::shared_lock lock(self.mutex);  // after `release`, so dropped before the GIL is retaken
    const kvsift::route_set& rs = self.rs;
    // The library's own checks, before the output is sized (route_seeds repeats them per query).
    ld = kvsift::detail::check_route_seeds(rs, one ? q1.size() : qs.cols(), top,
                                           std::numeric_limits<std::size_t>::max(), probe);
    seeds.resize(kvsift::checked_mul(m, ld, "route_seeds: queries x top x list_len"));
    for (std::size_t i = 0; i < m; ++i) {
      const std::span<const float> q = one ? q1 : std::span<const float>(qs.row(i), qs.cols());
      // At most rows + clusters: fits, as both are counts of a set held in memory.
      read[i] = static_cast<std::uint32_t>(kvsift::route_seeds(
          rs, q, top, std::span<kvsift::id_t>(seeds.data() + i * ld, ld), probe));
    }
  }
  py::array_t<std::uint32_t> out =
      one ? py::array_t<std::uint32_t>(static_cast<py::ssize_t>(ld))
          : py::array_t<std::uint32_t>({static_cast<py::ssize_t>(m), static_cast<py::ssize_t>(ld)});
  std::copy(seeds.begin(), seeds.end(), out.mutable_data());
  if (!reads) return out;
  // Two statements, not ?: : newer pybind11 types each make_tuple by its arguments.
  if (one) return py::make_tuple(out, read[0]);
  py::array_t<std::uint32_t> read_arr(static_cast<py::ssize_t>(m));
  std::copy(read.begin(), read.end(), read_arr.mutable_data());
  return py::make_tuple(out, read_arr);
}

/// kvsift::stack_route_sets of RouteSet objects, as a tuple of NumPy arrays and the maxima
/// (kvsift.route_stack wraps it in a RouteStack).
py::tuple stack_sets(const py::sequence& sets_h) {
  std::vector<const py_route_set*> holders;
  std::vector<const kvsift::route_set*> sets;
  holders.reserve(py::len(sets_h));
  sets.reserve(py::len(sets_h));
  for (const py::handle h : sets_h) {
    require<kvsift::invalid_argument>(py::isinstance<py_route_set>(h),
                                      "route_stack: expected RouteSet objects, got ",
                                      std::string(py::str(py::type::of(h).attr("__name__"))));
    holders.push_back(&h.cast<const py_route_set&>());
    sets.push_back(&holders.back()->rs);
  }
  // Each distinct set locked once (a set may appear more than once), without the GIL.
  std::sort(holders.begin(), holders.end());
  holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
  kvsift::route_set_stack st;
  {
    py::gil_scoped_release release;
    std::vector<std::shared_lock<std::shared_mutex>> locks;
    locks.reserve(holders.size());
    for (const py_route_set* h : holders) locks.emplace_back(h->mutex);
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
  py::class_<py_route_set>(
      m, "RouteSet",
      "Routing rows (unit-norm training queries) with their exact best keys: seeds for cold "
      "decode searches (kvsift::route_set). Make it with make_route_set; cluster() it so that a "
      "query scores the centroids and the rows of its best `probe` clusters only. Safe to use "
      "from several threads: cluster() waits for the seeds() and route_stack calls under way "
      "and they for it.")
      .def_property_readonly("dim", [](const py_route_set& s) { return s.rs.dim; })
      .def_property_readonly("list_len", [](const py_route_set& s) { return s.rs.list_len; })
      .def_property_readonly("rows",
                             [](const py_route_set& s) {
                               return read_locked(
                                   s, [](const kvsift::route_set& r) { return r.rows(); });
                             })
      .def_property_readonly(
          "clusters",
          [](const py_route_set& s) {
            return read_locked(s, [](const kvsift::route_set& r) { return r.clusters(); });
          },
          "0 until cluster() ran.")
      .def_property_readonly(
          "vectors",
          [](const py_route_set& s) {
            return read_locked(s, [](const kvsift::route_set& r) {
              return matrix_copy(r.vectors, r.rows(), r.dim);
            });
          },
          "(rows, dim) float32 copy, unit norm, grouped by cluster once clustered.")
      .def_property_readonly(
          "lists",
          [](const py_route_set& s) {
            return read_locked(s, [](const kvsift::route_set& r) {
              return matrix_copy(r.lists, r.rows(), r.list_len);
            });
          },
          "(rows, list_len) uint32 copy: each row's best keys, best first, INVALID_ID padded.")
      .def_property_readonly(
          "centroids",
          [](const py_route_set& s) {
            return read_locked(s, [](const kvsift::route_set& r) {
              return matrix_copy(r.centroids, r.clusters(), r.dim);
            });
          },
          "(clusters, dim) float32 copy, unit norm.")
      .def_property_readonly(
          "cluster_rows",
          [](const py_route_set& s) {
            return read_locked(
                s, [](const kvsift::route_set& r) { return int64_copy(r.cluster_rows); });
          },
          "(clusters + 1,) int64 row bounds: cluster c holds rows [cluster_rows[c], "
          "cluster_rows[c + 1]).")
      .def(
          "cluster",
          [](py_route_set& s, std::size_t clusters, std::size_t iterations) {
            py::gil_scoped_release release;
            std::unique_lock lock(s.mutex);  // after `release`: dropped before the GIL is retaken
            kvsift::cluster_routes(s.rs, clusters, iterations);
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
      .def("__repr__", [](const py_route_set& s) {
        return read_locked(s, [](const kvsift::route_set& r) {
          return "RouteSet(rows=" + std::to_string(r.rows()) + ", dim=" + std::to_string(r.dim) +
                 ", list_len=" + std::to_string(r.list_len) +
                 ", clusters=" + std::to_string(r.clusters()) + ")";
        });
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
