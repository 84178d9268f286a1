// nvcc half of kvsift._kvsift_cuda: instantiates kvsift::cuda's merge, sparse attention,
// decode search, decode step and kNN kernels for f32 / f16 / bf16, the page copies and the bucketed
// LRU step, behind the pointer-level interface of cuda_ops.hpp.
#include "cuda_ops.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <kvsift/cuda/batch_insert.cuh>
#include <kvsift/cuda/bucketed_lru.cuh>
#include <kvsift/cuda/decode_step.cuh>
#include <kvsift/cuda/error.cuh>
#include <kvsift/cuda/knn.cuh>
#include <kvsift/cuda/merge.cuh>
#include <kvsift/cuda/offloaded_attention.cuh>
#include <kvsift/cuda/page_gather.cuh>
#include <kvsift/cuda/route_seeds.cuh>
#include <kvsift/cuda/sparse_attention.cuh>
#include <kvsift/index/build_pipeline.hpp>
#include <kvsift/index/graph_io.hpp>
#include <kvsift/index/roargraph_builder.hpp>

namespace kvsift_python::cuda_ops {
namespace {

namespace kc = kvsift::cuda;

cudaStream_t as_stream(std::intptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

/// Calls f(); a kvsift::cuda_error leaves as cuda_failure (the module's side has no CUDA
/// headers to catch the original).
template <class F>
void translating_errors(F&& f) try {
  f();
} catch (const kvsift::cuda_error& e) {
  throw cuda_failure(e.what());
}

/// Calls f with a typed null pointer of the element type `t` names, translating errors.
template <class F>
void with_type(dtype t, F&& f) {
  translating_errors([&] {
    switch (t) {
      case dtype::f32:
        f(static_cast<float*>(nullptr));
        return;
      case dtype::f16:
        f(static_cast<__half*>(nullptr));
        return;
      case dtype::bf16:
        f(static_cast<__nv_bfloat16*>(nullptr));
        return;
    }
  });
}

/// kvsift's element type for a CUDA one (the host-side kernels, e.g. knn, take kvsift's).
template <class T>
using kvsift_element_t =
    std::conditional_t<std::is_same_v<T, __half>, kvsift::half,
                       std::conditional_t<std::is_same_v<T, __nv_bfloat16>, kvsift::bfloat16, T>>;

/// Head-wise paged K/V of element type T over raw pointers.
template <class T>
kc::paged_kv_ref<T> paged_ref(const void* k_pages, const void* v_pages, std::int64_t num_pages,
                              int page_size, int dim, const std::int32_t* page_table, int kv_heads,
                              int max_pages_per_head) {
  kc::paged_kv_ref<T> ref;
  ref.k_pages = static_cast<const T*>(k_pages);
  ref.v_pages = static_cast<const T*>(v_pages);
  ref.num_pages = num_pages;
  ref.page_size = page_size;
  ref.head_dim = dim;
  ref.page_table = page_table;
  ref.num_kv_heads = kv_heads;
  ref.max_pages_per_head = max_pages_per_head;
  return ref;
}

// Throws cuda_failure naming the call that failed and the error, unless err is cudaSuccess.
void check_cuda(cudaError_t err, const char* call) {
  if (err != cudaSuccess) {
    throw cuda_failure(std::string(call) + " failed: " + cudaGetErrorName(err) + " (" +
                       cudaGetErrorString(err) + ")");
  }
}

}  // namespace

int current_device() {
  int d = -1;
  check_cuda(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}

void merge_state(dtype t, const void* v_a, const float* s_a, const void* v_b, const float* s_b,
                 void* v_out, float* s_out, std::int64_t rows, int heads, int dim,
                 std::intptr_t stream, int* status) {
  with_type(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    kc::merge_state(static_cast<const T*>(v_a), s_a, static_cast<const T*>(v_b), s_b,
                    static_cast<T*>(v_out), s_out, rows, heads, dim, as_stream(stream), {}, status);
  });
}

void merge_state_in_place(dtype t, void* v, float* s, const void* v_other, const float* s_other,
                          std::int64_t rows, int heads, int dim, std::intptr_t stream,
                          int* status) {
  with_type(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    kc::merge_state_in_place(static_cast<T*>(v), s, static_cast<const T*>(v_other), s_other, rows,
                             heads, dim, as_stream(stream), {}, status);
  });
}

void merge_states(dtype t, const void* v, const float* s, std::int64_t num_states,
                  const std::int64_t* indptr, std::int64_t num_pos, int heads, int dim, void* v_out,
                  float* s_out, std::intptr_t stream, int* status) {
  with_type(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    kc::merge_states(static_cast<const T*>(v), s, num_states, indptr, num_pos, heads, dim,
                     static_cast<T*>(v_out), s_out, as_stream(stream), {}, status);
  });
}

