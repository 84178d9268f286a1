#pragma once
// Kernel and host dispatch behind <kvsift/cuda/graph_search.cuh> (internal).
//
// One warp runs one search. Its shared memory holds the query (f32), the pool of L entries,
// the expansion's fresh neighbours and their sorted survivors, and the pruning's kept and
// dropped lists. The pool is merged in place (see the merge below), which keeps a warp's
// shared memory near 6 KiB at L = 500; the kernel asks for 75% of the unified L1 / shared
// memory as shared memory (`walk_carveout_percent`), eight blocks of four warps, so that the
// L1 keeps room for the key and adjacency rows. The visited set is a bitset of n bits per
// concurrently running warp, in global memory (L2 in practice), cleared before each search. Every
// step is warp-synchronous: a fresh row is scored by a team of 8 lanes (16-byte rows; one lane per
// row otherwise), the pool merge computes each entry's final position by counting in the other
// sorted list.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <bit>
#include <climits>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <kvsift/core/error.hpp>
#include <kvsift/cuda/detail/device_buffer.cuh>
#include <kvsift/cuda/detail/kernel_attributes.cuh>
#include <kvsift/cuda/detail/vec.cuh>
#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda::detail {

// walk_*: the pieces of the warp-per-search graph walk (pool entries, their order, scoring, the
// in-place pool merge, the shared-memory layout). decode_search.inl reuses the entries, their
// order, the scoring and the layout; it merges with its own sort-based ds_merge.
inline constexpr int walk_warps_per_block = 4;
inline constexpr std::int64_t walk_max_slots = 8192;  // searches running at once (bitsets)
inline constexpr std::uint32_t walk_expanded = 0x80000000u;
// The search kernel's preferred shared-memory carveout, in percent of the maximum. At the
// driver's default (all shared memory, for the most resident blocks: nine of four warps at
// L = 500, d = 128) the L1 keeps 28 KiB and the key and adjacency rows miss it; at 75% (196 KiB
// on the H200: eight blocks, 60 KiB of L1) 8192 step-3 searches over 131072 f16 keys took
// 14.1 ms against 24.1 (60 / 50 / 40%: 15.1 / 16.9 / 17.0 ms; bench/results/
// h200_graph_search_step3.txt).
inline constexpr int walk_carveout_percent = 75;

/// Host element type -> the CUDA type of the same bits.
template <class T>
struct device_element {
  using type = T;
};
template <>
struct device_element<kvsift::half> {
  using type = __half;
};
template <>
struct device_element<kvsift::bfloat16> {
  using type = __nv_bfloat16;
};

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

struct walk_entry {
  float key;         // larger is better
  std::uint32_t id;  // bit 31: expanded
};

/// The pool order: higher key first, ties to the lower id (the expanded flag is ignored).
__device__ __forceinline__ bool walk_better(float ka, std::uint32_t ia, float kb,
                                            std::uint32_t ib) {
  ia &= ~walk_expanded;
  ib &= ~walk_expanded;
  return ka > kb || (ka == kb && ia < ib);
}

/// Entries of a[0, len) (sorted best first) that rank before (k, i).
__device__ __forceinline__ int walk_count_better(const walk_entry* a, int len, float k,
                                                 std::uint32_t i) {
  int lo = 0, hi = len;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (walk_better(a[mid].key, a[mid].id, k, i)) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

template <bool L2>
__device__ __forceinline__ float walk_accumulate(float acc, float a, float b) {
  if constexpr (L2) {
    const float dpad = a - b;
    return fmaf(dpad, dpad, acc);
  } else {
    return fmaf(a, b, acc);
  }
}

/// Raw score of a f32 query (shared memory, 16-byte aligned when `vec`) against a key row.
template <bool L2, class T>
__device__ float walk_score(const float* q, const T* __restrict__ row, int d, bool vec) {
  float acc = 0.0f;
  if (vec) {
    constexpr int V = vec_size_v<T>;
    static_assert(V % 4 == 0, "the query is read as float4");
    // Unrolled so that several 16-byte loads of the row are in flight at once: the walk is
    // bound by the latency of these reads, not by the FMAs.
#pragma unroll 8
    for (int j = 0; j < d; j += V) {
      float x[V];
      load_vec(row + j, x);
      // The query as 16-byte shared loads, the same values in the same order: one float at a
      // time (the compiler does not know q's alignment), its loads were 65% of the step-3
      // search's shared-memory wavefronts and the L1's load pipe its busiest unit (Nsight
      // Compute, bench/results/h200_graph_search_query_loads.txt).
#pragma unroll
      for (int t = 0; t < V; t += 4) {
        const float4 q4 = *reinterpret_cast<const float4*>(q + j + t);
        acc = walk_accumulate<L2>(acc, q4.x, x[t]);
        acc = walk_accumulate<L2>(acc, q4.y, x[t + 1]);
        acc = walk_accumulate<L2>(acc, q4.z, x[t + 2]);
        acc = walk_accumulate<L2>(acc, q4.w, x[t + 3]);
      }
    }
  } else {
    for (int j = 0; j < d; ++j) acc = walk_accumulate<L2>(acc, q[j], to_f32(row[j]));
  }
  return acc;
}

/// Raw scores of R key rows (16-byte aligned, d % vec_size_v<T> == 0) in a fixed order of N
/// partial sums, computed by a team of S adjacent lanes (S divides N; N and S powers of two):
/// partial sum p < N adds the row's 16-byte vectors p, p + N, p + 2N, ... (each vector's
/// elements in order), and the N sums are added as a tree, first p with p + N / 2, then with
/// p + N / 4, ..., down to p + 1. Lane `part` < S of a team holds the partial sums part,
/// part + S, ... and returns in acc[r] their sum (the tree's upper levels) for row rows[r] (a
/// null row is skipped); walk_combine_lanes<S> then adds the team's lanes (the lower levels),
/// so a row's score is the same float whatever S: one lane (S = 1) or a team. Several short chains
/// of FMAs instead of one long one, and S lanes reading a row's vectors together (S * 16 contiguous
/// bytes per load) instead of one lane reading all of them. U: 16-byte loads in flight per row and
/// lane, all issued before any is used. The decode search scores with N = 4 (one lane in its warp
/// kernel, four in its block kernel, bit for bit alike), step 3 with N = S = 8 and two rows per
/// team.
template <bool L2, int N, int S, int U, int R, class T>
__device__ __forceinline__ void walk_score_parts(const float* q, const T* const (&rows)[R], int d,
                                                 int part, float (&acc)[R]) {
  constexpr int V = vec_size_v<T>;
  static_assert(V % 4 == 0, "the query is read as float4");
  static_assert(N > 0 && (N & (N - 1)) == 0 && S > 0 && N % S == 0, "S lanes hold N sums");
  constexpr int P = N / S;  // partial sums per lane: part + S * j in sums[r][j]
  static_assert(U % P == 0, "a load round holds whole sets of the lane's partial sums");
  const int nvec = d / V;
  float sums[R][P];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int j = 0; j < P; ++j) sums[r][j] = 0.0f;
  }
  // Lane `part` reads vectors part, part + S, part + 2S, ...: vector part + S * j belongs to
  // partial sum (part + S * j) % N, held in sums[r][j % P].
  for (int v0 = part; v0 < nvec; v0 += U * S) {
    uint4 raw[R][U];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int v = v0 + u * S;
        if (rows[r] != nullptr && v < nvec) {
          raw[r][u] = *reinterpret_cast<const uint4*>(rows[r] + v * V);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = v0 + u * S;
      if (v >= nvec) break;
#pragma unroll
      for (int t = 0; t < V; t += 4) {
        // The query's floats as 16-byte shared loads (the compiler does not know q's
        // alignment): a quarter of the instructions, the same values in the same order.
        const float4 q4 = *reinterpret_cast<const float4*>(q + v * V + t);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (rows[r] == nullptr) continue;
          float x[V];
          // Written inside the t loop for brevity; it does not depend on t, and the compiled
          // code widens each vector once.
          widen_vec<T>(raw[r][u], x);
          float& a = sums[r][u % P];
          a = walk_accumulate<L2>(a, q4.x, x[t]);
          a = walk_accumulate<L2>(a, q4.y, x[t + 1]);
          a = walk_accumulate<L2>(a, q4.z, x[t + 2]);
          a = walk_accumulate<L2>(a, q4.w, x[t + 3]);
        }
      }
    }
  }
  // The tree's levels within the lane: sums j and j + P / 2 (partial sums N / 2 apart), ...
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int h = P / 2; h > 0; h /= 2) {
#pragma unroll
      for (int j = 0; j < h; ++j) sums[r][j] += sums[r][j + h];
    }
    acc[r] = sums[r][0];
  }
}

