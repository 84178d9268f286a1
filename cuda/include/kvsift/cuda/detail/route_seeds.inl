#pragma once
// route_seeds: bodies (internal; include <kvsift/cuda/route_seeds.cuh>).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include <kvsift/core/checked_size.hpp>
#include <kvsift/cuda/detail/device_buffer.cuh>
#include <kvsift/cuda/detail/vec.cuh>

namespace kvsift::cuda::detail {

/// Threads per routing block, lanes per routing vector (each reads every fourth 16-byte vector
/// of the row: a row's loads coalesce in 64-byte runs, as the decode walk's rows do), rows per
/// lane in flight, and 16-byte loads per lane and row issued before any is used. The routing pass
/// is a stream of bytes (a GQA group's rows read once): the loads in flight are its speed. A first
/// version with 128 threads, one row per lane and each load waited for took 0.19 ms for 1024
/// queries over 2048 rows per graph on the H200, 6x its bytes' time at the copy rate.
inline constexpr int route_threads = 256;
inline constexpr int route_lanes = 4;
inline constexpr int route_rows_in_flight = 2;
inline constexpr int route_loads = 4;

/// Scores rows [0, count) against the block's nq queries (q: nq x d_pad floats in shared memory)
/// into sc[j * sc_ld + i]; row_of(i) is row i's first element. S threads per row, U rows per thread
/// at a time; a lane sums its vectors in order, then the S lanes' sums are combined by shuffles
/// (the same tree for every row). Every thread of the block calls it (the trip count is uniform).
template <class T, class RowOf>
__device__ __forceinline__ void route_score_rows(const float* q, int nq, int d_pad, int d, bool vec,
                                                 int count, RowOf row_of, float* sc, int sc_ld) {
  constexpr unsigned full = 0xffffffffu;
  constexpr int U = route_rows_in_flight, W = route_loads, S = route_lanes;
  constexpr int V = vec_size_v<T>;
  const int tid = static_cast<int>(threadIdx.x);
  const int part = tid % S;
  constexpr int per_pass = route_threads / S * U;
  const int nvec = vec ? d / V : 0;
  for (int base = 0; base < count; base += per_pass) {
    float acc[U][max_route_group];
    const T* row[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int r = base + tid / S + u * (route_threads / S);
      row[u] = r < count ? row_of(r) : nullptr;
#pragma unroll
      for (int j = 0; j < max_route_group; ++j) acc[u][j] = 0.0f;
    }
    if (vec) {
      for (int v0 = part; v0 < nvec; v0 += S * W) {
        uint4 raw[U][W];
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
          for (int w = 0; w < W; ++w) {
            const int vi = v0 + w * S;
            if (row[u] != nullptr && vi < nvec) {
              raw[u][w] = *reinterpret_cast<const uint4*>(row[u] + vi * V);
            }
          }
        }
#pragma unroll
        for (int w = 0; w < W; ++w) {
          const int vi = v0 + w * S;
          if (vi >= nvec) break;
#pragma unroll
          for (int u = 0; u < U; ++u) {
            if (row[u] == nullptr) continue;
            float x[V];
            widen_vec<T>(raw[u][w], x);
#pragma unroll
            for (int j = 0; j < max_route_group; ++j) {
              if (j >= nq) break;
              const float* qj = q + j * d_pad + vi * V;
#pragma unroll
              for (int t = 0; t < V; ++t) acc[u][j] = fmaf(qj[t], x[t], acc[u][j]);
            }
          }
        }
      }
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (row[u] == nullptr) continue;
        for (int c = part; c < d; c += S) {
          const float x = static_cast<float>(row[u][c]);
#pragma unroll
          for (int j = 0; j < max_route_group; ++j) {
            if (j >= nq) break;
            acc[u][j] = fmaf(q[j * d_pad + c], x, acc[u][j]);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int j = 0; j < max_route_group; ++j) {
#pragma unroll
        for (int o = S / 2; o > 0; o >>= 1) acc[u][j] += __shfl_xor_sync(full, acc[u][j], o);
      }
      const int r = base + tid / S + u * (route_threads / S);
      if (r < count && part == 0) {
#pragma unroll
        for (int j = 0; j < max_route_group; ++j) {
          if (j < nq) sc[j * sc_ld + r] = acc[u][j];
        }
      }
    }
  }
}

/// A lane's best `top` candidates in registers, sorted (higher score, then lower index).
struct route_best {
  float s[max_route_top];
  int i[max_route_top];

