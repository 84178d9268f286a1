#pragma once
// The fused kNN kernel behind <kvsift/cuda/knn.cuh> (internal): tensor-core scores and the
// top-k selection in one pass, for 16-bit elements, d in {64, 128, 256} and k <= 128.
//
// Why fused: the tiled path writes every m x n f32 score to memory and reads it back for the
// selection (131072^2 scores are 64 GiB each way), which costs more than the GEMM itself. Here a
// block owns 128 queries and streams every key past them in chunks of 64; the scores never
// leave registers unless they beat the row's running k-th best. After the first chunks almost
// none do (about k ln(n / k) survivors per row in all for data in random order), so the
// selection's cost is one comparison per score.
//
// Keys arrive in a ring of shared-memory stages of 128 keys (64 at d = 256), multiplied a chunk
// of 64 at a time: each warp's 16 rows' query fragments, held in registers for the whole kernel,
// times the chunk's 64 keys (f32 accumulation). In an sm_90a build the products are Hopper's
// wgmma (a warpgroup's 64 rows per instruction, the keys read from shared memory by the tensor
// cores) and the stages are filled by TMA: one thread issues a stage's copy, a barrier in shared
// memory (mbarrier) completes when its bytes have landed, and the second warpgroup to be done
// with a stage refills it, so the two warpgroups run up to two stages apart and no warp waits
// for another's merges at a block barrier (131072^2, k = 100: 17.3 ms against 19.5 with cp.async
// and a block barrier per stage, 23.3 with a barrier per chunk; h200_knn_fused_tma.txt). Any
// other build (compute capability 8.0+) multiplies by mma.sync m16n8k16 and stages by cp.async,
// every thread copying its share, with one block barrier per stage. A thread compares the maximum
// of its 16 scores of a row with the row's threshold (the score of its k-th best so far); only then
// does it look at its pairs of scores, and at each score of a passing pair: packed into a rank key
// (knn.inl: same order as the tiled path and the CPU engine), a score that ranks above the k-th
// best is appended to the row's survivor buffer (global memory, 256 per row). A row whose buffer
// could not take another chunk is merged by its warp: the row's running top-k (global memory, k
// rank keys) and its survivors go through a radix select of the k-th largest, the keys above it are
// written back and the threshold rises. A buffer of 256 takes the chunk after any check (at most
// 192 + 64), so no survivor is ever dropped. With wgmma a merging warp holds up the three others
// of its warpgroup (they issue each wgmma together), so a warp announces a merge one chunk ahead
// and the whole warpgroup merges then, every row past a quarter full (17.3 -> 16.6 ms). A row's
// buffer, count, threshold and merges belong to one warp, so the only block barriers are the
// start's and, with cp.async, the stage ring's; with 107 KiB of shared memory and 128 registers
// per thread two blocks share an SM and hide each other's waits. Few queries split the keys into
// slices (blockIdx.y), each with its own running top-k per row; the final sort
// (knn_finalize_kernel) takes them all.

#include <cuda.h>  // CUtensorMap (the type only: its encoding is looked up at run time)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace kvsift::cuda::detail {

inline constexpr int fknn_rows = 128;    // queries per block
inline constexpr int fknn_cols = 64;     // keys per chunk
inline constexpr int fknn_buffer = 256;  // survivors held per row between merges (global)
inline constexpr int fknn_max_k = max_fused_knn_k;  // merge: k + buffer in 12 registers a lane
inline constexpr int fknn_threads = 256;            // 8 warps
static_assert(fknn_buffer >= 2 * fknn_cols, "a buffer must take the chunk after a check");
// sm_90a merges in step within a warpgroup (see the kernel): a warp whose row holds more than
// fknn_announce_merge survivors after a chunk announces a merge for the next chunk, and then every
// warp of the warpgroup merges its rows holding more than fknn_align_merge. 131072^2 x 128 at
// k = 100 on the H200: 16.59-16.63 ms against 17.27-17.32 with each row merged alone when full;
// (176, 96) took 16.64-16.66, (176, 128) 16.9, (160, 96) 16.8-16.9
// (bench/results/h200_knn_fused_merge_steps.txt).
inline constexpr int fknn_announce_merge = 184;
inline constexpr int fknn_align_merge = 64;
// One announcement slot per warpgroup (128 threads) and chunk parity.
inline constexpr int fknn_announce_slots = 2 * (fknn_threads / 128);
static_assert(fknn_align_merge < fknn_announce_merge &&
              fknn_announce_merge < fknn_buffer - fknn_cols);