std::size_t sparse_attention_workspace_size(int qo_heads, int dim, int num_splits) {
  kc::sparse_attention_params p;
  p.num_splits = num_splits;
  std::size_t bytes = 0;
  translating_errors([&] { bytes = kc::sparse_attention_workspace_size(qo_heads, dim, p); });
  return bytes;
}

void sparse_attention(dtype kv, const float* q, int qo_heads, int dim, const void* k_pages,
                      const void* v_pages, std::int64_t num_pages, int page_size,
                      const std::int32_t* page_table, int kv_heads, int max_pages_per_head,
                      const std::int64_t* indptr, const std::int32_t* ids, float* out_o,
                      float* out_lse, void* workspace, std::size_t workspace_bytes, float scale,
                      int num_splits, std::intptr_t stream, int* status) {
  kc::sparse_attention_params p;
  if (!std::isnan(scale)) p.scale = scale;
  p.num_splits = num_splits;
  p.status = status;
  with_type(kv, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto ref = paged_ref<T>(k_pages, v_pages, num_pages, page_size, dim, page_table, kv_heads,
                                  max_pages_per_head);
    kc::sparse_attention(q, qo_heads, dim, ref, indptr, ids, out_o, out_lse, workspace,
                         workspace_bytes, as_stream(stream), p);
  });
}

namespace {

kc::graph_set_ref graph_ref(const decode_graphs& g) {
  kc::graph_set_ref r;
  r.adjacency = g.adjacency;
  r.row_offset = g.row_offset;
  r.entries = g.entries;
  r.num_graphs = g.num_graphs;
  r.width = g.width;
  r.max_entries = g.max_entries;
  r.max_keys = g.max_keys;
  r.sizes = g.sizes;
  return r;
}

kc::decode_search_params search_params(const decode_search_knobs& k) {
  kc::decode_search_params p;
  p.mode = k.dipr ? kc::decode_search_mode::dipr : kc::decode_search_mode::topk;
  p.metric = k.l2 ? kc::graph_metric::l2 : kc::graph_metric::inner_product;
  p.k = k.k;
  p.L = k.L;
  p.expand_width = k.expand_width;
  p.walk_through = k.walk_through;
  p.degree_cap = k.degree_cap;
  p.beta = k.beta;
  p.l0 = k.l0;
  p.max_results = k.max_results;
  p.expand_limit = k.expand_limit;
  p.max_hops = k.max_hops;
  p.entry_prefix = k.entry_prefix;
  return p;
}

kc::decode_step_params step_params(const decode_step_knobs& k) {
  kc::decode_step_params p;
  p.search = search_params(k.search);
  p.sink = k.sink;
  p.window = k.window;
  p.unindexed = k.unindexed;
  p.dense_when_capped = k.dense_when_capped;
  p.seed_from_window = k.seed_from_window;
  if (!std::isnan(k.scale)) p.scale = k.scale;
  return p;
}

kc::route_params route_knobs(int top, int group, int probe) {
  kc::route_params p;
  p.top = top;
  p.group = group;
  p.probe = probe;
  return p;
}

template <class T>
kc::route_set_ref<T> route_ref(const route_sets& r) {
  return {static_cast<const T*>(r.vectors),
          r.dim,
          r.dim,
          reinterpret_cast<const kvsift::id_t*>(r.lists),
          r.list_len,
          r.offset,
          r.num_graphs,
          r.max_rows,
          static_cast<const T*>(r.centroids),
          r.cluster_offset,
          r.cluster_rows,
          r.max_clusters,
          r.max_cluster_rows};
}

}  // namespace