/// The tree's levels across a team's S lanes (adjacent, aligned; every lane of the warp calls
/// it): lanes S / 2 apart, then S / 4, ... (walk_score_parts). Float addition commutes, so
/// every lane of the team ends with the same sum.
template <int S>
__device__ __forceinline__ float walk_combine_lanes(float x) {
#pragma unroll
  for (int o = S / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

/// Raw score between two key rows.
template <bool L2, class T>
__device__ float walk_score_rows(const T* __restrict__ a, const T* __restrict__ b, int d,
                                 bool vec) {
  float acc = 0.0f;
  if (vec) {
    constexpr int V = vec_size_v<T>;
#pragma unroll 4
    for (int j = 0; j < d; j += V) {
      float x[V], y[V];
      load_vec(a + j, x);
      load_vec(b + j, y);
#pragma unroll
      for (int t = 0; t < V; ++t) acc = walk_accumulate<L2>(acc, x[t], y[t]);
    }
  } else {
    for (int j = 0; j < d; ++j) acc = walk_accumulate<L2>(acc, to_f32(a[j]), to_f32(b[j]));
  }
  return acc;
}

/// Rank key of a raw score (NaN ranks last), as `kvsift::to_key`.
template <bool L2>
__device__ __forceinline__ float walk_key(float s) {
  if (isnan(s)) return neg_inf();
  return L2 ? -s : s;
}

/// RNG pruning (`rng_prune`) of `count` candidates given best first: cands[i].id (bits past 31
/// ignored) with its key to the pivot; the id `skip` is never kept. A candidate is dropped if
/// some kept id is closer to it than the pivot is. With `fill` the dropped ids follow in rank
/// order, up to `degree`, so only the first `degree` are remembered. kept / dropped: `degree`
/// entries each (shared memory). Returns the kept count. Warp-synchronous: every lane calls it.
/// The step-3 searches and the merge both prune so.
///
/// The rule is sequential (a candidate is tested against the ids kept before it), but a lane
/// takes a candidate of its own: 32 at a time, each lane tests its candidate against the ids
/// kept before the batch, stopping at the first closer one, and those that pass against the
/// batch's earlier passing candidates; the verdicts are then settled in rank order from the
/// shuffled bit masks. That is the same rule (a batch's candidate can only be dropped by the
/// earlier kept ids and the batch members kept before it, which are among the earlier passing
/// ones), on every lane instead of one distance per kept id, most of them idle while few ids
/// are kept (the pruning was 37% of a step-3 search's time before; h200_graph_search_step3.txt).
template <bool L2, class T>
__device__ int walk_rng_prune(const walk_entry* cands, int count, std::uint32_t skip, int degree,
                              bool fill, std::uint32_t* kept, std::uint32_t* dropped,
                              const T* __restrict__ keys, std::int64_t ld, int d, bool vec,
                              int lane) {
  constexpr unsigned full = 0xffffffffu;
  const unsigned lower_lanes = (1u << lane) - 1u;
  auto row_of = [&](std::uint32_t id) { return keys + static_cast<std::size_t>(id) * ld; };
  // Is `other` closer to c than the pivot is (c's key ck)?
  auto closer = [&](std::uint32_t c, std::uint32_t other, float ck) {
    return walk_key<L2>(walk_score_rows<L2>(row_of(c), row_of(other), d, vec)) > ck;
  };
  int nk = 0, nd = 0;
  for (int i0 = 0; i0 < count && nk < degree; i0 += 32) {
    const int i = i0 + lane;
    std::uint32_t c = invalid_id;
    float ck = 0.0f;
    bool live = false;
    if (i < count) {
      c = cands[i].id & ~walk_expanded;
      ck = cands[i].key;
      live = c != skip;
    }
    bool drop = false;
    for (int k = 0; live && k < nk && !drop; ++k) drop = closer(c, kept[k], ck);
    const unsigned live_mask = __ballot_sync(full, live);
    const unsigned pass = __ballot_sync(full, live && !drop);
    unsigned beaten = 0;  // earlier passing members of the batch closer to c than the pivot
    if (live && !drop) {
      for (unsigned s = pass & lower_lanes; s != 0u; s &= s - 1u) {
        const int j = __ffs(static_cast<int>(s)) - 1;
        if (closer(c, cands[i0 + j].id & ~walk_expanded, ck)) beaten |= 1u << j;
      }
    }
    unsigned taken = 0;                            // members of the batch kept
    for (int j = 0; j < 32 && nk < degree; ++j) {  // warp-uniform
      const unsigned bj = __shfl_sync(full, beaten, j);
      const std::uint32_t cj = __shfl_sync(full, c, j);
      if (((live_mask >> j) & 1u) == 0u) continue;
      if (((pass >> j) & 1u) != 0u && (bj & taken) == 0u) {
        if (lane == 0) kept[nk] = cj;
        taken |= 1u << j;
        ++nk;
      } else {
        if (lane == 0 && nd < degree) dropped[nd] = cj;
        ++nd;
      }
    }
    __syncwarp();
  }
  for (int i = 0; fill && i < min(nd, degree) && nk < degree; ++i, ++nk) {
    if (lane == 0) kept[nk] = dropped[i];
  }
  __syncwarp();
  return nk;
}

/// Compacts to the front of inc[0, n), in order, the candidates that enter the sorted
/// pool[0, cnt) of capacity L: all of them while it is not full, else those better than its
/// worst; an id of invalid_id never does. Returns how many. Each chunk of 32 is read whole
/// before any lane writes, and a write never lands past the entry it came from, so the
/// compaction is in place. Warp-synchronous: every lane calls it. O(n / 32) per lane.
__device__ inline int walk_compact_survivors(const walk_entry* pool, int cnt, int L,
                                             walk_entry* inc, int n, int lane) {
  constexpr unsigned full = 0xffffffffu;
  const bool is_full = cnt == L;
  const float worst_key = is_full ? pool[L - 1].key : 0.0f;
  const std::uint32_t worst_id = is_full ? pool[L - 1].id : 0u;
  const unsigned lower_lanes = (1u << lane) - 1u;
  int keep_n = 0;
  for (int j0 = 0; j0 < n; j0 += 32) {
    const int j = j0 + lane;
    walk_entry e{0.0f, invalid_id};
    bool keep = false;
    if (j < n) {
      e = inc[j];
      keep = e.id != invalid_id && (!is_full || walk_better(e.key, e.id, worst_key, worst_id));
    }
    const unsigned b = __ballot_sync(full, keep);
    __syncwarp();
    if (keep) inc[keep_n + __popc(b & lower_lanes)] = e;
    keep_n += __popc(b);
    __syncwarp();
  }
  return keep_n;
}

/// Writes in[0, n) to out[0, n) in rank order (best first), each entry placed by counting the
/// entries that rank before it: O(n^2 / 32) per lane, no barriers beyond the final one, and
/// exact because ranks are distinct (ids are). Warp-synchronous: every lane calls it.
__device__ inline void walk_rank_sort(const walk_entry* in, int n, walk_entry* out, int lane) {
  for (int j = lane; j < n; j += 32) {
    const walk_entry e = in[j];
    int rank = 0;
    for (int i = 0; i < n; ++i) rank += walk_better(in[i].key, in[i].id, e.key, e.id) ? 1 : 0;
    out[rank] = e;
  }
  __syncwarp();
}

/// The end of a row's re-pruning, shared by the build's merge (`merge_rows_kernel`) and the
/// projection's (`projection_merge_kernel`): cand[0, n) hold the row's candidates with their
/// keys (squared distance to the row's key); they are ranked into srt, pruned by the RNG rule
/// (with `fill`) to at most `keep`, and row[0, keep) is written, padded with invalid_id.
/// Warp-synchronous: every lane calls it.
template <class T>
__device__ void walk_reprune_row(const walk_entry* cand, int n, walk_entry* srt, int keep,
                                 bool fill, std::uint32_t* kept, std::uint32_t* dropped,
                                 const T* __restrict__ keys, std::int64_t ld, int d, bool vec,
                                 id_t* row, int lane) {
  walk_rank_sort(cand, n, srt, lane);
  const int nk =
      walk_rng_prune<true>(srt, n, invalid_id, keep, fill, kept, dropped, keys, ld, d, vec, lane);
  for (int j = lane; j < keep; j += 32) row[j] = j < nk ? kept[j] : invalid_id;
  __syncwarp();
}

/// Merges the scored candidates inc[0, n) (ids distinct, not in the pool; an id of invalid_id
/// marks a candidate to ignore) into the sorted pool[0, cnt) of capacity L and returns the new
/// count. When the pool is full only candidates better than its worst survive. `inc` is
/// clobbered; `srt` needs room for n entries. Warp-synchronous: every lane calls it.
///
/// Survivors are sorted by rank (ids are distinct, so ranks are), then merged in place. Final
/// positions come from binary searches in the other sorted list; the survivors' are computed
/// first (in inc, no longer needed), while the pool is intact. A pool entry only moves up (to
/// i + the survivors ranking before it), so chunks of 32 entries are moved from the last chunk
/// down, each read whole before any lane writes: a write lands in the chunk itself or in
/// chunks already moved, never on an entry not yet read. Final positions are distinct, so the
/// survivors' writes come last without clobbering moved entries.
__device__ inline int walk_merge(walk_entry* pool, int cnt, int L, walk_entry* inc, walk_entry* srt,
                                 int n, int lane, int* first_new = nullptr) {
  // Survivors ranked among themselves only: late in a search few of an expansion's candidates
  // beat the pool's worst, so this is O(survivors^2 / 32) per lane instead of
  // O(survivors * candidates / 32).
  const int keep_n = walk_compact_survivors(pool, cnt, L, inc, n, lane);
  if (first_new != nullptr) *first_new = L;
  if (keep_n == 0) return cnt;
  walk_rank_sort(inc, keep_n, srt, lane);
  for (int j = lane; j < keep_n; j += 32) {
    inc[j].id = static_cast<std::uint32_t>(j + walk_count_better(pool, cnt, srt[j].key, srt[j].id));
  }
  __syncwarp();
  // The best survivor's position: the pool entries before it keep their places, so only the
  // chunks from its own on move (late in a search survivors land near the pool's end, and this
  // loop was O(L) per expansion).
  const int p0 = static_cast<int>(inc[0].id);
  if (first_new != nullptr) *first_new = p0;
  // A pool entry i moves up by the survivors that rank before it: survivor j does iff its
  // insertion point, the inc[j].id - j pool entries that rank before it, is <= i. With at most
  // 32 survivors lane j holds that point (non-decreasing in j) and each pool entry counts by a
  // binary search over the lanes with shuffles instead of one over srt in shared memory (the
  // merge's binary searches were a sixth of the step-3 search's instructions).
  constexpr unsigned full = 0xffffffffu;
  const bool by_lanes = keep_n <= 32;
  const int ins = lane < keep_n ? static_cast<int>(inc[lane].id) - lane : INT_MAX;
  for (int c0 = (cnt - 1) / 32 * 32; c0 >= p0 / 32 * 32; c0 -= 32) {
    const int i = c0 + lane;
    walk_entry e{};
    int pos = L;
    if (by_lanes) {  // warp-uniform
      int before = 0;
#pragma unroll
      for (int step = 32; step > 0; step >>= 1) {
        const int v = __shfl_sync(full, ins, min(before + step, 32) - 1);
        if (before + step <= keep_n && v <= i) before += step;
      }
      if (i < cnt) {
        e = pool[i];
        pos = i + before;
      }
    } else if (i < cnt) {
      e = pool[i];
      pos = i + walk_count_better(srt, keep_n, e.key, e.id);
    }
    __syncwarp();
    if (pos < L) pool[pos] = e;
    __syncwarp();
  }
  for (int j = lane; j < keep_n; j += 32) {
    const int pos = static_cast<int>(inc[j].id);
    if (pos < L) pool[pos] = srt[j];
  }
  __syncwarp();
  return min(L, cnt + keep_n);
}

struct walk_layout {
  int d_pad = 0;       // floats of the query, multiple of 4
  int warp_bytes = 0;  // shared memory per warp, multiple of 16
};

inline walk_layout walk_shared_layout(std::int64_t d, int L, int width, int degree) {
  walk_layout l;
  l.d_pad = static_cast<int>((d + 3) / 4 * 4);
  const std::size_t bytes =
      sizeof(float) * static_cast<std::size_t>(l.d_pad) +
      sizeof(walk_entry) * (static_cast<std::size_t>(L) + 2 * static_cast<std::size_t>(width)) +
      sizeof(std::uint32_t) * 2 * static_cast<std::size_t>(std::max(degree, 1));
  l.warp_bytes = static_cast<int>((bytes + 15) / 16 * 16);
  return l;
}

/// Bitset words per search, a multiple of 4 so that each bitset is 16-byte aligned.
inline std::int64_t walk_words(std::int64_t n) { return ((n + 31) / 32 + 3) / 4 * 4; }

inline std::int64_t walk_slots(std::int64_t m) { return std::min(m, walk_max_slots); }

// The search kernel's register bound. ptxas left to itself gave it 56 registers and spilled
// 20 / 28 bytes in the merge's lane-shuffle counts; capped at 64 (8 blocks of 128 threads per
// SM, what the shared memory allows anyway) it does not spill and 8192 step-3 searches took
// 12.60-12.69 ms against 13.43-13.44 ms (h200_graph_search_query_loads.txt). __maxnreg__ needs
// nvcc 12.4; older ones keep the thread bound alone.
#if defined(__CUDACC_VER_MAJOR__) && \
    (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4))
#define KVSIFT_WALK_KERNEL_BOUNDS __maxnreg__(64)
#else
#define KVSIFT_WALK_KERNEL_BOUNDS __launch_bounds__(walk_warps_per_block * 32)
#endif

template <class T, bool L2>
__global__ void KVSIFT_WALK_KERNEL_BOUNDS
graph_search_kernel(graph_ref<T> g, const id_t* __restrict__ query_rows, int m, int L, int limit,
                    int degree, graph_search_outputs out, std::uint32_t* visited_all, int words,
                    bool vec, walk_layout lay, int slots) {
  extern __shared__ __align__(16) unsigned char walk_smem[];
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int slot = static_cast<int>(blockIdx.x) * walk_warps_per_block + warp;
  if (slot >= slots) return;  // warp-level only: the kernel has no block barrier
  unsigned char* base = walk_smem + static_cast<std::size_t>(warp) * lay.warp_bytes;
  float* q = reinterpret_cast<float*>(base);
  walk_entry* const pool = reinterpret_cast<walk_entry*>(q + lay.d_pad);
  walk_entry* const inc = pool + L;
  walk_entry* const srt = inc + g.width;
  std::uint32_t* const kept = reinterpret_cast<std::uint32_t*>(srt + g.width);
  std::uint32_t* const dropped = kept + max(degree, 1);
  std::uint32_t* const visited = visited_all + static_cast<std::size_t>(slot) * words;
  constexpr unsigned full = 0xffffffffu;
  const unsigned lower_lanes = (1u << lane) - 1u;
  const int d = static_cast<int>(g.d);
  const int width = g.width;
  auto row_of = [&](std::uint32_t id) { return g.keys + static_cast<std::size_t>(id) * g.ld; };

  for (int qi = slot; qi < m; qi += slots) {
    uint4* v4 = reinterpret_cast<uint4*>(visited);
    for (int w = lane; w < words / 4; w += 32) v4[w] = make_uint4(0u, 0u, 0u, 0u);
    const std::uint32_t self = query_rows[qi];
    for (int j = lane; j < d; j += 32) q[j] = to_f32(row_of(self)[j]);
    __syncwarp();

    if (lane == 0) {
      atomicOr(&visited[g.entry >> 5], 1u << (g.entry & 31u));
      pool[0] = {walk_key<L2>(walk_score<L2>(q, row_of(g.entry), d, vec)), g.entry};
    }
    int cnt = 1;
    std::uint32_t scored = 1;
    int lo = 0;  // every pool entry before lo is expanded
    __syncwarp();

    for (;;) {
      // The best unexpanded entry among the first `limit`: each lane's first in its stride
      // from lo on, then the warp minimum.
      int first = INT_MAX;
      const int expandable = min(cnt, limit);
      for (int i = lo + lane; i < expandable; i += 32) {
        if ((pool[i].id & walk_expanded) == 0u) {
          first = i;
          break;
        }
      }
      first = __reduce_min_sync(full, first);
      if (first == INT_MAX) break;
      const std::uint32_t u = pool[first].id;
      __syncwarp();
      if (lane == 0) pool[first].id = u | walk_expanded;

      // Unvisited neighbours of u, compacted into inc[0, fresh_n).
      int fresh_n = 0;
      const id_t* nbrs = g.adjacency + static_cast<std::size_t>(u) * width;
      for (int r0 = 0; r0 < width; r0 += 32) {
        const int r = r0 + lane;
        std::uint32_t v = invalid_id;
        bool fresh = false;
        if (r < width) {
          v = nbrs[r];
          if (v != invalid_id) {
            const std::uint32_t bit = 1u << (v & 31u);
            fresh = (atomicOr(&visited[v >> 5], bit) & bit) == 0u;
          }
        }
        const unsigned b = __ballot_sync(full, fresh);
        if (fresh) inc[fresh_n + __popc(b & lower_lanes)].id = v;
        fresh_n += __popc(b);
      }
      __syncwarp();

      // Score them: a row by a team of S = 8 lanes (each two of its 16-byte vectors at
      // d = 128 f16), two rows per team at a time. One lane per row made each warp load touch
      // up to 32 lines, and 8192 searches fill every SM with warps, so the L1's load pipe, not
      // a search's latency, bounds them: 8192 step-3 searches took 10.93 ms against 13.32 ms,
      // teams of 4 / 16 11.08 / 11.84 ms (bench/results/h200_graph_search_team_scoring.txt).
      if (vec) {
        constexpr int S = 8, R = 2, per_pass = 32 / S * R;
        const int part = lane % S, tm = lane / S;
        for (int j0 = 0; j0 < fresh_n; j0 += per_pass) {
          const T* rows[R];
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const int j = j0 + tm + (32 / S) * r;
            rows[r] = j < fresh_n ? row_of(inc[j].id) : nullptr;
          }
          float x[R];
          walk_score_parts<L2, S, S, 2, R>(q, rows, d, part, x);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            x[r] = walk_combine_lanes<S>(x[r]);
            const int j = j0 + tm + (32 / S) * r;
            if (part == 0 && j < fresh_n) inc[j].key = walk_key<L2>(x[r]);
          }
        }
      } else {
        for (int j = lane; j < fresh_n; j += 32) {
          const std::uint32_t v = inc[j].id;
          inc[j].key = walk_key<L2>(walk_score<L2>(q, row_of(v), d, vec));
        }
      }
      scored += static_cast<std::uint32_t>(fresh_n);
      __syncwarp();
      int first_new = L;
      cnt = walk_merge(pool, cnt, L, inc, srt, fresh_n, lane, &first_new);
      // The entries before `first` were expanded and it now is; the merge moved nothing before
      // its first new entry, which is unexpanded.
      lo = min(first + 1, first_new);
    }

    const std::size_t row0 = static_cast<std::size_t>(qi) * L;
    if (out.ids != nullptr || out.scores != nullptr) {
      for (int i = lane; i < L; i += 32) {
        const bool have = i < cnt;
        if (out.ids != nullptr)
          out.ids[row0 + i] = have ? (pool[i].id & ~walk_expanded) : invalid_id;
        if (out.scores != nullptr) {
          const float worst = L2 ? -neg_inf() : neg_inf();
          out.scores[row0 + i] = have ? (L2 ? -pool[i].key : pool[i].key) : worst;
        }
      }
    }
    if (lane == 0) {
      if (out.counts != nullptr) out.counts[qi] = static_cast<std::uint32_t>(cnt);
      if (out.scored != nullptr) out.scored[qi] = scored;
    }

    if (degree > 0) {
      // RNG pruning around the query key, with fill, over the pool best first.
      const int nk = walk_rng_prune<L2>(pool, cnt, self, degree, true, kept, dropped, g.keys, g.ld,
                                        d, vec, lane);
      const std::size_t k0 = static_cast<std::size_t>(qi) * degree;
      if (out.kept != nullptr) {
        for (int j = lane; j < degree; j += 32) out.kept[k0 + j] = j < nk ? kept[j] : invalid_id;
      }
      if (out.kept_counts != nullptr && lane == 0) {
        out.kept_counts[qi] = static_cast<std::uint32_t>(nk);
      }
    }
    __syncwarp();  // the next search reuses this warp's shared memory and bitset
  }
}

