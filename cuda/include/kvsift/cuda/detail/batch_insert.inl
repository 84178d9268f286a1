#pragma once
// Kernels and host dispatch behind <kvsift/cuda/batch_insert.cuh> (internal).
//
// Three launches per call: a preparation kernel (each graph's new key widened to f32 and
// checked), decode_search (the Euclidean walk from every new key, the CPU insert's search), and
// the insert kernel, one block per graph. The insert kernel keeps its working lists in the
// workspace (global memory, L2-resident: a graph's are tens of KiB); shared memory holds only
// what is searched repeatedly, the reverse-edge targets and the gathered-query bitset (at most
// 34 KiB whatever the sizes, so no opt-in above 48 KiB is needed). Each step that the CPU runs
// in an order that matters (gathering queries, pruning, building the reverse-edge targets, x's
// pivot edges) is decided on one warp in that order; its distances, and the other steps, run on
// every warp.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <kvsift/core/checked_size.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/cuda/detail/decode_search.inl>
#include <kvsift/cuda/detail/device_buffer.cuh>
#include <kvsift/cuda/detail/vec.cuh>
#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda::detail {

// A graph's insert is a chain of dependent steps on one block, so more warps shorten it: the
// reverse edges' rows (about 75 full rows per Gemma-3 32K insert) and the list updates spread
// over them. One graph's launch: 3.38 ms on 256 threads, 1.93 on 512, 1.80 on 1024 (H200,
// bench/results/h200_batch_insert_threads.txt).
inline constexpr int bi_threads = 1024;
inline constexpr int bi_smem_words = 4096;
inline constexpr std::uint32_t bi_unknown_layout = 0xffffffffu;
inline constexpr int bi_warps = bi_threads / 32;

/// Byte offsets of one graph's scratch in the workspace (all 16-byte aligned), and the sizes
/// the kernel needs.
struct bi_layout {
  std::size_t x = 0, skip = 0, bits = 0, qids = 0, qkeys = 0, cids = 0, ckeys = 0, sids = 0,
              skeys = 0, ent = 0, piv = 0, kept = 0, dropped = 0, dk = 0, db = 0, warp = 0;
  std::size_t warp_bytes = 0, graph_bytes = 0;
  std::size_t found = 0, found_counts = 0, qgraph = 0, search_ws = 0, search_bytes = 0;
  std::size_t total = 0;
  int d = 0, L = 0, C = 0, t = 0, maxc = 0, degree = 0, words = 0;
};

__host__ __device__ inline std::size_t bi_align(std::size_t b) { return (b + 15) / 16 * 16; }

inline decode_search_params bi_search_params(const batch_insert_params& p) {
  decode_search_params s;
  s.mode = decode_search_mode::topk;
  s.metric = graph_metric::l2;
  s.k = p.L;
  s.L = p.L;
  s.expand_width = p.expand_width;  // 1: the CPU's walk
  s.warps_per_search = 0;           // a block per search when few run at once: the same walk
  return s;
}

inline bi_layout bi_plan(const graph_set_ref& set, int dim, const batch_insert_state_ref& st,
                         const batch_insert_params& p, const char* who) {
  using kvsift::detail::require;
  require(set.num_graphs >= 1, who, ": expected at least one graph, got ", set.num_graphs);
  require(set.width >= 1 && set.width <= max_graph_search_width, who,
          ": expected 1 <= adjacency width <= ", max_graph_search_width, ", got ", set.width);
  require(dim >= 1, who, ": expected a positive key dimension, got ", dim);
  require(p.expand_width >= 1 && p.expand_width <= max_decode_expand_width, who,
          ": expected 1 <= expand_width <= ", max_decode_expand_width, ", got ", p.expand_width);
  require(p.L >= 1 && p.L <= max_decode_search_L, who, ": expected 1 <= L <= ", max_decode_search_L,
          ", got ", p.L);
  require(p.degree >= 0 && p.degree <= set.width, who,
          ": expected 0 <= degree <= width = ", set.width, " (0 = width / 2), got ", p.degree);
  require(p.query_neighbors >= 0 && p.query_neighbors <= 8, who,
          ": expected 0 <= query_neighbors <= 8, got ", p.query_neighbors);
  require(p.query_candidates >= 1 && p.query_candidates <= max_insert_query_candidates, who,
          ": expected 1 <= query_candidates <= ", max_insert_query_candidates, ", got ",
          p.query_candidates);
  require(st.nq >= 1 && st.nq <= 1024, who, ": expected 1 <= nq <= 1024, got ", st.nq);
  require(st.holder_capacity >= 1 && st.holder_capacity <= max_insert_holders, who,
          ": expected 1 <= holder_capacity <= ", max_insert_holders, ", got ", st.holder_capacity);
  require(st.max_queries >= 1 && st.max_queries < std::int64_t{invalid_id}, who,
          ": expected 1 <= max_queries < 2^32 - 1, got ", st.max_queries);
  const std::int64_t maxc = std::int64_t{p.query_neighbors} * st.nq + p.L;
  require(maxc <= max_insert_candidates, who, ": query_neighbors x nq + L = ", maxc,
          " candidates, expected <= ", max_insert_candidates);
  bi_layout l;
  l.d = dim;
  l.L = p.L;
  l.C = p.query_candidates;
  l.t = p.query_neighbors;
  l.maxc = static_cast<int>(maxc);
  l.degree = p.degree != 0 ? p.degree : std::max(1, set.width / 2);
  l.words = static_cast<int>((st.max_queries + 31) / 32);
  std::size_t o = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t at = o;
    o += bi_align(bytes);
    return at;
  };
  const auto C = static_cast<std::size_t>(l.C), mc = static_cast<std::size_t>(maxc);
  const auto R = static_cast<std::size_t>(set.width);
  l.x = take(static_cast<std::size_t>(dim) * 4);
  l.skip = take(4);
  l.bits = take(static_cast<std::size_t>(l.words) * 4);  // when it does not fit shared memory
  l.qids = take(C * 4);
  l.qkeys = take(C * 4);
  l.cids = take(mc * 4);
  l.ckeys = take(mc * 4);
  l.sids = take(mc * 4);
  l.skeys = take(mc * 4);
  l.ent = take(C * 4);
  l.piv = take(C * 4);
  l.kept = take(R * 4);
  l.dropped = take(R * 4);
  // x's pruning in batches: each member's distances to the kept ids and to the members before it.
  l.dk = take(static_cast<std::size_t>(bi_warps) * static_cast<std::size_t>(l.degree) * 4);
  l.db = take(static_cast<std::size_t>(bi_warps) * bi_warps * 4);
  // Per warp, a row's re-pruning: R + 1 candidates (ids, keys) unsorted and sorted, kept and
  // dropped lists.
  l.warp_bytes = bi_align((R + 1) * 16) + 2 * bi_align(R * 4);
  l.warp = take(l.warp_bytes * bi_warps);
  l.graph_bytes = o;
  const auto G = static_cast<std::size_t>(set.num_graphs);
  std::size_t t = kvsift::checked_mul(G, l.graph_bytes, "batch_insert: workspace");
  auto take_all = [&](std::size_t bytes) {
    const std::size_t at = t;
    t += bi_align(bytes);
    return at;
  };
  l.found = take_all(G * static_cast<std::size_t>(p.L) * 4);
  l.found_counts = take_all(G * 4);
  l.qgraph = take_all(G * 4);
  l.search_bytes = decode_search_workspace_size(set, set.num_graphs, bi_search_params(p));
  l.search_ws = take_all(l.search_bytes);
  l.total = t;
  return l;
}