// wgmma's 128-byte swizzle is a function of the shared address bits 4-9, so a swizzled stage
// starts at a multiple of 1024 bytes.
inline constexpr std::size_t fknn_smem_align = 1024;

/// Layout of the fused kernel for dimension D; `Hopper`: for compute capability 9.0, whose SMs
/// hold 228 KiB of shared memory (any other build keeps the layout measured before the stages
/// grew, so that two blocks still share an A100's SM of 164 KiB). Each warp owns 16 query rows
/// (one m-tile) and all 64 keys of a chunk (a stage holds one or two chunks), so a row's
/// survivors, count, threshold and merges belong to one warp and need no block barrier. Key rows
/// staged by cp.async have a pitch of D + 32 halves (an odd multiple of 16 words), so the 16-byte
/// fragment loads of a quarter-warp (2 rows x 4 lanes) hit 32 distinct banks; TMA stages hold
/// the swizzled panels that wgmma reads, unpadded.
template <int D, bool Hopper = true>
struct fknn_shape {
  static_assert(D == 64 || D == 128 || D == 256);
  static constexpr int ni = fknn_cols / 8;  // n-tiles (8 keys) per warp
  // A stage holds `stage_keys` keys, multiplied a chunk of 64 at a time, with one block barrier
  // per stage: two chunks per barrier took 131072^2 x 128 at k = 100 from 21.5 to 20.2 ms on the
  // H200 (h200_knn_fused_stage_copies.txt). At d = 256 two such stages would leave one block
  // per SM.
  static constexpr int stage_keys = Hopper && D != 256 ? 128 : 64;
  static constexpr int stages = Hopper ? (D == 64 ? 3 : 2) : (D == 64 ? 4 : D == 128 ? 3 : 2);
  static constexpr int pitch = D + 32;  // halves per staged key row
  static constexpr std::size_t stage_bytes = std::size_t{stage_keys} * pitch * 2;
  // sm_90a builds fill the stages by TMA, unpadded (the swizzled panels), and keep more of them:
  // a stage is released by the last warpgroup done with it, not at a block barrier. Six stages
  // of 64 keys at d = 128 (the same bytes) measured the same, 17.33 against 17.28 ms.
  static constexpr int tma_stage_keys = stage_keys;
  static constexpr int tma_stages = !Hopper ? 1 : D == 64 ? 4 : 3;  // 1: no TMA below 9.0
  static constexpr std::size_t tma_stage_bytes = std::size_t{tma_stage_keys} * D * 2;
  static constexpr std::size_t ring_bytes =
      std::max(std::size_t{stages} * stage_bytes, std::size_t{tma_stages} * tma_stage_bytes);
  static constexpr std::size_t rows_offset = ring_bytes;
  static constexpr std::size_t bars_offset =
      rows_offset + std::size_t{fknn_rows} * (8 + 4 + 4) + std::size_t{8} * 256 * 4;
  static constexpr std::size_t smem_bytes =
      bars_offset  // stages; k-th, threshold, count per row; a histogram per warp
      + std::size_t{tma_stages} * 12  // a full barrier and a release count per stage
      + fknn_announce_slots * 4       // merge announcements
      + fknn_smem_align;              // slack: the stages start at a 1024-byte boundary
  static_assert(stage_bytes % fknn_smem_align == 0 && tma_stage_bytes % fknn_smem_align == 0);
};

/// Shared memory of a fused-kernel launch at dimension d on a device of compute capability
/// `major`.x: a 9.0 device may run a build for 9.0 or an older one (compiled from PTX), so it
/// gets the larger of the two layouts.
inline std::size_t fused_knn_smem_bytes(int d, int major) {
  const auto pick = [major]<int D>() {
    return major >= 9 ? std::max(fknn_shape<D, true>::smem_bytes, fknn_shape<D, false>::smem_bytes)
                      : fknn_shape<D, false>::smem_bytes;
  };
  return d == 64    ? pick.template operator()<64>()
         : d == 128 ? pick.template operator()<128>()
                    : pick.template operator()<256>();
}

