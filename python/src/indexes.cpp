// Index objects of the Python module: construction (the builds release the GIL) and the
// bindings of FlatIndex, RoarGraphIndex, InsertableGraphIndex and BlockIndex.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <filesystem>
#include <istream>
#include <sstream>
#include <streambuf>

#include "bindings.hpp"
#include "indexes.hpp"
#include "kvsift/core/checked_size.hpp"
#include "kvsift/index/graph_io.hpp"
#include "kvsift/index/roargraph_builder.hpp"

namespace kvsift_python {
namespace {

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

// ----------------------------------------------------------------------------- persistence

/// A read-only streambuf over bytes owned elsewhere (a Python bytes object), so a pickled graph
/// is parsed in place instead of being copied into a std::string first.
class bytes_streambuf : public std::streambuf {
 public:
  bytes_streambuf(const char* data, std::size_t size) {
    char* p = const_cast<char*>(data);  // the get area only: never written through
    setg(p, p, p + size);
  }
};

void save_roargraph(const py_graph& self, const std::filesystem::path& path) {
  py::gil_scoped_release release;
  std::visit([&](const auto& g) { kvsift::save_graph(g, path); }, self.index());
}

py_graph load_roargraph(const std::filesystem::path& path, const py::handle& keys_h) {
  tensor keys = tensor_of(keys_h, "keys");
  auto index = over_keys<py_graph::variant>(keys, [&](auto store) {
    py::gil_scoped_release release;
    return kvsift::load_graph(path, store);
  });
  return {py::reinterpret_borrow<py::object>(keys_h), std::move(keys), std::move(index)};
}

/// A graph's rows cut or padded (0xFFFFFFFF) to `width` (0 = max_degree), uint32 [size, width]
/// (RoarGraphIndex.adjacency and InsertableGraphIndex.adjacency; `what` names the caller).
template <class Graph>
py::array_t<std::uint32_t> adjacency_table(const Graph& g, std::int64_t width, const char* what) {
  // Bounded so that a typo cannot ask for terabytes: 2^16 is far above any graph's degree.
  require(width >= 0 && width <= (std::int64_t{1} << 16), what,
          ": expected 0 <= width <= 65536 (0 = max_degree ", g.max_degree(), "), got ", width);
  const std::size_t w =
      width == 0 ? std::max<std::size_t>(g.max_degree(), 1) : static_cast<std::size_t>(width);
  const std::size_t n = g.size();
  (void)kvsift::checked_mul(n, w, sizeof(std::uint32_t), "adjacency bytes");
  py::array_t<std::uint32_t> out({static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(w)});
  std::uint32_t* dst = out.mutable_data();
  {
    py::gil_scoped_release release;
    std::fill(dst, dst + n * w, kvsift::invalid_id);
    for (std::size_t u = 0; u < n; ++u) {
      const auto row = g.neighbors(static_cast<kvsift::id_t>(u));
      std::copy_n(row.begin(), std::min(row.size(), w), dst + u * w);
    }
  }
  return out;
}

/// The entry points as uint32 [count].
py::array_t<std::uint32_t> entry_array(std::span<const kvsift::id_t> e) {
  py::array_t<std::uint32_t> out(static_cast<py::ssize_t>(e.size()));
  std::copy(e.begin(), e.end(), out.mutable_data());
  return out;
}

py::array_t<std::uint32_t> graph_adjacency(const py_graph& self, std::int64_t width) {
  return std::visit(
      [&](const auto& g) { return adjacency_table(g, width, "RoarGraphIndex.adjacency"); },
      self.index());
}

std::uint64_t roargraph_fingerprint(const py_graph& self) {
  return std::visit([](const auto& g) { return kvsift::key_fingerprint(g.store()); }, self.index());
}

/// Pickle state, version 1: (1, keys, graph bytes (write_graph), build stats). The keys are the
/// caller's object itself, so pickle copies their data (and they must be picklable: a NumPy
/// array or a torch tensor is); the graph bytes carry the metric and the keys' fingerprint,
/// checked again on unpickling.
constexpr int pickle_version = 1;

/// A graph from write_graph bytes over `keys_h` (borrowed), checked against the keys'
/// fingerprint, shape, dtype and metric; `source` names the bytes in errors.
py_graph graph_from_bytes(const py::handle& keys_h, const py::handle& bytes_h,
                          const build_info& stats, const char* source) {
  tensor keys = tensor_of(keys_h, "keys");
  char* data = nullptr;
  py::ssize_t size = 0;
  if (PYBIND11_BYTES_AS_STRING_AND_SIZE(bytes_h.ptr(), &data, &size) != 0) {
    throw py::error_already_set();
  }
  const py::object keep = py::reinterpret_borrow<py::object>(bytes_h);  // alive without the GIL
  auto index = over_keys<py_graph::variant>(keys, [&](auto store) {
    py::gil_scoped_release release;
    bytes_streambuf buf(data, static_cast<std::size_t>(size));
    std::istream in(&buf);
    return kvsift::read_graph(in, static_cast<std::uint64_t>(size), store, source);
  });
  return {py::reinterpret_borrow<py::object>(keys_h), std::move(keys), std::move(index), stats};
}

py::bytes roargraph_to_bytes(const py_graph& self) {
  std::ostringstream out(std::ios::binary);
  {
    py::gil_scoped_release release;
    std::visit([&](const auto& g) { kvsift::write_graph(g, out); }, self.index());
  }
  return py::bytes(out.str());
}

py::tuple roargraph_getstate(const py_graph& self) {
  const build_info& st = self.build_stats();
  return py::make_tuple(pickle_version, self.keys(), roargraph_to_bytes(self),
                        py::make_tuple(st.knn_seconds, st.projection_seconds,
                                       st.connectivity_seconds, st.total_seconds));
}

py_graph roargraph_setstate(const py::tuple& state) {
  require(state.size() == 4 && py::isinstance<py::int_>(state[0]) &&
              state[0].cast<int>() == pickle_version && py::isinstance<py::bytes>(state[2]),
          "RoarGraphIndex pickle: expected state (", pickle_version,
          ", keys, graph bytes, build stats), got a tuple of ", state.size(),
          " items; it was made by another kvsift version");
  const auto st = state[3].cast<std::tuple<double, double, double, double>>();
  return graph_from_bytes(state[1], state[2],
                          {std::get<0>(st), std::get<1>(st), std::get<2>(st), std::get<3>(st)},
                          "pickled RoarGraphIndex");
}

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

std::size_t insertable_add_queries(py_insertable& self, const py::handle& queries_h,
                                   const py::handle& ids_h, std::size_t pool) {
  const tensor queries = tensor_of(queries_h, "queries");
  const auto q = f32_matrix_of(queries, "queries");
  if (ids_h.is_none()) {
    py::gil_scoped_release release;
    return self.add_queries(q, bounded_count(pool, "InsertableGraphIndex.add_queries: pool"));
  }
  // Rows of ids with INVALID_ID padding, as a search returns them: one row per query.
  const auto [flat, starts] = token_rows_of(ids_h, q.rows(), "ids");
  kvsift::knn_result lists;
  lists.rows = q.rows();
  for (std::size_t r = 0; r + 1 < starts.size(); ++r) {
    lists.k = std::max(lists.k, starts[r + 1] - starts[r]);
  }
  lists.k = std::max<std::size_t>(lists.k, 1);
  lists.ids.assign(kvsift::checked_mul(lists.rows, lists.k, "add_queries: ids rows x k"),
                   kvsift::invalid_id);
  for (std::size_t r = 0; r + 1 < starts.size(); ++r) {
    std::copy(flat.begin() + static_cast<std::ptrdiff_t>(starts[r]),
              flat.begin() + static_cast<std::ptrdiff_t>(starts[r + 1]),
              lists.ids.begin() + static_cast<std::ptrdiff_t>(r * lists.k));
  }
  py::gil_scoped_release release;
  return self.add_queries(q, lists);
}

constexpr auto dim_of = [](const auto& i) { return i.dim(); };
constexpr auto max_degree_of = [](const auto& i) { return i.max_degree(); };

py::tuple insertable_query_knn(const py_insertable& self) {
  kvsift::knn_result r;
  {
    py::gil_scoped_release release;
    r = self.read([](const auto& i) { return i.query_knn(); });
  }
  const auto rows = static_cast<py::ssize_t>(r.rows), k = static_cast<py::ssize_t>(r.k);
  py::array_t<std::uint32_t> ids({rows, k});
  py::array_t<float> scores({rows, k});
  std::copy(r.ids.begin(), r.ids.end(), ids.mutable_data());
  std::copy(r.scores.begin(), r.scores.end(), scores.mutable_data());
  return py::make_tuple(ids, scores);
}

py::array_t<float> insertable_train_queries(const py_insertable& self) {
  return self.read([](const auto& i) {
    const auto q = i.training_queries();
    py::array_t<float> out(
        {static_cast<py::ssize_t>(q.rows()), static_cast<py::ssize_t>(q.cols())});
    std::copy_n(q.row(0), q.rows() * q.cols(), out.mutable_data());
    return out;
  });
}

}  // namespace

void bind_indexes(py::module_& m) {
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
      .def("dipr", &flat_dipr, py::arg("query"), py::arg("beta"), py::kw_only(), py::arg("l0") = 64,
           py::arg("max_candidates") = 0, py::arg("seed_score") = py::none(),
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
      .def_property_readonly(
          "entry_points",
          [](const py_graph& g) {
            return std::visit([](const auto& i) { return entry_array(i.entry_points()); },
                              g.index());
          },
          "The search's entry points (uint32), the first one the entry point.")
      .def_property_readonly(
          "memory",
          [](const py_graph& g) {
            const auto m = std::visit([](const auto& i) { return i.memory(); }, g.index());
            py::dict d;
            d["adjacency"] = m.adjacency;
            d["degrees"] = m.degrees;
            d["entries"] = m.entries;
            d["total"] = m.total();
            d["edges"] = m.edges;
            d["compact"] = m.compact();
            return d;
          },
          "The graph's bytes, the keys excluded (they are the caller's array): adjacency "
          "(size x max_degree uint32, padded rows), degrees, entries, their total; edges (the "
          "edge count) and compact (bytes of the same edges as CSR with int64 offsets). O(size).")
      .def("adjacency", &graph_adjacency, py::kw_only(), py::arg("width") = 0,
           "The graph as a fixed-width table: uint32 [size, width], row u = u's out-neighbours "
           "in the builder's order, padded with 0xFFFFFFFF (kvsift.cuda.graph_set stacks these "
           "for the GPU decode search). width 0 = max_degree; a smaller width keeps each "
           "row's first neighbours (as degree_cap does). O(size * width); a copy.")
      .def("search", &graph_search, py::arg("queries"), py::arg("k"), py::kw_only(),
           py::arg("L") = 100, py::arg("filter") = py::none(), py::arg("entries") = py::none(),
           py::arg("threads") = 0, py::arg("degree_cap") = 0, py::arg("expand_limit") = 0,
           py::arg("walk_through") = true, py::arg("entry_prefix") = 0,
           "Approximate top-k (beam search, pool L >= k) of (d,) or (m, d) float32 queries; with "
           "a filter only passing ids are returned (2-hop walk; walk_through=False drops a "
           "failing neighbour instead of walking through it, for filters that exclude few ids "
           "such as a window, as the GPU's decode search does; entry_prefix=P also enters the walk "
           "at ids [0, P), a decode step's sinks). degree_cap > 0 expands only "
           "each node's first degree_cap neighbours (the builder puts the most useful first): "
           "fewer vectors scored per hop, at some recall; 0 = all. expand_limit > 0 (<= L) "
           "expands only the pool's best expand_limit entries: with entries near the answer "
           "(the previous decode step's results, RouteSet.seeds) far fewer hops; 0 = L. "
           "INVALID_ID among entries is padding, skipped.")
      .def("dipr", &graph_dipr, py::arg("query"), py::arg("beta"), py::kw_only(),
           py::arg("l0") = 64, py::arg("max_candidates") = 0, py::arg("seed_score") = py::none(),
           py::arg("filter") = py::none(), py::arg("entries") = py::none(),
           py::arg("degree_cap") = 0, py::arg("max_hops") = 0, py::arg("walk_through") = true,
           py::arg("entry_prefix") = 0,
           "DIPRS graph search: keys with score >= best - beta; seed_score (e.g. the best "
           "window score) tightens pruning from the first hop; degree_cap, walk_through and "
           "entry_prefix as in search. "
           "max_hops > 0 stops a walk about to expand one node more and marks it capped, as "
           "max_candidates does (0 = no cap).")
      .def_property_readonly("key_fingerprint", &roargraph_fingerprint,
                             "64-bit FNV-1a fingerprint of the keys (shape, dtype and bytes; "
                             "every row up to 16 MiB of keys, 4096 evenly spaced rows beyond) "
                             "that save() records and load() checks. O(n d) up to that size.")
      .def("save", &save_roargraph, py::arg("path"),
           "Writes the graph (not the keys) to path atomically, with the metric and the keys' "
           "fingerprint. O(n M). Raises IoError if the file cannot be written.")
      .def_static("load", &load_roargraph, py::arg("path"), py::arg("keys"),
                  "RoarGraphIndex.load(path, keys): the graph saved at path over these keys "
                  "(borrowed as by the constructor). Raises IoError for a missing, truncated or "
                  "corrupted file, InvalidArgument if the file was built over other keys (the "
                  "expected and actual fingerprints are named), another shape, dtype or metric. "
                  "O(n M) plus the fingerprint.")
      .def("to_bytes", &roargraph_to_bytes,
           "The graph (not the keys) as bytes, the layout save() writes: metric, the keys' "
           "fingerprint, adjacency and entry points. O(n M).")
      .def_static(
          "from_bytes",
          [](const py::bytes& data, const py::handle& keys, const py::object& stats) {
            build_info st;
            if (!stats.is_none()) {
              require(py::isinstance<py::sequence>(stats) && py::len(stats) == 4,
                      "RoarGraphIndex.from_bytes: expected build_stats = (knn, projection, "
                      "connectivity, total) seconds, got ",
                      std::string(py::repr(stats)));
              const auto seq = stats.cast<py::sequence>();
              auto at = [&](std::size_t i) { return py::float_(seq[i]).cast<double>(); };
              st = {at(0), at(1), at(2), at(3)};
            }
            return graph_from_bytes(keys, data, st, "RoarGraphIndex bytes");
          },
          py::arg("data"), py::arg("keys"), py::kw_only(), py::arg("build_stats") = py::none(),
          "RoarGraphIndex.from_bytes(data, keys): the graph to_bytes() (or kvsift.cuda's GPU "
          "build) wrote, over these keys (borrowed as by the constructor); build_stats = (kNN, "
          "projection, connectivity, total) seconds to report. Raises IoError for truncated or "
          "corrupted bytes, InvalidArgument for other keys (fingerprints named), another "
          "shape, dtype or metric. O(n M) plus the fingerprint.")
      .def(py::pickle(&roargraph_getstate, &roargraph_setstate),
           "Pickling is self-contained: the state holds the key array (pickled as the object it "
           "is, so its data is copied and it must be picklable) and the graph bytes; "
           "unpickling checks the keys' fingerprint like load().");

  py::class_<py_insertable>(m, "InsertableGraphIndex",
                            "RoarGraph over float32 keys (n, d), copied, that grows: insert() adds "
                            "decode-time keys by RoarGraph's update rule. Searches may run from "
                            "several threads; an insert waits for them and excludes them.")
      .def(py::init([](const py::handle& keys, const py::handle& train, std::size_t nq,
                       std::size_t M, std::size_t L, std::size_t threads, std::size_t insert_L,
                       std::size_t query_neighbors, std::size_t query_knn_lists,
                       std::size_t query_candidates, std::size_t holder_capacity) {
             kvsift::roargraph_params p;
             p.nq = bounded_count(nq, "InsertableGraphIndex: nq");
             p.M = bounded_count(M, "InsertableGraphIndex: M");
             p.L = bounded_count(L, "InsertableGraphIndex: L");
             p.threads = threads;
             kvsift::graph_insert_params ip;
             ip.L = insert_L;
             ip.query_neighbors = query_neighbors;
             ip.query_knn_lists = query_knn_lists;
             ip.query_candidates = query_candidates;
             ip.holder_capacity = holder_capacity;
             return make_insertable(keys, train, p, ip);
           }),
           py::arg("keys"), py::arg("train_queries"), py::kw_only(), py::arg("nq") = 100,
           py::arg("M") = 35, py::arg("L") = 500, py::arg("threads") = 0, py::arg("insert_L") = 48,
           py::arg("query_neighbors") = 4, py::arg("query_knn_lists") = 0,
           py::arg("query_candidates") = kvsift::graph_insert_params{}.query_candidates,
           py::arg("holder_capacity") = kvsift::graph_insert_params{}.holder_capacity,
           "query_candidates: an inserted key is scored against at most this many training "
           "queries, those whose kNN lists hold the keys its graph search finds (0: every "
           "query, and the lists stay exact). holder_capacity: per key, at most this many of "
           "the queries whose lists hold it are recorded for that gathering (0: all). "
           "query_knn_lists: only the nearest T of the scored queries' lists take the key (0: "
           "all it beats).")
      .def_property_readonly("size", &py_insertable::size)
      .def_property_readonly("dim", [](const py_insertable& g) { return g.read(dim_of); })
      .def_property_readonly("max_degree",
                             [](const py_insertable& g) { return g.read(max_degree_of); })
      .def_property_readonly(
          "entry_points",
          [](const py_insertable& g) {
            return g.read([](const auto& i) { return entry_array(i.entry_points()); });
          },
          "The search's entry points (uint32), the build's (inserted keys never become entries).")
      .def(
          "adjacency",
          [](const py_insertable& g, std::int64_t width) {
            return g.read([&](const auto& i) {
              return adjacency_table(i, width, "InsertableGraphIndex.adjacency");
            });
          },
          py::kw_only(), py::arg("width") = 0,
          "The graph as a fixed-width table, as RoarGraphIndex.adjacency (kvsift.cuda.graph_set "
          "and insert_state stack these). O(size * width); a copy.")
      .def("query_knn", &insertable_query_knn,
           "The training queries' kNN lists as they stand (the build's, updated by every insert): "
           "(ids uint32 [m, nq], scores float32 [m, nq]), row i = query i's keys best first, raw "
           "inner products; missing entries 0xFFFFFFFF. With train_queries() and the graph it is "
           "the state kvsift.cuda.insert_state hands to the GPU insert. O(m nq log nq); a copy.")
      .def("train_queries", &insertable_train_queries,
           "The training queries of the build (float32 [m, d], a copy), row i = query i of "
           "query_knn().")
      .def("insert", &insertable_insert, py::arg("keys"),
           "Inserts float32 keys (count, d) in order; returns the id of the first. All keys are "
           "checked (dimension, NaN/Inf, id space) before any is inserted.")
      .def("add_queries", &insertable_add_queries, py::arg("queries"), py::arg("ids") = py::none(),
           py::kw_only(), py::arg("pool") = 200,
           "Adds float32 decode-time queries (count, d) to the training queries that later "
           "inserts are scored against and offered to (RoarGraph's update rule; the graph is "
           "not changed); returns the number of the first. ids: each query's top keys, an "
           "integer array (count, k) with INVALID_ID padding (e.g. a search's ids); the best nq "
           "are kept. Without ids a search of pool max(pool, nq) finds them. All queries and "
           "ids are checked before any is added. Where the build saw only the prefill's "
           "queries, this keeps the index as good as a rebuild on later queries "
           "(docs/algorithms.md).")
      .def("search", &insertable_search, py::arg("queries"), py::arg("k"), py::kw_only(),
           py::arg("L") = 100, py::arg("threads") = 0,
           "Approximate top-k (beam search, pool L >= k) of (d,) or (m, d) float32 queries.");

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
      .def("topk", &block_topk, py::arg("query"), py::arg("k"), py::kw_only(),
           py::arg("filter") = py::none(),
           "The k blocks with the highest upper bounds among blocks with a token passing the "
           "filter. O(B d) for B blocks.")
      .def("dipr", &block_dipr, py::arg("query"), py::arg("beta"), py::kw_only(),
           py::arg("filter") = py::none(),
           "Block-level DIPR: every block whose upper bound is >= (best lower bound) - beta; "
           "contains every passing token within beta of the best. O(B d + r log r).")
      .def("tokens", &block_tokens, py::arg("blocks"), py::kw_only(),
           py::arg("filter") = py::none(),
           "Token ids (uint32) of the blocks that pass the filter, in block order.");
}

}  // namespace kvsift_python