std::size_t decode_step_workspace_size(const decode_graphs& g, int qo_heads, int dim,
                                       const decode_step_knobs& p, const step_routing& r) {
  std::size_t bytes = 0;
  translating_errors([&] {
    if (r.sets == nullptr) {
      bytes = kc::decode_step_workspace_size(graph_ref(g), qo_heads, dim, step_params(p));
    } else {
      // The size reads the list length and the routing parameters only.
      kc::decode_step_routes<float> routes;
      routes.set.list_len = r.sets->list_len;
      routes.params = route_knobs(r.top, r.group, r.probe);
      bytes = kc::decode_step_workspace_size(graph_ref(g), qo_heads, dim, step_params(p), routes);
    }
  });
  return bytes;
}

void decode_step(dtype kv, const decode_graphs& g, const void* k_pages, const void* v_pages,
                 std::int64_t num_pages, int page_size, const std::int32_t* page_table,
                 int max_pages_per_head, const float* q, int qo_heads, int dim, float* out_o,
                 float* out_lse, void* workspace, std::size_t workspace_bytes,
                 const decode_step_knobs& p, std::uint32_t* status, std::intptr_t stream,
                 std::uint32_t* carry, std::uint32_t* capped, const step_routing& routes) {
  with_type(kv, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto ref = paged_ref<T>(k_pages, v_pages, num_pages, page_size, dim, page_table,
                                  g.num_graphs, max_pages_per_head);
    auto* ids = reinterpret_cast<kvsift::id_t*>(carry);
    if (routes.sets == nullptr) {
      kc::decode_step(graph_ref(g), ref, q, qo_heads, dim, out_o, out_lse, workspace,
                      workspace_bytes, as_stream(stream), step_params(p), status, ids, capped);
      return;
    }
    with_type(routes.sets->type, [&](auto* rtag) {
      using R = std::remove_pointer_t<decltype(rtag)>;
      const kc::decode_step_routes<R> rt{route_ref<R>(*routes.sets),
                                         route_knobs(routes.top, routes.group, routes.probe)};
      kc::decode_step(graph_ref(g), rt, ref, q, qo_heads, dim, out_o, out_lse, workspace,
                      workspace_bytes, as_stream(stream), step_params(p), status, ids, capped);
    });
  });
}

namespace {

kc::decode_queries search_queries(const decode_search_queries& q, int dim) {
  kc::decode_queries r;
  r.q = q.q;
  r.ld = dim;
  r.graph = q.graph;
  r.seed_score = q.seed_score;
  r.filter_first = q.filter_first;
  r.filter_last = q.filter_last;
  r.seeds = q.seeds;
  r.seeds_ld = q.seeds_ld;
  return r;
}

kc::decode_search_outputs search_outputs(const decode_search_outputs& o) {
  kc::decode_search_outputs r;
  r.ids = o.ids;
  r.scores = o.scores;
  r.counts = o.counts;
  r.scored = o.scored;
  r.best_scores = o.best;
  r.status = o.status;
  r.capped = o.capped;
  return r;
}

}  // namespace

int decode_search_capacity(const decode_search_knobs& p) {
  int c = 0;
  translating_errors([&] { c = kc::decode_search_capacity(search_params(p)); });
  return c;
}

std::size_t decode_search_workspace_size(const decode_graphs& g, std::int64_t m,
                                         const decode_search_knobs& p) {
  std::size_t bytes = 0;
  translating_errors(
      [&] { bytes = kc::decode_search_workspace_size(graph_ref(g), m, search_params(p)); });
  return bytes;
}