template <class T>
__device__ inline void fknn_mma(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                std::uint32_t b1) {
  if constexpr (std::is_same_v<T, half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Hopper's warpgroup MMA (wgmma, sm_90a only). Compiled for sm_90a, the kernel multiplies with
// wgmma instead of mma.sync: a warpgroup (4 warps, 64 rows) issues one m64n64k16 per k-step with
// the chunk's keys read by the tensor cores straight from shared memory, where mma.sync makes
// every warp load its own copy of each key fragment into registers (the loads, not the tensor
// cores, bounded the mma.sync loop at about 220 TFLOP/s). Each warp's 16 x 64 accumulators come
// out in the same registers and order as its eight m16n8 tiles, so the filter and the merges are
// the same code on both paths.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVSIFT_FKNN_WGMMA 1
#else
#define KVSIFT_FKNN_WGMMA 0
#endif
// The layout of fknn_shape<D, true> in device code for compute capability 9.0 and the host's;
// builds for older targets take fknn_shape<D, false> (the host sizes the launch by the device's
// compute capability: fused_knn_smem_bytes).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define KVSIFT_FKNN_HOPPER 0
#else
#define KVSIFT_FKNN_HOPPER 1
#endif

// wgmma's K-major layout with the 128-byte swizzle, as TMA writes a stage: the dimension in panels
// of 64 elements, one 128-byte line per key, a panel of stage_keys keys x 128 bytes; segment s of
// key r's line is stored at position s ^ (r % 8), which spreads the eight rows of a core matrix
// over all 32 banks.
inline constexpr int fknn_line_bytes = 128;

/// wgmma shared-memory descriptor of the 64-key block whose swizzled lines start at shared
/// address `addr` (its k-step 0; fknn_desc_step adds a later k-step's offset): 8-row core-matrix
/// groups are 8 lines apart (stride byte offset); the leading byte offset is unused for this
/// layout.
__device__ inline std::uint64_t fknn_desc(std::uint32_t addr) {
  return static_cast<std::uint64_t>((addr & 0x3FFFFu) >> 4) | (std::uint64_t{1} << 16) |
         (std::uint64_t{(8 * fknn_line_bytes) >> 4} << 32) | (std::uint64_t{1} << 62);
}

/// What k-step kk (16 elements) adds to the descriptor of k-step 0 in a stage of `Keys` keys: its
/// start, 32 bytes per k-step into its panel's swizzled lines, in the descriptor's 16-byte units
/// (the address field cannot carry: shared addresses are below 2^18 bytes).
template <int Keys>
__device__ constexpr std::uint64_t fknn_desc_step(int kk) {
  return static_cast<std::uint64_t>(((kk / 4) * (Keys * fknn_line_bytes) + (kk % 4) * 32) >> 4);
}

/// Keeps the compiler from moving reads or writes of the accumulators across the asynchronous
/// MMA (it cannot see that wgmma writes them after the instruction has issued).
template <int N>
__device__ inline void fknn_fence_acc(float (&c)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(c[i][j])::"memory");
  }
}