/// Raw score (dot, or squared distance) of two rows, lanes over the dimension, summed across
/// the warp; every lane gets it. A null row scores NaN (ranks last).
template <bool L2, class A, class B>
__device__ float bi_warp_score(const A* a, const B* b, int d, int lane) {
  constexpr unsigned full = 0xffffffffu;
  if (a == nullptr || b == nullptr) return __int_as_float(0x7fc00000);
  float acc = 0.0f;
  for (int j = lane; j < d; j += 32) acc = walk_accumulate<L2>(acc, to_f32(a[j]), to_f32(b[j]));
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(full, acc, o);
  return acc;
}

/// Squared distances of row c to rows r[0, U) (a null row: skipped, NaN), lanes over the
/// dimension with independent sums per row, so that the U rows' loads are in flight together;
/// every lane gets all U. A null c gives NaN (ranks last).
template <int U, class T>
__device__ void bi_warp_l2(const T* c, const T* const (&r)[U], int d, int lane, float (&out)[U]) {
  constexpr unsigned full = 0xffffffffu;
  float acc[U];
#pragma unroll
  for (int u = 0; u < U; ++u) acc[u] = 0.0f;
  if (c != nullptr) {
#pragma unroll 4
    for (int j = lane; j < d; j += 32) {
      const float cj = to_f32(c[j]);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (r[u] != nullptr) {
          const float t = cj - to_f32(r[u][j]);
          acc[u] = fmaf(t, t, acc[u]);
        }
      }
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    for (int o = 16; o > 0; o >>= 1) acc[u] += __shfl_xor_sync(full, acc[u], o);
    out[u] = c == nullptr || r[u] == nullptr ? __int_as_float(0x7fc00000) : acc[u];
  }
}

inline constexpr int bi_rows_at_once = 4;

/// out[j] = the rank key (minus the squared distance) of row c against key ids[j], for
/// j < count: bi_rows_at_once rows per round of loads, lane u writing row u's key. Every lane
/// of the warp calls it.
template <class T, class Src>
__device__ void bi_l2_keys(const Src& src, int g, std::int64_t base, const T* c,
                           const std::uint32_t* ids, int count, int d, int lane, float* out) {
  constexpr int U = bi_rows_at_once;
  for (int j0 = 0; j0 < count; j0 += U) {
    const T* rows[U];
    float dist[U];
#pragma unroll
    for (int u = 0; u < U; ++u) rows[u] = j0 + u < count ? src.row(g, base, ids[j0 + u]) : nullptr;
    bi_warp_l2<U>(c, rows, d, lane, dist);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (lane == u && j0 + u < count) out[j0 + u] = walk_key<true>(dist[u]);
    }
  }
}

/// (k1, i1) ranks before (k2, i2): higher key first, ties to the lower id.
__device__ __forceinline__ bool bi_better(float k1, std::uint32_t i1, float k2, std::uint32_t i2) {
  return k1 > k2 || (k1 == k2 && i1 < i2);
}

/// Appends the lanes' `take` values to out[n..] in lane order; returns the new count.
__device__ __forceinline__ int bi_append(bool take, std::uint32_t v, std::uint32_t* out, int n,
                                         int lane) {
  const unsigned b = __ballot_sync(0xffffffffu, take);
  if (take) out[n + __popc(b & ((1u << lane) - 1u))] = v;
  return n + __popc(b);
}

/// RNG pruning of sorted candidates (ids[0, n), keys = minus the squared distance to the pivot)
/// to `degree`, filled with pruned ones in rank order when `fill`: `rng_prune`'s rule, on one
/// warp (bi_rows_at_once kept rows per round of loads). Writes kept[0, return) (the RNG-kept
/// ones first, their count in *rng_kept); dropped is scratch.
template <class T, class Src>
__device__ int bi_prune(const Src& src, int g, std::int64_t base, int d, const std::uint32_t* ids,
                        const float* keys, int n, int degree, bool fill, std::uint32_t* kept,
                        std::uint32_t* dropped, int lane, int* rng_kept = nullptr) {
  constexpr int U = bi_rows_at_once;
  int nk = 0, nd = 0;
  for (int i = 0; i < n && nk < degree; ++i) {
    const std::uint32_t c = ids[i];
    const T* rc = src.row(g, base, c);
    bool drop = false;
    // U kept rows at a time, the whole warp on each distance: one round of loads per U rows
    // instead of a lane walking a row alone.
    for (int k0 = 0; k0 < nk && !drop; k0 += U) {
      const T* rows[U];
      float dist[U];
#pragma unroll
      for (int u = 0; u < U; ++u) rows[u] = k0 + u < nk ? src.row(g, base, kept[k0 + u]) : nullptr;
      bi_warp_l2<U>(rc, rows, d, lane, dist);
#pragma unroll
      for (int u = 0; u < U; ++u) drop = drop || (k0 + u < nk && walk_key<true>(dist[u]) > keys[i]);
    }
    if (lane == 0) {
      if (!drop) {
        kept[nk] = c;
      } else if (nd < degree) {
        dropped[nd] = c;
      }
    }
    if (drop) {
      ++nd;
    } else {
      ++nk;
    }
    __syncwarp();
  }
  if (rng_kept != nullptr) *rng_kept = nk;
  const int fills = fill ? min(min(nd, degree), degree - nk) : 0;
  for (int i = lane; i < fills; i += 32) kept[nk + i] = dropped[i];
  __syncwarp();
  return nk + fills;
}