namespace {

/// Calls f with the keys as the kvsift::cuda reference of their element type: dense_keys_ref<T>
/// or paged_kv_ref<T> (V aliases K: the searches and inserts read K only).
template <class F>
void with_keys(const graph_keys& k, F&& f) {
  with_type(k.type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (k.dense != nullptr) {
      kc::dense_keys_ref<T> ref;
      ref.keys = static_cast<const T*>(k.dense);
      ref.ld = k.dim;
      ref.dim = k.dim;
      f(ref);
    } else {
      f(paged_ref<T>(k.k_pages, k.k_pages, k.num_pages, k.page_size, k.dim, k.page_table,
                     k.table_rows, k.max_pages_per_head));
    }
  });
}

}  // namespace

void decode_search(const decode_graphs& g, const graph_keys& keys, const decode_search_queries& q,
                   std::int64_t m, const decode_search_knobs& p, const decode_search_outputs& out,
                   void* workspace, std::size_t workspace_bytes, std::intptr_t stream) {
  with_keys(keys, [&](const auto& ref) {
    kc::decode_search(graph_ref(g), ref, search_queries(q, keys.dim), m, search_params(p),
                      search_outputs(out), workspace, workspace_bytes, as_stream(stream));
  });
}

int route_seeds_ld(int list_len, int top, int group, int probe) {
  int ld = 0;
  translating_errors([&] { ld = kc::route_seeds_ld(list_len, route_knobs(top, group, probe)); });
  return ld;
}

void route_seeds(const route_sets& r, const float* q, const std::int32_t* graph, std::int64_t m,
                 int top, int group, int probe, std::uint32_t* seeds, std::uint32_t* status,
                 std::intptr_t stream) {
  with_type(r.type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const kc::route_set_ref<T> ref = route_ref<T>(r);
    const kc::decode_queries qs{q, r.dim, graph};
    kc::route_seeds(ref, qs, m, route_knobs(top, group, probe),
                    reinterpret_cast<kvsift::id_t*>(seeds), status, as_stream(stream));
  });
}

void decode_results_to_csr(const std::uint32_t* ids, const std::uint32_t* counts, std::int64_t m,
                           int capacity, std::int64_t* indptr, std::int32_t* indices,
                           std::intptr_t stream) {
  translating_errors([&] {
    kc::decode_results_to_csr(reinterpret_cast<const kvsift::id_t*>(ids), counts, m, capacity,
                              indptr, indices, as_stream(stream));
  });
}

std::size_t knn_workspace_size(std::int64_t m, std::int64_t n, int k) {
  return kc::knn_workspace_size(m, n, k);
}

void knn(dtype t, const void* queries, std::int64_t m, const void* keys, std::int64_t n, int dim,
         int k, float* out_scores, std::int32_t* out_ids, void* workspace,
         std::size_t workspace_bytes, std::intptr_t stream) {
  // One handle per device for the process; the mutex covers setting its stream and enqueuing.
  static std::mutex mutex;
  static std::map<int, cublasHandle_t> handles;
  const int device = current_device();
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = handles.find(device);
  if (it == handles.end()) {
    cublasHandle_t h = nullptr;
    const cublasStatus_t st = cublasCreate(&h);
    if (st != CUBLAS_STATUS_SUCCESS) {
      throw cuda_failure("cublasCreate failed with status " + std::to_string(static_cast<int>(st)));
    }
    it = handles.emplace(device, h).first;
  }
  with_type(t, [&](auto* tag) {
    using E = kvsift_element_t<std::remove_pointer_t<decltype(tag)>>;
    const kvsift::matrix_view<const E> q(
        static_cast<const E*>(queries), static_cast<std::size_t>(m), static_cast<std::size_t>(dim));
    const kvsift::matrix_view<const E> x(static_cast<const E*>(keys), static_cast<std::size_t>(n),
                                         static_cast<std::size_t>(dim));
    kc::knn(q, x, k, out_scores, reinterpret_cast<kvsift::id_t*>(out_ids), workspace,
            workspace_bytes, it->second, as_stream(stream));
  });
}

namespace {

kvsift::roargraph_params params_of(const build_knobs& k) {
  kvsift::roargraph_params p;
  p.nq = k.nq;
  p.M = k.M;
  p.L = k.L;
  p.threads = k.threads;
  p.seed = k.seed;
  return p;
}

template <class G>
built_graph to_built(const G& g, const kvsift::roargraph_build_stats& st) {
  built_graph out;
  std::ostringstream bytes(std::ios::binary);
  kvsift::write_graph(g, bytes);
  out.bytes = std::move(bytes).str();
  out.knn_seconds = st.knn_seconds;
  out.projection_seconds = st.projection_seconds;
  out.connectivity_seconds = st.connectivity_seconds;
  out.total_seconds = st.total_seconds;
  return out;
}

}  // namespace

