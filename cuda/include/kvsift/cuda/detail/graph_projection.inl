#pragma once
// Step 2 of the RoarGraph build (the projection) on the device, behind
// `connectivity_searcher<T>::project` (internal; included by graph_search.inl, whose walk_*
// pieces it uses).
//
// The CPU step (`roargraph_builder::project`) gathers, for each pivot p (the best key of a
// training query), the other keys of the lists whose pivot is p, prunes them around p, then
// appends to each row x the pivots whose pruned list holds x (in pivot order) and re-prunes the
// rows that overflow. Here every stage is a sort or a warp per list:
//   1. (p << 32 | c) for every candidate c of every list, radix-sorted and made unique: the
//      candidate sets grouped by pivot, ids ascending, as the CPU's sort + unique leaves them;
//   2. each candidate's squared distance to its pivot, then a stable radix sort by
//      (p << 32 | distance bits): rank order within each pivot's run (distances are >= 0, so
//      their bits order as they do; ties keep the ascending ids of stage 1, the CPU's
//      "ties to the lower id");
//   3. a warp per pivot run: `walk_rng_prune` with fill, the rule of step 3's searches;
//   4. (x << 32 | p) for every kept edge p -> x, sorted: each row's reverse edges, pivots
//      ascending;
//   5. a warp per row with reverse edges: its pruned list, then the reverse pivots it does not
//      hold; a row longer than the degree is ranked (`walk_rank_sort`) and pruned around x.
// The rows go into the searcher's adjacency (width >= degree), padded with invalid_id.

#include <cub/device/device_select.cuh>

namespace kvsift::cuda::detail {

/// Stage 1's keys: candidate j >= 1 of list q as (pivot << 32 | id); (n << 32) for a slot
/// without one (an invalid id, the pivot itself, or a list without a valid pivot), which sorts
/// last and is dropped by the run loop.
template <class Id>
__global__ void projection_pairs_kernel(const Id* ids, std::int64_t m, int k, Id n,
                                        std::uint64_t* out) {
  const std::int64_t per = k - 1, total = m * per;
  const std::uint64_t none = static_cast<std::uint64_t>(n) << 32;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t q = t / per, j = t - q * per + 1;
    const Id p = ids[q * k], c = ids[q * k + j];
    const bool valid = p < n && c < n && c != p;
    out[t] = valid ? (static_cast<std::uint64_t>(p) << 32 | c) : none;
  }
}

/// Stage 2's sort keys: for the `*count` unique pairs, (p << 32 | bits of |p - c|^2) with c as
/// the value and p in `pivot`; every other slot of [0, total) gets the key (n << 32 | ~0), the
/// value and pivot n. Lane per candidate, as the search scores its neighbours.
template <class T>
__global__ void projection_distance_kernel(const T* __restrict__ keys, std::int64_t ld, int d,
                                           bool vec, id_t n, const std::uint64_t* pairs,
                                           const int* count, std::int64_t total,
                                           std::uint64_t* sort_keys, id_t* values, id_t* pivot) {
  const std::int64_t valid = *count;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::uint64_t u = t < valid ? pairs[t] : static_cast<std::uint64_t>(n) << 32;
    const auto p = static_cast<id_t>(u >> 32);
    const auto c = static_cast<id_t>(u & 0xffffffffu);
    if (p >= n) {
      sort_keys[t] = static_cast<std::uint64_t>(n) << 32 | 0xffffffffu;
      values[t] = n;
      pivot[t] = n;
      continue;
    }
    const float s = walk_score_rows<true>(keys + static_cast<std::size_t>(p) * ld,
                                          keys + static_cast<std::size_t>(c) * ld, d, vec);
    sort_keys[t] = static_cast<std::uint64_t>(p) << 32 | __float_as_uint(s);
    values[t] = c;
    pivot[t] = p;
  }
}