/// adjacency[rows[i] * width + j] = padded[i * width + j]. (A template, so that the header-only
/// kernel has one definition however many translation units include it.)
template <class Id>
__global__ void scatter_rows_kernel(Id* adjacency, int width, const Id* rows, const Id* padded,
                                    std::int64_t count) {
  const std::int64_t total = count * width;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = t / width, j = t % width;
    adjacency[static_cast<std::int64_t>(rows[i]) * width + j] = padded[t];
  }
}

// Step 3's merge on the device (connectivity_searcher::search_and_merge). A round's edges are
// generated in the builder's order, sorted by source with a stable radix sort (so each row's
// new edges keep that order), cut into runs of one source, and each run is merged into its row
// by one warp, which re-prunes the row if it overflows. Rows are distinct per run, so the warps
// never share a row.

/// Edge e of a round: query i's j-th pruned neighbour y, slot t = i * degree + j, gives edge
/// 2t (rows[i] -> y) and 2t + 1 (y -> rows[i]); a slot past the query's count gives two edges
/// from n (sorted last, skipped). The value carried through the sort is e itself.
template <class Id>
__global__ void merge_edges_kernel(const Id* rows, const Id* kept, const std::uint32_t* counts,
                                   std::int64_t m, int degree, Id n, Id* src, std::uint32_t* edge) {
  const std::int64_t total = m * degree;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = t / degree;
    const bool have = t - i * degree < static_cast<std::int64_t>(counts[i]);
    src[2 * t] = have ? rows[i] : n;
    src[2 * t + 1] = have ? kept[t] : n;
    edge[2 * t] = static_cast<std::uint32_t>(2 * t);
    edge[2 * t + 1] = static_cast<std::uint32_t>(2 * t + 1);
  }
}