std::vector<built_graph> build_roargraphs(dtype t, const std::vector<build_head>& heads, int dim,
                                          const build_knobs& k, int builders,
                                          const std::vector<int>& devices) {
  kvsift::detail::require(builders >= 1, "build_roargraphs: expected builders >= 1, got ",
                          builders);
  std::vector<int> on = devices;
  if (on.empty()) on.push_back(current_device());
  int count = 0;
  check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  for (std::size_t i = 0; i < on.size(); ++i) {
    kvsift::detail::require(on[i] >= 0 && on[i] < count, "devices[", i,
                            "]: expected a device id in [0, ", count, "), got ", on[i]);
  }
  kvsift::detail::require(static_cast<std::size_t>(builders) >= on.size(),
                          "builders: expected >= len(devices) = ", on.size(), ", got ", builders);
  std::vector<built_graph> out;
  with_type(t, [&](auto* tag) {
    using E = kvsift_element_t<std::remove_pointer_t<decltype(tag)>>;
    if constexpr (std::is_same_v<E, kvsift::bfloat16>) {
      throw kvsift::invalid_argument(
          "build_roargraphs: expected float32 or float16 keys (RoarGraphIndex's), got bfloat16");
    } else {
      using store = kvsift::view_store<E>;
      using builder = kvsift::roargraph_builder<kvsift::inner_product, kc::knn_engine>;
      // Each head's training queries as a GQA group of one, taken whole (sample_ratio 1 keeps
      // every row in order): the graph is build_roargraph's.
      std::vector<kvsift::kv_head_job<store>> jobs;
      for (const build_head& h : heads) {
        jobs.push_back({store(kvsift::matrix_view<const E>(static_cast<const E*>(h.keys),
                                                           static_cast<std::size_t>(h.n),
                                                           static_cast<std::size_t>(dim))),
                        {kvsift::matrix_view<const float>(h.train, static_cast<std::size_t>(h.m),
                                                          static_cast<std::size_t>(dim))}});
      }
      kvsift::roargraph_params p = params_of(k);
      const std::size_t total = k.threads != 0 ? k.threads : kvsift::default_thread_count();
      p.threads = std::max<std::size_t>(1, total / static_cast<std::size_t>(builders));
      std::vector<builder> bs;
      for (int b = 0; b < builders; ++b) {
        bs.emplace_back(p, kc::knn_engine({.device = on[static_cast<std::size_t>(b) % on.size()]}));
      }
      std::vector<kvsift::roargraph_build_stats> stats;
      const auto graphs = kvsift::build_heads_sharded(
          std::span<const builder>(bs), std::span<const kvsift::kv_head_job<store>>(jobs),
          {.sample_ratio = 1.0}, &stats);
      for (std::size_t h = 0; h < graphs.size(); ++h) out.push_back(to_built(graphs[h], stats[h]));
    }
  });
  return out;
}

built_graph build_roargraph(dtype t, const void* keys, std::int64_t n, int dim, const float* train,
                            std::int64_t m, const build_knobs& k) {
  const kvsift::roargraph_params p = params_of(k);
  built_graph out;
  with_type(t, [&](auto* tag) {
    using E = kvsift_element_t<std::remove_pointer_t<decltype(tag)>>;
    // RoarGraphIndex holds float32 or float16 keys; the builder is not instantiated for bf16.
    if constexpr (std::is_same_v<E, kvsift::bfloat16>) {
      throw kvsift::invalid_argument(
          "build_roargraph: expected float32 or float16 keys (RoarGraphIndex's), got bfloat16");
    } else {
      const kvsift::view_store<E> store(kvsift::matrix_view<const E>(
          static_cast<const E*>(keys), static_cast<std::size_t>(n), static_cast<std::size_t>(dim)));
      const kvsift::matrix_view<const float> q(train, static_cast<std::size_t>(m),
                                               static_cast<std::size_t>(dim));
      const kvsift::roargraph_builder<kvsift::inner_product, kc::knn_engine> b(
          p, kc::knn_engine({.device = current_device()}));
      kvsift::roargraph_build_stats st;
      const auto g = b.build(store, q, &st);
      out = to_built(g, st);
    }
  });
  return out;
}