struct projection_args {
  id_t n = 0;
  int degree = 0;
  const id_t* run_id = nullptr;  // per run: its pivot (stage 3) or row (stage 5); n: unused
  const std::uint32_t* run_len = nullptr;
  const std::uint32_t* run_off = nullptr;
  const int* runs = nullptr;
  id_t* pruned = nullptr;                 // n x degree: stage 3's lists (invalid_id padded)
  std::uint32_t* pruned_count = nullptr;  // n
  id_t* adjacency = nullptr;              // n x width: the rows (stage 5)
  int width = 0;
};

/// Stage 3: a warp per pivot run prunes its ranked candidates (keys of stage 2, sorted, with
/// their ids) around the pivot, l2, with fill, into `pruned`.
template <class T>
__global__ void __launch_bounds__(walk_warps_per_block * 32)
    projection_prune_kernel(const T* __restrict__ keys, std::int64_t ld, int d, bool vec,
                            projection_args a, const std::uint64_t* sorted_keys,
                            const id_t* sorted_ids, walk_entry* entries) {
  __shared__ std::uint32_t kept_all[walk_warps_per_block][max_graph_search_degree];
  __shared__ std::uint32_t dropped_all[walk_warps_per_block][max_graph_search_degree];
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  std::uint32_t* const kept = kept_all[warp];
  std::uint32_t* const dropped = dropped_all[warp];
  const int runs = *a.runs;
  const int warps = static_cast<int>(gridDim.x) * walk_warps_per_block;
  for (int r = static_cast<int>(blockIdx.x) * walk_warps_per_block + warp; r < runs; r += warps) {
    const id_t p = a.run_id[r];
    if (p >= a.n) continue;  // warp-uniform
    const int len = static_cast<int>(a.run_len[r]);
    const std::uint32_t off = a.run_off[r];
    walk_entry* const e = entries + off;
    for (int j = lane; j < len; j += 32) {
      e[j].key = walk_key<true>(__uint_as_float(static_cast<std::uint32_t>(sorted_keys[off + j])));
      e[j].id = sorted_ids[off + j];
    }
    __syncwarp();
    const int nk = walk_rng_prune<true>(e, len, invalid_id, a.degree, true, kept, dropped, keys, ld,
                                        d, vec, lane);
    id_t* const row = a.pruned + static_cast<std::size_t>(p) * a.degree;
    for (int j = lane; j < a.degree; j += 32) row[j] = j < nk ? kept[j] : invalid_id;
    if (lane == 0) a.pruned_count[p] = static_cast<std::uint32_t>(nk);
    __syncwarp();
  }
}

/// Stage 4's keys: the kept edge p -> x (slot j of row p) as (x << 32 | p); (n << 32) for an
/// empty slot.
template <class Id>
__global__ void projection_reverse_kernel(const Id* pruned, const std::uint32_t* pruned_count, Id n,
                                          int degree, std::uint64_t* out) {
  const std::int64_t total = static_cast<std::int64_t>(n) * degree;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t p = t / degree;
    const bool have = t - p * degree < static_cast<std::int64_t>(pruned_count[p]);
    out[t] = have ? (static_cast<std::uint64_t>(pruned[t]) << 32 | static_cast<std::uint64_t>(p))
                  : static_cast<std::uint64_t>(n) << 32;
  }
}

/// The high half of each key (stage 4's rows, for the run-length encoding).
template <class Id>
__global__ void projection_high_kernel(const std::uint64_t* in, std::int64_t total, Id* out) {
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[t] = static_cast<Id>(in[t] >> 32);
  }
}

/// Every row's pruned list copied into the adjacency, padded to the width.
template <class Id>
__global__ void projection_rows_kernel(const Id* pruned, Id n, int degree, Id* adjacency,
                                       int width) {
  const std::int64_t total = static_cast<std::int64_t>(n) * width;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t x = t / width, j = t - x * width;
    adjacency[t] = j < degree ? pruned[x * degree + j] : invalid_id;
  }
}