#if KVSIFT_FKNN_WGMMA
#define KVSIFT_FKNN_WGMMA_ASM(TYPE)                                                               \
  asm volatile(                                                                                   \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE                                 \
      " "                                                                                         \
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,"   \
      "%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, 1, 1, 1, 0;\n"                   \
      : "+f"(c[0][0]), "+f"(c[0][1]), "+f"(c[0][2]), "+f"(c[0][3]), "+f"(c[1][0]), "+f"(c[1][1]), \
        "+f"(c[1][2]), "+f"(c[1][3]), "+f"(c[2][0]), "+f"(c[2][1]), "+f"(c[2][2]), "+f"(c[2][3]), \
        "+f"(c[3][0]), "+f"(c[3][1]), "+f"(c[3][2]), "+f"(c[3][3]), "+f"(c[4][0]), "+f"(c[4][1]), \
        "+f"(c[4][2]), "+f"(c[4][3]), "+f"(c[5][0]), "+f"(c[5][1]), "+f"(c[5][2]), "+f"(c[5][3]), \
        "+f"(c[6][0]), "+f"(c[6][1]), "+f"(c[6][2]), "+f"(c[6][3]), "+f"(c[7][0]), "+f"(c[7][1]), \
        "+f"(c[7][2]), "+f"(c[7][3])                                                              \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc))
#endif

/// c += A (this warpgroup's 64 rows x 16, in registers as mma.sync's A fragments) x the 16 x 64
/// key block of `desc`; asynchronous: fence before, commit and wait after (fknn_wgmma_*).
template <class T>
__device__ inline void fknn_wgmma(float (&c)[8][4], const std::uint32_t (&a)[4],
                                  std::uint64_t desc) {
#if KVSIFT_FKNN_WGMMA
  if constexpr (std::is_same_v<T, half>) {
    KVSIFT_FKNN_WGMMA_ASM("f16");
  } else {
    KVSIFT_FKNN_WGMMA_ASM("bf16");
  }
#else
  (void)c, (void)a, (void)desc;
  __trap();  // never called: the kernel takes the mma.sync path when compiled for another target
#endif
}

__device__ inline void fknn_wgmma_fence() {
#if KVSIFT_FKNN_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ inline void fknn_wgmma_commit_and_wait() {
#if KVSIFT_FKNN_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}

/// The TMA ring's barriers (sm_90a): `full` completes a phase when a stage's bytes have landed.
__device__ inline void fknn_bar_init(std::uint64_t* bar, unsigned count) {
#if KVSIFT_FKNN_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(
                   static_cast<unsigned>(__cvta_generic_to_shared(bar))),
               "r"(count)
               : "memory");
#else
  (void)bar, (void)count;
#endif
}
__device__ inline void fknn_fence_bar_init() {
#if KVSIFT_FKNN_WGMMA
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ inline void fknn_bar_wait(std::uint64_t* bar, unsigned parity) {
#if KVSIFT_FKNN_WGMMA
  const auto addr = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  unsigned done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, "
        "0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  } while (done == 0);
#else
  (void)bar, (void)parity;
#endif
}
/// Stages keys [row, row + Keys) x all D dimensions into the swizzled panels at `dst` by TMA (one
/// box of 64 dimensions per panel); `bar` completes when they have landed.
template <int D, int Keys>
__device__ inline void fknn_tma_stage(const CUtensorMap* map, unsigned char* dst,
                                      std::uint64_t* bar, int row) {
#if KVSIFT_FKNN_WGMMA
  const auto b = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(b),
               "r"(Keys * D * 2)
               : "memory");
#pragma unroll
  for (int p = 0; p < D / 64; ++p) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
        "{%2, %3}], [%4];\n" ::"r"(
            static_cast<unsigned>(__cvta_generic_to_shared(dst + p * Keys * fknn_line_bytes))),
        "l"(map), "r"(p * 64), "r"(row), "r"(b)
        : "memory");
  }
#else
  (void)map, (void)dst, (void)bar, (void)row;
#endif
}

/// 16 bytes global -> shared, asynchronously; zero-filled when !valid (src is then not read).
__device__ inline void fknn_cp_async(void* dst, const void* src, bool valid) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ inline void fknn_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int Pending>
__device__ inline void fknn_cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

/// The rank-th largest (1-based) of a warp's entries (v[j] where valid[j], N per lane),
/// by an 8-bit radix select over the warp's own histogram; stops as soon as one entry is left
/// under the prefix. All lanes must call it; rank <= the number of valid entries.
template <int N>
__device__ inline rank_key fknn_warp_kth(const rank_key (&v)[N], const bool (&valid)[N], int rank,
                                         unsigned* hist) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  rank_key prefix = 0, mask = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = 0; b < 8; ++b) hist[lane * 8 + b] = 0;
    __syncwarp();
#pragma unroll
    for (int j = 0; j < N; ++j) {
      if (valid[j] && (v[j] & mask) == prefix) atomicAdd(&hist[(v[j] >> shift) & 255u], 1u);
    }
    __syncwarp();
    const radix_digit d = warp_find_digit(hist, rank);
    rank = d.rank;
    prefix |= static_cast<rank_key>(d.digit) << shift;
    mask |= rank_key{255} << shift;
    if (d.count == 1) {  // one entry left under the prefix: it is the answer
      rank_key mine = 0;
      bool has = false;
#pragma unroll
      for (int j = 0; j < N; ++j) {
        if (valid[j] && (v[j] & mask) == prefix) {
          mine = v[j];
          has = true;
        }
      }
      return __shfl_sync(0xffffffffu, mine, __ffs(__ballot_sync(0xffffffffu, has)) - 1);
    }
  }
  return prefix;
}

