#pragma once
// Host dispatch behind <kvsift/cuda/decode_step.cuh> (internal): one preparation kernel (graph
// of each query head, its retrieval range, its window's size), then the library's own
// decode_search and one sparse_attention pass over each head's window and retrieved tokens,
// read in place (window_then_rows) and launched as a dependent of the search.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <kvsift/core/error.hpp>
#include <kvsift/cuda/detail/device_buffer.cuh>
#include <kvsift/cuda/detail/vec.cuh>
#include <kvsift/cuda/merge.cuh>

namespace kvsift::cuda::detail {

/// Per query head h: graph = h / group, the retrieval range [sink', w_lo) (`first`, `last`)
/// and the window's token count sink' + (n + unindexed - w_lo): the window is [0, sink') and
/// [w_lo, n + unindexed) (the tokens past the graph's n rows follow its last ones). One thread
/// per head.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    dstep_prepare_kernel(graph_set_ref set, int heads, int group, int sink, int window,
                         int unindexed, std::int32_t* graph, std::uint32_t* first,
                         std::uint32_t* last, std::uint32_t* win_counts) {
  const int h = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (h >= heads) return;
  const int g = h / group;
  // A bad size (the search flags it) leaves the head with no tokens rather than reading past
  // the graph's rows.
  const std::int64_t keys = ds_graph_keys(set, g);
  const std::int64_t n = keys < 0 ? 0 : keys;
  const std::int64_t s = n < sink ? n : sink;
  const std::int64_t lo = n - window > s ? n - window : s;
  graph[h] = g;
  first[h] = static_cast<std::uint32_t>(s);
  last[h] = static_cast<std::uint32_t>(lo);
  win_counts[h] = static_cast<std::uint32_t>(s + (n - lo) + unindexed);
}

/// DIPR's window seed (`decode_step_params::seed_from_window`): per query head h, the best raw
/// score q.k over its window tokens, the win_counts[h] tokens of [0, first[h]) and
/// [last[h], n + unindexed) (dstep_prepare_kernel's), NaN when the window is empty. One block per
/// head; each thread scores whole rows (16-byte loads, products summed with fmaf in element order),
/// so a block has `Threads` rows in flight; q in shared memory. A page id outside the pool is
/// skipped (the search and the attention flag it).
template <int Threads, class T>
__global__ void __launch_bounds__(Threads)
    dstep_window_seed_kernel(ds_paged_source<T> keys, const float* __restrict__ q, int head_dim,
                             const std::int32_t* __restrict__ graph,
                             const std::uint32_t* __restrict__ first,
                             const std::uint32_t* __restrict__ last,
                             const std::uint32_t* __restrict__ win_counts,
                             float* __restrict__ seed) {
  extern __shared__ float dstep_q[];
  __shared__ float warp_best[Threads / 32];
  const int h = static_cast<int>(blockIdx.x);
  for (int j = static_cast<int>(threadIdx.x); j < head_dim; j += Threads)
    dstep_q[j] = q[static_cast<std::size_t>(h) * head_dim + j];
  __syncthreads();
  const int g = graph[h];
  const std::uint32_t s = first[h], lo = last[h], win = win_counts[h];
  constexpr int V = vec_size_v<T>;
  float best = -INFINITY;
  for (std::uint32_t i = threadIdx.x; i < win; i += Threads) {
    const T* row = keys.row(g, 0, i < s ? i : lo + (i - s));
    if (row == nullptr) continue;
    float acc = 0.0f;
    for (int j = 0; j < head_dim; j += V) {
      float x[V];
      load_vec<T>(row + j, x);
#pragma unroll
      for (int e = 0; e < V; ++e) acc = fmaf(dstep_q[j + e], x[e], acc);
    }
    best = fmaxf(best, acc);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) best = fmaxf(best, __shfl_xor_sync(0xffffffffu, best, o));
  if ((threadIdx.x & 31) == 0) warp_best[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < Threads / 32; ++w) best = fmaxf(best, warp_best[w]);
    seed[h] = best == -INFINITY ? __int_as_float(0x7fc00000) : best;
  }
}