/// Stage 5: a warp per row with reverse edges (run r of the sorted (x << 32 | p) keys): the
/// row's pruned list, then each reverse pivot it does not hold, in pivot order (the CPU's
/// merged list); kept as is if it fits the degree, else ranked by distance to x and pruned with
/// fill. cand / srt: room for run_len[r] + degree entries at run_off[r] + r * degree.
template <class T>
__global__ void __launch_bounds__(walk_warps_per_block * 32)
    projection_merge_kernel(const T* __restrict__ keys, std::int64_t ld, int d, bool vec,
                            projection_args a, const std::uint64_t* sorted_reverse,
                            walk_entry* cand, walk_entry* srt) {
  __shared__ std::uint32_t kept_all[walk_warps_per_block][max_graph_search_degree];
  __shared__ std::uint32_t dropped_all[walk_warps_per_block][max_graph_search_degree];
  constexpr unsigned full = 0xffffffffu;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const unsigned lower_lanes = (1u << lane) - 1u;
  std::uint32_t* const kept = kept_all[warp];
  std::uint32_t* const dropped = dropped_all[warp];
  const int degree = a.degree;
  const int runs = *a.runs;
  const int warps = static_cast<int>(gridDim.x) * walk_warps_per_block;
  for (int r = static_cast<int>(blockIdx.x) * walk_warps_per_block + warp; r < runs; r += warps) {
    const id_t x = a.run_id[r];
    if (x >= a.n) continue;  // warp-uniform
    const int len = static_cast<int>(a.run_len[r]);
    const std::uint32_t off = a.run_off[r];
    const std::size_t base = off + static_cast<std::size_t>(r) * degree;
    walk_entry* const c = cand + base;
    const id_t* const own = a.pruned + static_cast<std::size_t>(x) * degree;
    const int f = static_cast<int>(a.pruned_count[x]);
    for (int j = lane; j < f; j += 32) c[j].id = own[j];
    __syncwarp();
    int tot = f;
    for (int k0 = 0; k0 < len; k0 += 32) {
      const int k = k0 + lane;
      bool add = false;
      std::uint32_t p = invalid_id;
      if (k < len) {
        p = static_cast<std::uint32_t>(sorted_reverse[off + k] & 0xffffffffu);
        add = p != x;
        for (int j = 0; add && j < f; ++j) add = own[j] != p;
      }
      const unsigned b = __ballot_sync(full, add);
      if (add) c[tot + __popc(b & lower_lanes)].id = p;
      tot += __popc(b);
    }
    __syncwarp();
    id_t* const row = a.adjacency + static_cast<std::size_t>(x) * a.width;
    if (tot <= degree) {
      for (int j = f + lane; j < tot; j += 32) row[j] = c[j].id;
      __syncwarp();
      continue;
    }
    const T* const xr = keys + static_cast<std::size_t>(x) * ld;
    for (int j = lane; j < tot; j += 32) {
      c[j].key = walk_key<true>(
          walk_score_rows<true>(xr, keys + static_cast<std::size_t>(c[j].id) * ld, d, vec));
    }
    __syncwarp();
    walk_reprune_row(c, tot, srt + base, degree, true, kept, dropped, keys, ld, d, vec, row, lane);
  }
}

/// Blocks of 256 threads for a grid-stride loop over `total` items (at most 4096 blocks).
inline unsigned projection_blocks(std::int64_t total) {
  return static_cast<unsigned>(std::clamp<std::int64_t>((total + 255) / 256, 1, 4096));
}

/// Blocks for a warp per run, runs <= `most` (at most 8192 blocks; the kernels stride).
inline unsigned projection_run_blocks(std::int64_t most) {
  return static_cast<unsigned>(
      std::clamp<std::int64_t>((most + walk_warps_per_block - 1) / walk_warps_per_block, 1, 8192));
}

}  // namespace kvsift::cuda::detail