/// Merges row `row`'s survivors into its running top-k (one warp), raises its threshold and
/// empties its buffer.
__device__ inline void fknn_merge_row(rank_key* __restrict__ best_row, int k,
                                      const rank_key* buffer, int count, rank_key* kth_out,
                                      float* threshold_out, int* count_out, unsigned* hist) {
  constexpr int from_best = fknn_max_k / 32, from_buffer = fknn_buffer / 32;
  constexpr int slots = from_best + from_buffer;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  rank_key v[slots];
  bool valid[slots];
#pragma unroll
  for (int j = 0; j < from_best; ++j) {
    const int i = lane + 32 * j;
    valid[j] = i < k;
    v[j] = valid[j] ? best_row[i] : 0;
  }
#pragma unroll
  for (int j = 0; j < from_buffer; ++j) {
    const int i = lane + 32 * j;
    valid[from_best + j] = i < count;
    v[from_best + j] = valid[from_best + j] ? buffer[i] : 0;
  }
  const rank_key kth = fknn_warp_kth(v, valid, k, hist);
  // Every lane has its entries in registers (the select's shuffles ordered the reads before
  // these writes). Keys above the k-th keep their order of arrival; the row is sorted at the end.
  const unsigned below = (1u << lane) - 1u;
  int base = 0;
#pragma unroll
  for (int j = 0; j < slots; ++j) {
    const bool take = valid[j] && v[j] > kth;
    const unsigned ballot = __ballot_sync(0xffffffffu, take);
    if (take) best_row[base + __popc(ballot & below)] = v[j];
    base += __popc(ballot);
  }
  // Keys equal to the k-th are that one key or copies of the empty key 0 (knn_merge_tile_kernel).
  for (int i = base + lane; i < k; i += 32) best_row[i] = kth;
  if (lane == 0) {
    *kth_out = kth;
    *threshold_out = kth == 0 ? -INFINITY : rank_key_score(kth);
    *count_out = 0;
  }
}