/// Carves the workspace into pieces aligned to `workspace_alignment`, in a fixed order.
/// `dense`: DIPR with dense_when_capped, which adds the capped flags, the window pass's state
/// per head and the full-attention pass's split states (o, then lse; [heads * splits] rows).
struct dstep_layout {
  std::size_t graph = 0, first = 0, last = 0, ids = 0, counts = 0, win_counts = 0;
  std::size_t search_ws = 0, attn_ws = 0, total = 0;
  std::size_t search_bytes = 0, attn_bytes = 0;
  int capacity = 0;
  bool dense = false;
  int dense_splits = 0;
  std::size_t capped = 0, main_o = 0, main_lse = 0, dense_o = 0, dense_lse = 0;
  bool seeded = false;  ///< DIPR with seed_from_window: `seed` holds a score per head
  std::size_t seed = 0;
  int route_ld = 0;  ///< with routes: routed seeds per head (route_seeds_ld), at `routed`
  std::size_t routed = 0;
};

/// decode_step's last merge with the full-attention pass: head h's window-pass state, then,
/// where its search was capped, the pass's `splits` states of that head (rows h * splits ..).
/// Heads that were not capped merge their one state (the output is that state, bit for bit).
struct capped_merge_source {
  static constexpr bool dependent_range = false;
  struct range {};
  struct states {
    const float* main_o;
    float main_lse;
    const float* dense_o;
    const float* dense_lse;
    std::int64_t n;
    int head_dim;
    __device__ const float* o_at(std::int64_t j) const {
      return j == 0 ? main_o : dense_o + (j - 1) * head_dim;
    }
    __device__ float lse_at(std::int64_t j) const { return j == 0 ? main_lse : dense_lse[j - 1]; }
  };
  const float* main_o;
  const float* main_lse;
  const float* dense_o;
  const float* dense_lse;
  const std::uint32_t* capped;
  int splits;
  int head_dim;
  __device__ range range_of(std::int64_t) const { return {}; }
  __device__ states at(std::int64_t, int h, range) const {
    const std::int64_t rows = static_cast<std::int64_t>(h) * splits;
    return {main_o + static_cast<std::int64_t>(h) * head_dim,
            main_lse[h],
            dense_o + rows * head_dim,
            dense_lse + rows,
            capped[h] != 0u ? splits + 1 : 1,
            head_dim};
  }
};

/// `route_ld`: routed seeds per head (0: no routing).
inline dstep_layout dstep_plan(const graph_set_ref& set, int heads, int head_dim,
                               const decode_step_params& p, int route_ld = 0) {
  using kvsift::detail::require;
  require(p.sink >= 0 && p.window >= 0, "decode_step: expected sink >= 0 and window >= 0, got ",
          p.sink, " and ", p.window);
  require(p.sink + p.window >= 1 && p.sink <= (1 << 20) && p.window <= (1 << 20),
          "decode_step: expected 1 <= sink + window <= 2^21, got ", p.sink, " + ", p.window);
  require(p.unindexed >= 0 && p.unindexed <= (1 << 30),
          "decode_step: expected 0 <= unindexed <= 2^30, got ", p.unindexed);
  require(heads >= 1 && set.num_graphs >= 1 && heads % set.num_graphs == 0,
          "decode_step: expected num_qo_heads a positive multiple of num_graphs = ", set.num_graphs,
          ", got ", heads);
  dstep_layout l;
  l.capacity = decode_search_capacity(p.search);
  const auto H = static_cast<std::size_t>(heads);
  const auto cap = static_cast<std::size_t>(l.capacity);
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t here = at;
    at += align_up(bytes);
    return here;
  };
  l.graph = take(H * 4);
  l.first = take(H * 4);
  l.last = take(H * 4);
  l.ids = take(H * cap * sizeof(id_t));
  l.counts = take(H * 4);
  l.win_counts = take(H * 4);
  l.search_bytes = decode_search_workspace_size(set, heads, p.search);
  l.search_ws = take(l.search_bytes);
  sparse_attention_params ap;
  ap.scale = p.scale;
  l.attn_bytes = sparse_attention_workspace_size(heads, head_dim, ap);
  l.attn_ws = take(l.attn_bytes);
  l.seeded = p.search.mode == decode_search_mode::dipr && p.seed_from_window;
  // The seed is a dot product: under l2 it would be read as a squared distance.
  require(!l.seeded || p.search.metric == graph_metric::inner_product,
          "decode_step: seed_from_window needs the inner-product metric (the window's best q.k), "
          "got l2");
  if (l.seeded) l.seed = take(H * 4);
  l.route_ld = route_ld;
  if (route_ld > 0) {
    l.routed = take(kvsift::checked_mul(H, static_cast<std::size_t>(route_ld) * sizeof(id_t),
                                        "decode_step: heads x routed seeds"));
  }
  l.dense = p.search.mode == decode_search_mode::dipr && p.dense_when_capped;
  if (l.dense) {
    // Splits of decode_step_dense_chunk tokens over the longest graph: the pass does not know
    // on the host how many heads are capped, and one capped head must not run on one block.
    const std::int64_t pieces =
        (set.max_keys + decode_step_dense_chunk - 1) / decode_step_dense_chunk;
    l.dense_splits = static_cast<int>(std::clamp<std::int64_t>(pieces, 1, 64));
    const auto D = static_cast<std::size_t>(head_dim);
    const std::size_t rows = H * static_cast<std::size_t>(l.dense_splits);
    l.capped = take(H * 4);
    l.main_o = take(H * D * sizeof(float));
    l.main_lse = take(H * sizeof(float));
    l.dense_o = take(rows * D * sizeof(float));
    l.dense_lse = take(rows * sizeof(float));
  }
  l.total = at;
  return l;
}

}  // namespace kvsift::cuda::detail