namespace kvsift::cuda {

template <Element T>
void connectivity_searcher<T>::project(std::span<const id_t> knn_ids, std::size_t k,
                                       std::size_t degree) {
  using kvsift::detail::require;
  state& s = *s_;
  const auto n = static_cast<id_t>(s.n);
  // Every check before anything is enqueued or allocated.
  require(k >= 1, "connectivity_searcher::project: expected k >= 1 ids per list, got 0");
  require(knn_ids.size() % k == 0, "connectivity_searcher::project: expected m x ", k, " ids, got ",
          knn_ids.size(), " (not a multiple of k)");
  require(
      degree >= 1 && degree <= static_cast<std::size_t>(std::min(s.width, max_graph_search_degree)),
      "connectivity_searcher::project: expected 1 <= degree <= ",
      std::min(s.width, max_graph_search_degree), " (the width and the kernel's limit), got ",
      degree);
  const std::size_t m = knn_ids.size() / k;
  // The sort keys and the run buffers count items in int (CUB) and offsets in uint32.
  require(m * (k - 1) <= static_cast<std::size_t>(INT_MAX) &&
              static_cast<std::size_t>(s.n) * degree <= static_cast<std::size_t>(INT_MAX),
          "connectivity_searcher::project: expected m x (k - 1) and n x degree <= ", INT_MAX,
          ", got ", m, " x ", k - 1, " and ", s.n, " x ", degree);
  for (std::size_t q = 0; q < m; ++q) {
    const id_t* row = knn_ids.data() + q * k;
    bool padding = false;
    for (std::size_t j = 0; j < k; ++j) {
      const id_t v = row[j];
      kvsift::detail::require<out_of_range>(v < n || v == invalid_id,
                                            "connectivity_searcher::project: expected ids < ", n,
                                            " or invalid_id, got ", v, " in list ", q);
      require(v == invalid_id || !padding, "connectivity_searcher::project: list ", q, " has id ",
              v, " after invalid_id at position ", j, "; expected the padding at the end");
      padding = padding || v == invalid_id;
    }
  }
  detail::device_guard guard(s.device);
  auto* adjacency = static_cast<id_t*>(s.adjacency.p);
  const std::int64_t E1 = static_cast<std::int64_t>(m * (k - 1));
  const std::int64_t E2 = s.n * static_cast<std::int64_t>(degree);
  const std::int64_t E = std::max(E1, E2);
  const int bits =
      32 + std::max(1, static_cast<int>(std::bit_width(static_cast<std::uint32_t>(n))));
  using device_t = typename detail::device_element<T>::type;
  const auto* keys = static_cast<const device_t*>(s.keys.p);
  const bool vec = detail::is_aligned16(keys) && s.d % detail::vec_size_v<device_t> == 0;
  const int d = static_cast<int>(s.d);

  // Buffers of this call only (about 60 bytes per list entry), stream-ordered: the
  // projection runs once per build, while other builders' kernels may run on the device.
  struct buffers {
    detail::stream_buffer ids, k0, k1, vals0, vals1, piv, run_id, run_len, run_off, runs, temp,
        entries, pruned, pruned_count, cand, srt;
  } b;
  const auto u64s = [](std::int64_t c) { return static_cast<std::size_t>(c) * 8; };
  const auto u32s = [](std::int64_t c) { return static_cast<std::size_t>(c) * 4; };
  auto* p_pairs = static_cast<std::uint64_t*>(b.k0.allocate(u64s(E), s.stream));
  auto* p_sorted = static_cast<std::uint64_t*>(b.k1.allocate(u64s(E), s.stream));
  auto* p_vals0 = static_cast<id_t*>(b.vals0.allocate(u32s(E), s.stream));
  auto* p_vals1 = static_cast<id_t*>(b.vals1.allocate(u32s(E), s.stream));
  auto* p_piv = static_cast<id_t*>(b.piv.allocate(u32s(E), s.stream));
  auto* p_run_id = static_cast<id_t*>(b.run_id.allocate(u32s(E), s.stream));
  auto* p_run_len = static_cast<std::uint32_t*>(b.run_len.allocate(u32s(E), s.stream));
  auto* p_run_off = static_cast<std::uint32_t*>(b.run_off.allocate(u32s(E), s.stream));
  auto* p_runs = static_cast<int*>(b.runs.allocate(sizeof(int) * 2, s.stream));
  auto* p_pruned = static_cast<id_t*>(b.pruned.allocate(u32s(E2), s.stream));
  auto* p_pruned_count = static_cast<std::uint32_t*>(b.pruned_count.allocate(u32s(s.n), s.stream));
  const int iE = static_cast<int>(E);
  std::size_t sort_a = 0, sort_b = 0, uniq = 0, rle = 0, scan = 0;
  KVSIFT_CUDA_CHECK(
      cub::DeviceRadixSort::SortKeys(nullptr, sort_a, p_pairs, p_sorted, iE, 0, bits, s.stream));
  KVSIFT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_b, p_pairs, p_sorted, p_vals0,
                                                    p_vals1, iE, 0, bits, s.stream));
  KVSIFT_CUDA_CHECK(
      cub::DeviceSelect::Unique(nullptr, uniq, p_sorted, p_pairs, p_runs, iE, s.stream));
  KVSIFT_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, rle, p_piv, p_run_id, p_run_len,
                                                       p_runs, iE, s.stream));
  KVSIFT_CUDA_CHECK(
      cub::DeviceScan::ExclusiveSum(nullptr, scan, p_run_len, p_run_off, iE, s.stream));
  const std::size_t temp_bytes = std::max({sort_a, sort_b, uniq, rle, scan});
  void* p_temp = b.temp.allocate(std::max<std::size_t>(temp_bytes, 1), s.stream);
  std::size_t tb = 0;

  detail::projection_args a;
  a.n = n;
  a.degree = static_cast<int>(degree);
  a.run_id = p_run_id;
  a.run_len = p_run_len;
  a.run_off = p_run_off;
  a.runs = p_runs;
  a.pruned = p_pruned;
  a.pruned_count = p_pruned_count;
  a.adjacency = adjacency;
  a.width = s.width;

  KVSIFT_CUDA_CHECK(cudaMemsetAsync(p_pruned, 0xff, u32s(E2), s.stream));
  KVSIFT_CUDA_CHECK(cudaMemsetAsync(p_pruned_count, 0, u32s(s.n), s.stream));
  if (E1 > 0) {
    // Stages 1-3: the pivots' candidate sets, ranked, pruned.
    auto* d_ids = static_cast<id_t*>(b.ids.allocate(knn_ids.size_bytes(), s.stream));
    KVSIFT_CUDA_CHECK(cudaMemcpyAsync(d_ids, knn_ids.data(), knn_ids.size_bytes(),
                                      cudaMemcpyHostToDevice, s.stream));
    detail::projection_pairs_kernel<id_t><<<detail::projection_blocks(E1), 256, 0, s.stream>>>(
        d_ids, static_cast<std::int64_t>(m), static_cast<int>(k), n, p_pairs);
    KVSIFT_CUDA_CHECK(cudaGetLastError());
    const int iE1 = static_cast<int>(E1);
    tb = temp_bytes;
    KVSIFT_CUDA_CHECK(
        cub::DeviceRadixSort::SortKeys(p_temp, tb, p_pairs, p_sorted, iE1, 0, bits, s.stream));
    tb = temp_bytes;
    KVSIFT_CUDA_CHECK(
        cub::DeviceSelect::Unique(p_temp, tb, p_sorted, p_pairs, p_runs + 1, iE1, s.stream));
    detail::projection_distance_kernel<device_t>
        <<<detail::projection_blocks(E1), 256, 0, s.stream>>>(
            keys, s.d, d, vec, n, p_pairs, p_runs + 1, E1, p_sorted, p_vals0, p_piv);
    KVSIFT_CUDA_CHECK(cudaGetLastError());
    // Stable: equal (pivot, distance) keep stage 1's ascending ids.
    tb = temp_bytes;
    KVSIFT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(p_temp, tb, p_sorted, p_pairs, p_vals0,
                                                      p_vals1, iE1, 0, bits, s.stream));
    // The pivots' runs: p_piv is in stage 1's order, whose runs the stable sort kept in place.
    tb = temp_bytes;
    KVSIFT_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(p_temp, tb, p_piv, p_run_id, p_run_len,
                                                         p_runs, iE1, s.stream));
    tb = temp_bytes;
    KVSIFT_CUDA_CHECK(
        cub::DeviceScan::ExclusiveSum(p_temp, tb, p_run_len, p_run_off, iE1, s.stream));
    auto* p_entries = static_cast<detail::walk_entry*>(b.entries.allocate(u64s(E1), s.stream));
    constexpr auto prune = detail::projection_prune_kernel<device_t>;
    prune<<<detail::projection_run_blocks(std::min<std::int64_t>(E1, s.n + 1)),
            detail::walk_warps_per_block * 32, 0, s.stream>>>(keys, s.d, d, vec, a, p_pairs,
                                                              p_vals1, p_entries);
    KVSIFT_CUDA_CHECK(cudaGetLastError());
  }
  // Every row starts as its pruned list (empty for a key that is no pivot).
  detail::projection_rows_kernel<id_t>
      <<<detail::projection_blocks(s.n * s.width), 256, 0, s.stream>>>(
          p_pruned, n, static_cast<int>(degree), adjacency, s.width);
  KVSIFT_CUDA_CHECK(cudaGetLastError());
  if (E1 > 0) {
    // Stages 4-5: the reverse edges, merged into the rows they reach.
    detail::projection_reverse_kernel<id_t><<<detail::projection_blocks(E2), 256, 0, s.stream>>>(
        p_pruned, p_pruned_count, n, static_cast<int>(degree), p_pairs);
    KVSIFT_CUDA_CHECK(cudaGetLastError());
    const int iE2 = static_cast<int>(E2);
    tb = temp_bytes;
    KVSIFT_CUDA_CHECK(
        cub::DeviceRadixSort::SortKeys(p_temp, tb, p_pairs, p_sorted, iE2, 0, bits, s.stream));
    detail::projection_high_kernel<id_t>
        <<<detail::projection_blocks(E2), 256, 0, s.stream>>>(p_sorted, E2, p_piv);
    KVSIFT_CUDA_CHECK(cudaGetLastError());
    tb = temp_bytes;
    KVSIFT_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(p_temp, tb, p_piv, p_run_id, p_run_len,
                                                         p_runs, iE2, s.stream));
    tb = temp_bytes;
    KVSIFT_CUDA_CHECK(
        cub::DeviceScan::ExclusiveSum(p_temp, tb, p_run_len, p_run_off, iE2, s.stream));
    // A run per row (at most n + 1 with the empty slots' run), each with room for its row.
    const std::int64_t most_runs = std::min<std::int64_t>(E2, s.n + 1);
    const std::size_t slots =
        static_cast<std::size_t>(E2) + static_cast<std::size_t>(most_runs) * degree;
    auto* p_cand = static_cast<detail::walk_entry*>(b.cand.allocate(slots * 8, s.stream));
    auto* p_srt = static_cast<detail::walk_entry*>(b.srt.allocate(slots * 8, s.stream));
    constexpr auto merge = detail::projection_merge_kernel<device_t>;
    merge<<<detail::projection_run_blocks(most_runs), detail::walk_warps_per_block * 32, 0,
            s.stream>>>(keys, s.d, d, vec, a, p_sorted, p_cand, p_srt);
    KVSIFT_CUDA_CHECK(cudaGetLastError());
  }
  // Wait, so that an error of the kernels is reported here; the buffers are then released in
  // stream order.
  KVSIFT_CUDA_CHECK(cudaStreamSynchronize(s.stream));
}

}  // namespace kvsift::cuda
