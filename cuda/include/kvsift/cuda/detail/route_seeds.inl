#pragma once
// route_seeds: bodies (internal; include <kvsift/cuda/route_seeds.cuh>).

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

/// Block b routes queries [b * group, b * group + group) (fewer in the last block), which must
/// share one graph. Shared memory: the queries (group x d_pad floats), then one score per
/// (query, routing row) (group x max_rows floats).
template <class T>
__global__ void __launch_bounds__(route_threads)
    route_seeds_kernel(route_set_ref<T> rs, decode_queries qs, int m, int top, int group, int d_pad,
                       bool vec, id_t* seeds, std::uint32_t* status) {
  extern __shared__ __align__(16) float route_smem[];
  constexpr unsigned full = 0xffffffffu;
  constexpr int U = route_rows_in_flight, W = route_loads, S = route_lanes;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int q0 = static_cast<int>(blockIdx.x) * group;
  const int nq = min(group, m - q0);
  const int d = rs.dim;
  const int seeds_ld = top * rs.list_len;
  float* const q = route_smem;
  float* const sc = route_smem + static_cast<std::size_t>(group) * d_pad;
  __shared__ int finite[max_route_group];

  const int g = qs.graph[q0];
  bool ok = g >= 0 && g < rs.num_graphs;
  std::int64_t r0 = 0, rows = 0;
  if (ok) {
    r0 = rs.offset[g];
    rows = rs.offset[g + 1] - r0;
    ok = r0 >= 0 && rows >= 0 && rows <= rs.max_rows;
  }
  for (int j = 1; j < nq; ++j) ok = ok && qs.graph[q0 + j] == g;
  if (!ok) {
    if (tid == 0 && status != nullptr) atomicOr(status, decode_status_bad_graph);
    for (std::int64_t i = tid; i < static_cast<std::int64_t>(nq) * seeds_ld; i += route_threads) {
      seeds[static_cast<std::size_t>(q0) * seeds_ld + static_cast<std::size_t>(i)] = invalid_id;
    }
    return;  // block-uniform
  }
  if (tid < nq) finite[tid] = 1;
  __syncthreads();
  for (int i = tid; i < nq * d; i += route_threads) {
    const int j = i / d, c = i - j * d;
    const float x = qs.q[static_cast<std::size_t>(q0 + j) * qs.ld + c];
    if (!isfinite(x)) finite[j] = 0;  // benign race: every writer stores 0
    q[j * d_pad + c] = x;
  }
  __syncthreads();

  // Scores: S threads per row, U rows per thread at a time; a lane sums its vectors in order,
  // then the S lanes' sums are combined by shuffles (the same tree for every row).
  constexpr int V = vec_size_v<T>;
  const int part = tid % S;
  const int per_pass = route_threads / S * U;
  const int nvec = vec ? d / V : 0;
  for (std::int64_t base = 0; base < rows; base += per_pass) {  // block-uniform trip count
    float acc[U][max_route_group];
    const T* row[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::int64_t r = base + tid / S + u * (route_threads / S);
      row[u] = r < rows
                   ? rs.vectors + static_cast<std::size_t>(r0 + r) * static_cast<std::size_t>(rs.ld)
                   : nullptr;
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
      const std::int64_t r = base + tid / S + u * (route_threads / S);
      if (r < rows && part == 0) {
#pragma unroll
        for (int j = 0; j < max_route_group; ++j) {
          if (j < nq) sc[j * rs.max_rows + r] = acc[u][j];
        }
      }
    }
  }
  __syncthreads();

  // Selection: a warp per query. Each lane keeps the best `top` of its rows (r = lane, lane + 32,
  // ...) in registers, sorted (higher score, then lower row), in one pass; then `top` rounds of a
  // warp arg-max over the lanes' heads.
  for (int j = warp; j < nq; j += route_threads / 32) {
    const float* s = sc + static_cast<std::size_t>(j) * rs.max_rows;
    id_t* out = seeds + static_cast<std::size_t>(q0 + j) * seeds_ld;
    float bs[max_route_top];
    int bi[max_route_top];
#pragma unroll
    for (int t = 0; t < max_route_top; ++t) {
      bs[t] = -INFINITY;
      bi[t] = -1;
    }
    if (finite[j] != 0) {
      for (int r = lane; r < rows; r += 32) {
        float x = s[r];
        int xi = r;
        // Insertion into the sorted list: x takes the first place it beats, and what held that
        // place moves on down (it beats every later entry, ties by its lower row included).
#pragma unroll
        for (int t = 0; t < max_route_top; ++t) {
          if (t < top && (bi[t] < 0 || x > bs[t] || (x == bs[t] && xi < bi[t]))) {
            const float ys = bs[t];
            const int yi = bi[t];
            bs[t] = x;
            bi[t] = xi;
            x = ys;
            xi = yi;
            if (xi < 0) break;
          }
        }
      }
    }
    int head = 0;  // this lane's next candidate
    for (int t = 0; t < top; ++t) {
      float best = -INFINITY;
      int at = -1;
#pragma unroll
      for (int h = 0; h < max_route_top; ++h) {
        if (h == head) {
          best = bs[h];
          at = bi[h];
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
      const id_t* list =
          at >= 0 ? rs.lists + static_cast<std::size_t>(r0 + at) * rs.list_len : nullptr;
      for (int c = lane; c < rs.list_len; c += 32) {
        out[t * rs.list_len + c] = list != nullptr ? list[c] : invalid_id;
      }
    }
  }
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

template <class T>
void route_seeds(const route_set_ref<T>& routes, const decode_queries& queries, std::int64_t m,
                 const route_params& p, id_t* seeds, std::uint32_t* status, cudaStream_t stream) {
  using kvsift::detail::require;
  constexpr const char* who = "route_seeds";
  static_assert(detail::is_supported_element_v<T>,
                "route_seeds: vectors must be float, __half or __nv_bfloat16");
  const int seeds_ld = route_seeds_ld(routes.list_len, p);
  require(p.group >= 1 && p.group <= max_route_group, who,
          ": expected 1 <= group <= ", max_route_group, ", got ", p.group);
  require(m >= 0 && m <= (std::int64_t{1} << 30), who, ": expected 0 <= m <= 2^30, got ", m);
  require(routes.num_graphs >= 1, who, ": expected at least one graph, got ", routes.num_graphs);
  require(routes.dim >= 1, who, ": expected a positive dimension, got ", routes.dim);
  require(routes.max_rows >= 1, who, ": expected max_rows >= 1, got ", routes.max_rows);
  require(std::int64_t{p.group} * routes.max_rows <= max_route_scores, who, ": group ", p.group,
          " x max_rows ", routes.max_rows, " scores, expected <= ", max_route_scores);
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
  const int d_pad = (routes.dim + 3) / 4 * 4;
  const std::size_t smem = sizeof(float) * (static_cast<std::size_t>(p.group) * d_pad +
                                            static_cast<std::size_t>(p.group) *
                                                static_cast<std::size_t>(routes.max_rows));
  int smem_max = 0;
  KVSIFT_CUDA_CHECK(
      cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  require(smem <= static_cast<std::size_t>(smem_max), who, ": dim ", routes.dim, ", group ",
          p.group, " and max_rows ", routes.max_rows, " need ", smem,
          " bytes of shared memory, the device has ", smem_max);
  constexpr auto kernel = detail::route_seeds_kernel<T>;
  KVSIFT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  const bool vec = detail::is_aligned16(routes.vectors) &&
                   routes.dim % detail::vec_size_v<T> == 0 &&
                   (routes.ld * static_cast<std::int64_t>(sizeof(T))) % 16 == 0;
  const auto blocks = static_cast<unsigned>((m + p.group - 1) / p.group);
  kernel<<<blocks, detail::route_threads, smem, stream>>>(
      routes, queries, static_cast<int>(m), p.top, p.group, d_pad, vec, seeds, status);
  KVSIFT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kvsift::cuda