  __device__ __forceinline__ route_best() {
#pragma unroll
    for (int t = 0; t < max_route_top; ++t) {
      s[t] = -INFINITY;
      i[t] = -1;
    }
  }

  /// x takes the first place it beats, and what held that place moves on down (it beats every
  /// later entry, ties by its lower index included).
  __device__ __forceinline__ void offer(int top, float x, int xi) {
#pragma unroll
    for (int t = 0; t < max_route_top; ++t) {
      if (t < top && (i[t] < 0 || x > s[t] || (x == s[t] && xi < i[t]))) {
        const float ys = s[t];
        const int yi = i[t];
        s[t] = x;
        i[t] = xi;
        x = ys;
        xi = yi;
        if (xi < 0) break;
      }
    }
  }

  /// `top` rounds of a warp arg-max over the lanes' heads: emit(t, index) on every lane with the
  /// warp's t-th best index (-1 when there are fewer candidates). Every lane of the warp calls it.
  template <class Emit>
  __device__ __forceinline__ void emit_warp_top(int top, int lane, Emit emit) const {
    constexpr unsigned full = 0xffffffffu;
    int head = 0;  // this lane's next candidate
    for (int t = 0; t < top; ++t) {
      float best = -INFINITY;
      int at = -1;
#pragma unroll
      for (int h = 0; h < max_route_top; ++h) {
        if (h == head) {
          best = s[h];
          at = i[h];
        }
      }
      int from = lane;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ob = __shfl_xor_sync(full, best, o);
        const int oa = __shfl_xor_sync(full, at, o);
        const int of = __shfl_xor_sync(full, from, o);
        if (oa >= 0 && (at < 0 || ob > best || (ob == best && oa < at))) {
          best = ob;
          at = oa;
          from = of;
        }
      }
      if (at >= 0 && from == lane) ++head;
      emit(t, at);
    }
  }
};

/// Union of the clusters a block's queries probe, ascending: cluster, its first global row, the
/// queries probing it (a bit per query), and the prefix of the rows before it.
struct route_union {
  int n;
  int cluster[max_route_group * max_route_probe];
  std::int64_t first_row[max_route_group * max_route_probe];
  unsigned queries[max_route_group * max_route_probe];
  int start[max_route_group * max_route_probe + 1];

  /// The union entry holding probed row i (start[u] <= i < start[u + 1]). O(log n).
  __device__ __forceinline__ int entry_of(int i) const {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (start[mid] <= i) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  }
  __device__ __forceinline__ std::int64_t row_of(int i) const {
    const int u = entry_of(i);
    return first_row[u] + (i - start[u]);
  }
};