bool is_pinned_host(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // an unregistered pointer is an answer here, not an error
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}

void copy_pages(bool gather, const void* copies, std::uint64_t count, void* host,
                std::uint64_t host_pages, void* device, std::uint64_t device_pages,
                std::uint64_t page_bytes, int* status, std::intptr_t stream) {
  static_assert(sizeof(kvsift::page_copy) == 16, "copies are (cpu_page, gpu_page) uint64 pairs");
  kc::page_pools_ref pools;
  pools.host = host;
  pools.host_pages = host_pages;
  pools.device = device;
  pools.device_pages = device_pages;
  pools.page_bytes = page_bytes;
  const auto* c = static_cast<const kvsift::page_copy*>(copies);
  translating_errors([&] {
    if (gather) {
      kc::gather_pages(c, count, pools, status, as_stream(stream));
    } else {
      kc::scatter_pages(c, count, pools, status, as_stream(stream));
    }
  });
}

void bucketed_lru_step(std::uint32_t* keys, std::uint8_t* ages, std::uint32_t* slot_of,
                       std::uint32_t pairs, std::uint32_t capacity, std::uint32_t pages,
                       const std::uint32_t* selected, const std::uint64_t* offsets,
                       std::uint32_t* evicted_keys, std::uint32_t* evicted_slots,
                       std::uint32_t* admitted_keys, std::uint32_t* admitted_slots,
                       std::uint32_t* counts, int* status, int buckets, std::intptr_t stream,
                       const std::uint32_t* limits, std::uint64_t eviction_stride) {
  kc::bucketed_lru_ref state;
  state.keys = keys;
  state.ages = ages;
  state.slot_of = slot_of;
  state.pairs = pairs;
  state.capacity = capacity;
  state.pages = pages;
  state.limits = limits;
  kc::lru_step_io io;
  io.selected = selected;
  io.offsets = offsets;
  io.evicted_keys = evicted_keys;
  io.evicted_slots = evicted_slots;
  io.admitted_keys = admitted_keys;
  io.admitted_slots = admitted_slots;
  io.counts = counts;
  io.status = status;
  io.eviction_stride = eviction_stride;
  translating_errors([&] { kc::bucketed_lru_step(state, io, buckets, as_stream(stream)); });
}

namespace {

/// The library's handle of `l` for K/V elements of `bytes` bytes.
kc::offloaded_kv_ref offloaded_ref(const offloaded_layer& l, std::size_t bytes) {
  kc::offloaded_kv_ref r;
  r.lru = {l.keys, l.ages, l.slot_of, l.pairs, l.capacity, l.pages, l.limits};
  r.page_table = l.page_table;
  r.host_page = l.host_page;
  const std::uint64_t page_bytes = std::uint64_t(l.page_size) * std::uint64_t(l.dim) * bytes;
  r.k_pools = {l.k_host, l.host_pages, l.k_device, l.device_pages, page_bytes};
  r.v_pools = {l.v_host, l.host_pages, l.v_device, l.device_pages, page_bytes};
  r.page_size = l.page_size;
  r.head_dim = l.dim;
  return r;
}

}  // namespace

void offloaded_reset(dtype t, const offloaded_layer& l, std::intptr_t stream) {
  with_type(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    kc::offloaded_reset(offloaded_ref(l, sizeof(T)), as_stream(stream));
  });
}

std::size_t offloaded_attention_workspace_size(dtype t, const offloaded_layer& l, int qo_heads,
                                               std::size_t max_ids) {
  std::size_t bytes = 0;
  with_type(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    bytes = kc::offloaded_attention_workspace_size(offloaded_ref(l, sizeof(T)), qo_heads, max_ids);
  });
  return bytes;
}