/// Running top-k (unsorted rank keys, m x slices x k) of every query over each slice of
/// `slice_keys` keys (a multiple of 64; blockIdx.y picks the slice); see the file comment. Queries
/// and keys: 16-byte aligned rows of D elements at the given pitches (elements, multiples of 8);
/// `key_map` describes the same keys for TMA (fused_key_map; read only by sm_90a builds).
/// Grid: ceil(m / 128) x slices blocks of 256 threads, fused_knn_smem_bytes(D, major) bytes. A
/// slice past the keys (possible when the slices round up) leaves its lists empty (key 0, ranked
/// last).
template <class T, int D>
__global__ void __launch_bounds__(fknn_threads, 2)
    knn_fused_kernel(const T* __restrict__ queries, std::int64_t q_pitch, int m,
                     const T* __restrict__ keys, std::int64_t k_pitch, int n_total, int slice_keys,
                     int k, rank_key* __restrict__ best, rank_key* __restrict__ buffer,
                     const __grid_constant__ CUtensorMap key_map) {
  using shape = fknn_shape<D, KVSIFT_FKNN_HOPPER != 0>;
  constexpr int ksteps = D / 16;
  constexpr int segs = D / 8;  // 16-byte segments per key row
  // Hopper's wgmma (sm_90a builds) or mma.sync (any other target, 8.0+): see fknn_wgmma.
  constexpr bool wgmma = KVSIFT_FKNN_WGMMA != 0;
  // Merges in step (fknn_announce_merge) with wgmma only: mma.sync warps do not wait for each
  // other. Not at d = 256, where the extra registers spill (96 bytes of loads against 36) and
  // 32768 x 131072 took 5.88-5.95 ms against 5.83-5.85.
  constexpr bool align_merges = wgmma && D != 256;
  extern __shared__ __align__(16) unsigned char fknn_smem_raw[];
  // Only the swizzled stages need the 1024-byte boundary; the mma.sync path keeps the constant
  // base (a computed one costs it registers and spills at the 128-register cap).
  unsigned char* const fknn_smem =
      wgmma
          ? fknn_smem_raw + ((fknn_smem_align -
                              (static_cast<std::uint32_t>(__cvta_generic_to_shared(fknn_smem_raw)) %
                               fknn_smem_align)) %
                             fknn_smem_align)
          : fknn_smem_raw;
  auto* stage_base = reinterpret_cast<std::uint16_t*>(fknn_smem);
  auto* kth_key = reinterpret_cast<rank_key*>(fknn_smem + shape::rows_offset);
  auto* threshold = reinterpret_cast<float*>(kth_key + fknn_rows);
  auto* count = reinterpret_cast<int*>(threshold + fknn_rows);
  auto* hist = reinterpret_cast<unsigned*>(count + fknn_rows);
  auto* full = reinterpret_cast<std::uint64_t*>(fknn_smem + shape::bars_offset);  // TMA ring
  auto* released = reinterpret_cast<unsigned*>(full + shape::tma_stages);
  auto* announce = reinterpret_cast<int*>(released + shape::tma_stages);

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;  // mma fragment coordinates
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * fknn_rows;
  // Key slice blockIdx.y of gridDim.y: its own running top-k and buffer per row, so that few
  // queries still fill the GPU; the slices' lists are merged by the final sort.
  const int slices = static_cast<int>(gridDim.y), slice = static_cast<int>(blockIdx.y);
  const int key0 = slice * slice_keys;
  const int n = max(0, min(n_total - key0, slice_keys));
  keys += static_cast<std::int64_t>(key0) * k_pitch;
  constexpr int stage_keys = wgmma ? shape::tma_stage_keys : shape::stage_keys;
  constexpr int subs = stage_keys / fknn_cols;
  const int chunks = (n + stage_keys - 1) / stage_keys;  // stages of keys
  const auto list = [&](int row) { return (row0 + row) * slices + slice; };
  const auto row_best = [&](int row) { return best + list(row) * k; };
  const auto row_buffer = [&](int row) { return buffer + list(row) * fknn_buffer; };

  // Builds without TMA: stage chunk c's keys by cp.async (rows past n read as zeros and are
  // never pushed); chunks are staged in order, c = 0, 1, ... A chunk is stage_keys rows of
  // `segs` 16-byte segments; thread tid copies segment tid % segs of rows tid / segs + j R
  // (R = 256 / segs). Its addresses are worked out once and advanced by a chunk per call: a chunk
  // costs a thread `passes` copies and a few adds, where computing each copy's row, segment and
  // address per chunk took two thirds of the kernel's instructions (Nsight Compute, 2026-11-30).
  constexpr int copy_rows = fknn_threads / segs;  // R: rows apart of one thread's copies
  constexpr int passes = stage_keys / copy_rows;
  static_assert(fknn_threads % segs == 0 && stage_keys % copy_rows == 0);
  constexpr int row_bytes = shape::pitch * 2;  // stage bytes per key
  const int copy_seg = tid % segs, copy_row = tid / segs;
  const int copy_dst = (copy_row * shape::pitch + copy_seg * 8) * 2;
  const std::int64_t copy_stride = std::int64_t{copy_rows} * k_pitch;
  const T* next_src = keys + static_cast<std::int64_t>(copy_row) * k_pitch + copy_seg * 8;
  int rows_left = n - copy_row;  // of this thread's rows, from the next chunk to stage on
  auto load_chunk = [&](int c) {
    unsigned char* const dst = reinterpret_cast<unsigned char*>(stage_base) +
                               (c % shape::stages) * shape::stage_bytes + copy_dst;
    const T* src = next_src;
#pragma unroll
    for (int j = 0; j < passes; ++j) {
      const bool valid = j * copy_rows < rows_left;
      fknn_cp_async(dst + j * copy_rows * row_bytes, valid ? src : keys, valid);
      src += copy_stride;
    }
    next_src = src;  // passes * copy_rows = stage_keys rows on
    rows_left -= stage_keys;
  };
  if constexpr (wgmma) {
    // Other threads wait on the barriers only after the block barrier before the main loop.
    if (tid == 0) {
      for (int s = 0; s < shape::tma_stages; ++s) {
        fknn_bar_init(&full[s], 1);
        released[s] = 0;
      }
      for (int i = 0; i < fknn_announce_slots; ++i) announce[i] = -1;
      fknn_fence_bar_init();  // initialized before the TMA unit signals them
      for (int s = 0; s < shape::tma_stages && s < chunks; ++s) {
        fknn_tma_stage<D, stage_keys>(&key_map, fknn_smem + s * shape::tma_stage_bytes, &full[s],
                                      key0 + s * stage_keys);
      }
    }
  } else {
#pragma unroll
    for (int s = 0; s < shape::stages - 1; ++s) {
      if (s < chunks) load_chunk(s);
      fknn_cp_commit();
    }
  }

  // Rows past m never pass (threshold +inf; their zero scores are finite).
  for (int r = tid; r < fknn_rows; r += fknn_threads) {
    kth_key[r] = 0;
    threshold[r] = row0 + r < m ? -INFINITY : INFINITY;
    count[r] = 0;
  }
  for (int i = tid; i < fknn_rows * k; i += fknn_threads) {
    if (row0 + i / k < m) row_best(i / k)[i % k] = 0;
  }

  // This warp's query fragments (A of m16n8k16, row-major), in registers for the whole kernel.
  std::uint32_t a[ksteps][4];
  if constexpr (wgmma) {
    // wgmma reads the keys in their stored order, so here the dimension is not permuted: k-step
    // kk's fragment holds elements 16 kk + 2t, + 1 (a[0], a[1]) and 16 kk + 8 + 2t, + 1 (a[2],
    // a[3]) of rows g and g + 8.
    const std::int64_t r_lo = row0 + warp * 16 + g, r_hi = r_lo + 8;
    const auto* lo = reinterpret_cast<const std::uint32_t*>(queries + r_lo * q_pitch);
    const auto* hi = reinterpret_cast<const std::uint32_t*>(queries + r_hi * q_pitch);
#pragma unroll
    for (int kk = 0; kk < ksteps; ++kk) {
      a[kk][0] = r_lo < m ? lo[kk * 8 + t] : 0u;
      a[kk][1] = r_hi < m ? hi[kk * 8 + t] : 0u;
      a[kk][2] = r_lo < m ? lo[kk * 8 + 4 + t] : 0u;
      a[kk][3] = r_hi < m ? hi[kk * 8 + 4 + t] : 0u;
    }
  } else {
    // mma.sync: the dimension is permuted the same way for queries and keys (a dot product does
    // not care): within each 32 elements, lane t's 8 consecutive elements 8t .. 8t + 7 are its
    // k = 2t, 2t + 1, 2t + 8, 2t + 9 of two k-steps, so each key fragment pair is one 16-byte load.
    const std::int64_t r_lo = row0 + warp * 16 + g, r_hi = r_lo + 8;
    const auto* lo = reinterpret_cast<const uint4*>(queries + r_lo * q_pitch);
    const auto* hi = reinterpret_cast<const uint4*>(queries + r_hi * q_pitch);
#pragma unroll
    for (int kk = 0; kk < ksteps / 2; ++kk) {
      const uint4 l = r_lo < m ? lo[kk * 4 + t] : uint4{0, 0, 0, 0};
      const uint4 h = r_hi < m ? hi[kk * 4 + t] : uint4{0, 0, 0, 0};
      a[2 * kk][0] = l.x;
      a[2 * kk][1] = h.x;
      a[2 * kk][2] = l.y;
      a[2 * kk][3] = h.y;
      a[2 * kk + 1][0] = l.z;
      a[2 * kk + 1][1] = h.z;
      a[2 * kk + 1][2] = l.w;
      a[2 * kk + 1][3] = h.w;
    }
  }

  // Every row's threshold, count and k-th key (and the TMA ring's barriers) are set before any
  // warp reads them: the rows of a warp were set by other warps' threads. Within the loop a
  // row is read and written by its own warp only.
  __syncthreads();

  for (int c = 0; c < chunks; ++c) {
    const int ring = wgmma ? c % shape::tma_stages : c % shape::stages;
    if constexpr (wgmma) {
      fknn_bar_wait(&full[ring], static_cast<unsigned>(c / shape::tma_stages) & 1u);
    } else {
      fknn_cp_wait<shape::stages - 2>();
      __syncthreads();  // chunk c staged; the previous chunk's merges are done
      if (c + shape::stages - 1 < chunks) load_chunk(c + shape::stages - 1);
      fknn_cp_commit();
    }
    const std::uint16_t* const stage_c =
        wgmma ? reinterpret_cast<const std::uint16_t*>(fknn_smem + ring * shape::tma_stage_bytes)
              : stage_base + ring * (stage_keys * shape::pitch);
#pragma unroll 1  // unrolled, the two chunks took 22.2 ms instead of 20.2 (same file)
    for (int sub = 0; sub < subs; ++sub) {
      const int k0 = c * stage_keys + sub * fknn_cols;  // the sub-chunk's first key
      float acc[shape::ni][4] = {};
      if constexpr (wgmma) {
        // One m64n64k16 per k-step.
        const std::uint64_t desc =
            fknn_desc(static_cast<std::uint32_t>(__cvta_generic_to_shared(stage_c)) +
                      sub * fknn_cols * fknn_line_bytes);
        fknn_fence_acc(acc);
        fknn_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < ksteps; ++kk) {
          fknn_wgmma<T>(acc, a[kk], desc + fknn_desc_step<stage_keys>(kk));
        }
        fknn_wgmma_commit_and_wait();
        fknn_fence_acc(acc);
        // The stage's last products are done: the second warpgroup to be done with it refills
        // it (the two warpgroups run up to tma_stages - 1 stages apart).
        if (sub + 1 == subs && (tid & 127) == 0) {
          __threadfence_block();
          if (atomicAdd(&released[ring], 1u) % 2u == 1u && c + shape::tma_stages < chunks) {
            __threadfence_block();
            fknn_tma_stage<D, stage_keys>(&key_map, fknn_smem + ring * shape::tma_stage_bytes,
                                          &full[ring], key0 + (c + shape::tma_stages) * stage_keys);
          }
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < ksteps / 2; ++kk) {
#pragma unroll
          for (int nj = 0; nj < shape::ni; ++nj) {
            // B of m16n8k16 (column-major 16 x 8) is 8 key rows; one load serves two k-steps.
            const uint4 b = *reinterpret_cast<const uint4*>(
                stage_c + (sub * fknn_cols + nj * 8 + g) * shape::pitch + kk * 32 + 8 * t);
            fknn_mma<T>(acc[nj], a[2 * kk], b.x, b.y);
            fknn_mma<T>(acc[nj], a[2 * kk + 1], b.z, b.w);
          }
        }
      }

      // Filter: a score below the row's threshold cannot enter its top-k. One comparison per row
      // of this thread's scores (their maximum) decides whether any of them needs a look. While a
      // row's threshold is -inf (fewer than k keys merged) every score is looked at, since the
      // maximum skips NaN, which ranks as -inf. Keys past n exist only in the last chunk.
      const bool full_chunk = k0 + fknn_cols <= n;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = warp * 16 + g + 8 * h;
        const float thr = threshold[row];
        const bool open = thr == -INFINITY;  // fewer than k keys merged: NaN must get a look
        float pair[shape::ni];
        float top = -INFINITY;
#pragma unroll
        for (int nj = 0; nj < shape::ni; ++nj) {
          pair[nj] = fmaxf(acc[nj][2 * h], acc[nj][2 * h + 1]);
          top = fmaxf(top, pair[nj]);
        }
        if (top >= thr || open) [[unlikely]] {
          const rank_key thr_key = kth_key[row];
#pragma unroll
          for (int nj = 0; nj < shape::ni; ++nj) {
            if (!(pair[nj] >= thr || open)) continue;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float s = acc[nj][2 * h + e];
              const int key = k0 + nj * 8 + 2 * t + e;
              if (!(s < thr) && (full_chunk || key < n)) {  // NaN passes, ranks as -inf below
                const rank_key rk = make_rank_key(s, static_cast<std::uint32_t>(key0 + key));
                if (rk > thr_key) {
                  row_buffer(row)[atomicAdd(&count[row], 1)] = rk;
                }
              }
            }
          }
        }
      }
      __syncwarp();  // this warp's survivors and counts are visible to all its lanes

      // A row merges when its buffer could not take another chunk, and at the end; its warp does
      // it at once (lane l < 16 reads row 16 w + l's count).
      const bool last = c + 1 == chunks && sub + 1 == subs;
      const int my_count = lane < 16 ? count[warp * 16 + lane] : 0;
      bool merge = my_count > fknn_buffer - fknn_cols || (last && my_count > 0);
      if constexpr (align_merges) {
        // A warp merging a row holds up its warpgroup's next wgmma (it completes only once all
        // four warps have issued it), so the warpgroup merges in step. An announcement for chunk
        // `step` was written after chunk step - 1, before the writer issued this chunk's wgmma,
        // which has completed here. Two slots by chunk parity: the next write to this one comes
        // after chunk step + 1's wgmma, which this warp issues only after reading. A missed
        // announcement costs time, never a survivor (a row merges alone when it must). Atomics:
        // racecheck reports relaxed loads and stores between warps as hazards.
        int* const slot = announce + 2 * (warp >> 2);
        const int step = c * subs + sub;
        int seen = 0;
        if (lane == 0) seen = atomicAdd(slot + (step & 1), 0);
        if (__shfl_sync(0xffffffffu, seen, 0) == step) merge = merge || my_count > fknn_align_merge;
        if (__any_sync(0xffffffffu, !merge && my_count > fknn_announce_merge) && lane == 0) {
          atomicExch(slot + ((step + 1) & 1), step + 1);
        }
      }
      unsigned due = __ballot_sync(0xffffffffu, merge);
      while (due != 0) {
        const int l = __ffs(due) - 1;
        due &= due - 1;
        const int row = warp * 16 + l;
        fknn_merge_row(row_best(row), k, row_buffer(row), __shfl_sync(0xffffffffu, my_count, l),
                       &kth_key[row], &threshold[row], &count[row], hist + warp * 256);
      }
      __syncwarp();  // lane 0's new thresholds, k-th keys and counts before the next filter
    }
  }
}

}  // namespace kvsift::cuda::detail

#undef KVSIFT_FKNN_WGMMA
#undef KVSIFT_FKNN_HOPPER
#undef KVSIFT_FKNN_WGMMA_ASM