/// `bi_prune` on the whole block, for x's own candidates (up to query_neighbors x nq + L of
/// them): candidates in batches of bi_warps, warp w scoring batch member w against the ids kept
/// so far (dk) and against the members before it (db), all at once; warp 0 then decides the
/// batch in order, a member dropped if a kept id or a member kept earlier in the batch is closer
/// to it than the pivot is. The same decisions as bi_prune, in batches of parallel distances
/// instead of a chain of them. Every thread calls it; returns the kept count (kept[0, return)).
template <class T, class Src>
__device__ int bi_prune_block(const Src& src, int g, std::int64_t base, int d,
                              const std::uint32_t* ids, const float* keys, int n, int degree,
                              bool fill, std::uint32_t* kept, std::uint32_t* dropped, float* dk,
                              float* db, int* s_counts, int warp, int lane) {
  constexpr unsigned full = 0xffffffffu;
  int nk = 0, nd = 0;
  for (int b0 = 0; b0 < n && nk < degree; b0 += bi_warps) {
    const int bn = min(bi_warps, n - b0);
    if (warp < bn) {
      const T* rc = src.row(g, base, ids[b0 + warp]);
      bi_l2_keys<T>(src, g, base, rc, kept, nk, d, lane, dk + warp * degree);
      bi_l2_keys<T>(src, g, base, rc, ids + b0, warp, d, lane, db + warp * bi_warps);
    }
    __syncthreads();
    if (warp == 0) {
      const int old = nk;
      unsigned taken = 0;  // batch members kept
      for (int i = 0; i < bn && nk < degree; ++i) {
        const float ki = keys[b0 + i];
        bool closer = false;
        for (int k = lane; k < old; k += 32) closer = closer || dk[i * degree + k] > ki;
        if (lane < i && ((taken >> lane) & 1u) != 0u)
          closer = closer || db[i * bi_warps + lane] > ki;
        const bool drop = __any_sync(full, closer);
        if (!drop) {
          if (lane == 0) kept[nk] = ids[b0 + i];
          taken |= 1u << i;
          ++nk;
        } else {
          if (lane == 0 && nd < degree) dropped[nd] = ids[b0 + i];
          ++nd;
        }
        __syncwarp();
      }
      if (lane == 0) {
        s_counts[0] = nk;
        s_counts[1] = nd;
      }
    }
    __syncthreads();
    nk = s_counts[0];
    nd = s_counts[1];
  }
  __syncthreads();  // every warp has read the counts before warp 0 overwrites them
  if (warp == 0) {
    const int fills = fill ? min(min(nd, degree), degree - nk) : 0;
    for (int i = lane; i < fills; i += 32) kept[nk + i] = dropped[i];
    if (lane == 0) s_counts[0] = nk + fills;
  }
  __syncthreads();
  return s_counts[0];
}

/// Sorts n (key, id) pairs best first by counting each one's rank (n^2 comparisons split over
/// `threads` threads starting at `t`); pairs equal in key and id keep their input order.
__device__ inline void bi_rank_sort(const float* keys, const std::uint32_t* ids, int n,
                                    float* skeys, std::uint32_t* sids, int t, int threads) {
  for (int i = t; i < n; i += threads) {
    const float k = keys[i];
    const std::uint32_t id = ids[i];
    int r = 0;
    for (int j = 0; j < n; ++j) {
      r += (bi_better(keys[j], ids[j], k, id) || (keys[j] == k && ids[j] == id && j < i)) ? 1 : 0;
    }
    skeys[r] = k;
    sids[r] = id;
  }
}

/// Leading valid entries of a row padded with invalid_id, on one warp.
__device__ __forceinline__ int bi_row_degree(const id_t* row, int width, int lane) {
  int deg = 0;
  for (int j0 = 0; j0 < width; j0 += 32) {
    const int j = j0 + lane;
    deg += __popc(__ballot_sync(0xffffffffu, j < width && row[j] != invalid_id));
  }
  return deg;
}

/// Whether `v` is among a[0, n), on one warp.
__device__ __forceinline__ bool bi_contains(const std::uint32_t* a, int n, std::uint32_t v,
                                            int lane) {
  bool in = false;
  for (int j0 = 0; j0 < n && !in; j0 += 32) {
    const int j = j0 + lane;
    in = __any_sync(0xffffffffu, j < n && a[j] == v);
  }
  return in;
}

/// Per graph: checks that there is room and that key sizes[g] is finite and mapped, widens it
/// to f32 (the search's query), and records the graph as the query's.
template <class T, class Src>
__global__ void bi_prepare_kernel(graph_set_ref set, Src src, bi_layout lay, unsigned char* ws,
                                  std::uint32_t* status) {
  const int g = static_cast<int>(blockIdx.x);
  unsigned char* w = ws + static_cast<std::size_t>(g) * lay.graph_bytes;
  auto* x = reinterpret_cast<float*>(w + lay.x);
  auto* skip = reinterpret_cast<std::uint32_t*>(w + lay.skip);
  auto* qgraph = reinterpret_cast<std::int32_t*>(ws + lay.qgraph);
  const std::int64_t base = set.row_offset[g];
  const std::int64_t rows = set.row_offset[g + 1] - base;
  const std::int64_t n = set.sizes[g];
  std::uint32_t bad = 0;
  const T* row = nullptr;
  if (n < 1 || n >= rows || n > src.capacity(g) - 1 || n >= set.max_keys) {
    bad = insert_status_no_room;
  } else {
    row = src.row(g, base, static_cast<std::uint32_t>(n));
    if (row == nullptr) bad = insert_status_bad_key;
  }
  int nonfinite = 0;
  for (int j = static_cast<int>(threadIdx.x); j < lay.d; j += static_cast<int>(blockDim.x)) {
    const float v = row != nullptr ? to_f32(row[j]) : 0.0f;
    nonfinite |= isfinite(v) ? 0 : 1;
    x[j] = isfinite(v) ? v : 0.0f;
  }
  if (__syncthreads_or(nonfinite) && bad == 0) bad = insert_status_bad_key;
  if (threadIdx.x == 0) {
    *skip = bad;
    qgraph[g] = g;
    if (bad != 0 && status != nullptr) atomicOr(status, bad);
  }
}