struct merge_args {
  id_t* adjacency = nullptr;  // n x width, rows packed and padded with invalid_id
  int width = 0;
  id_t n = 0;
  const id_t* rows = nullptr;  // the round's queries
  const id_t* kept = nullptr;  // their pruned neighbours, m x degree
  int degree = 0;
  const id_t* run_src = nullptr;  // per run: its source row (n: the unused slots)
  const std::uint32_t* run_len = nullptr;
  const std::uint32_t* run_off = nullptr;  // first entry of the run in `edge`
  const int* runs = nullptr;
  const std::uint32_t* edge = nullptr;  // edge ids sorted by source, generation order kept
  walk_entry* cand = nullptr;           // per run r: width + run_len[r] entries at off + r * width
  walk_entry* srt = nullptr;            // the same, sorted
  bool fill = true;
  int d_pad = 0;
  int warp_bytes = 0;  // shared memory per warp: the key (d_pad floats), kept and dropped ids
};

/// Merges each run's new edges into its row, then re-prunes the row if it is longer than the
/// width (rng_prune around the row's key, l2, as `prune_around`). Warp-synchronous per run.
template <class T>
__global__ void __launch_bounds__(walk_warps_per_block * 32)
    merge_rows_kernel(const T* __restrict__ keys, std::int64_t ld, int d, bool vec, merge_args a) {
  extern __shared__ __align__(16) unsigned char merge_smem[];
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  float* const q = reinterpret_cast<float*>(merge_smem + warp * a.warp_bytes);
  std::uint32_t* const kept = reinterpret_cast<std::uint32_t*>(q + a.d_pad);
  std::uint32_t* const dropped = kept + a.width;
  constexpr unsigned full = 0xffffffffu;
  const unsigned lower_lanes = (1u << lane) - 1u;
  const int width = a.width;
  auto row_of = [&](std::uint32_t id) { return keys + static_cast<std::size_t>(id) * ld; };
  // Target of edge e (see merge_edges_kernel).
  auto target = [&](std::uint32_t e) -> std::uint32_t {
    const std::uint32_t t = e >> 1;
    return (e & 1u) != 0u ? a.rows[t / static_cast<std::uint32_t>(a.degree)] : a.kept[t];
  };
  const int runs = *a.runs;
  const int warps = static_cast<int>(gridDim.x) * walk_warps_per_block;
  for (int r = static_cast<int>(blockIdx.x) * walk_warps_per_block + warp; r < runs; r += warps) {
    const std::uint32_t x = a.run_src[r];
    if (x >= a.n) continue;  // warp-uniform
    const int cnt = static_cast<int>(a.run_len[r]);
    const std::uint32_t off = a.run_off[r];
    const std::uint32_t* const es = a.edge + off;
    walk_entry* const cand = a.cand + off + static_cast<std::size_t>(r) * width;
    walk_entry* const srt = a.srt + off + static_cast<std::size_t>(r) * width;
    id_t* const row = a.adjacency + static_cast<std::size_t>(x) * width;

    // The row as it stands.
    int tot = 0;
    for (int j0 = 0; j0 < width; j0 += 32) {
      const int j = j0 + lane;
      const std::uint32_t v = j < width ? row[j] : invalid_id;
      const bool valid = v != invalid_id;
      const unsigned b = __ballot_sync(full, valid);
      if (valid) cand[tot + __popc(b & lower_lanes)].id = v;
      tot += __popc(b);
    }
    const int c_old = tot;
    // x's own results (edges x -> y) are one contiguous block of the run: the round's queries
    // are distinct and the edges between them come from other sources. Only they can repeat
    // an edge of the run (the reverse edges y -> x' have distinct x'), so an entry is a repeat
    // if the row holds it, or if an earlier entry of the other kind (forward vs reverse) has
    // the same target: the builder's "append unless the row holds it".
    int fb = cnt, fe = cnt;
    for (int k0 = 0; k0 < cnt; k0 += 32) {
      const int k = k0 + lane;
      const bool fwd = k < cnt && (es[k] & 1u) == 0u;
      const unsigned b = __ballot_sync(full, fwd);
      if (b != 0u && fb == cnt) fb = k0 + __ffs(static_cast<int>(b)) - 1;
      if (b != 0u) fe = k0 + 32 - __clz(static_cast<int>(b));
    }
    __syncwarp();
    for (int k0 = 0; k0 < cnt; k0 += 32) {
      const int k = k0 + lane;
      bool add = false;
      std::uint32_t y = invalid_id;
      if (k < cnt) {
        const std::uint32_t e = es[k];
        y = target(e);
        add = y != x;
        for (int j = 0; add && j < c_old; ++j) add = cand[j].id != y;
        // A forward entry against the reverse ones before the block, a reverse entry against
        // the forward ones before it.
        const int lo = (e & 1u) == 0u ? 0 : fb;
        const int hi = (e & 1u) == 0u ? fb : min(fe, k);
        for (int j = lo; add && j < hi; ++j) add = target(es[j]) != y;
      }
      const unsigned b = __ballot_sync(full, add);
      if (add) cand[tot + __popc(b & lower_lanes)].id = y;
      tot += __popc(b);
    }
    __syncwarp();
    if (tot <= width) {
      for (int j = c_old + lane; j < tot; j += 32) row[j] = cand[j].id;
      __syncwarp();
      continue;
    }

    // Re-prune around x: keys to x, rank order, then the RNG rule with fill.
    for (int j = lane; j < d; j += 32) q[j] = to_f32(row_of(x)[j]);
    __syncwarp();
    for (int j = lane; j < tot; j += 32) {
      cand[j].key = walk_key<true>(walk_score<true>(q, row_of(cand[j].id), d, vec));
    }
    __syncwarp();
    walk_reprune_row(cand, tot, srt, width, a.fill, kept, dropped, keys, ld, d, vec, row, lane);
  }
}

}  // namespace kvsift::cuda::detail