namespace kvsift::cuda {

inline std::size_t decode_step_workspace_size(const graph_set_ref& set, int num_qo_heads,
                                              int head_dim, const decode_step_params& p) {
  return detail::dstep_plan(set, num_qo_heads, head_dim, p).total;
}

template <class R>
std::size_t decode_step_workspace_size(const graph_set_ref& set, int num_qo_heads, int head_dim,
                                       const decode_step_params& p,
                                       const decode_step_routes<R>& routes) {
  return detail::dstep_plan(set, num_qo_heads, head_dim, p,
                            route_seeds_ld(routes.set.list_len, routes.params))
      .total;
}

namespace detail {

/// decode_step; with `enqueue` false it runs every check of the step and of the search and
/// attention it chains, and launches nothing (the sharded step's first pass). `routes`: the
/// routing sets (decode_step with routes), or null.
template <class T, class R = T>
void run_decode_step(const graph_set_ref& set, const paged_kv_ref<T>& kv, const float* q,
                     int num_qo_heads, int head_dim, float* out_o, float* out_lse, void* workspace,
                     std::size_t workspace_bytes, cudaStream_t stream, const decode_step_params& p,
                     std::uint32_t* status, id_t* carry, std::uint32_t* capped_out, bool enqueue,
                     const decode_step_routes<R>* routes = nullptr) {
  using kvsift::detail::require;
  const int route_ld = routes != nullptr ? route_seeds_ld(routes->set.list_len, routes->params) : 0;
  const dstep_layout l = dstep_plan(set, num_qo_heads, head_dim, p, route_ld);
  if (routes != nullptr) {
    const int gqa = num_qo_heads / set.num_graphs;
    require(routes->set.num_graphs == set.num_graphs,
            "decode_step: expected a routing set per graph (", set.num_graphs, "), got ",
            routes->set.num_graphs);
    kvsift::detail::require<dimension_mismatch>(
        routes->set.dim == head_dim,
        "decode_step: expected routing vectors of head_dim = ", head_dim, " elements, got ",
        routes->set.dim);
    require(routes->params.group >= 1 && gqa % routes->params.group == 0,
            "decode_step: expected a routing group dividing the GQA group (", gqa, "), got ",
            routes->params.group);
  }
  if (enqueue && (l.seeded || routes != nullptr)) {
    // The window's scores and the routing launch before the search checks its arguments (q, the
    // K pages, the head dimension): a dry pass, which launches nothing, checks every argument
    // first.
    run_decode_step(set, kv, q, num_qo_heads, head_dim, out_o, out_lse, workspace, workspace_bytes,
                    stream, p, status, carry, capped_out, false, routes);
  }
  require(kv.num_kv_heads == set.num_graphs, "decode_step: expected one graph per KV head (",
          kv.num_kv_heads, "), got ", set.num_graphs, " graphs");
  require(workspace_bytes >= l.total, "decode_step: workspace of ", workspace_bytes,
          " bytes is too small, expected >= ", l.total);
  require(workspace != nullptr, "decode_step: null workspace");
  int device = 0;
  KVSIFT_CUDA_CHECK(cudaGetDevice(&device));
  require_stream_on(stream, device, "decode_step");
  require_device_pointer(set.row_offset, device, "decode_step", "row offsets");
  if (set.sizes != nullptr) {
    require_device_pointer(set.sizes, device, "decode_step", "graph sizes");
  }
  require_device_pointer(workspace, device, "decode_step", "workspace");
  // decode_search checks q and the K pages; the list building and the attention below run unchecked
  // on the workspace and these.
  require_device_pointer(kv.v_pages, device, "decode_step", "v_pages");
  require_device_pointer(kv.page_table, device, "decode_step", "page table");
  require_device_pointer(out_o, device, "decode_step", "out_o");
  require_device_pointer(out_lse, device, "decode_step", "out_lse");
  if (carry != nullptr) require_device_pointer(carry, device, "decode_step", "carry");
  if (capped_out != nullptr) require_device_pointer(capped_out, device, "decode_step", "capped");
  auto* base = static_cast<unsigned char*>(workspace);
  auto at = [&](std::size_t off) { return static_cast<void*>(base + off); };
  auto* graph = static_cast<std::int32_t*>(at(l.graph));
  auto* first = static_cast<std::uint32_t*>(at(l.first));
  auto* last = static_cast<std::uint32_t*>(at(l.last));
  // With a carry the search reads its seeds from it and writes its results over them (each
  // search reads its own row's seeds before it writes that row).
  auto* ids = carry != nullptr ? carry : static_cast<id_t*>(at(l.ids));
  auto* counts = static_cast<std::uint32_t*>(at(l.counts));
  auto* win_counts = static_cast<std::uint32_t*>(at(l.win_counts));

  const int group = num_qo_heads / set.num_graphs;
  if (enqueue) {
    constexpr int threads = 128;
    const auto blocks = static_cast<unsigned>((num_qo_heads + threads - 1) / threads);
    dstep_prepare_kernel<threads><<<blocks, threads, 0, stream>>>(
        set, num_qo_heads, group, p.sink, p.window, p.unindexed, graph, first, last, win_counts);
    KVSIFT_CUDA_CHECK(cudaGetLastError());
  }

  decode_queries qs;
  qs.q = q;
  qs.ld = head_dim;
  qs.graph = graph;
  qs.filter_first = first;
  qs.filter_last = last;
  if (routes != nullptr) {
    // Reads q and the heads' graphs (prepared above, same stream); writes every head's row.
    auto* routed = static_cast<id_t*>(at(l.routed));
    run_route_seeds(routes->set, qs, num_qo_heads, routes->params, routed, status, stream, enqueue);
    qs.extra_seeds = routed;
    qs.extra_seeds_ld = l.route_ld;
  }
  if (l.seeded) {
    auto* seed = static_cast<float*>(at(l.seed));
    if (enqueue) {
      constexpr int threads = 128;
      dstep_window_seed_kernel<threads, T>
          <<<static_cast<unsigned>(num_qo_heads), threads,
             static_cast<std::size_t>(head_dim) * sizeof(float), stream>>>(
              ds_paged_source<T>{kv}, q, head_dim, graph, first, last, win_counts, seed);
      KVSIFT_CUDA_CHECK(cudaGetLastError());
    }
    qs.seed_score = seed;
  }
  if (carry != nullptr) {
    qs.seeds = carry;
    qs.seeds_ld = l.capacity;
  }
  // The search's capped flags: the caller's array when given (the dense pass reads them there),
  // else the workspace's when the dense pass needs them.
  auto* capped = capped_out != nullptr ? capped_out
                 : l.dense             ? static_cast<std::uint32_t*>(at(l.capped))
                                       : nullptr;
  decode_search_outputs out;
  out.ids = ids;
  out.counts = counts;
  out.status = status;
  out.capped = capped;
  run_decode_search(set, kv, qs, num_qo_heads, p.search, out, at(l.search_ws), l.search_bytes,
                    stream, enqueue);
  // One attention pass per query head over its window, then its retrieved tokens (disjoint:
  // the search's range excludes the window): the same attention as two passes and an exact
  // merge of their states, with three launches fewer and no partial states written and read
  // back (docs/decode_search.md). The kernel reads the window as ranges and the retrieved ids
  // in place from the search's rows (window_then_rows): no CSR lists are built, two launches
  // fewer. It launches as a dependent of the search (its launch overlaps the search's end, and
  // it waits for the search's results on the device). At 128K tokens, 16 requests: 0.366-0.370
  // ms per step against 0.377-0.381 ms with the lists built (docs/decode_search.md).
  sparse_attention_params ap;
  ap.scale = p.scale;
  void* aw = l.attn_bytes > 0 ? at(l.attn_ws) : nullptr;
  // The window pass leaves a capped head's retrieved ids out only when the dense pass attends
  // its middle (a caller's flags alone change nothing).
  const window_then_rows lists{
      first, last, win_counts, ids, counts, l.capacity, l.dense ? capped : nullptr};
  // With the full-attention pass, both passes leave their states in the workspace and a merge
  // writes the outputs.
  auto* main_o = l.dense ? static_cast<float*>(at(l.main_o)) : out_o;
  auto* main_lse = l.dense ? static_cast<float*>(at(l.main_lse)) : out_lse;
  run_attention_lists(
      q, num_qo_heads, head_dim, kv, lists, [](int) {}, main_o, main_lse, aw, l.attn_bytes, stream,
      ap, {}, false, enqueue, true);
  if (!l.dense) return;
  // Heads whose DIPR search was capped attend their whole middle range in a second pass, in
  // splits of decode_step_dense_chunk tokens; its blocks of other heads stop at once and write
  // nothing. The two passes' token sets are disjoint, so merging a capped head's window-pass
  // state with its split states is attention over the union; a head that was not capped keeps
  // its window-pass state. The merge propagates NaN (a NaN query's head shows it, as in one
  // pass) instead of emptying the row.
  auto* dense_o = static_cast<float*>(at(l.dense_o));
  auto* dense_lse = static_cast<float*>(at(l.dense_lse));
  sparse_attention_params dp = ap;
  dp.num_splits = l.dense_splits;
  run_attention_lists(
      q, num_qo_heads, head_dim, kv, capped_middle{first, last, capped}, [](int) {}, dense_o,
      dense_lse, nullptr, 0, stream, dp, {}, false, enqueue, false);
  if (!enqueue) return;
  const capped_merge_source both{main_o, main_lse,       dense_o, dense_lse,
                                 capped, l.dense_splits, head_dim};
  launch_merge<float, false, capped_merge_source, true>(
      both, out_o, out_lse, num_qo_heads, num_qo_heads, head_dim, stream, merge_policy{}, nullptr,
      "kvsift::cuda::decode_step (merge of the window and full-attention passes)");
}

}  // namespace detail

template <class T>
void decode_step(const graph_set_ref& set, const paged_kv_ref<T>& kv, const float* q,
                 int num_qo_heads, int head_dim, float* out_o, float* out_lse, void* workspace,
                 std::size_t workspace_bytes, cudaStream_t stream, const decode_step_params& p,
                 std::uint32_t* status, id_t* carry, std::uint32_t* capped) {
  detail::run_decode_step(set, kv, q, num_qo_heads, head_dim, out_o, out_lse, workspace,
                          workspace_bytes, stream, p, status, carry, capped, true);
}

template <class T, class R>
void decode_step(const graph_set_ref& set, const decode_step_routes<R>& routes,
                 const paged_kv_ref<T>& kv, const float* q, int num_qo_heads, int head_dim,
                 float* out_o, float* out_lse, void* workspace, std::size_t workspace_bytes,
                 cudaStream_t stream, const decode_step_params& p, std::uint32_t* status,
                 id_t* carry, std::uint32_t* capped) {
  detail::run_decode_step(set, kv, q, num_qo_heads, head_dim, out_o, out_lse, workspace,
                          workspace_bytes, stream, p, status, carry, capped, true, &routes);
}

}  // namespace kvsift::cuda