template <class T, class Src, bool QL2>
__global__ void __launch_bounds__(bi_threads)
    bi_insert_kernel(graph_set_ref set, batch_insert_state_ref st, Src src, bi_layout lay,
                     bool update_lists, bool fill, unsigned char* ws) {
  constexpr unsigned full = 0xffffffffu;
  const int g = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31;
  unsigned char* w = ws + static_cast<std::size_t>(g) * lay.graph_bytes;
  if (*reinterpret_cast<const std::uint32_t*>(w + lay.skip) != 0) return;  // uniform
  const float* xf = reinterpret_cast<const float*>(w + lay.x);
  // The reverse-edge targets are searched once per list x enters: shared memory.
  extern __shared__ std::uint32_t targets[];
  // The gathered-query bitset: shared memory up to bi_smem_words words (131072 queries), else
  // the workspace.
  auto* bits = lay.words <= bi_smem_words ? targets + set.width + lay.C
                                          : reinterpret_cast<std::uint32_t*>(w + lay.bits);
  auto* qids = reinterpret_cast<std::uint32_t*>(w + lay.qids);
  auto* qkeys = reinterpret_cast<float*>(w + lay.qkeys);
  auto* cids = reinterpret_cast<std::uint32_t*>(w + lay.cids);
  auto* ckeys = reinterpret_cast<float*>(w + lay.ckeys);
  auto* sids = reinterpret_cast<std::uint32_t*>(w + lay.sids);
  auto* skeys = reinterpret_cast<float*>(w + lay.skeys);
  auto* ent = reinterpret_cast<std::uint32_t*>(w + lay.ent);
  auto* piv = reinterpret_cast<std::uint32_t*>(w + lay.piv);
  auto* kept = reinterpret_cast<std::uint32_t*>(w + lay.kept);
  auto* dropped = reinterpret_cast<std::uint32_t*>(w + lay.dropped);
  auto* dk = reinterpret_cast<float*>(w + lay.dk);
  auto* db = reinterpret_cast<float*>(w + lay.db);
  const std::uint32_t* found =
      reinterpret_cast<const std::uint32_t*>(ws + lay.found) + static_cast<std::size_t>(g) * lay.L;
  const int fc = min(
      static_cast<int>(reinterpret_cast<const std::uint32_t*>(ws + lay.found_counts)[g]), lay.L);

  __shared__ int s_ng, s_nc, s_nent, s_ntg, s_linked;
  __shared__ int s_counts[3];
  __shared__ std::uint32_t s_top[8];
  const int d = lay.d, R = set.width, H = st.holder_capacity, nq = st.nq;
  const std::int64_t base = set.row_offset[g];
  const auto x = static_cast<std::uint32_t>(set.sizes[g]);
  const std::int64_t qbase = st.query_offset[g];
  const std::int64_t m = st.query_offset[g + 1] - qbase;
  const bool need_queries = lay.t > 0 || update_lists;
  std::uint32_t* layouts = st.layouts;
  auto row_of = [&](std::uint32_t i) { return src.row(g, base, i); };
  auto holders_of = [&](std::uint32_t key) {
    return st.holders + static_cast<std::size_t>(base + key) * static_cast<std::size_t>(H);
  };

  // 1. Gather: the queries on the found keys' key -> query lists, nearest key first, in list
  //    (ascending) order inside a key, until C; then ascending, from the bitset.
  if (need_queries) {
    const int words = static_cast<int>((m + 31) / 32);
    for (int i = tid; i < words; i += bi_threads) bits[i] = 0;
    __syncthreads();
    if (warp == 0) {
      int ng = 0;
      for (int f = 0; f < fc && ng < lay.C; ++f) {
        const std::uint32_t y = found[f];
        const std::uint32_t* h = holders_of(y);
        const int hc = min(static_cast<int>(st.holder_counts[base + y]), H);
        for (int j0 = 0; j0 < hc && ng < lay.C; j0 += 32) {
          const int j = j0 + lane;
          const std::uint32_t q = j < hc ? h[j] : invalid_id;
          const bool fresh = q != invalid_id && q < m && ((bits[q >> 5] >> (q & 31)) & 1u) == 0;
          const unsigned b = __ballot_sync(full, fresh);
          if (fresh && ng + __popc(b & ((1u << lane) - 1u)) < lay.C) {
            atomicOr(&bits[q >> 5], 1u << (q & 31));
          }
          ng = min(ng + __popc(b), lay.C);
          __syncwarp();
        }
      }
      int pos = 0;
      for (int w0 = 0; w0 < words; w0 += 32) {
        const int wi = w0 + lane;
        std::uint32_t word = wi < words ? bits[wi] : 0u;
        const int c = __popc(word);
        int incl = c;
        for (int o = 1; o < 32; o <<= 1) {
          const int v = __shfl_up_sync(full, incl, o);
          if (lane >= o) incl += v;
        }
        int at = pos + incl - c;
        while (word != 0u) {
          qids[at++] = static_cast<std::uint32_t>(wi * 32 + __ffs(static_cast<int>(word)) - 1);
          word &= word - 1u;
        }
        pos += __shfl_sync(full, incl, 31);
      }
      if (lane == 0) s_ng = pos;
    }
  } else if (tid == 0) {
    s_ng = 0;
  }
  __syncthreads();
  const int ng = s_ng;
  // 2. x against the gathered queries (the lists' metric).
  for (int j = warp; j < ng; j += bi_warps) {
    const float s = bi_warp_score<QL2>(
        st.queries + static_cast<std::size_t>(qbase + qids[j]) * st.query_ld, xf, d, lane);
    if (lane == 0) qkeys[j] = walk_key<QL2>(s);
  }
  __syncthreads();
  // 3. Candidates: the nearest `t` queries' kNN keys and the found keys, scored against x,
  //    sorted, deduplicated, pruned.
  if (warp == 0) {
    const int t = min(lay.t, ng);
    for (int r = 0; r < t; ++r) {
      float bk = 0.0f;
      std::uint32_t bq = invalid_id;
      bool have = false;
      for (int j = lane; j < ng; j += 32) {
        bool taken = false;
        for (int u = 0; u < r; ++u) taken = taken || s_top[u] == qids[j];
        if (!taken && (!have || bi_better(qkeys[j], qids[j], bk, bq))) {
          bk = qkeys[j];
          bq = qids[j];
          have = true;
        }
      }
      for (int o = 16; o > 0; o >>= 1) {
        const float ok = __shfl_xor_sync(full, bk, o);
        const std::uint32_t oq = __shfl_xor_sync(full, bq, o);
        const bool oh = __shfl_xor_sync(full, have, o);
        if (oh && (!have || bi_better(ok, oq, bk, bq))) {
          bk = ok;
          bq = oq;
          have = true;
        }
      }
      if (lane == 0) s_top[r] = bq;
      __syncwarp();
    }
    int nc = 0;
    for (int r = 0; r < t; ++r) {
      const std::uint32_t* list = st.knn_ids + static_cast<std::size_t>(qbase + s_top[r]) * nq;
      for (int j0 = 0; j0 < nq; j0 += 32) {
        const std::uint32_t id = j0 + lane < nq ? list[j0 + lane] : invalid_id;
        nc = bi_append(id != invalid_id, id, cids, nc, lane);
      }
    }
    for (int j0 = 0; j0 < fc; j0 += 32) {
      const std::uint32_t id = j0 + lane < fc ? found[j0 + lane] : invalid_id;
      nc = bi_append(id != invalid_id, id, cids, nc, lane);
    }
    if (lane == 0) s_nc = nc;
  }
  __syncthreads();
  const int nc = s_nc;
  for (int i = warp; i < nc; i += bi_warps) {
    const float s = bi_warp_score<true>(xf, row_of(cids[i]), d, lane);
    if (lane == 0) ckeys[i] = walk_key<true>(s);
  }
  __syncthreads();
  bi_rank_sort(ckeys, cids, nc, skeys, sids, tid, bi_threads);
  __syncthreads();
  if (warp == 0) {
    int nu = 0;  // duplicates (the same id, so the same key) are adjacent
    for (int j0 = 0; j0 < nc; j0 += 32) {
      const int j = j0 + lane;
      const bool keep = j < nc && (j == 0 || sids[j] != sids[j - 1]);
      const std::uint32_t id = j < nc ? sids[j] : 0u;
      const float k = j < nc ? skeys[j] : 0.0f;
      __syncwarp();
      const unsigned b = __ballot_sync(full, keep);
      if (keep) {
        const int at = nu + __popc(b & ((1u << lane) - 1u));
        cids[at] = id;
        ckeys[at] = k;
      }
      nu += __popc(b);
    }
    if (lane == 0) s_counts[2] = nu;
  }
  __syncthreads();
  const int nk = bi_prune_block<T>(src, g, base, d, cids, ckeys, s_counts[2], lay.degree, fill,
                                   kept, dropped, dk, db, s_counts, warp, lane);
  if (warp == 0) {
    id_t* row_x = st.adjacency + static_cast<std::size_t>(base + x) * R;
    for (int j = lane; j < R; j += 32) row_x[j] = j < nk ? kept[j] : invalid_id;
    for (int j = lane; j < nk; j += 32) targets[j] = kept[j];
    if (lane == 0) {
      st.holder_counts[base + x] = 0;
      if (layouts != nullptr) layouts[base + x] = bi_unknown_layout;
      s_linked = 0;
    }
  }
  __syncthreads();

  // 4. The lists x beats take it, in place of their worst entry.
  if (update_lists) {
    if (warp == 0) {
      int ne = 0;
      for (int j0 = 0; j0 < ng; j0 += 32) {
        const int j = j0 + lane;
        const bool enters = j < ng && qkeys[j] > st.worst_key[qbase + qids[j]];
        ne = bi_append(enters, static_cast<std::uint32_t>(j), ent, ne, lane);
      }
      if (lane == 0) s_nent = ne;
    }
    __syncthreads();
    const int ne = s_nent;
    for (int e = warp; e < ne; e += bi_warps) {
      const int j = static_cast<int>(ent[e]);
      const std::uint32_t q = qids[j];
      const float qk = qkeys[j];
      const std::size_t li = static_cast<std::size_t>(qbase + q);
      std::uint32_t* ids = st.knn_ids + li * nq;
      float* keys = st.knn_keys + li * nq;
      // The worst entry: lowest key, ties the highest id (an empty slot is -inf, invalid_id).
      int wpos = -1;
      float wk = 0.0f;
      std::uint32_t wid = 0;
      for (int i = lane; i < nq; i += 32) {
        if (wpos < 0 || bi_better(wk, wid, keys[i], ids[i])) {
          wpos = i;
          wk = keys[i];
          wid = ids[i];
        }
      }
      for (int o = 16; o > 0; o >>= 1) {
        const int op = __shfl_xor_sync(full, wpos, o);
        const float ok = __shfl_xor_sync(full, wk, o);
        const std::uint32_t oi = __shfl_xor_sync(full, wid, o);
        if (op >= 0 && (wpos < 0 || bi_better(wk, wid, ok, oi))) {
          wpos = op;
          wk = ok;
          wid = oi;
        }
      }
      __syncwarp();
      if (lane == 0) {
        ids[wpos] = x;
        keys[wpos] = qk;
      }
      __syncwarp();
      float mk = INFINITY;
      for (int i = lane; i < nq; i += 32) mk = fminf(mk, keys[i]);
      for (int o = 16; o > 0; o >>= 1) mk = fminf(mk, __shfl_xor_sync(full, mk, o));
      if (wid != invalid_id) {  // the evicted key no longer holds this list (if recorded)
        std::uint32_t* h = holders_of(wid);
        const int hc = min(static_cast<int>(st.holder_counts[base + wid]), H);
        for (int i = lane; i < hc; i += 32) {
          if (h[i] == q) h[i] = invalid_id;
        }
      }
      if (lane == 0) {
        st.worst_key[li] = mk;
        if (bi_better(qk, x, st.best_key[li], st.best_id[li])) {
          st.best_key[li] = qk;
          st.best_id[li] = x;
        }
        piv[e] = st.best_id[li];
      }
    }
    __syncthreads();
    if (warp == 0) {
      // x's key -> query list: the first H lists it entered (ascending), and the reverse-edge
      // targets: x's neighbours, then each new pivot in list order (as the CPU's walk).
      const int hn = min(ne, H);
      std::uint32_t* hx = holders_of(x);
      for (int i = lane; i < hn; i += 32) hx[i] = qids[ent[i]];
      int ntg = nk;
      std::uint32_t last = invalid_id;
      for (int e = 0; e < ne; ++e) {
        const std::uint32_t p = piv[e];
        if (p == x || p == last) continue;
        last = p;
        if (!bi_contains(targets, ntg, p, lane)) {
          if (lane == 0) targets[ntg] = p;
          ++ntg;
          __syncwarp();
        }
      }
      if (lane == 0) {
        st.holder_counts[base + x] = static_cast<std::uint32_t>(hn);
        s_ntg = ntg;
      }
    }
  } else if (tid == 0) {
    s_ntg = nk;
  }
  __syncthreads();
  const int ntg = s_ntg;

  // 5. Reverse edges: one warp per target row (the rows are distinct).
  unsigned char* wb = w + lay.warp + static_cast<std::size_t>(warp) * lay.warp_bytes;
  auto* uid = reinterpret_cast<std::uint32_t*>(wb);
  auto* ukey = reinterpret_cast<float*>(wb + (R + 1) * 4);
  auto* rsid = reinterpret_cast<std::uint32_t*>(wb + (R + 1) * 8);
  auto* rskey = reinterpret_cast<float*>(wb + (R + 1) * 12);
  auto* rkept = reinterpret_cast<std::uint32_t*>(wb + bi_align((R + 1) * 16));
  auto* rdropped = reinterpret_cast<std::uint32_t*>(wb + bi_align((R + 1) * 16) + bi_align(R * 4));
  for (int i = warp; i < ntg; i += bi_warps) {
    const std::uint32_t y = targets[i];
    id_t* row_y = st.adjacency + static_cast<std::size_t>(base + y) * R;
    const int deg = bi_row_degree(row_y, R, lane);
    if (deg < R) {
      if (lane == 0) {
        row_y[deg] = x;
        if (layouts != nullptr) layouts[base + y] = bi_unknown_layout;
        s_linked = 1;
      }
      __syncwarp();
      continue;
    }
    const T* ry = row_of(y);
    // A full row laid out as its last re-pruning left it (RNG-kept edges, then the fill, each
    // in rank order around y): while x is occluded by a kept edge ranking before it, the
    // re-pruning would keep the kept edges and drop the farthest of the fill and x, so a few
    // distances decide (the CPU's link_back, edge for edge); so they do when x is kept and
    // occludes none of the kept edges after it (below); otherwise re-prune.
    const std::uint32_t kept = layouts != nullptr && fill ? layouts[base + y] : bi_unknown_layout;
    if (kept <= static_cast<std::uint32_t>(R)) {  // known (a corrupt count > R re-prunes)
      float sx = 0.0f;
      {
        const T* one[1] = {ry};
        float dist[1];
        bi_warp_l2<1>(row_of(x), one, d, lane, dist);
        sx = walk_key<true>(dist[0]);
      }
      // The squared distances of kept edges [j0, j0 + bi_rows_at_once) to y and to x.
      auto kept_distances = [&](int j0, float(&dy)[bi_rows_at_once], float(&dx)[bi_rows_at_once]) {
        const T* rows[bi_rows_at_once];
#pragma unroll
        for (int u = 0; u < bi_rows_at_once; ++u) {
          rows[u] = j0 + u < static_cast<int>(kept) ? row_of(row_y[j0 + u]) : nullptr;
        }
        bi_warp_l2<bi_rows_at_once>(ry, rows, d, lane, dy);
        bi_warp_l2<bi_rows_at_once>(row_of(x), rows, d, lane, dx);
      };
      bool occluded = false, stop = false;
      int at = static_cast<int>(kept);  // x's rank among the kept edges, when it is kept
      for (int j0 = 0; j0 < static_cast<int>(kept) && !occluded && !stop; j0 += bi_rows_at_once) {
        float dy[bi_rows_at_once], dx[bi_rows_at_once];
        kept_distances(j0, dy, dx);
#pragma unroll
        for (int u = 0; u < bi_rows_at_once; ++u) {
          if (occluded || stop || j0 + u >= static_cast<int>(kept)) continue;
          if (!bi_better(walk_key<true>(dy[u]), row_y[j0 + u], sx, x)) {
            stop = true;
            at = j0 + u;
          } else {
            occluded = walk_key<true>(dx[u]) > sx;
          }
        }
      }
      if (occluded) {
        // x is pruned: it goes if R edges were kept or the fill's last edge ranks before it;
        // otherwise the last goes and x takes its rank among the fill.
        if (kept < static_cast<std::uint32_t>(R)) {
          bi_l2_keys<T>(src, g, base, ry, row_y + kept, R - static_cast<int>(kept), d, lane,
                        ukey + kept);
          __syncwarp();
          if (lane == 0 && !bi_better(ukey[R - 1], row_y[R - 1], sx, x)) {
            int pos = R - 1;
            for (; pos > static_cast<int>(kept) && !bi_better(ukey[pos - 1], row_y[pos - 1], sx, x);
                 --pos) {
              row_y[pos] = row_y[pos - 1];
            }
            row_y[pos] = x;
            s_linked = 1;
          }
          __syncwarp();
        }
        continue;
      }
      // x is kept. If it occludes none of the kept edges ranking after it, they stay kept and
      // every fill edge keeps the kept edge that occluded it: x joins the kept edges at its
      // rank and the fill's last edge goes (the CPU's link_back, edge for edge). Otherwise (or
      // with R kept edges) x may free fill edges: re-prune.
      bool frees = kept == static_cast<std::uint32_t>(R);
      for (int j0 = at; j0 < static_cast<int>(kept) && !frees; j0 += bi_rows_at_once) {
        float dy[bi_rows_at_once], dx[bi_rows_at_once];
        kept_distances(j0, dy, dx);
#pragma unroll
        for (int u = 0; u < bi_rows_at_once; ++u) {
          frees = frees || (j0 + u < static_cast<int>(kept) &&
                            walk_key<true>(dx[u]) > walk_key<true>(dy[u]));
        }
      }
      if (!frees) {
        if (lane == 0) {
          for (int j = R - 1; j > at; --j) row_y[j] = row_y[j - 1];
          row_y[at] = x;
          layouts[base + y] = kept + 1;
          s_linked = 1;
        }
        __syncwarp();
        continue;
      }
    }
    // The build's re-pruning with x as one more candidate (RNG in rank order around y, filled
    // to R); it records the row's new layout.
    for (int j = lane; j <= R; j += 32) uid[j] = j < R ? row_y[j] : x;
    __syncwarp();
    bi_l2_keys<T>(src, g, base, ry, uid, R + 1, d, lane, ukey);
    __syncwarp();
    bi_rank_sort(ukey, uid, R + 1, rskey, rsid, lane, 32);
    __syncwarp();
    int rng_kept = 0;
    const int nr =
        bi_prune<T>(src, g, base, d, rsid, rskey, R + 1, R, fill, rkept, rdropped, lane, &rng_kept);
    if (layouts != nullptr && lane == 0) layouts[base + y] = static_cast<std::uint32_t>(rng_kept);
    bool took = false;
    for (int j = lane; j < R; j += 32) {
      const std::uint32_t v = j < nr ? rkept[j] : invalid_id;
      row_y[j] = v;
      took = took || v == x;
    }
    if (__any_sync(full, took) && lane == 0) s_linked = 1;
    __syncwarp();
  }
  __syncthreads();
  // 6. x's in-edge if no row took it (into its first target's row, as the CPU's link_back
  //    ends); then x -> p for each pivot p that kept x, while x's row has room.
  if (warp == 0) {
    if (s_linked == 0 && ntg > 0) {
      const std::uint32_t y = targets[0];
      id_t* row_y = st.adjacency + static_cast<std::size_t>(base + y) * R;
      const int deg = bi_row_degree(row_y, R, lane);
      if (lane == 0 && deg > 0) {
        row_y[deg - 1] = x;
        if (layouts != nullptr) layouts[base + y] = bi_unknown_layout;
      }
      __syncwarp();
    }
    id_t* row_x = st.adjacency + static_cast<std::size_t>(base + x) * R;
    int degx = nk;
    for (int i = nk; i < ntg && degx < R; ++i) {
      const std::uint32_t p = targets[i];
      const id_t* row_p = st.adjacency + static_cast<std::size_t>(base + p) * R;
      if (!bi_contains(row_p, R, x, lane)) continue;
      if (bi_contains(row_x, degx, p, lane)) continue;
      if (lane == 0) row_x[degx] = p;
      ++degx;
      __syncwarp();
    }
    __syncwarp();
    if (lane == 0) {
      __threadfence();
      st.sizes[g] = x + 1;
    }
  }
}