/// Block b routes queries [b * group, b * group + group) (fewer in the last block), which must
/// share one graph. Shared memory: the queries (group x d_pad floats), then one score per
/// (query, scored row) (group x sc_ld floats: max_rows, or with probe what the centroids and the
/// probed rows need, `route_scores_ld`), then with probe a bit mask of the queries probing each
/// cluster (max_clusters words).
template <class T>
__global__ void __launch_bounds__(route_threads)
    route_seeds_kernel(route_set_ref<T> rs, decode_queries qs, int m, int top, int group, int probe,
                       int sc_ld, int d_pad, bool vec, id_t* seeds, std::uint32_t* status) {
  extern __shared__ __align__(16) float route_smem[];
  constexpr unsigned full = 0xffffffffu;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int q0 = static_cast<int>(blockIdx.x) * group;
  const int nq = min(group, m - q0);
  const int d = rs.dim;
  const int seeds_ld = top * rs.list_len;
  const int max_cluster_rows = rs.max_cluster_rows > 0 ? rs.max_cluster_rows : rs.max_rows;
  float* const q = route_smem;
  float* const sc = route_smem + static_cast<std::size_t>(group) * d_pad;
  auto* const probed_by = reinterpret_cast<unsigned*>(sc + static_cast<std::size_t>(group) *
                                                               static_cast<std::size_t>(sc_ld));
  __shared__ int finite[max_route_group];
  __shared__ route_union un;

  auto fail = [&] {  // block-uniform: every thread calls it, then returns
    if (tid == 0 && status != nullptr) atomicOr(status, decode_status_bad_graph);
    for (std::int64_t i = tid; i < static_cast<std::int64_t>(nq) * seeds_ld; i += route_threads) {
      seeds[static_cast<std::size_t>(q0) * seeds_ld + static_cast<std::size_t>(i)] = invalid_id;
    }
  };
  const int g = qs.graph[q0];
  bool ok = g >= 0 && g < rs.num_graphs;
  std::int64_t r0 = 0, rows = 0, c0 = 0, nc = 0;
  if (ok) {
    r0 = rs.offset[g];
    rows = rs.offset[g + 1] - r0;
    ok = r0 >= 0 && rows >= 0 && rows <= rs.max_rows;
  }
  if (ok && probe > 0) {
    c0 = rs.cluster_offset[g];
    nc = rs.cluster_offset[g + 1] - c0;
    ok = c0 >= 0 && nc >= 0 && nc <= rs.max_clusters && rs.cluster_rows[c0] == r0 &&
         rs.cluster_rows[c0 + nc] == r0 + rows;
  }
  for (int j = 1; j < nq; ++j) ok = ok && qs.graph[q0 + j] == g;
  if (!ok) {
    fail();
    return;
  }
  if (tid < nq) finite[tid] = 1;
  for (int c = tid; c < nc; c += route_threads) probed_by[c] = 0;
  __syncthreads();
  for (int i = tid; i < nq * d; i += route_threads) {
    const int j = i / d, c = i - j * d;
    const float x = qs.q[static_cast<std::size_t>(q0 + j) * qs.ld + c];
    if (!isfinite(x)) finite[j] = 0;  // benign race: every writer stores 0
    q[j * d_pad + c] = x;
  }
  __syncthreads();

  if (probe == 0) {
    route_score_rows<T>(
        q, nq, d_pad, d, vec, static_cast<int>(rows),
        [&](int r) { return rs.vectors + static_cast<std::size_t>(r0 + r) * rs.ld; }, sc, sc_ld);
    __syncthreads();
  } else {
    // Centroids first; each query's best `probe` clusters mark themselves in probed_by.
    route_score_rows<T>(
        q, nq, d_pad, d, vec, static_cast<int>(nc),
        [&](int c) { return rs.centroids + static_cast<std::size_t>(c0 + c) * rs.ld; }, sc, sc_ld);
    __syncthreads();
    for (int j = warp; j < nq; j += route_threads / 32) {
      if (finite[j] == 0) continue;
      route_best best;
      for (int c = lane; c < nc; c += 32) best.offer(probe, sc[j * sc_ld + c], c);
      best.emit_warp_top(probe, lane, [&](int, int c) {
        if (c >= 0 && lane == 0) atomicOr(&probed_by[c], 1u << j);
      });
    }
    __syncthreads();
    // Warp 0 lists the probed clusters in ascending order (so probed rows ascend, and ties
    // between rows still go to the lower row) with the prefix of their row counts.
    if (warp == 0) {
      int n = 0, rows_before = 0;
      bool sane = true;
      for (int base = 0; base < nc; base += 32) {
        const int c = base + lane;
        const unsigned by = c < nc ? probed_by[c] : 0u;
        const unsigned taken = __ballot_sync(full, by != 0);
        int count = 0;
        std::int64_t first = 0;
        if (by != 0) {
          first = rs.cluster_rows[c0 + c];
          const std::int64_t len = rs.cluster_rows[c0 + c + 1] - first;
          // A cluster outside the graph's rows would read another graph's (or no) rows.
          sane = len >= 0 && len <= max_cluster_rows && first >= r0 && first + len <= r0 + rows;
          count = sane ? static_cast<int>(len) : 0;
        }
        int incl = count;  // inclusive prefix of the counts over the taken lanes
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const int x = __shfl_up_sync(full, incl, o);
          if (lane >= o) incl += x;
        }
        if (by != 0) {
          const int at = n + __popc(taken & ((1u << lane) - 1u));
          un.cluster[at] = c;
          un.first_row[at] = first;
          un.queries[at] = by;
          un.start[at] = rows_before + incl - count;
        }
        n += __popc(taken);
        rows_before += __shfl_sync(full, incl, 31);
      }
      // (sc_ld bounds the probed rows: every probed cluster holds at most max_cluster_rows.)
      sane = __all_sync(full, sane) && rows_before <= rows && rows_before <= sc_ld;
      if (lane == 0) {
        un.n = sane ? n : -1;
        if (sane) un.start[n] = rows_before;
      }
    }
    __syncthreads();
    if (un.n < 0) {  // cluster bounds that do not tile the graph's rows
      fail();
      return;
    }
    route_score_rows<T>(
        q, nq, d_pad, d, vec, un.start[un.n],
        [&](int i) { return rs.vectors + static_cast<std::size_t>(un.row_of(i)) * rs.ld; }, sc,
        sc_ld);
    __syncthreads();
  }

  // Selection: a warp per query over its candidate rows; then its lists, best route first.
  for (int j = warp; j < nq; j += route_threads / 32) {
    const float* s = sc + static_cast<std::size_t>(j) * sc_ld;
    id_t* out = seeds + static_cast<std::size_t>(q0 + j) * seeds_ld;
    route_best best;
    if (finite[j] != 0) {
      if (probe == 0) {
        for (int r = lane; r < rows; r += 32) best.offer(top, s[r], r);
      } else {
        for (int u = 0; u < un.n; ++u) {
          if ((un.queries[u] >> j & 1u) == 0) continue;
          for (int i = un.start[u] + lane; i < un.start[u + 1]; i += 32) best.offer(top, s[i], i);
        }
      }
    }
    best.emit_warp_top(top, lane, [&](int t, int at) {
      const std::int64_t row = at < 0 ? -1 : probe == 0 ? r0 + at : un.row_of(at);
      const id_t* list =
          row >= 0 ? rs.lists + static_cast<std::size_t>(row) * rs.list_len : nullptr;
      for (int c = lane; c < rs.list_len; c += 32) {
        out[t * rs.list_len + c] = list != nullptr ? list[c] : invalid_id;
      }
    });
  }
}

