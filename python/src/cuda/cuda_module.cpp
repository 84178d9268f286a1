// kvsift._kvsift_cuda: kvsift's CUDA kernels (LSE merges, paged sparse attention, the decode
// search and step, kNN, page copies, the bucketed LRU step) on device tensors from any DLPack
// producer (torch, CuPy, JAX), without copies. The low-level functions here take every output too
// (the caller's framework allocates it, so results are the framework's own tensors); kvsift/cuda.py
// wraps them in FlashInfer-shaped calls that allocate outputs, pick the caller's current stream and
// convert base-2 LSEs. One exception to "device tensors": build_roargraph (the GPU index build)
// takes the host arrays a RoarGraphIndex borrows, and returns the graph as bytes for
// RoarGraphIndex.from_bytes.
//
// Checks before any launch: device memory (kDLCUDA) on the current device, dtypes, shapes,
// contiguous row-major layout. Device-side data (lse values, token ids) is checked by the
// kernels through the optional `status` word, as in C++.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "../tensor.hpp"
#include "cuda_ops.hpp"
#include "kvsift/core/error.hpp"

namespace py = pybind11;
using kvsift::detail::fail;
using kvsift::detail::require;
using kvsift_python::tensor;
namespace ops = kvsift_python::cuda_ops;

namespace {

/// Compact row-major layout (size-1 axes may have any stride).
void require_contiguous(const tensor& t, const char* what) {
  std::int64_t expect = static_cast<std::int64_t>(t.itemsize);
  for (std::int64_t ax = t.ndim() - 1; ax >= 0; --ax) {
    const auto a = static_cast<std::size_t>(ax);
    require(t.shape[a] <= 1 || t.strides[a] == expect, what, ": expected a contiguous row-major ",
            "tensor, got byte stride ", t.strides[a], " on axis ", ax, " (expected ", expect,
            "); make it contiguous with x.contiguous()");
    expect *= t.shape[a];
  }
}

/// A device tensor on the current device with compact row-major layout, as `what`.
tensor device_tensor(const py::handle& h, const char* what, std::intptr_t stream, int device) {
  // A capsule (what kvsift.cuda passes for torch tensors) first: asking a capsule for
  // __dlpack__ raises and clears an AttributeError, about 1 us per tensor of a small call.
  if (PyCapsule_CheckExact(h.ptr()) == 0) {
    if (py::isinstance<py::array>(h)) {
      fail<kvsift::invalid_argument>(what,
                                     ": expected a tensor in CUDA device memory, got a "
                                     "numpy.ndarray (host memory; move it with "
                                     "torch.as_tensor(x, device='cuda') or cupy.asarray(x))");
    }
    require(py::hasattr(h, "__dlpack__"), what,
            ": expected a DLPack tensor in CUDA memory (torch.Tensor, cupy.ndarray, ...), got ",
            std::string(py::str(py::type::of(h).attr("__name__"))));
  }
  tensor t = kvsift_python::detail::from_dlpack(h, what, /*cuda=*/true, stream);
  require(t.cuda_device == device, what, ": tensor is on cuda:", t.cuda_device,
          " but the current device is cuda:", device, " (call torch.cuda.set_device(",
          t.cuda_device, ") or move the tensor there)");
  require_contiguous(t, what);
  return t;
}

/// Reads a call's device tensors: all on the current device, exported for `stream`.
struct intake {
  std::intptr_t stream;
  int device = ops::current_device();
  tensor operator()(const py::handle& h, const char* what) const {
    return device_tensor(h, what, stream, device);
  }
};

ops::dtype value_type(const tensor& t, const char* what) {
  if (t.is_f32()) return ops::dtype::f32;
  if (t.is_f16()) return ops::dtype::f16;
  if (t.is_bf16()) return ops::dtype::bf16;
  fail<kvsift::invalid_argument>(what, ": expected float32, float16 or bfloat16, got ", t.dl_dtype);
}

void require_kind(const tensor& t, char kind, std::size_t itemsize, const char* what,
                  const char* name) {
  require(t.kind == kind && t.itemsize == itemsize, what, ": expected ", name, ", got ", t.dl_dtype,
          " (convert with x.to(torch.", name, "))");
}

void require_shape(const tensor& t, const std::vector<std::int64_t>& shape, const char* what) {
  auto str = [](const std::vector<std::int64_t>& s) {
    std::string r = "(";
    for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + (s.size() == 1 ? ",)" : ")");
  };
  require<kvsift::dimension_mismatch>(t.shape == shape, what, ": expected shape ", str(shape),
                                      ", got ", str(t.shape));
}

/// v as the kernel's integer type I (int or uint32), refused when it does not fit.
template <class I>
I kernel_int(std::int64_t v, const char* what) {
  require(v >= 0 && static_cast<std::uint64_t>(v) <= std::numeric_limits<I>::max(), what, ": ", v,
          " does not fit the kernel's ", std::is_signed_v<I> ? "int" : "uint32", " range");
  return static_cast<I>(v);
}

int as_int(std::int64_t v, const char* what) { return kernel_int<int>(v, what); }

/// Bytes of the tensor's axes from `from` on (0: the whole tensor; 1: one row, e.g. a page).
std::uint64_t bytes_of(const tensor& t, std::size_t from = 0) {
  std::uint64_t b = t.itemsize;
  for (std::size_t a = from; a < t.shape.size(); ++a) b *= static_cast<std::uint64_t>(t.shape[a]);
  return b;
}

template <class T = void>
T* ptr(const tensor& t) {
  return const_cast<T*>(reinterpret_cast<const T*>(t.data));
}

int* status_ptr(const py::object& status, const intake& in) {
  if (status.is_none()) return nullptr;
  const tensor s = in(status, "status");
  require_kind(s, 'i', 4, "status", "int32");
  require(s.shape.size() == 1 && s.shape[0] >= 1, "status: expected an int32 tensor of shape (1,)");
  return ptr<int>(s);
}

/// The two-state merge's shape checks; returns (rows, heads, dim).
std::array<std::int64_t, 3> state_shape(const tensor& v, const tensor& s, const char* vn,
                                        const char* sn) {
  require<kvsift::dimension_mismatch>(v.ndim() == 3, vn, ": expected [seq, heads, dim], got ",
                                      v.ndim(), " axes");
  require_kind(s, 'f', 4, sn, "float32");
  require_shape(s, {v.shape[0], v.shape[1]}, sn);
  return {v.shape[0], v.shape[1], v.shape[2]};
}

/// The checks shared by the paged-attention calls: q [qo_heads, dim] float32, K/V pages
/// [num_pages, page_size, dim] of one dtype, a 2-D int32 page table, o [qo_heads, dim] and
/// lse [qo_heads] float32. Returns the K/V element type.
ops::dtype paged_attention_checks(const tensor& tq, const tensor& tk, const tensor& tv,
                                  const tensor& tp, const tensor& to, const tensor& tl,
                                  const char* who) {
  require_kind(tq, 'f', 4, "q", "float32");
  require<kvsift::dimension_mismatch>(tq.ndim() == 2, "q: expected [qo_heads, dim], got ",
                                      tq.ndim(), " axes");
  const std::int64_t qo_heads = tq.shape[0], dim = tq.shape[1];
  require<kvsift::dimension_mismatch>(
      tk.ndim() == 3, "k_pages: expected [num_pages, page_size, dim], got ", tk.ndim(), " axes");
  require_shape(tv, tk.shape, "v_pages");
  const ops::dtype kt = value_type(tk, "k_pages");
  require(value_type(tv, "v_pages") == kt, who, ": v_pages must have k_pages' dtype ", tk.dl_dtype,
          ", got ", tv.dl_dtype);
  require<kvsift::dimension_mismatch>(tk.shape[2] == dim, "k_pages: head dim ", tk.shape[2],
                                      " differs from q's ", dim);
  require_kind(tp, 'i', 4, "page_table", "int32");
  require<kvsift::dimension_mismatch>(tp.ndim() == 2,
                                      "page_table: expected [kv_heads, max_pages_per_head], got ",
                                      tp.ndim(), " axes");
  require_kind(to, 'f', 4, "o", "float32");
  require_shape(to, {qo_heads, dim}, "o");
  require_kind(tl, 'f', 4, "lse", "float32");
  require_shape(tl, {qo_heads}, "lse");
  return kt;
}

/// The six tensors of a paged-attention call (sparse attention, the decode step), read for
/// the call's stream and checked by paged_attention_checks, with the K/V element type.
struct paged_call {
  tensor q, k, v, table, o, lse;
  ops::dtype kv = ops::dtype::f32;
};

paged_call paged_intake(const intake& in, const py::handle& q, const py::handle& k_pages,
                        const py::handle& v_pages, const py::handle& page_table,
                        const py::handle& o, const py::handle& lse, const char* who) {
  paged_call c{
      in(q, "q"), in(k_pages, "k_pages"), in(v_pages, "v_pages"), in(page_table, "page_table"),
      in(o, "o"), in(lse, "lse")};
  c.kv = paged_attention_checks(c.q, c.k, c.v, c.table, c.o, c.lse, who);
  return c;
}

/// Bucketed LRU state: keys int32 [pairs, capacity], ages uint8 [pairs, capacity], slot_of
/// int32 [pairs, pages], checked; returns {pairs, capacity, pages}.
std::array<std::int64_t, 3> lru_state_shape(const tensor& tk, const tensor& ta, const tensor& ts) {
  require_kind(tk, 'i', 4, "keys", "int32");
  require<kvsift::dimension_mismatch>(tk.ndim() == 2, "keys: expected [pairs, capacity], got ",
                                      tk.ndim(), " axes");
  const std::int64_t pairs = tk.shape[0], capacity = tk.shape[1];
  require_kind(ta, 'u', 1, "ages", "uint8");
  require_shape(ta, {pairs, capacity}, "ages");
  require_kind(ts, 'i', 4, "slot_of", "int32");
  require<kvsift::dimension_mismatch>(ts.ndim() == 2 && ts.shape[0] == pairs,
                                      "slot_of: expected [pairs = ", pairs, ", pages]");
  return {pairs, capacity, ts.shape[1]};
}

/// The state of an offloaded layer (kvsift.cuda.OffloadedKV's tuple: keys, ages, slot_of,
/// page_table, host_page, k_host, v_host, k_device, v_device), checked, with the K/V type.
struct offloaded_state {
  ops::offloaded_layer l;
  ops::dtype kv = ops::dtype::f32;
};

offloaded_state offloaded_intake(const intake& in, const py::tuple& state) {
  require(state.size() == 9, "offloaded state: expected 9 tensors, got ", state.size());
  const tensor tk = in(state[0], "keys"), ta = in(state[1], "ages"), ts = in(state[2], "slot_of");
  const tensor tt = in(state[3], "page_table"), th = in(state[4], "host_page");
  const tensor tkd = in(state[7], "k_device"), tvd = in(state[8], "v_device");
  const auto [pairs, capacity, pages] = lru_state_shape(tk, ta, ts);
  require_kind(tt, 'i', 4, "page_table", "int32");
  require_shape(tt, {pairs, pages}, "page_table");
  require_kind(th, 'i', 8, "host_page", "int64");
  require_shape(th, {pairs, pages}, "host_page");
  std::array<tensor, 2> host;
  for (int i = 0; i < 2; ++i) {
    const char* what = i == 0 ? "k_host" : "v_host";
    require(!py::isinstance<py::array>(state[5 + i]), what,
            ": expected a pinned torch tensor (torch.empty(..., pin_memory=True)), got a "
            "numpy.ndarray");
    host[i] = kvsift_python::detail::from_dlpack(state[5 + i], what);
    require_contiguous(host[i], what);
    require(host[i].ndim() == 3 && host[i].shape[0] >= 1, what,
            ": expected [host_pages >= 1, page_size, dim]");
    require(ops::is_pinned_host(host[i].data), what,
            ": expected pinned (page-locked) host memory, got pageable memory (allocate it with "
            "torch.empty(..., pin_memory=True) or x.pin_memory())");
  }
  require_shape(host[1], host[0].shape, "v_host");
  offloaded_state r;
  r.kv = value_type(host[0], "k_host");
  require(value_type(host[1], "v_host") == r.kv && value_type(tkd, "k_device") == r.kv &&
              value_type(tvd, "v_device") == r.kv,
          "offloaded state: v_host, k_device and v_device must have k_host's dtype ",
          host[0].dl_dtype);
  require<kvsift::dimension_mismatch>(
      tkd.ndim() == 3 && tkd.shape[1] == host[0].shape[1] && tkd.shape[2] == host[0].shape[2],
      "k_device: expected [device_pages, page_size, dim] with k_host's page_size and dim");
  require_shape(tvd, tkd.shape, "v_device");
  ops::offloaded_layer& l = r.l;
  l.keys = ptr<std::uint32_t>(tk);
  l.ages = ptr<std::uint8_t>(ta);
  l.slot_of = ptr<std::uint32_t>(ts);
  l.page_table = ptr<std::int32_t>(tt);
  l.host_page = ptr<std::uint64_t>(th);
  l.pairs = kernel_int<std::uint32_t>(pairs, "pairs");
  l.capacity = kernel_int<std::uint32_t>(capacity, "capacity");
  l.pages = kernel_int<std::uint32_t>(pages, "pages");
  l.k_host = ptr(host[0]);
  l.v_host = ptr(host[1]);
  l.host_pages = static_cast<std::uint64_t>(host[0].shape[0]);
  l.k_device = ptr(tkd);
  l.v_device = ptr(tvd);
  l.device_pages = static_cast<std::uint64_t>(tkd.shape[0]);
  l.page_size = as_int(host[0].shape[1], "page_size");
  l.dim = as_int(host[0].shape[2], "dim");
  return r;
}

/// `max_keys` of a graph set whose adjacency has `rows` rows, checked (1 <= max_keys <= rows):
/// the workspace-size query and the step itself both size or index by it.
std::int64_t checked_max_keys(std::int64_t max_keys, std::int64_t rows) {
  require(max_keys >= 1 && max_keys <= rows, "max_keys: expected 1 <= max_keys <= ", rows,
          " (the adjacency's rows), got ", max_keys);
  return max_keys;
}

/// The graph set of a decode step: adjacency [rows, width] and entries [graphs, max_entries]
/// int32 or uint32 (the same bits: 0xFFFFFFFF = -1 pads), row_offset int64 [graphs + 1].
ops::decode_graphs graphs_of(const tensor& adj, const tensor& off, const tensor& ent,
                             std::int64_t max_keys) {
  auto id_table = [](const tensor& t, const char* what) {
    require((t.kind == 'i' || t.kind == 'u') && t.itemsize == 4, what,
            ": expected int32 or uint32 ids, got ", t.dl_dtype,
            " (kvsift.cuda.graph_set makes int32)");
    require<kvsift::dimension_mismatch>(t.ndim() == 2, what, ": expected a 2-D table, got ",
                                        t.ndim(), " axes");
  };
  id_table(adj, "adjacency");
  id_table(ent, "entries");
  require_kind(off, 'i', 8, "row_offset", "int64");
  require<kvsift::dimension_mismatch>(off.ndim() == 1 && off.shape[0] == ent.shape[0] + 1,
                                      "row_offset: expected shape (", ent.shape[0] + 1,
                                      ",) = (graphs + 1,), got ", off.ndim(), " axes of ",
                                      off.ndim() ? off.shape[0] : 0);
  ops::decode_graphs g;
  g.adjacency = ptr<std::uint32_t>(adj);
  g.row_offset = ptr<std::int64_t>(off);
  g.entries = ptr<std::uint32_t>(ent);
  g.num_graphs = as_int(ent.shape[0], "graphs");
  g.width = as_int(adj.shape[1], "adjacency width");
  g.max_entries = as_int(ent.shape[1], "max_entries");
  g.max_keys = checked_max_keys(max_keys, adj.shape[0]);
  return g;
}

/// Whether `metric` is squared l2 ("l2") rather than inner product ("ip"); refuses others.
bool l2_metric(const std::string& metric) {
  require(metric == "ip" || metric == "l2", "metric: expected 'ip' or 'l2', got '", metric, "'");
  return metric == "l2";
}

ops::decode_search_knobs search_knobs(const std::string& mode, int k, int L, int expand_width,
                                      bool walk_through, int degree_cap, float beta, int l0,
                                      int max_results, const std::string& metric = "ip",
                                      int expand_limit = 0, int max_hops = 0,
                                      int entry_prefix = 0) {
  require(mode == "topk" || mode == "dipr", "mode: expected 'topk' or 'dipr', got '", mode, "'");
  const bool l2 = l2_metric(metric);
  ops::decode_search_knobs p;
  p.dipr = mode == "dipr";
  p.l2 = l2;
  p.k = k;
  p.L = L;
  p.expand_width = expand_width;
  p.walk_through = walk_through;
  p.degree_cap = degree_cap;
  p.beta = beta;
  p.l0 = l0;
  p.max_results = max_results;
  p.expand_limit = expand_limit;
  p.max_hops = max_hops;
  p.entry_prefix = entry_prefix;
  return p;
}

ops::decode_step_knobs step_knobs(const std::string& mode, int k, int L, int expand_width,
                                  bool walk_through, int degree_cap, float beta, int l0,
                                  int max_results, int expand_limit, int max_hops, int sink,
                                  int window, bool dense_when_capped, bool seed_from_window,
                                  float scale, int entry_prefix, int unindexed) {
  ops::decode_step_knobs p;
  p.search = search_knobs(mode, k, L, expand_width, walk_through, degree_cap, beta, l0, max_results,
                          "ip", expand_limit, max_hops, entry_prefix);
  p.sink = sink;
  p.window = window;
  p.unindexed = unindexed;
  p.dense_when_capped = dense_when_capped;
  p.seed_from_window = seed_from_window;
  p.scale = scale;
  return p;
}

/// Sizes only (the workspace does not depend on the graphs' contents), max_keys checked.
ops::decode_graphs graph_sizes(std::int64_t graphs, std::int64_t rows, std::int64_t width,
                               std::int64_t max_entries, std::int64_t max_keys) {
  ops::decode_graphs g;
  g.num_graphs = as_int(graphs, "graphs");
  g.width = as_int(width, "width");
  g.max_entries = as_int(max_entries, "max_entries");
  g.max_keys = checked_max_keys(max_keys, rows);
  return g;
}

/// int32 or uint32 (the same bits) of the given shape, as `what`.
void require_u32(const tensor& t, const std::vector<std::int64_t>& shape, const char* what) {
  require((t.kind == 'i' || t.kind == 'u') && t.itemsize == 4, what,
          ": expected int32 or uint32, got ", t.dl_dtype);
  require_shape(t, shape, what);
}

/// The keys of a decode search or insert, where they live: `keys` dense [rows, dim], or
/// `k_pages` [num_pages, page_size, dim] with an int32 `page_table` [graphs, max_pages_per_head]
/// (exactly one of the two; dim < 0 takes the keys' own).
ops::graph_keys graph_keys_of(const intake& in, const py::object& keys, const py::object& k_pages,
                              const py::object& page_table, std::int64_t rows, std::int64_t dim,
                              const char* who) {
  require(keys.is_none() != k_pages.is_none(), who,
          ": expected the keys either dense (keys) or paged (k_pages and page_table), got ",
          keys.is_none() ? "neither" : "both");
  ops::graph_keys r;
  if (!keys.is_none()) {
    const tensor tk = in(keys, "keys");
    r.type = value_type(tk, "keys");
    require<kvsift::dimension_mismatch>(tk.ndim() == 2, "keys: expected [rows, dim], got ",
                                        tk.ndim(), " axes");
    require_shape(tk, {rows, dim < 0 ? tk.shape[1] : dim}, "keys");
    r.dense = ptr(tk);
    r.dim = as_int(tk.shape[1], "dim");
    return r;
  }
  require(!page_table.is_none(), who, ": k_pages needs page_table");
  const tensor tk = in(k_pages, "k_pages");
  const tensor tp = in(page_table, "page_table");
  r.type = value_type(tk, "k_pages");
  require<kvsift::dimension_mismatch>(tk.ndim() == 3 && (dim < 0 || tk.shape[2] == dim),
                                      "k_pages: expected [num_pages, page_size, dim]",
                                      dim < 0 ? "" : " with q's dim ",
                                      dim < 0 ? "" : std::to_string(dim));
  require_kind(tp, 'i', 4, "page_table", "int32");
  require<kvsift::dimension_mismatch>(tp.ndim() == 2,
                                      "page_table: expected [graphs, max_pages_per_head], got ",
                                      tp.ndim(), " axes");
  r.k_pages = ptr(tk);
  r.num_pages = tk.shape[0];
  r.page_size = as_int(tk.shape[1], "page_size");
  r.dim = as_int(tk.shape[2], "dim");
  r.page_table = ptr<std::int32_t>(tp);
  r.table_rows = as_int(tp.shape[0], "page_table rows");
  r.max_pages_per_head = as_int(tp.shape[1], "max_pages_per_head");
  return r;
}

/// An f32 or 32-bit id tensor of the given shape, as `what` (a batch_insert state array, an
/// optional vector).
template <class T>
T* state_array(const tensor& t, const std::vector<std::int64_t>& shape, const char* what) {
  if constexpr (std::is_same_v<T, float>) {
    require_kind(t, 'f', 4, what, "float32");
    require_shape(t, shape, what);
  } else {
    require_u32(t, shape, what);
  }
  return ptr<T>(t);
}

/// An optional [m] tensor of the given kind (f32 or 32-bit ids), or null.
template <class T>
T* optional_vector(const py::object& h, const intake& in, std::int64_t m, const char* what) {
  return h.is_none() ? nullptr : state_array<T>(in(h, what), {m}, what);
}

ops::insert_knobs insert_knobs(int degree, int L, int expand_width, int query_neighbors,
                               int query_candidates, bool update_query_knn, bool fill,
                               const std::string& metric) {
  const bool l2 = l2_metric(metric);
  ops::insert_knobs p;
  p.degree = degree;
  p.L = L;
  p.expand_width = expand_width;
  p.query_neighbors = query_neighbors;
  p.query_candidates = query_candidates;
  p.update_query_knn = update_query_knn;
  p.fill = fill;
  p.l2 = l2;
  return p;
}

template <class T>
py::array_t<T> to_numpy(const std::vector<T>& v, std::vector<py::ssize_t> shape) {
  py::array_t<T> a(shape);
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

/// A RouteStack's arrays (device) as ops::route_sets, checked against each other: the vectors
/// [rows, dim] (float32/16, bfloat16), lists [rows, list_len] 32-bit ids, offset int64
/// [graphs + 1], and the three cluster arrays all given (clustered) or none.
ops::route_sets route_intake(const intake& in, const py::handle& vectors, const py::handle& lists,
                             const py::handle& offset, const py::object& centroids,
                             const py::object& cluster_offset, const py::object& cluster_rows,
                             std::int64_t max_rows, std::int64_t max_clusters,
                             std::int64_t max_cluster_rows) {
  const tensor tv = in(vectors, "vectors");
  ops::route_sets r;
  r.type = value_type(tv, "vectors");
  require<kvsift::dimension_mismatch>(tv.ndim() == 2, "vectors: expected [rows, dim], got ",
                                      tv.ndim(), " axes");
  const std::int64_t rows = tv.shape[0], dim = tv.shape[1];
  r.vectors = tv.data;
  r.dim = as_int(dim, "dim");
  const tensor tl = in(lists, "lists");
  require<kvsift::dimension_mismatch>(tl.ndim() == 2, "lists: expected [rows, list_len], ", "got ",
                                      tl.ndim(), " axes");
  require_u32(tl, {rows, tl.shape[1]}, "lists");
  r.lists = ptr<std::uint32_t>(tl);
  r.list_len = as_int(tl.shape[1], "list_len");
  const tensor to = in(offset, "offset");
  require_kind(to, 'i', 8, "offset", "int64");
  require<kvsift::dimension_mismatch>(to.ndim() == 1 && to.shape[0] >= 2,
                                      "offset: expected (graphs + 1,) with graphs >= 1, got ",
                                      to.ndim(), " axes of ", to.ndim() ? to.shape[0] : 0);
  r.offset = ptr<std::int64_t>(to);
  r.num_graphs = as_int(to.shape[0] - 1, "graphs");
  r.max_rows = as_int(max_rows, "max_rows");
  const int clustered =
      int(!centroids.is_none()) + int(!cluster_offset.is_none()) + int(!cluster_rows.is_none());
  require(clustered == 0 || clustered == 3,
          "routes: expected centroids, cluster_offset and cluster_rows all given (a "
          "clustered RouteStack) or none, got ",
          clustered, " of them");
  if (clustered == 3) {
    const tensor tc = in(centroids, "centroids");
    require(value_type(tc, "centroids") == r.type, "centroids: expected the vectors' dtype ",
            tv.dl_dtype, ", got ", tc.dl_dtype);
    require<kvsift::dimension_mismatch>(tc.ndim() == 2 && tc.shape[1] == dim,
                                        "centroids: expected [clusters, ", dim, "]");
    const tensor tco = in(cluster_offset, "cluster_offset");
    require_kind(tco, 'i', 8, "cluster_offset", "int64");
    require_shape(tco, {to.shape[0]}, "cluster_offset");
    const tensor tcr = in(cluster_rows, "cluster_rows");
    require_kind(tcr, 'i', 8, "cluster_rows", "int64");
    require_shape(tcr, {tc.shape[0] + 1}, "cluster_rows");
    r.centroids = tc.data;
    r.cluster_offset = ptr<std::int64_t>(tco);
    r.cluster_rows = ptr<std::int64_t>(tcr);
    r.max_clusters = as_int(max_clusters, "max_clusters");
    r.max_cluster_rows = as_int(max_cluster_rows, "max_cluster_rows");
  }
  return r;
}

/// route_intake over a RouteStack passed whole (its nine fields, in order).
ops::route_sets route_intake(const intake& in, const py::tuple& stack) {
  require(stack.size() == 9, "routes: expected a RouteStack of 9 fields, got ", stack.size());
  return route_intake(in, stack[0], stack[1], stack[2], stack[3], stack[4], stack[5],
                      stack[6].cast<std::int64_t>(), stack[7].cast<std::int64_t>(),
                      stack[8].cast<std::int64_t>());
}

void bind_batch_insert(py::module_& m) {
  m.def(
      "make_insert_lists",
      [](const py::array_t<std::uint32_t, py::array::c_style | py::array::forcecast>& ids,
         const py::array_t<float, py::array::c_style | py::array::forcecast>& scores,
         std::int64_t rows, int holder_capacity, const std::string& metric) {
        const bool l2 = l2_metric(metric);
        require<kvsift::dimension_mismatch>(
            ids.ndim() == 2, "knn ids: expected [queries, nq], got ", ids.ndim(), " axes");
        const auto m_ = static_cast<std::size_t>(ids.shape(0));
        const auto nq = static_cast<std::size_t>(ids.shape(1));
        require<kvsift::dimension_mismatch>(
            scores.ndim() == 2 && static_cast<std::size_t>(scores.shape(0)) == m_ &&
                static_cast<std::size_t>(scores.shape(1)) == nq,
            "knn scores: expected the ids' shape (", m_, ", ", nq, ")");
        require(rows >= 1, "rows: expected >= 1, got ", rows);
        std::vector<std::uint32_t> vi(ids.data(), ids.data() + ids.size());
        std::vector<float> vs(scores.data(), scores.data() + scores.size());
        ops::insert_lists l;
        {
          py::gil_scoped_release release;
          l = ops::make_insert_lists(vi, vs, m_, nq, static_cast<std::size_t>(rows),
                                     holder_capacity, l2);
        }
        const auto qm = static_cast<py::ssize_t>(m_), qk = static_cast<py::ssize_t>(nq);
        const auto r = static_cast<py::ssize_t>(rows);
        py::dict d;
        d["knn_ids"] = to_numpy(l.knn_ids, {qm, qk});
        d["knn_keys"] = to_numpy(l.knn_keys, {qm, qk});
        d["worst_key"] = to_numpy(l.worst_key, {qm});
        d["best_id"] = to_numpy(l.best_id, {qm});
        d["best_key"] = to_numpy(l.best_key, {qm});
        d["holders"] = to_numpy(l.holders, {r, static_cast<py::ssize_t>(holder_capacity)});
        d["holder_counts"] = to_numpy(l.holder_counts, {r});
        d["layouts"] = to_numpy(l.layouts, {r});
        return d;
      },
      py::arg("knn_ids"), py::arg("knn_scores"), py::arg("rows"), py::arg("holder_capacity"),
      py::arg("metric"),
      "Host: one graph's batch_insert list arrays (dict of numpy arrays) from its training kNN. "
      "Use kvsift.cuda.insert_state.");

  m.def(
      "batch_insert_workspace_size",
      [](std::int64_t graphs, std::int64_t rows, std::int64_t width, std::int64_t max_entries,
         std::int64_t max_keys, std::int64_t dim, std::int64_t max_queries, int nq,
         int holder_capacity, int degree, int L, int expand_width, int query_neighbors,
         int query_candidates, bool update_query_knn, bool fill, const std::string& metric) {
        const auto g = graph_sizes(graphs, rows, width, max_entries, max_keys);
        ops::insert_state st;
        st.max_queries = max_queries;
        st.nq = nq;
        st.holder_capacity = holder_capacity;
        return ops::batch_insert_workspace_size(
            g, as_int(dim, "dim"), st,
            insert_knobs(degree, L, expand_width, query_neighbors, query_candidates,
                         update_query_knn, fill, metric));
      },
      py::arg("graphs"), py::arg("rows"), py::arg("width"), py::arg("max_entries"),
      py::arg("max_keys"), py::arg("dim"), py::arg("max_queries"), py::arg("nq"),
      py::arg("holder_capacity"), py::arg("degree"), py::arg("L"), py::arg("expand_width"),
      py::arg("query_neighbors"), py::arg("query_candidates"), py::arg("update_query_knn"),
      py::arg("fill"), py::arg("metric"),
      "Bytes of device workspace batch_insert needs; raises for bad parameters.");

  m.def(
      "batch_insert",
      [](py::handle adjacency, py::handle row_offset, py::handle entries, std::int64_t max_keys,
         py::handle sizes, py::object keys, py::object k_pages, py::object page_table,
         py::handle queries, py::handle query_offset, std::int64_t max_queries, py::handle knn_ids,
         py::handle knn_keys, py::handle worst_key, py::handle best_id, py::handle best_key,
         py::handle holders, py::handle holder_counts, py::object layouts, py::handle workspace,
         int degree, int L, int expand_width, int query_neighbors, int query_candidates,
         bool update_query_knn, bool fill, const std::string& metric, std::intptr_t stream,
         py::object status) {
        const intake in{stream};
        const tensor tadj = in(adjacency, "adjacency");
        ops::decode_graphs g =
            graphs_of(tadj, in(row_offset, "row_offset"), in(entries, "entries"), max_keys);
        g.sizes = state_array<std::uint32_t>(in(sizes, "sizes"), {g.num_graphs}, "sizes");
        const std::int64_t rows = tadj.shape[0];
        const ops::insert_knobs p = insert_knobs(degree, L, expand_width, query_neighbors,
                                                 query_candidates, update_query_knn, fill, metric);
        ops::insert_state st;
        const tensor tq = in(queries, "queries");
        require_kind(tq, 'f', 4, "queries", "float32");
        require<kvsift::dimension_mismatch>(
            tq.ndim() == 2, "queries: expected [training queries, dim], got ", tq.ndim(), " axes");
        const std::int64_t nqueries = tq.shape[0];
        st.queries = ptr<float>(tq);
        st.query_ld = tq.shape[1];
        const tensor to = in(query_offset, "query_offset");
        require_kind(to, 'i', 8, "query_offset", "int64");
        require_shape(to, {g.num_graphs + std::int64_t{1}}, "query_offset");
        st.query_offset = ptr<std::int64_t>(to);
        require(max_queries >= 1 && max_queries <= nqueries,
                "max_queries: expected 1 <= ", "max_queries <= ", nqueries,
                " (the training queries' rows), got ", max_queries);
        st.max_queries = max_queries;
        const tensor tki = in(knn_ids, "knn_ids");
        require<kvsift::dimension_mismatch>(tki.ndim() == 2, "knn_ids: expected [", nqueries,
                                            ", nq], got ", tki.ndim(), " axes");
        st.nq = as_int(tki.shape[1], "nq");
        st.knn_ids = state_array<std::uint32_t>(tki, {nqueries, st.nq}, "knn_ids");
        st.knn_keys = state_array<float>(in(knn_keys, "knn_keys"), {nqueries, st.nq}, "knn_keys");
        st.worst_key = state_array<float>(in(worst_key, "worst_key"), {nqueries}, "worst_key");
        st.best_id = state_array<std::uint32_t>(in(best_id, "best_id"), {nqueries}, "best_id");
        st.best_key = state_array<float>(in(best_key, "best_key"), {nqueries}, "best_key");
        const tensor th = in(holders, "holders");
        require<kvsift::dimension_mismatch>(th.ndim() == 2 && th.shape[0] == rows,
                                            "holders: expected [", rows,
                                            " (the adjacency's rows), holder_capacity]");
        st.holder_capacity = as_int(th.shape[1], "holder_capacity");
        st.holders = state_array<std::uint32_t>(th, {rows, th.shape[1]}, "holders");
        st.holder_counts =
            state_array<std::uint32_t>(in(holder_counts, "holder_counts"), {rows}, "holder_counts");
        if (!layouts.is_none()) {
          st.layouts = state_array<std::uint32_t>(in(layouts, "layouts"), {rows}, "layouts");
        }
        auto* const stat = reinterpret_cast<std::uint32_t*>(status_ptr(status, in));
        const tensor tw = in(workspace, "workspace");
        const ops::graph_keys kk =
            graph_keys_of(in, keys, k_pages, page_table, rows, -1, "batch_insert");
        py::gil_scoped_release release;
        ops::batch_insert(g, kk, st, p, ptr(tw), bytes_of(tw), stream, stat);
      },
      py::arg("adjacency"), py::arg("row_offset"), py::arg("entries"), py::arg("max_keys"),
      py::arg("sizes"), py::arg("keys"), py::arg("k_pages"), py::arg("page_table"),
      py::arg("queries"), py::arg("query_offset"), py::arg("max_queries"), py::arg("knn_ids"),
      py::arg("knn_keys"), py::arg("worst_key"), py::arg("best_id"), py::arg("best_key"),
      py::arg("holders"), py::arg("holder_counts"), py::arg("layouts"), py::arg("workspace"),
      py::arg("degree"), py::arg("L"), py::arg("expand_width"), py::arg("query_neighbors"),
      py::arg("query_candidates"), py::arg("update_query_knn"), py::arg("fill"), py::arg("metric"),
      py::arg("stream"), py::arg("status") = py::none(),
      "Low level: one key into every graph (kvsift::cuda::batch_insert). Use "
      "kvsift.cuda.batch_insert.");
}

}  // namespace

PYBIND11_MODULE(_kvsift_cuda, m) {
  m.doc() =
      "kvsift's CUDA kernels on device tensors (DLPack, zero copy). Use kvsift.cuda, which wraps "
      "these low-level functions (outputs passed in, explicit stream) in FlashInfer-shaped "
      "calls.";
  // The CUDA layer's own error (a failed launch or device query): a RuntimeError.
  py::register_exception<ops::cuda_failure>(m, "CudaError", PyExc_RuntimeError);

  m.def("current_device", &ops::current_device, "The current CUDA device (cudaGetDevice).");

  m.def(
      "merge_state",
      [](py::handle v_a, py::handle s_a, py::handle v_b, py::handle s_b, py::handle v_out,
         py::handle s_out, std::intptr_t stream, py::object status) {
        const intake in{stream};
        const tensor va = in(v_a, "v_a");
        const tensor sa = in(s_a, "s_a");
        const tensor vb = in(v_b, "v_b");
        const tensor sb = in(s_b, "s_b");
        const tensor vo = in(v_out, "v_out");
        const tensor so = in(s_out, "s_out");
        const auto [rows, heads, dim] = state_shape(va, sa, "v_a", "s_a");
        const ops::dtype t = value_type(va, "v_a");
        for (const auto* x : {&vb, &vo}) {
          require(value_type(*x, "v_b/v_out") == t, "merge_state: v_b and v_out must have v_a's ",
                  "dtype ", va.dl_dtype, ", got ", x->dl_dtype);
          require_shape(*x, va.shape, x == &vb ? "v_b" : "v_out");
        }
        state_shape(vb, sb, "v_b", "s_b");
        state_shape(vo, so, "v_out", "s_out");
        int* st = status_ptr(status, in);
        py::gil_scoped_release release;
        ops::merge_state(t, ptr(va), ptr<float>(sa), ptr(vb), ptr<float>(sb), ptr(vo),
                         ptr<float>(so), rows, as_int(heads, "heads"), as_int(dim, "dim"), stream,
                         st);
      },
      py::arg("v_a"), py::arg("s_a"), py::arg("v_b"), py::arg("s_b"), py::arg("v_out"),
      py::arg("s_out"), py::arg("stream"), py::arg("status") = py::none(),
      "Low level: v_out, s_out <- merge((v_a, s_a), (v_b, s_b)); natural-log lse; enqueued on "
      "`stream` (an integer cudaStream_t). Use kvsift.cuda.merge_state.");

  m.def(
      "merge_state_in_place",
      [](py::handle v, py::handle s, py::handle v_other, py::handle s_other, std::intptr_t stream,
         py::object status) {
        const intake in{stream};
        const tensor tv = in(v, "v");
        const tensor ts = in(s, "s");
        const tensor to = in(v_other, "v_other");
        const tensor tso = in(s_other, "s_other");
        const auto [rows, heads, dim] = state_shape(tv, ts, "v", "s");
        const ops::dtype t = value_type(tv, "v");
        require(value_type(to, "v_other") == t,
                "merge_state_in_place: v_other must have v's dtype ", tv.dl_dtype, ", got ",
                to.dl_dtype);
        require_shape(to, tv.shape, "v_other");
        state_shape(to, tso, "v_other", "s_other");
        int* st = status_ptr(status, in);
        py::gil_scoped_release release;
        ops::merge_state_in_place(t, ptr(tv), ptr<float>(ts), ptr(to), ptr<float>(tso), rows,
                                  as_int(heads, "heads"), as_int(dim, "dim"), stream, st);
      },
      py::arg("v"), py::arg("s"), py::arg("v_other"), py::arg("s_other"), py::arg("stream"),
      py::arg("status") = py::none(),
      "Low level: (v, s) <- merge((v, s), (v_other, s_other)), in the caller's memory.");

  m.def(
      "merge_states",
      [](py::handle v, py::handle s, py::handle indptr, py::handle v_out, py::handle s_out,
         std::intptr_t stream, py::object status) {
        const intake in{stream};
        const tensor tv = in(v, "v");
        const tensor ts = in(s, "s");
        const tensor ti = in(indptr, "indptr");
        const tensor vo = in(v_out, "v_out");
        const tensor so = in(s_out, "s_out");
        const auto [num_states, heads, dim] = state_shape(tv, ts, "v", "s");
        const ops::dtype t = value_type(tv, "v");
        require_kind(ti, 'i', 8, "indptr", "int64");
        require<kvsift::dimension_mismatch>(ti.ndim() == 1 && ti.shape[0] >= 1,
                                            "indptr: expected shape (num_pos + 1,)");
        const std::int64_t num_pos = ti.shape[0] - 1;
        require(value_type(vo, "v_out") == t, "merge_states: v_out must have v's dtype ",
                tv.dl_dtype, ", got ", vo.dl_dtype);
        require_shape(vo, {num_pos, heads, dim}, "v_out");
        require_shape(so, {num_pos, heads}, "s_out");
        require_kind(so, 'f', 4, "s_out", "float32");
        int* st = status_ptr(status, in);
        py::gil_scoped_release release;
        ops::merge_states(t, ptr(tv), ptr<float>(ts), num_states, ptr<std::int64_t>(ti), num_pos,
                          as_int(heads, "heads"), as_int(dim, "dim"), ptr(vo), ptr<float>(so),
                          stream, st);
      },
      py::arg("v"), py::arg("s"), py::arg("indptr"), py::arg("v_out"), py::arg("s_out"),
      py::arg("stream"), py::arg("status") = py::none(),
      "Low level: position p of (v_out, s_out) merges states indptr[p]..indptr[p+1] of (v, s).");

  m.def(
      "sparse_attention_workspace_size",
      [](std::int64_t qo_heads, std::int64_t dim, int num_splits) {
        return ops::sparse_attention_workspace_size(as_int(qo_heads, "qo_heads"),
                                                    as_int(dim, "dim"), num_splits);
      },
      py::arg("qo_heads"), py::arg("dim"), py::arg("num_splits") = 0,
      "Bytes of device workspace sparse_attention needs (0 when the split count is 1).");

  m.def(
      "sparse_attention",
      [](py::handle q, py::handle k_pages, py::handle v_pages, py::handle page_table,
         py::handle indptr, py::handle ids, py::handle o, py::handle lse, py::object workspace,
         float scale, int num_splits, std::intptr_t stream, py::object status) {
        const intake in{stream};
        const paged_call c =
            paged_intake(in, q, k_pages, v_pages, page_table, o, lse, "sparse_attention");
        const tensor &tq = c.q, &tk = c.k, &tv = c.v, &tp = c.table, &to = c.o, &tl = c.lse;
        const ops::dtype kt = c.kv;
        const tensor ti = in(indptr, "indptr");
        const tensor tid = in(ids, "ids");
        const std::int64_t qo_heads = tq.shape[0], dim = tq.shape[1];
        require_kind(ti, 'i', 8, "indptr", "int64");
        require_shape(ti, {qo_heads + 1}, "indptr");
        require_kind(tid, 'i', 4, "ids", "int32");
        require<kvsift::dimension_mismatch>(tid.ndim() == 1, "ids: expected a 1-D tensor");
        void* ws = nullptr;
        std::size_t ws_bytes = 0;
        if (!workspace.is_none()) {
          const tensor tw = in(workspace, "workspace");
          ws = ptr(tw);
          ws_bytes = bytes_of(tw);
        }
        int* st = status_ptr(status, in);
        py::gil_scoped_release release;
        ops::sparse_attention(kt, ptr<float>(tq), as_int(qo_heads, "qo_heads"), as_int(dim, "dim"),
                              ptr(tk), ptr(tv), tk.shape[0], as_int(tk.shape[1], "page_size"),
                              ptr<std::int32_t>(tp), as_int(tp.shape[0], "kv_heads"),
                              as_int(tp.shape[1], "max_pages_per_head"), ptr<std::int64_t>(ti),
                              tid.shape[0] == 0 ? nullptr : ptr<std::int32_t>(tid), ptr<float>(to),
                              ptr<float>(tl), ws, ws_bytes, scale, num_splits, stream, st);
      },
      py::arg("q"), py::arg("k_pages"), py::arg("v_pages"), py::arg("page_table"),
      py::arg("indptr"), py::arg("ids"), py::arg("o"), py::arg("lse"), py::arg("workspace"),
      py::arg("scale"), py::arg("num_splits"), py::arg("stream"), py::arg("status") = py::none(),
      "Low level: paged sparse attention into (o, lse). Use kvsift.cuda.sparse_attention.");

  m.def(
      "decode_step_workspace_size",
      [](std::int64_t graphs, std::int64_t rows, std::int64_t width, std::int64_t max_entries,
         std::int64_t max_keys, std::int64_t qo_heads, std::int64_t dim, const std::string& mode,
         int k, int L, int expand_width, bool walk_through, int degree_cap, float beta, int l0,
         int max_results, int expand_limit, int max_hops, int sink, int window,
         bool dense_when_capped, bool seed_from_window, int entry_prefix, int unindexed,
         int route_list_len, int route_top, int route_group, int route_probe) {
        // With routes (route_list_len > 0) the size reads only the lists' length and the
        // routing parameters.
        ops::route_sets sets;
        sets.list_len = route_list_len;
        ops::step_routing routing{route_list_len > 0 ? &sets : nullptr, route_top, route_group,
                                  route_probe};
        return ops::decode_step_workspace_size(
            graph_sizes(graphs, rows, width, max_entries, max_keys), as_int(qo_heads, "qo_heads"),
            as_int(dim, "dim"),
            step_knobs(mode, k, L, expand_width, walk_through, degree_cap, beta, l0, max_results,
                       expand_limit, max_hops, sink, window, dense_when_capped, seed_from_window,
                       std::numeric_limits<float>::quiet_NaN(), entry_prefix, unindexed),
            routing);
      },
      py::arg("graphs"), py::arg("rows"), py::arg("width"), py::arg("max_entries"),
      py::arg("max_keys"), py::arg("qo_heads"), py::arg("dim"), py::arg("mode"), py::arg("k"),
      py::arg("L"), py::arg("expand_width"), py::arg("walk_through"), py::arg("degree_cap"),
      py::arg("beta"), py::arg("l0"), py::arg("max_results"), py::arg("expand_limit"),
      py::arg("max_hops"), py::arg("sink"), py::arg("window"), py::arg("dense_when_capped"),
      py::arg("seed_from_window") = false, py::arg("entry_prefix") = 0, py::arg("unindexed") = 0,
      py::arg("route_list_len") = 0, py::arg("route_top") = 4, py::arg("route_group") = 1,
      py::arg("route_probe") = 0,
      "Bytes of device workspace decode_step needs for a graph set of `graphs` graphs over an "
      "adjacency of `rows` x `width`; raises for bad parameters (max_keys outside [1, rows] "
      "included).");

  m.def(
      "decode_step",
      [](py::handle adjacency, py::handle row_offset, py::handle entries, std::int64_t max_keys,
         py::handle q, py::handle k_pages, py::handle v_pages, py::handle page_table, py::handle o,
         py::handle lse, py::handle workspace, const std::string& mode, int k, int L,
         int expand_width, bool walk_through, int degree_cap, float beta, int l0, int max_results,
         int expand_limit, int max_hops, int sink, int window, bool dense_when_capped, float scale,
         std::intptr_t stream, py::object status, py::object carry, py::object sizes,
         bool seed_from_window, py::object capped, int entry_prefix, int unindexed,
         py::object routes, int route_top, int route_group, int route_probe) {
        const intake in{stream};
        ops::decode_graphs g = graphs_of(in(adjacency, "adjacency"), in(row_offset, "row_offset"),
                                         in(entries, "entries"), max_keys);
        g.sizes = optional_vector<std::uint32_t>(sizes, in, g.num_graphs, "sizes");
        const paged_call c =
            paged_intake(in, q, k_pages, v_pages, page_table, o, lse, "decode_step");
        const tensor &tq = c.q, &tk = c.k, &tv = c.v, &tp = c.table, &to = c.o, &tl = c.lse;
        const ops::dtype kt = c.kv;
        const tensor tw = in(workspace, "workspace");
        const std::int64_t qo_heads = tq.shape[0], dim = tq.shape[1];
        require<kvsift::dimension_mismatch>(tp.shape[0] == g.num_graphs,
                                            "page_table: expected one row per graph (",
                                            g.num_graphs, "), got ", tp.shape[0], " rows");
        std::uint32_t* st = nullptr;
        if (!status.is_none()) st = reinterpret_cast<std::uint32_t*>(status_ptr(status, in));
        const ops::decode_step_knobs p =
            step_knobs(mode, k, L, expand_width, walk_through, degree_cap, beta, l0, max_results,
                       expand_limit, max_hops, sink, window, dense_when_capped, seed_from_window,
                       scale, entry_prefix, unindexed);
        std::uint32_t* carry_ids = nullptr;
        if (!carry.is_none()) {
          const tensor tc = in(carry, "carry");
          require_u32(tc, {qo_heads, ops::decode_search_capacity(p.search)}, "carry");
          carry_ids = ptr<std::uint32_t>(tc);
        }
        std::uint32_t* capped_flags = nullptr;
        if (!capped.is_none()) {
          const tensor tf = in(capped, "capped");
          require_u32(tf, {qo_heads}, "capped");
          capped_flags = ptr<std::uint32_t>(tf);
        }
        ops::route_sets sets;
        ops::step_routing routing{nullptr, route_top, route_group, route_probe};
        if (!routes.is_none()) {
          sets = route_intake(in, py::tuple(routes));
          routing.sets = &sets;
        }
        py::gil_scoped_release release;
        ops::decode_step(kt, g, ptr(tk), ptr(tv), tk.shape[0], as_int(tk.shape[1], "page_size"),
                         ptr<std::int32_t>(tp), as_int(tp.shape[1], "max_pages_per_head"),
                         ptr<float>(tq), as_int(qo_heads, "qo_heads"), as_int(dim, "dim"),
                         ptr<float>(to), ptr<float>(tl), ptr(tw), bytes_of(tw), p, st, stream,
                         carry_ids, capped_flags, routing);
      },
      py::arg("adjacency"), py::arg("row_offset"), py::arg("entries"), py::arg("max_keys"),
      py::arg("q"), py::arg("k_pages"), py::arg("v_pages"), py::arg("page_table"), py::arg("o"),
      py::arg("lse"), py::arg("workspace"), py::arg("mode"), py::arg("k"), py::arg("L"),
      py::arg("expand_width"), py::arg("walk_through"), py::arg("degree_cap"), py::arg("beta"),
      py::arg("l0"), py::arg("max_results"), py::arg("expand_limit"), py::arg("max_hops"),
      py::arg("sink"), py::arg("window"), py::arg("dense_when_capped"), py::arg("scale"),
      py::arg("stream"), py::arg("status") = py::none(), py::arg("carry") = py::none(),
      py::arg("sizes") = py::none(), py::arg("seed_from_window") = false,
      py::arg("capped") = py::none(), py::arg("entry_prefix") = 0, py::arg("unindexed") = 0,
      py::arg("routes") = py::none(), py::arg("route_top") = 4, py::arg("route_group") = 1,
      py::arg("route_probe") = 0,
      "Low level: one retrieval-attention decode step into (o, lse). Use kvsift.cuda.decode_step.");

  m.def(
      "decode_search_sizes",
      [](std::int64_t graphs, std::int64_t rows, std::int64_t width, std::int64_t max_entries,
         std::int64_t max_keys, std::int64_t queries, const std::string& mode,
         const std::string& metric, int k, int L, int expand_width, bool walk_through,
         int degree_cap, float beta, int l0, int max_results, int expand_limit, int max_hops,
         int entry_prefix) {
        const auto p = search_knobs(mode, k, L, expand_width, walk_through, degree_cap, beta, l0,
                                    max_results, metric, expand_limit, max_hops, entry_prefix);
        const auto g = graph_sizes(graphs, rows, width, max_entries, max_keys);
        return py::make_tuple(ops::decode_search_capacity(p),
                              ops::decode_search_workspace_size(g, queries, p));
      },
      py::arg("graphs"), py::arg("rows"), py::arg("width"), py::arg("max_entries"),
      py::arg("max_keys"), py::arg("queries"), py::arg("mode"), py::arg("metric"), py::arg("k"),
      py::arg("L"), py::arg("expand_width"), py::arg("walk_through"), py::arg("degree_cap"),
      py::arg("beta"), py::arg("l0"), py::arg("max_results"), py::arg("expand_limit"),
      py::arg("max_hops"), py::arg("entry_prefix") = 0,
      "(result slots per query, bytes of device workspace) of decode_search; raises for bad "
      "parameters (max_keys outside [1, rows] included).");

  m.def(
      "decode_search",
      [](py::handle adjacency, py::handle row_offset, py::handle entries, std::int64_t max_keys,
         py::handle q, py::object keys, py::object k_pages, py::object page_table, py::handle graph,
         py::object seed_score, py::object filter_first, py::object filter_last, py::object seeds,
         py::handle ids, py::handle scores, py::handle counts, py::handle scored, py::object best,
         py::object capped, py::handle workspace, const std::string& mode,
         const std::string& metric, int k, int L, int expand_width, bool walk_through,
         int degree_cap, float beta, int l0, int max_results, int expand_limit, int max_hops,
         std::intptr_t stream, py::object status, py::object sizes, int entry_prefix) {
        const intake in{stream};
        const tensor tadj = in(adjacency, "adjacency");
        ops::decode_graphs g =
            graphs_of(tadj, in(row_offset, "row_offset"), in(entries, "entries"), max_keys);
        g.sizes = optional_vector<std::uint32_t>(sizes, in, g.num_graphs, "sizes");
        const ops::decode_search_knobs p =
            search_knobs(mode, k, L, expand_width, walk_through, degree_cap, beta, l0, max_results,
                         metric, expand_limit, max_hops, entry_prefix);
        const tensor tq = in(q, "q");
        require_kind(tq, 'f', 4, "q", "float32");
        require<kvsift::dimension_mismatch>(tq.ndim() == 2, "q: expected [queries, dim], got ",
                                            tq.ndim(), " axes");
        const std::int64_t m = tq.shape[0], dim = tq.shape[1];
        const int capacity = ops::decode_search_capacity(p);
        ops::decode_search_queries qs;
        qs.q = ptr<float>(tq);
        const tensor tg = in(graph, "graph");
        require_kind(tg, 'i', 4, "graph", "int32");
        require_shape(tg, {m}, "graph");
        qs.graph = ptr<std::int32_t>(tg);
        qs.seed_score = optional_vector<float>(seed_score, in, m, "seed_score");
        qs.filter_first = optional_vector<std::uint32_t>(filter_first, in, m, "filter_first");
        qs.filter_last = optional_vector<std::uint32_t>(filter_last, in, m, "filter_last");
        if (!seeds.is_none()) {
          const tensor tseeds = in(seeds, "seeds");
          require<kvsift::dimension_mismatch>(tseeds.ndim() == 2,
                                              "seeds: expected [queries, seeds per query], got ",
                                              tseeds.ndim(), " axes");
          require_u32(tseeds, {m, tseeds.shape[1]}, "seeds");
          qs.seeds = ptr<std::uint32_t>(tseeds);
          qs.seeds_ld = kernel_int<int>(tseeds.shape[1], "seeds per query");
        }
        ops::decode_search_outputs out;
        const tensor ti = in(ids, "ids");
        require_u32(ti, {m, capacity}, "ids");
        out.ids = ptr<std::uint32_t>(ti);
        const tensor ts = in(scores, "scores");
        require_kind(ts, 'f', 4, "scores", "float32");
        require_shape(ts, {m, capacity}, "scores");
        out.scores = ptr<float>(ts);
        const tensor tc = in(counts, "counts");
        require_u32(tc, {m}, "counts");
        out.counts = ptr<std::uint32_t>(tc);
        const tensor tn = in(scored, "scored");
        require_u32(tn, {m}, "scored");
        out.scored = ptr<std::uint32_t>(tn);
        out.best = optional_vector<float>(best, in, m, "best");
        out.capped = optional_vector<std::uint32_t>(capped, in, m, "capped");
        if (!status.is_none())
          out.status = reinterpret_cast<std::uint32_t*>(status_ptr(status, in));
        const tensor tw = in(workspace, "workspace");
        const ops::graph_keys kk =
            graph_keys_of(in, keys, k_pages, page_table, tadj.shape[0], dim, "decode_search");
        py::gil_scoped_release release;
        ops::decode_search(g, kk, qs, m, p, out, ptr(tw), bytes_of(tw), stream);
      },
      py::arg("adjacency"), py::arg("row_offset"), py::arg("entries"), py::arg("max_keys"),
      py::arg("q"), py::arg("keys"), py::arg("k_pages"), py::arg("page_table"), py::arg("graph"),
      py::arg("seed_score"), py::arg("filter_first"), py::arg("filter_last"), py::arg("seeds"),
      py::arg("ids"), py::arg("scores"), py::arg("counts"), py::arg("scored"), py::arg("best"),
      py::arg("capped"), py::arg("workspace"), py::arg("mode"), py::arg("metric"), py::arg("k"),
      py::arg("L"), py::arg("expand_width"), py::arg("walk_through"), py::arg("degree_cap"),
      py::arg("beta"), py::arg("l0"), py::arg("max_results"), py::arg("expand_limit"),
      py::arg("max_hops"), py::arg("stream"), py::arg("status") = py::none(),
      py::arg("sizes") = py::none(), py::arg("entry_prefix") = 0,
      "Low level: the batched GPU graph search into padded rows. Use kvsift.cuda.decode_search.");

  m.def(
      "route_seeds",
      [](py::handle vectors, py::handle lists, py::handle offset, py::object centroids,
         py::object cluster_offset, py::object cluster_rows, std::int64_t max_rows,
         std::int64_t max_clusters, std::int64_t max_cluster_rows, py::handle q, py::handle graph,
         py::handle seeds, int top, int group, int probe, std::intptr_t stream, py::object status) {
        const intake in{stream};
        const ops::route_sets r =
            route_intake(in, vectors, lists, offset, centroids, cluster_offset, cluster_rows,
                         max_rows, max_clusters, max_cluster_rows);
        const std::int64_t dim = r.dim;
        const tensor tq = in(q, "q");
        require_kind(tq, 'f', 4, "q", "float32");
        require<kvsift::dimension_mismatch>(tq.ndim() == 2 && tq.shape[1] == dim,
                                            "q: expected [queries, ", dim, "] (the vectors' dim)");
        const std::int64_t m = tq.shape[0];
        const tensor tg = in(graph, "graph");
        require_kind(tg, 'i', 4, "graph", "int32");
        require_shape(tg, {m}, "graph");
        const int ld = ops::route_seeds_ld(r.list_len, top, group, probe);
        const tensor ts = in(seeds, "seeds");
        require_u32(ts, {m, ld}, "seeds");
        std::uint32_t* st =
            status.is_none() ? nullptr : reinterpret_cast<std::uint32_t*>(status_ptr(status, in));
        py::gil_scoped_release release;
        ops::route_seeds(r, ptr<float>(tq), ptr<std::int32_t>(tg), m, top, group, probe,
                         ptr<std::uint32_t>(ts), st, stream);
      },
      py::arg("vectors"), py::arg("lists"), py::arg("offset"), py::arg("centroids"),
      py::arg("cluster_offset"), py::arg("cluster_rows"), py::arg("max_rows"),
      py::arg("max_clusters"), py::arg("max_cluster_rows"), py::arg("q"), py::arg("graph"),
      py::arg("seeds"), py::arg("top"), py::arg("group"), py::arg("probe"), py::arg("stream"),
      py::arg("status") = py::none(),
      "Low level: kvsift::cuda::route_seeds into seeds [queries, top * list_len]. Use "
      "kvsift.cuda.route_seeds.");
  m.def(
      "route_seeds_ld",
      [](int list_len, int top, int group, int probe) {
        return ops::route_seeds_ld(list_len, top, group, probe);
      },
      py::arg("list_len"), py::arg("top"), py::arg("group"), py::arg("probe"),
      "Seeds per query of route_seeds (top * list_len); raises for parameters out of range.");

  bind_batch_insert(m);

  m.def(
      "decode_results_to_csr",
      [](py::handle ids, py::handle counts, py::handle indptr, py::handle indices,
         std::intptr_t stream) {
        const intake in{stream};
        const tensor ti = in(ids, "ids");
        require<kvsift::dimension_mismatch>(ti.ndim() == 2, "ids: expected [queries, capacity], ",
                                            "got ", ti.ndim(), " axes");
        const std::int64_t m = ti.shape[0], capacity = ti.shape[1];
        require_u32(ti, {m, capacity}, "ids");
        const tensor tc = in(counts, "counts");
        require_u32(tc, {m}, "counts");
        const tensor tp = in(indptr, "indptr");
        require_kind(tp, 'i', 8, "indptr", "int64");
        require_shape(tp, {m + 1}, "indptr");
        const tensor tx = in(indices, "indices");
        require_kind(tx, 'i', 4, "indices", "int32");
        require_shape(tx, {m * capacity}, "indices");
        py::gil_scoped_release release;
        ops::decode_results_to_csr(ptr<std::uint32_t>(ti), ptr<std::uint32_t>(tc), m,
                                   as_int(capacity, "capacity"), ptr<std::int64_t>(tp),
                                   ptr<std::int32_t>(tx), stream);
      },
      py::arg("ids"), py::arg("counts"), py::arg("indptr"), py::arg("indices"), py::arg("stream"),
      "Low level: padded search rows to CSR (indptr, indices). Use kvsift.cuda.results_to_csr.");

  m.def(
      "build_roargraph",
      [](py::handle keys, py::handle train, std::size_t nq, std::size_t M, std::size_t L,
         std::size_t threads, std::uint64_t seed) {
        const tensor tk = kvsift_python::tensor_of(keys, "keys");
        const tensor tt = kvsift_python::tensor_of(train, "train_queries");
        require(tk.is_f32() || tk.is_f16(), "keys: expected float32 or float16, got ", tk.dl_dtype);
        require_kind(tt, 'f', 4, "train_queries", "float32");
        require<kvsift::dimension_mismatch>(tk.ndim() == 2 && tt.ndim() == 2,
                                            "build_roargraph: expected keys (n, d) and "
                                            "train_queries (m, d), got ",
                                            tk.ndim(), " and ", tt.ndim(), " axes");
        require<kvsift::dimension_mismatch>(tt.shape[1] == tk.shape[1],
                                            "train_queries: expected dimension ", tk.shape[1],
                                            " (the keys'), got ", tt.shape[1]);
        require_contiguous(tk, "keys");
        require_contiguous(tt, "train_queries");
        const ops::build_knobs p{nq, M, L, threads, seed};
        ops::built_graph g;
        {
          py::gil_scoped_release release;
          g = ops::build_roargraph(tk.is_f32() ? ops::dtype::f32 : ops::dtype::f16, ptr(tk),
                                   tk.shape[0], as_int(tk.shape[1], "dim"), ptr<float>(tt),
                                   tt.shape[0], p);
        }
        return py::make_tuple(py::bytes(g.bytes),
                              py::make_tuple(g.knn_seconds, g.projection_seconds,
                                             g.connectivity_seconds, g.total_seconds));
      },
      py::arg("keys"), py::arg("train_queries"), py::arg("nq"), py::arg("M"), py::arg("L"),
      py::arg("threads"), py::arg("seed"),
      "Low level: a RoarGraph built with its kNN and step-3 searches on the current GPU, as "
      "(graph bytes, build seconds). Use kvsift.cuda.build_index.");

  m.def(
      "build_roargraphs",
      [](py::sequence keys, py::sequence trains, std::size_t nq, std::size_t M, std::size_t L,
         std::size_t threads, std::uint64_t seed, int builders, py::sequence device_ids) {
        std::vector<int> devices;
        for (const auto& d : device_ids) devices.push_back(d.cast<int>());
        require(py::len(keys) == py::len(trains),
                "build_roargraphs: expected as many training "
                "query sets as key sets (",
                py::len(keys), "), got ", py::len(trains));
        require(builders >= 1, "builders: expected >= 1, got ", builders);
        std::vector<tensor> tks, tts;  // keep the DLPack views alive through the build
        std::vector<ops::build_head> heads;
        int dim = 0;
        bool f32 = true;
        for (std::size_t h = 0; h < py::len(keys); ++h) {
          tks.push_back(kvsift_python::tensor_of(keys[h], "keys"));
          tts.push_back(kvsift_python::tensor_of(trains[h], "train_queries"));
          const tensor& tk = tks.back();
          const tensor& tt = tts.back();
          require(tk.is_f32() || tk.is_f16(), "keys[", h, "]: expected float32 or float16, got ",
                  kvsift_python::dtype_name(tk));
          require(h == 0 || tk.is_f32() == f32, "keys[", h, "]: expected the dtype of keys[0]");
          require_kind(tt, 'f', 4, "train_queries", "float32");
          require<kvsift::dimension_mismatch>(tk.ndim() == 2 && tt.ndim() == 2, "head ", h,
                                              ": expected keys (n, d) and train_queries (m, d), "
                                              "got ",
                                              tk.ndim(), " and ", tt.ndim(), " axes");
          if (h == 0) {
            dim = as_int(tk.shape[1], "dim");
            f32 = tk.is_f32();
          }
          require<kvsift::dimension_mismatch>(tk.shape[1] == dim && tt.shape[1] == dim, "head ", h,
                                              ": expected dimension ", dim, ", got keys ",
                                              tk.shape[1], " and train_queries ", tt.shape[1]);
          require_contiguous(tk, "keys");
          require_contiguous(tt, "train_queries");
          heads.push_back({ptr(tk), tk.shape[0], ptr<float>(tt), tt.shape[0]});
        }
        const ops::build_knobs p{nq, M, L, threads, seed};
        std::vector<ops::built_graph> gs;
        {
          py::gil_scoped_release release;
          gs = ops::build_roargraphs(f32 ? ops::dtype::f32 : ops::dtype::f16, heads, dim, p,
                                     builders, devices);
        }
        py::list out;
        for (const auto& g : gs) {
          out.append(py::make_tuple(py::bytes(g.bytes),
                                    py::make_tuple(g.knn_seconds, g.projection_seconds,
                                                   g.connectivity_seconds, g.total_seconds)));
        }
        return out;
      },
      py::arg("keys"), py::arg("train_queries"), py::arg("nq"), py::arg("M"), py::arg("L"),
      py::arg("threads"), py::arg("seed"), py::arg("builders"), py::arg("devices"),
      "Low level: build_roargraph for a list of heads, sharded over `builders` builders, "
      "builder b on devices[b % len(devices)] (the current GPU if empty), as a list of (graph "
      "bytes, build seconds). Use kvsift.cuda.build_indexes.");

  m.def(
      "knn_workspace_size",
      [](std::int64_t m, std::int64_t n, std::int64_t k) {
        return ops::knn_workspace_size(m, n, as_int(k, "k"));
      },
      py::arg("m"), py::arg("n"), py::arg("k"),
      "Bytes of device workspace knn needs for m queries, n keys and k neighbours.");

  m.def(
      "knn",
      [](py::handle queries, py::handle keys, std::int64_t k, py::handle out_scores,
         py::handle out_ids, py::handle workspace, std::intptr_t stream) {
        const intake in{stream};
        const tensor tq = in(queries, "queries");
        const tensor tk = in(keys, "keys");
        const tensor ts = in(out_scores, "out_scores");
        const tensor ti = in(out_ids, "out_ids");
        const tensor tw = in(workspace, "workspace");
        require<kvsift::dimension_mismatch>(tq.ndim() == 2, "queries: expected [m, dim], got ",
                                            tq.ndim(), " axes");
        require<kvsift::dimension_mismatch>(tk.ndim() == 2, "keys: expected [n, dim], got ",
                                            tk.ndim(), " axes");
        const ops::dtype t = value_type(tq, "queries");
        require(value_type(tk, "keys") == t, "knn: keys must have the queries' dtype ", tq.dl_dtype,
                ", got ", tk.dl_dtype);
        const std::int64_t m = tq.shape[0], n = tk.shape[0], dim = tq.shape[1];
        require<kvsift::dimension_mismatch>(tk.shape[1] == dim, "knn: keys have dim ", tk.shape[1],
                                            ", queries ", dim);
        // kvsift's ids are uint32; as int32 they keep their bits only below 2^31.
        require(n <= std::numeric_limits<std::int32_t>::max(), "keys: at most ",
                std::numeric_limits<std::int32_t>::max(), " rows (ids are int32), got ", n);
        require_kind(ts, 'f', 4, "out_scores", "float32");
        require_shape(ts, {m, k}, "out_scores");
        require_kind(ti, 'i', 4, "out_ids", "int32");
        require_shape(ti, {m, k}, "out_ids");
        py::gil_scoped_release release;
        ops::knn(t, ptr(tq), m, ptr(tk), n, as_int(dim, "dim"), as_int(k, "k"), ptr<float>(ts),
                 ptr<std::int32_t>(ti), ptr(tw), bytes_of(tw), stream);
      },
      py::arg("queries"), py::arg("keys"), py::arg("k"), py::arg("out_scores"), py::arg("out_ids"),
      py::arg("workspace"), py::arg("stream"),
      "Low level: exact top-k keys by inner product into (out_scores, out_ids). Use "
      "kvsift.cuda.knn.");

  m.def(
      "copy_pages",
      [](bool gather, py::handle copies, py::handle host_pool, py::handle device_pool,
         std::intptr_t stream, py::object status) {
        const intake in{stream};
        const tensor tc = in(copies, "copies");
        const tensor td = in(device_pool, "device_pool");
        require(!py::isinstance<py::array>(host_pool), "host_pool: expected a pinned torch ",
                "tensor (torch.empty(..., pin_memory=True)), got a numpy.ndarray");
        const tensor th = kvsift_python::detail::from_dlpack(host_pool, "host_pool");
        require_contiguous(th, "host_pool");
        require_kind(tc, 'i', 8, "copies", "int64");
        require<kvsift::dimension_mismatch>(
            tc.ndim() == 2 && tc.shape[1] == 2,
            "copies: expected [count, 2] (cpu_page, gpu_page), got ", tc.ndim(), " axes");
        auto page_bytes = [](const tensor& t, const char* what) {
          require<kvsift::dimension_mismatch>(t.ndim() >= 2, what,
                                              ": expected [pages, ...] with a page per row, got ",
                                              t.ndim(), " axes");
          return bytes_of(t, 1);
        };
        const std::uint64_t hb = page_bytes(th, "host_pool"), db = page_bytes(td, "device_pool");
        require<kvsift::dimension_mismatch>(hb == db, "copy_pages: host pages of ", hb,
                                            " bytes, device pages of ", db, " bytes");
        const std::uint64_t count = static_cast<std::uint64_t>(tc.shape[0]);
        // The kernel reads or writes the host pool through its device mapping: pageable memory
        // would fault on the device. Checked only when there is something to copy.
        require(count == 0 || th.shape[0] == 0 || ops::is_pinned_host(th.data), "host_pool: ",
                "expected pinned (page-locked) host memory, got pageable memory (allocate it with "
                "torch.empty(..., pin_memory=True) or x.pin_memory())");
        int* st = status_ptr(status, in);
        py::gil_scoped_release release;
        ops::copy_pages(gather, count == 0 ? nullptr : ptr(tc), count, ptr(th),
                        static_cast<std::uint64_t>(th.shape[0]), ptr(td),
                        static_cast<std::uint64_t>(td.shape[0]), hb, st, stream);
      },
      py::arg("gather"), py::arg("copies"), py::arg("host_pool"), py::arg("device_pool"),
      py::arg("stream"), py::arg("status") = py::none(),
      "Low level: gather (host -> device) or scatter (device -> host) of whole pages. Use "
      "kvsift.cuda.gather_pages / scatter_pages.");

  m.def(
      "bucketed_lru_step",
      [](py::handle keys, py::handle ages, py::handle slot_of, py::handle selected,
         py::handle offsets, py::handle evicted_keys, py::handle evicted_slots,
         py::handle admitted_keys, py::handle admitted_slots, py::handle counts, py::handle status,
         int buckets, std::intptr_t stream, py::object limits) {
        const intake in{stream};
        const tensor tk = in(keys, "keys");
        const tensor ta = in(ages, "ages");
        const tensor ts = in(slot_of, "slot_of");
        const tensor tsel = in(selected, "selected");
        const tensor toff = in(offsets, "offsets");
        const auto [pairs, capacity, pages] = lru_state_shape(tk, ta, ts);
        require_kind(tsel, 'i', 4, "selected", "int32");
        require<kvsift::dimension_mismatch>(tsel.ndim() == 1, "selected: expected a 1-D tensor");
        require_kind(toff, 'i', 8, "offsets", "int64");
        require_shape(toff, {pairs + 1}, "offsets");
        const std::int64_t total = tsel.shape[0];
        // With limits a lowered limit may evict more pages than the step selects: every pair's
        // evictions get their own range of `capacity` entries (lru_step_io::eviction_stride).
        const std::uint32_t* lim = nullptr;
        if (!limits.is_none()) {
          const tensor tlim = in(limits, "limits");
          require_kind(tlim, 'i', 4, "limits", "int32");
          require_shape(tlim, {pairs}, "limits");
          lim = ptr<std::uint32_t>(tlim);
        }
        const std::int64_t evicted_total = lim != nullptr ? pairs * capacity : total;
        std::array<std::uint32_t*, 4> outs{};
        const std::array<py::handle, 4> out_handles{evicted_keys, evicted_slots, admitted_keys,
                                                    admitted_slots};
        const std::array<const char*, 4> out_names{"evicted_keys", "evicted_slots", "admitted_keys",
                                                   "admitted_slots"};
        for (std::size_t i = 0; i < 4; ++i) {
          const tensor t = in(out_handles[i], out_names[i]);
          require_kind(t, 'i', 4, out_names[i], "int32");
          const std::int64_t need = i < 2 ? evicted_total : total;
          require<kvsift::dimension_mismatch>(t.ndim() == 1 && t.shape[0] >= need, out_names[i],
                                              ": expected a 1-D tensor of at least ", need,
                                              i < 2 && lim != nullptr
                                                  ? " entries (pairs x capacity, with limits)"
                                                  : " entries (one per selected page)");
          outs[i] = ptr<std::uint32_t>(t);
        }
        const tensor tc = in(counts, "counts");
        require_kind(tc, 'i', 4, "counts", "int32");
        require_shape(tc, {pairs, 3}, "counts");
        const tensor tst = in(status, "status");
        require_kind(tst, 'i', 4, "status", "int32");
        require_shape(tst, {pairs}, "status");
        // The kernel's own checks (capacity <= 8192, pages < 2^31, buckets in [2, 256]) name
        // the limits; the sizes only have to reach it intact.
        const auto n_pairs = kernel_int<std::uint32_t>(pairs, "pairs");
        const auto cap = kernel_int<std::uint32_t>(capacity, "capacity");
        const auto n_pages = kernel_int<std::uint32_t>(pages, "pages");
        py::gil_scoped_release release;
        ops::bucketed_lru_step(
            ptr<std::uint32_t>(tk), ptr<std::uint8_t>(ta), ptr<std::uint32_t>(ts), n_pairs, cap,
            n_pages, ptr<std::uint32_t>(tsel), ptr<std::uint64_t>(toff), outs[0], outs[1], outs[2],
            outs[3], ptr<std::uint32_t>(tc), ptr<int>(tst), buckets, stream, lim,
            lim != nullptr ? static_cast<std::uint64_t>(capacity) : 0);
      },
      py::arg("keys"), py::arg("ages"), py::arg("slot_of"), py::arg("selected"), py::arg("offsets"),
      py::arg("evicted_keys"), py::arg("evicted_slots"), py::arg("admitted_keys"),
      py::arg("admitted_slots"), py::arg("counts"), py::arg("status"), py::arg("buckets"),
      py::arg("stream"), py::arg("limits") = py::none(),
      "Low level: one bucketed LRU step for every pair. Use kvsift.cuda.BucketedLRU.");
  m.def(
      "offloaded_reset",
      [](const py::tuple& state, std::intptr_t stream) {
        const intake in{stream};
        const offloaded_state st = offloaded_intake(in, state);
        py::gil_scoped_release release;
        ops::offloaded_reset(st.kv, st.l, stream);
      },
      py::arg("state"), py::arg("stream"),
      "Low level: empties an offloaded layer's LRU and page table. Use kvsift.cuda.OffloadedKV.");
  m.def(
      "offloaded_attention_workspace_size",
      [](const py::tuple& state, std::int64_t qo_heads, std::int64_t max_ids) {
        const offloaded_state st = offloaded_intake(intake{0}, state);
        require(max_ids >= 0, "max_ids: expected >= 0, got ", max_ids);
        return ops::offloaded_attention_workspace_size(st.kv, st.l, as_int(qo_heads, "qo_heads"),
                                                       static_cast<std::size_t>(max_ids));
      },
      py::arg("state"), py::arg("qo_heads"), py::arg("max_ids"),
      "Low level: workspace bytes of offloaded_attention. Use kvsift.cuda.OffloadedKV.");
  m.def(
      "offloaded_attention",
      [](const py::tuple& state, py::handle q, py::handle indptr, py::handle ids,
         std::int64_t max_ids, py::handle o, py::handle lse, py::handle workspace, float scale,
         int buckets, std::intptr_t stream, py::object status, py::object limits) {
        const intake in{stream};
        offloaded_state st = offloaded_intake(in, state);
        const tensor tq = in(q, "q"), ti = in(indptr, "indptr"), tid = in(ids, "ids");
        const tensor to = in(o, "o"), tl = in(lse, "lse"), tw = in(workspace, "workspace");
        require_kind(tq, 'f', 4, "q", "float32");
        require<kvsift::dimension_mismatch>(tq.ndim() == 2 && tq.shape[1] == st.l.dim,
                                            "q: expected [qo_heads, ", st.l.dim, "]");
        const std::int64_t heads = tq.shape[0];
        require_kind(ti, 'i', 8, "indptr", "int64");
        require_shape(ti, {heads + 1}, "indptr");
        require_kind(tid, 'i', 4, "ids", "int32");
        require<kvsift::dimension_mismatch>(tid.ndim() == 1, "ids: expected a 1-D tensor");
        require(max_ids >= 0 && max_ids <= tid.shape[0],
                "max_ids: expected 0 <= max_ids <= ", tid.shape[0], " (ids' length), got ",
                max_ids);
        require_kind(to, 'f', 4, "o", "float32");
        require_shape(to, {heads, st.l.dim}, "o");
        require_kind(tl, 'f', 4, "lse", "float32");
        require_shape(tl, {heads}, "lse");
        int* stp = status_ptr(status, in);
        if (!limits.is_none()) {
          const tensor tlim = in(limits, "limits");
          require_kind(tlim, 'i', 4, "limits", "int32");
          require_shape(tlim, {static_cast<std::int64_t>(st.l.pairs)}, "limits");
          st.l.limits = ptr<std::uint32_t>(tlim);
        }
        py::gil_scoped_release release;
        ops::offloaded_attention(
            st.kv, st.l, ptr<float>(tq), as_int(heads, "qo_heads"), ptr<std::int64_t>(ti),
            tid.shape[0] == 0 ? nullptr : ptr<std::int32_t>(tid), static_cast<std::size_t>(max_ids),
            ptr<float>(to), ptr<float>(tl), ptr(tw), bytes_of(tw), scale, buckets, stream, stp);
      },
      py::arg("state"), py::arg("q"), py::arg("indptr"), py::arg("ids"), py::arg("max_ids"),
      py::arg("o"), py::arg("lse"), py::arg("workspace"), py::arg("scale"), py::arg("buckets"),
      py::arg("stream"), py::arg("status") = py::none(), py::arg("limits") = py::none(),
      "Low level: kvsift::cuda::offloaded_attention. Use kvsift.cuda.OffloadedKV.attend.");
}