template <class T, class Src>
void batch_insert_launch(const graph_set_ref& set, const Src& src, int dim, bool vec,
                         const void* keys_ptr, const batch_insert_state_ref& st,
                         const batch_insert_params& p, void* workspace, std::size_t workspace_bytes,
                         cudaStream_t stream, std::uint32_t* status) {
  using kvsift::detail::require;
  constexpr const char* who = "batch_insert";
  const bi_layout l = bi_plan(set, dim, st, p, who);
  require(set.sizes != nullptr && set.sizes == st.sizes, who,
          ": expected the set's sizes to be the state's (graphs that grow in place)");
  require(set.adjacency != nullptr && set.adjacency == st.adjacency, who,
          ": expected the set's adjacency to be the state's (writable) adjacency");
  kvsift::detail::require<dimension_mismatch>(st.query_ld >= dim, who,
                                              ": expected a query row stride >= dim = ", dim,
                                              ", got ", st.query_ld);
  require(workspace_bytes >= l.total, who, ": workspace of ", workspace_bytes,
          " bytes is too small, expected >= ", l.total);
  int device = 0;
  KVSIFT_CUDA_CHECK(cudaGetDevice(&device));
  require_stream_on(stream, device, who);
  const void* ptrs[] = {set.row_offset,  set.entries, st.adjacency,     st.sizes,     st.queries,
                        st.query_offset, st.knn_ids,  st.knn_keys,      st.worst_key, st.best_id,
                        st.best_key,     st.holders,  st.holder_counts, keys_ptr,     workspace};
  const char* names[] = {"row offsets",   "entries", "adjacency",     "sizes",      "queries",
                         "query offsets", "knn ids", "knn keys",      "worst keys", "best ids",
                         "best keys",     "holders", "holder counts", "keys",       "workspace"};
  for (std::size_t i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); ++i) {
    require_device_pointer(ptrs[i], device, who, names[i]);
  }
  if (status != nullptr) require_device_pointer(status, device, who, "status");
  if (st.layouts != nullptr) require_device_pointer(st.layouts, device, who, "layouts");
  auto* ws = static_cast<unsigned char*>(workspace);
  const auto G = static_cast<unsigned>(set.num_graphs);
  bi_prepare_kernel<T><<<G, 128, 0, stream>>>(set, src, l, ws, status);
  KVSIFT_CUDA_CHECK(cudaGetLastError());
  decode_queries qs;
  qs.q = reinterpret_cast<const float*>(ws + l.x);
  // Each graph's x sits at the start of its scratch: a query row stride of graph_bytes / 4.
  qs.ld = static_cast<std::int64_t>(l.graph_bytes / sizeof(float));
  qs.graph = reinterpret_cast<const std::int32_t*>(ws + l.qgraph);
  decode_search_outputs out;
  out.ids = reinterpret_cast<id_t*>(ws + l.found);
  out.counts = reinterpret_cast<std::uint32_t*>(ws + l.found_counts);
  out.status = status;
  decode_search_launch<T>(set, src, dim, vec, keys_ptr, qs, set.num_graphs, bi_search_params(p),
                          out, ws + l.search_ws, l.search_bytes, stream);
  const bool lists = p.update_query_knn;
  const std::size_t smem =
      (static_cast<std::size_t>(set.width) + l.C + (l.words <= bi_smem_words ? l.words : 0)) *
      sizeof(std::uint32_t);
  if (p.metric == graph_metric::l2) {
    bi_insert_kernel<T, Src, true>
        <<<G, bi_threads, smem, stream>>>(set, st, src, l, lists, p.fill, ws);
  } else {
    bi_insert_kernel<T, Src, false>
        <<<G, bi_threads, smem, stream>>>(set, st, src, l, lists, p.fill, ws);
  }
  KVSIFT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kvsift::cuda::detail