/// Scores kept per query: every routing row of a graph, or with probe the centroids and the
/// rows of the clusters a group probes (at most group x probe clusters of max_cluster_rows).
template <class T>
std::int64_t route_scores_ld(const route_set_ref<T>& rs, const route_params& p) {
  if (p.probe == 0) return rs.max_rows;
  const std::int64_t most = rs.max_cluster_rows > 0 ? rs.max_cluster_rows : rs.max_rows;
  const std::int64_t probed =
      std::min<std::int64_t>(rs.max_rows, std::int64_t{p.group} * p.probe * most);
  return std::max<std::int64_t>(rs.max_clusters, probed);
}

}  // namespace kvsift::cuda::detail

namespace kvsift::cuda {

inline int route_seeds_ld(int list_len, const route_params& p) {
  using kvsift::detail::require;
  require(p.top >= 1 && p.top <= max_route_top, "route_seeds: expected 1 <= top <= ", max_route_top,
          ", got ", p.top);
  require(list_len >= 1, "route_seeds: expected list_len >= 1, got ", list_len);
  const std::int64_t ld = std::int64_t{p.top} * list_len;
  require(ld <= max_decode_search_seeds, "route_seeds: top * list_len = ", ld,
          " seeds per query, expected <= ", max_decode_search_seeds);
  return static_cast<int>(ld);
}

namespace detail {

/// route_seeds; with `enqueue` false it runs every check and launches nothing (decode_step's
/// dry pass, which checks all of a step's arguments before its first launch).
template <class T>
void run_route_seeds(const route_set_ref<T>& routes, const decode_queries& queries, std::int64_t m,
                     const route_params& p, id_t* seeds, std::uint32_t* status, cudaStream_t stream,
                     bool enqueue) {
  using kvsift::detail::require;
  constexpr const char* who = "route_seeds";
  static_assert(detail::is_supported_element_v<T>,
                "route_seeds: vectors must be float, __half or __nv_bfloat16");
  const int seeds_ld = route_seeds_ld(routes.list_len, p);
  require(p.group >= 1 && p.group <= max_route_group, who,
          ": expected 1 <= group <= ", max_route_group, ", got ", p.group);
  require(p.probe >= 0 && p.probe <= max_route_probe, who,
          ": expected 0 <= probe <= ", max_route_probe, ", got ", p.probe);
  if (p.probe > 0) {
    require(routes.max_clusters >= 1 && routes.max_clusters <= routes.max_rows, who, ": probe ",
            p.probe, " needs 1 <= max_clusters <= max_rows = ", routes.max_rows, ", got ",
            routes.max_clusters);
    require(routes.max_cluster_rows >= 0 && routes.max_cluster_rows <= routes.max_rows, who,
            ": expected 0 <= max_cluster_rows <= max_rows = ", routes.max_rows, ", got ",
            routes.max_cluster_rows);
  }
  require(m >= 0 && m <= (std::int64_t{1} << 30), who, ": expected 0 <= m <= 2^30, got ", m);
  require(routes.num_graphs >= 1, who, ": expected at least one graph, got ", routes.num_graphs);
  require(routes.dim >= 1, who, ": expected a positive dimension, got ", routes.dim);
  require(routes.max_rows >= 1, who, ": expected max_rows >= 1, got ", routes.max_rows);
  const std::int64_t sc_ld = detail::route_scores_ld(routes, p);
  if (p.probe == 0) {
    require(std::int64_t{p.group} * routes.max_rows <= max_route_scores, who, ": group ", p.group,
            " x max_rows ", routes.max_rows, " scores, expected <= ", max_route_scores);
  } else {
    require(std::int64_t{p.group} * sc_ld <= max_route_scores, who, ": group ", p.group, " x ",
            sc_ld,
            " scores (the centroids, or group x probe x max_cluster_rows probed rows), "
            "expected <= ",
            max_route_scores);
  }
  kvsift::detail::require<dimension_mismatch>(
      routes.ld >= routes.dim, who, ": expected a vector row stride >= dim = ", routes.dim,
      ", got ", routes.ld);
  kvsift::detail::require<dimension_mismatch>(queries.ld >= routes.dim, who,
                                              ": expected a query row stride >= dim = ", routes.dim,
                                              ", got ", queries.ld);
  // The seeds' extent, checked before anything is read or launched.
  (void)kvsift::checked_mul(static_cast<std::size_t>(m), static_cast<std::size_t>(seeds_ld),
                            "route_seeds: m x seeds");
  if (m == 0) return;
  const int device = detail::current_device();
  detail::require_stream_on(stream, device, who);
  detail::require_device_pointer(routes.vectors, device, who, "routing vectors");
  detail::require_device_pointer(routes.lists, device, who, "routing lists");
  detail::require_device_pointer(routes.offset, device, who, "routing offsets");
  detail::require_device_pointer(queries.q, device, who, "queries");
  detail::require_device_pointer(queries.graph, device, who, "query graphs");
  detail::require_device_pointer(seeds, device, who, "seeds");
  detail::require_optional_device_pointer(status, device, who, "status");
  if (p.probe > 0) {
    detail::require_device_pointer(routes.centroids, device, who, "centroids");
    detail::require_device_pointer(routes.cluster_offset, device, who, "cluster offsets");
    detail::require_device_pointer(routes.cluster_rows, device, who, "cluster rows");
  }
  const int d_pad = (routes.dim + 3) / 4 * 4;
  const std::size_t smem =
      sizeof(float) * (static_cast<std::size_t>(p.group) * d_pad +
                       static_cast<std::size_t>(p.group) * static_cast<std::size_t>(sc_ld)) +
      (p.probe > 0 ? sizeof(unsigned) * static_cast<std::size_t>(routes.max_clusters) : 0);
  int smem_max = 0;
  KVSIFT_CUDA_CHECK(
      cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  require(smem <= static_cast<std::size_t>(smem_max), who, ": dim ", routes.dim, ", group ",
          p.group, " and max_rows ", routes.max_rows, " need ", smem,
          " bytes of shared memory, the device has ", smem_max);
  constexpr auto kernel = detail::route_seeds_kernel<T>;
  if (!enqueue) return;
  KVSIFT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  const bool vec = detail::is_aligned16(routes.vectors) &&
                   (p.probe == 0 || detail::is_aligned16(routes.centroids)) &&
                   routes.dim % detail::vec_size_v<T> == 0 &&
                   (routes.ld * static_cast<std::int64_t>(sizeof(T))) % 16 == 0;
  const auto blocks = static_cast<unsigned>((m + p.group - 1) / p.group);
  kernel<<<blocks, detail::route_threads, smem, stream>>>(
      routes, queries, static_cast<int>(m), p.top, p.group, p.probe, static_cast<int>(sc_ld), d_pad,
      vec, seeds, status);
  KVSIFT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail

template <class T>
void route_seeds(const route_set_ref<T>& routes, const decode_queries& queries, std::int64_t m,
                 const route_params& p, id_t* seeds, std::uint32_t* status, cudaStream_t stream) {
  detail::run_route_seeds(routes, queries, m, p, seeds, status, stream, true);
}

}  // namespace kvsift::cuda