namespace kvsift::cuda {

inline std::size_t graph_search_workspace_size(std::int64_t n, std::int64_t m) {
  kvsift::detail::require(n > 0, "graph_search: expected a non-empty key set, got ", n, " keys");
  kvsift::detail::require(m > 0, "graph_search: expected at least one query, got ", m);
  return static_cast<std::size_t>(detail::walk_slots(m) * detail::walk_words(n)) *
         sizeof(std::uint32_t);
}

template <class T>
void graph_search(const graph_ref<T>& g, const id_t* query_rows, std::int64_t m,
                  const graph_search_params& p, const graph_search_outputs& out, void* workspace,
                  std::size_t workspace_bytes, cudaStream_t stream) {
  static_assert(detail::is_supported_element_v<T>,
                "graph_search: keys must be float, __half or __nv_bfloat16");
  using kvsift::detail::require;
  require(g.n > 0, "graph_search: expected a non-empty key set, got ", g.n, " keys");
  require(g.n < std::int64_t{detail::walk_expanded}, "graph_search: at most ",
          detail::walk_expanded - 1, " keys supported, got ", g.n);
  require(g.d > 0, "graph_search: expected a positive dimension, got ", g.d);
  require(g.ld >= g.d, "graph_search: expected a row stride >= d = ", g.d, ", got ", g.ld);
  require(g.width >= 1 && g.width <= max_graph_search_width,
          "graph_search: expected 1 <= adjacency width <= ", max_graph_search_width, ", got ",
          g.width);
  require(static_cast<std::int64_t>(g.entry) < g.n, "graph_search: expected an entry id < ", g.n,
          ", got ", g.entry);
  require(m > 0 && m <= std::int64_t{INT_MAX}, "graph_search: expected 1 <= queries <= ", INT_MAX,
          ", got ", m);
  require(p.L >= 1 && p.L <= max_graph_search_L,
          "graph_search: expected 1 <= L <= ", max_graph_search_L, ", got ", p.L);
  require(p.expand_limit >= 0 && p.expand_limit <= p.L,
          "graph_search: expected 0 <= expand_limit <= L = ", p.L, " (0 = L), got ",
          p.expand_limit);
  require(p.degree >= 0 && p.degree <= max_graph_search_degree,
          "graph_search: expected 0 <= degree <= ", max_graph_search_degree, ", got ", p.degree);
  require(p.degree > 0 || (out.kept == nullptr && out.kept_counts == nullptr),
          "graph_search: pruning outputs need degree > 0, got degree 0");
  const std::size_t need = graph_search_workspace_size(g.n, m);
  require(workspace_bytes >= need, "graph_search: workspace of ", workspace_bytes,
          " bytes is too small, expected >= ", need);
  int device = 0;
  KVSIFT_CUDA_CHECK(cudaGetDevice(&device));
  detail::require_stream_on(stream, device, "graph_search");
  detail::require_device_pointer(g.keys, device, "graph_search", "keys");
  detail::require_device_pointer(g.adjacency, device, "graph_search", "adjacency");
  detail::require_device_pointer(query_rows, device, "graph_search", "query rows");
  detail::require_device_pointer(workspace, device, "graph_search", "workspace");
  for (const void* o :
       {static_cast<const void*>(out.ids), static_cast<const void*>(out.scores),
        static_cast<const void*>(out.counts), static_cast<const void*>(out.kept),
        static_cast<const void*>(out.kept_counts), static_cast<const void*>(out.scored)}) {
    if (o != nullptr) detail::require_device_pointer(o, device, "graph_search", "an output");
  }

  const detail::walk_layout lay = detail::walk_shared_layout(g.d, p.L, g.width, p.degree);
  const std::size_t smem = static_cast<std::size_t>(lay.warp_bytes) * detail::walk_warps_per_block;
  int smem_max = 0;
  KVSIFT_CUDA_CHECK(
      cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  require(smem <= static_cast<std::size_t>(smem_max), "graph_search: L = ", p.L, ", d = ", g.d,
          " and width ", g.width, " need ", smem,
          " bytes of shared memory per block, the device has ", smem_max);
  const bool vec = detail::is_aligned16(g.keys) && g.d % detail::vec_size_v<T> == 0 &&
                   (g.ld * static_cast<std::int64_t>(sizeof(T))) % 16 == 0;
  const auto slots = static_cast<int>(detail::walk_slots(m));
  const auto words = static_cast<int>(detail::walk_words(g.n));
  const unsigned blocks = static_cast<unsigned>((slots + detail::walk_warps_per_block - 1) /
                                                detail::walk_warps_per_block);
  auto launch = [&]<bool L2>() {
    constexpr auto kernel = detail::graph_search_kernel<T, L2>;
    detail::allow_shared_memory<kernel>(device, smem_max, detail::walk_carveout_percent);
    kernel<<<blocks, detail::walk_warps_per_block * 32, smem, stream>>>(
        g, query_rows, static_cast<int>(m), p.L, p.expand_limit == 0 ? p.L : p.expand_limit,
        p.degree, out, static_cast<std::uint32_t*>(workspace), words, vec, lay, slots);
    KVSIFT_CUDA_CHECK(cudaGetLastError());
  };
  if (p.metric == graph_metric::l2) {
    launch.template operator()<true>();
  } else {
    launch.template operator()<false>();
  }
}

template <Element T>
struct connectivity_searcher<T>::state {
  int device = 0;
  std::int64_t n = 0, d = 0;
  int width = 0;
  std::size_t expand_limit = 0;  // 0 = L
  cudaStream_t stream = nullptr;
  detail::grow_buffer keys, adjacency, rows, padded, queries, kept, kept_counts, scored, workspace;
  // search_and_merge: the round's edges (source, edge id) before and after the sort, the runs,
  // CUB's temporary storage, and the merge's candidate lists.
  detail::grow_buffer src, edge, src_sorted, edge_sorted, run_src, run_len, run_off, runs, temp,
      cand, srt;
  std::vector<std::uint32_t> host_counts, host_scored;

  ~state() {
    const detail::quiet_device_guard guard(device);  // freed on the device they live on
    for (auto* b : {&keys,    &adjacency, &rows, &padded, &queries,    &kept,        &kept_counts,
                    &scored,  &workspace, &src,  &edge,   &src_sorted, &edge_sorted, &run_src,
                    &run_len, &run_off,   &runs, &temp,   &cand,       &srt}) {
      b->release();
    }
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

template <Element T>
connectivity_searcher<T>::connectivity_searcher(matrix_view<const T> keys, std::size_t width,
                                                int device)
    : s_(std::make_unique<state>()) {
  kvsift::detail::require(keys.rows() > 0 && keys.cols() > 0,
                          "connectivity_searcher: expected a non-empty key set, got ", keys.rows(),
                          " x ", keys.cols());
  kvsift::detail::require(keys.rows() < detail::walk_expanded, "connectivity_searcher: at most ",
                          detail::walk_expanded - 1, " keys supported, got ", keys.rows());
  kvsift::detail::require(width >= 1 && width <= max_graph_search_width,
                          "connectivity_searcher: expected 1 <= width <= ", max_graph_search_width,
                          ", got ", width);
  require_finite(keys, "connectivity_searcher: keys");
  state& s = *s_;
  s.device = device;
  s.n = static_cast<std::int64_t>(keys.rows());
  s.d = static_cast<std::int64_t>(keys.cols());
  s.width = static_cast<int>(width);
  detail::device_guard guard(device);
  KVSIFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  const std::size_t row_bytes = static_cast<std::size_t>(s.d) * sizeof(T);
  void* dk = s.keys.reserve(row_bytes * static_cast<std::size_t>(s.n));
  KVSIFT_CUDA_CHECK(cudaMemcpy2DAsync(dk, row_bytes, keys.data(), keys.stride() * sizeof(T),
                                      row_bytes, keys.rows(), cudaMemcpyHostToDevice, s.stream));
  const std::size_t adj_bytes = static_cast<std::size_t>(s.n) * width * sizeof(id_t);
  void* da = s.adjacency.reserve(adj_bytes);
  KVSIFT_CUDA_CHECK(cudaMemsetAsync(da, 0xff, adj_bytes, s.stream));  // all invalid_id
  KVSIFT_CUDA_CHECK(cudaStreamSynchronize(s.stream));
}

template <Element T>
connectivity_searcher<T>::~connectivity_searcher() = default;
template <Element T>
connectivity_searcher<T>::connectivity_searcher(connectivity_searcher&&) noexcept = default;
template <Element T>
connectivity_searcher<T>& connectivity_searcher<T>::operator=(connectivity_searcher&&) noexcept =
    default;

template <Element T>
void connectivity_searcher<T>::set_rows(std::span<const id_t> rows, std::span<const id_t> padded) {
  state& s = *s_;
  const auto width = static_cast<std::size_t>(s.width);
  kvsift::detail::require(padded.size() == rows.size() * width,
                          "connectivity_searcher: ", rows.size(), " rows of width ", width,
                          " need ", rows.size() * width, " ids, got ", padded.size());
  const auto n = static_cast<id_t>(s.n);
  for (const id_t r : rows) {
    kvsift::detail::require<out_of_range>(r < n, "connectivity_searcher: expected row ids < ", n,
                                          ", got ", r);
  }
  for (const id_t v : padded) {
    kvsift::detail::require<out_of_range>(v < n || v == invalid_id,
                                          "connectivity_searcher: expected neighbour ids < ", n,
                                          " or invalid_id, got ", v);
  }
  if (rows.empty()) return;
  detail::device_guard guard(s.device);
  auto* dr = static_cast<id_t*>(s.rows.reserve(rows.size_bytes()));
  auto* dpad = static_cast<id_t*>(s.padded.reserve(padded.size_bytes()));
  KVSIFT_CUDA_CHECK(
      cudaMemcpyAsync(dr, rows.data(), rows.size_bytes(), cudaMemcpyHostToDevice, s.stream));
  KVSIFT_CUDA_CHECK(
      cudaMemcpyAsync(dpad, padded.data(), padded.size_bytes(), cudaMemcpyHostToDevice, s.stream));
  const std::int64_t total = static_cast<std::int64_t>(padded.size());
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((total + 255) / 256, 4096));
  detail::scatter_rows_kernel<id_t><<<blocks, 256, 0, s.stream>>>(
      static_cast<id_t*>(s.adjacency.p), s.width, dr, dpad, static_cast<std::int64_t>(rows.size()));
  KVSIFT_CUDA_CHECK(cudaGetLastError());
  // The host spans may be freed once this returns.
  KVSIFT_CUDA_CHECK(cudaStreamSynchronize(s.stream));
}

template <Element T>
std::int64_t connectivity_searcher<T>::enqueue_search(std::span<const id_t> rows, id_t entry,
                                                      std::size_t L, std::size_t degree) {
  state& s = *s_;
  const auto n = static_cast<id_t>(s.n);
  kvsift::detail::require(L >= 1 && L <= static_cast<std::size_t>(max_graph_search_L),
                          "connectivity_searcher: expected 1 <= L <= ", max_graph_search_L,
                          ", got ", L);
  kvsift::detail::require(
      degree >= 1 && degree <= static_cast<std::size_t>(max_graph_search_degree),
      "connectivity_searcher: expected 1 <= degree <= ", max_graph_search_degree, ", got ", degree);
  kvsift::detail::require<out_of_range>(entry < n, "connectivity_searcher: expected an entry id < ",
                                        n, ", got ", entry);
  for (const id_t r : rows) {
    kvsift::detail::require<out_of_range>(r < n, "connectivity_searcher: expected query rows < ", n,
                                          ", got ", r);
  }
  if (rows.empty()) return 0;
  const auto m = static_cast<std::int64_t>(rows.size());
  auto* dq = static_cast<id_t*>(s.queries.reserve(rows.size_bytes()));
  auto* dk = static_cast<id_t*>(s.kept.reserve(rows.size() * degree * sizeof(id_t)));
  auto* dc =
      static_cast<std::uint32_t*>(s.kept_counts.reserve(rows.size() * sizeof(std::uint32_t)));
  auto* ds = static_cast<std::uint32_t*>(s.scored.reserve(rows.size() * sizeof(std::uint32_t)));
  const std::size_t ws = graph_search_workspace_size(s.n, m);
  void* dw = s.workspace.reserve(ws);
  KVSIFT_CUDA_CHECK(
      cudaMemcpyAsync(dq, rows.data(), rows.size_bytes(), cudaMemcpyHostToDevice, s.stream));
  // The device element type named directly, not through the private `state`: nvcc's host
  // stub for the kernel spells its template arguments as written here, and the stub code
  // cannot reach a private member (the f16 instantiation failed to compile).
  using device_t = typename detail::device_element<T>::type;
  graph_ref<device_t> g;
  g.keys = static_cast<const device_t*>(s.keys.p);
  g.n = s.n;
  g.d = s.d;
  g.ld = s.d;
  g.adjacency = static_cast<const id_t*>(s.adjacency.p);
  g.width = s.width;
  g.entry = entry;
  graph_search_params p;
  p.L = static_cast<int>(std::min<std::size_t>(L, static_cast<std::size_t>(s.n)));
  p.degree = static_cast<int>(degree);
  p.metric = graph_metric::l2;
  if (s.expand_limit < static_cast<std::size_t>(p.L))
    p.expand_limit = static_cast<int>(s.expand_limit);
  graph_search_outputs o;
  o.kept = dk;
  o.kept_counts = dc;
  o.scored = ds;
  graph_search(g, dq, m, p, o, dw, ws, s.stream);
  return m;
}

template <Element T>
void connectivity_searcher<T>::search(std::span<const id_t> rows, id_t entry, std::size_t L,
                                      std::size_t degree, connectivity_batch& out) {
  state& s = *s_;
  detail::device_guard guard(s.device);
  const std::int64_t m = enqueue_search(rows, entry, L, degree);
  out.degree = degree;
  out.kept.assign(rows.size() * degree, invalid_id);
  out.counts.assign(rows.size(), 0);
  out.scored = 0;
  if (m == 0) return;
  KVSIFT_CUDA_CHECK(cudaMemcpyAsync(out.kept.data(), s.kept.p, out.kept.size() * sizeof(id_t),
                                    cudaMemcpyDeviceToHost, s.stream));
  KVSIFT_CUDA_CHECK(cudaMemcpyAsync(out.counts.data(), s.kept_counts.p,
                                    rows.size() * sizeof(std::uint32_t), cudaMemcpyDeviceToHost,
                                    s.stream));
  out.scored = wait_scored(m);
}

template <Element T>
std::size_t connectivity_searcher<T>::wait_scored(std::int64_t m) {
  state& s = *s_;
  s.host_scored.resize(static_cast<std::size_t>(m));
  KVSIFT_CUDA_CHECK(cudaMemcpyAsync(s.host_scored.data(), s.scored.p,
                                    s.host_scored.size() * sizeof(std::uint32_t),
                                    cudaMemcpyDeviceToHost, s.stream));
  KVSIFT_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  std::size_t scored = 0;
  for (const std::uint32_t c : s.host_scored) scored += c;
  return scored;
}

template <Element T>
std::size_t connectivity_searcher<T>::search_and_merge(std::span<const id_t> rows, id_t entry,
                                                       std::size_t L, std::size_t degree,
                                                       bool fill) {
  state& s = *s_;
  // Every check before anything is enqueued: the edge count must fit CUB's int item count.
  kvsift::detail::require(
      rows.size() <= static_cast<std::size_t>(INT_MAX) / 2 / std::max<std::size_t>(degree, 1),
      "connectivity_searcher: 2 * rows * degree must be <= ", INT_MAX, ", got ", rows.size(),
      " rows of degree ", degree);
  detail::device_guard guard(s.device);
  const std::int64_t m = enqueue_search(rows, entry, L, degree);
  if (m == 0) return 0;
  const auto E = static_cast<int>(2 * m * static_cast<std::int64_t>(degree));
  const auto n = static_cast<id_t>(s.n);
  const std::size_t e_ids = static_cast<std::size_t>(E) * sizeof(std::uint32_t);
  auto* src = static_cast<id_t*>(s.src.reserve(e_ids));
  auto* edge = static_cast<std::uint32_t*>(s.edge.reserve(e_ids));
  auto* src_sorted = static_cast<id_t*>(s.src_sorted.reserve(e_ids));
  auto* edge_sorted = static_cast<std::uint32_t*>(s.edge_sorted.reserve(e_ids));
  auto* run_src = static_cast<id_t*>(s.run_src.reserve(e_ids));
  auto* run_len = static_cast<std::uint32_t*>(s.run_len.reserve(e_ids));
  auto* run_off = static_cast<std::uint32_t*>(s.run_off.reserve(e_ids));
  auto* runs = static_cast<int*>(s.runs.reserve(sizeof(int)));
  // A run per source row (at most n + 1 with the unused slots' run), each with room for its
  // row and its new edges.
  const std::size_t most_runs = std::min<std::size_t>(static_cast<std::size_t>(E), s.n + 1);
  const std::size_t slots = static_cast<std::size_t>(E) + most_runs * s.width;
  auto* cand = static_cast<detail::walk_entry*>(s.cand.reserve(slots * sizeof(detail::walk_entry)));
  auto* srt = static_cast<detail::walk_entry*>(s.srt.reserve(slots * sizeof(detail::walk_entry)));
  const int bits = std::max(1, static_cast<int>(std::bit_width(static_cast<std::uint32_t>(n))));
  std::size_t sort_bytes = 0, rle_bytes = 0, scan_bytes = 0;
  KVSIFT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, src, src_sorted, edge,
                                                    edge_sorted, E, 0, bits, s.stream));
  KVSIFT_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, rle_bytes, src_sorted, run_src,
                                                       run_len, runs, E, s.stream));
  KVSIFT_CUDA_CHECK(
      cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, run_len, run_off, E, s.stream));
  const std::size_t temp_bytes = std::max({sort_bytes, rle_bytes, scan_bytes});
  void* temp = s.temp.reserve(temp_bytes);

  const auto* dq = static_cast<const id_t*>(s.queries.p);
  const auto* dk = static_cast<const id_t*>(s.kept.p);
  const auto* dc = static_cast<const std::uint32_t*>(s.kept_counts.p);
  const std::int64_t slots_q = m * static_cast<std::int64_t>(degree);
  const auto eblocks = static_cast<unsigned>(std::min<std::int64_t>((slots_q + 255) / 256, 4096));
  detail::merge_edges_kernel<id_t>
      <<<eblocks, 256, 0, s.stream>>>(dq, dk, dc, m, static_cast<int>(degree), n, src, edge);
  KVSIFT_CUDA_CHECK(cudaGetLastError());
  std::size_t tb = temp_bytes;
  KVSIFT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, tb, src, src_sorted, edge, edge_sorted, E,
                                                    0, bits, s.stream));
  tb = temp_bytes;
  KVSIFT_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(temp, tb, src_sorted, run_src, run_len, runs,
                                                       E, s.stream));
  tb = temp_bytes;
  KVSIFT_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp, tb, run_len, run_off, E, s.stream));

  detail::merge_args a;
  a.adjacency = static_cast<id_t*>(s.adjacency.p);
  a.width = s.width;
  a.n = n;
  a.rows = dq;
  a.kept = dk;
  a.degree = static_cast<int>(degree);
  a.run_src = run_src;
  a.run_len = run_len;
  a.run_off = run_off;
  a.runs = runs;
  a.edge = edge_sorted;
  a.cand = cand;
  a.srt = srt;
  a.fill = fill;
  a.d_pad = static_cast<int>((s.d + 3) / 4 * 4);
  a.warp_bytes = static_cast<int>(
      (sizeof(float) * a.d_pad + 2 * sizeof(std::uint32_t) * a.width + 15) / 16 * 16);
  const std::size_t smem = static_cast<std::size_t>(a.warp_bytes) * detail::walk_warps_per_block;
  int smem_max = 0;
  KVSIFT_CUDA_CHECK(
      cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, s.device));
  kvsift::detail::require(smem <= static_cast<std::size_t>(smem_max),
                          "connectivity_searcher: d = ", s.d, " and width ", s.width, " need ",
                          smem, " bytes of shared memory per block, the device has ", smem_max);
  using device_t = typename detail::device_element<T>::type;
  const auto* keys = static_cast<const device_t*>(s.keys.p);
  const bool vec = detail::is_aligned16(keys) && s.d % detail::vec_size_v<device_t> == 0;
  const auto mblocks = static_cast<unsigned>(std::min<std::size_t>(
      (most_runs + detail::walk_warps_per_block - 1) / detail::walk_warps_per_block, 8192));
  constexpr auto kernel = detail::merge_rows_kernel<device_t>;
  detail::allow_shared_memory<kernel>(s.device, smem_max, cudaSharedmemCarveoutDefault);
  kernel<<<mblocks, detail::walk_warps_per_block * 32, smem, s.stream>>>(
      keys, s.d, static_cast<int>(s.d), vec, a);
  KVSIFT_CUDA_CHECK(cudaGetLastError());
  return wait_scored(m);
}

template <Element T>
void connectivity_searcher<T>::set_expand_limit(std::size_t limit) noexcept {
  s_->expand_limit = limit;
}

template <Element T>
void connectivity_searcher<T>::get_rows(std::vector<std::vector<id_t>>& rows) const {
  const state& s = *s_;
  const auto width = static_cast<std::size_t>(s.width);
  std::vector<id_t> flat(static_cast<std::size_t>(s.n) * width);
  {
    detail::device_guard guard(s.device);
    KVSIFT_CUDA_CHECK(cudaMemcpyAsync(flat.data(), s.adjacency.p, flat.size() * sizeof(id_t),
                                      cudaMemcpyDeviceToHost, s.stream));
    KVSIFT_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  }
  rows.resize(static_cast<std::size_t>(s.n));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const id_t* r = flat.data() + i * width;
    rows[i].assign(r, std::find(r, r + width, invalid_id));
  }
}

}  // namespace kvsift::cuda

#include <kvsift/cuda/detail/graph_projection.inl>