namespace kvsift::cuda {

inline insert_lists make_insert_lists(const std::vector<id_t>& ids,
                                      const std::vector<float>& scores, std::size_t m,
                                      std::size_t nq, std::size_t rows, int holder_capacity,
                                      graph_metric metric) {
  using kvsift::detail::require;
  constexpr const char* who = "make_insert_lists";
  const std::size_t cells = kvsift::checked_mul(m, nq, "make_insert_lists: m x nq");
  require(ids.size() == cells && scores.size() == cells, who, ": expected ", cells,
          " ids and scores (m x nq), got ", ids.size(), " and ", scores.size());
  require(holder_capacity >= 1 && holder_capacity <= max_insert_holders, who,
          ": expected 1 <= holder_capacity <= ", max_insert_holders, ", got ", holder_capacity);
  for (const id_t id : ids) {
    require(id == invalid_id || id < rows, who, ": a kNN id ", id, " is not below ", rows, " rows");
  }
  const auto H = static_cast<std::size_t>(holder_capacity);
  (void)kvsift::checked_mul(rows, H, "make_insert_lists: rows x H");
  insert_lists r;
  r.knn_ids = ids;
  r.knn_keys.resize(cells);
  r.worst_key.resize(m);
  r.best_key.resize(m);
  r.best_id.resize(m);
  r.holders.assign(rows * H, invalid_id);
  r.holder_counts.assign(rows, 0);
  r.layouts.assign(rows, detail::bi_unknown_layout);
  const auto rank = [](float k1, id_t i1, float k2, id_t i2) {
    return k1 > k2 || (k1 == k2 && i1 < i2);
  };
  for (std::size_t i = 0; i < m; ++i) {
    float wk = 0, bk = 0;
    id_t wid = 0, bid = invalid_id;
    for (std::size_t j = 0; j < nq; ++j) {
      const std::size_t c = i * nq + j;
      const float s = scores[c];
      const float k =
          ids[c] == invalid_id || std::isnan(s) ? -INFINITY : (metric == graph_metric::l2 ? -s : s);
      r.knn_keys[c] = k;
      if (j == 0 || rank(wk, wid, k, ids[c])) wk = k, wid = ids[c];
      if (j == 0 || rank(k, ids[c], bk, bid)) bk = k, bid = ids[c];
      if (ids[c] != invalid_id && r.holder_counts[ids[c]] < H) {
        r.holders[ids[c] * H + r.holder_counts[ids[c]]++] = static_cast<id_t>(i);
      }
    }
    r.worst_key[i] = wk;
    r.best_key[i] = bk;
    r.best_id[i] = bid;
  }
  return r;
}

inline std::size_t batch_insert_workspace_size(const graph_set_ref& set, int dim,
                                               const batch_insert_state_ref& st,
                                               const batch_insert_params& p) {
  return detail::bi_plan(set, dim, st, p, "batch_insert_workspace_size").total;
}

template <class T>
void batch_insert(const graph_set_ref& set, const dense_keys_ref<T>& keys,
                  const batch_insert_state_ref& st, const batch_insert_params& p, void* workspace,
                  std::size_t workspace_bytes, cudaStream_t stream, std::uint32_t* status) {
  kvsift::detail::require(keys.ld >= keys.dim,
                          "batch_insert: expected a key row stride >= dim = ", keys.dim, ", got ",
                          keys.ld);
  const bool vec = detail::is_aligned16(keys.keys) && keys.dim % detail::vec_size_v<T> == 0 &&
                   (keys.ld * static_cast<std::int64_t>(sizeof(T))) % 16 == 0;
  detail::batch_insert_launch<T>(set, detail::ds_dense_source<T>{keys.keys, keys.ld}, keys.dim, vec,
                                 keys.keys, st, p, workspace, workspace_bytes, stream, status);
}

template <class T>
void batch_insert(const graph_set_ref& set, const paged_kv_ref<T>& kv,
                  const batch_insert_state_ref& st, const batch_insert_params& p, void* workspace,
                  std::size_t workspace_bytes, cudaStream_t stream, std::uint32_t* status) {
  using kvsift::detail::require;
  require(kv.page_size > 0 && kv.max_pages_per_head > 0 && kv.num_pages > 0,
          "batch_insert: expected positive page_size, max_pages_per_head and num_pages, got ",
          kv.page_size, ", ", kv.max_pages_per_head, ", ", kv.num_pages);
  require(set.num_graphs <= kv.num_kv_heads, "batch_insert: ", set.num_graphs,
          " graphs need as many page-table rows, the view has ", kv.num_kv_heads);
  int device = 0;
  KVSIFT_CUDA_CHECK(cudaGetDevice(&device));
  detail::require_device_pointer(kv.page_table, device, "batch_insert", "page table");
  const bool vec = detail::is_aligned16(kv.k_pages) && kv.head_dim % detail::vec_size_v<T> == 0;
  detail::batch_insert_launch<T>(set, detail::ds_paged_source<T>{kv}, kv.head_dim, vec, kv.k_pages,
                                 st, p, workspace, workspace_bytes, stream, status);
}

}  // namespace kvsift::cuda