void offloaded_attention(dtype t, const offloaded_layer& l, const float* q, int qo_heads,
                         const std::int64_t* indptr, const std::int32_t* ids, std::size_t max_ids,
                         float* out_o, float* out_lse, void* workspace, std::size_t workspace_bytes,
                         float scale, int buckets, std::intptr_t stream, int* status) {
  kc::offloaded_attention_params p;
  p.buckets = buckets;
  if (!std::isnan(scale)) p.attention.scale = scale;
  p.attention.status = status;  // the same word: the attention then checks every id (bit 1)
  with_type(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    kc::offloaded_attention<T>(offloaded_ref(l, sizeof(T)), q, qo_heads, indptr, ids, max_ids,
                               out_o, out_lse, workspace, workspace_bytes, as_stream(stream), p,
                               status);
  });
}

}  // namespace kvsift_python::cuda_ops

namespace kvsift_python::cuda_ops {

insert_lists make_insert_lists(const std::vector<std::uint32_t>& ids,
                               const std::vector<float>& scores, std::size_t m, std::size_t nq,
                               std::size_t rows, int holder_capacity, bool l2) {
  insert_lists r;
  translating_errors([&] {
    kc::insert_lists l =
        kc::make_insert_lists(ids, scores, m, nq, rows, holder_capacity,
                              l2 ? kc::graph_metric::l2 : kc::graph_metric::inner_product);
    r.knn_ids = std::move(l.knn_ids);
    r.knn_keys = std::move(l.knn_keys);
    r.worst_key = std::move(l.worst_key);
    r.best_key = std::move(l.best_key);
    r.best_id = std::move(l.best_id);
    r.holders = std::move(l.holders);
    r.holder_counts = std::move(l.holder_counts);
    r.layouts = std::move(l.layouts);
  });
  return r;
}

namespace {

kc::batch_insert_state_ref insert_state_ref(const decode_graphs& g, const insert_state& s) {
  kc::batch_insert_state_ref r;
  r.adjacency = const_cast<kvsift::id_t*>(g.adjacency);
  r.sizes = g.sizes;
  r.queries = s.queries;
  r.query_ld = s.query_ld;
  r.query_offset = s.query_offset;
  r.max_queries = s.max_queries;
  r.nq = s.nq;
  r.knn_ids = s.knn_ids;
  r.knn_keys = s.knn_keys;
  r.worst_key = s.worst_key;
  r.best_id = s.best_id;
  r.best_key = s.best_key;
  r.holders = s.holders;
  r.holder_counts = s.holder_counts;
  r.holder_capacity = s.holder_capacity;
  r.layouts = s.layouts;
  return r;
}

kc::batch_insert_params insert_params(const insert_knobs& k) {
  kc::batch_insert_params p;
  p.degree = k.degree;
  p.L = k.L;
  p.expand_width = k.expand_width;
  p.query_neighbors = k.query_neighbors;
  p.query_candidates = k.query_candidates;
  p.update_query_knn = k.update_query_knn;
  p.fill = k.fill;
  p.metric = k.l2 ? kc::graph_metric::l2 : kc::graph_metric::inner_product;
  return p;
}

}  // namespace

std::size_t batch_insert_workspace_size(const decode_graphs& g, int dim, const insert_state& st,
                                        const insert_knobs& p) {
  std::size_t bytes = 0;
  translating_errors([&] {
    bytes = kc::batch_insert_workspace_size(graph_ref(g), dim, insert_state_ref(g, st),
                                            insert_params(p));
  });
  return bytes;
}

void batch_insert(const decode_graphs& g, const graph_keys& keys, const insert_state& st,
                  const insert_knobs& p, void* workspace, std::size_t workspace_bytes,
                  std::intptr_t stream, std::uint32_t* status) {
  with_keys(keys, [&](const auto& ref) {
    kc::batch_insert(graph_ref(g), ref, insert_state_ref(g, st), insert_params(p), workspace,
                     workspace_bytes, as_stream(stream), status);
  });
}

}  // namespace kvsift_python::cuda_ops
