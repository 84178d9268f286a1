#pragma once
// Kernels and host dispatch behind <kvsift/cuda/knn.cuh> (internal).

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include <kvsift/core/checked_size.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/cuda/detail/device_buffer.cuh>
#include <kvsift/cuda/detail/kernel_attributes.cuh>
#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda::detail {

using rank_key = unsigned long long;  // (ordered score bits << 32) | ~id

inline constexpr int knn_threads = 256;
inline constexpr int knn_step = 1024;  // scores filtered per step; buffer of 2 steps

/// Packs (score, id) so that a larger key ranks first: higher score, then lower id. NaN is
/// -inf and -0 is +0, as in the CPU engine's comparisons. Every real key is > 0, so 0 is a
/// free "no entry yet" value below everything.
__device__ inline rank_key make_rank_key(float s, std::uint32_t id) {
  if (isnan(s)) s = -INFINITY;
  if (s == 0.0f) s = 0.0f;
  std::uint32_t b = __float_as_uint(s);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<rank_key>(b) << 32) | static_cast<rank_key>(~id);
}

__device__ inline float rank_key_score(rank_key key) {
  std::uint32_t b = static_cast<std::uint32_t>(key >> 32);
  b = (b & 0x80000000u) ? (b & 0x7fffffffu) : ~b;
  return __uint_as_float(b);
}

__device__ inline std::uint32_t rank_key_id(rank_key key) {
  return ~static_cast<std::uint32_t>(key);
}

struct radix_scratch {
  unsigned hist[256];
  rank_key prefix;
  int rank;
};

/// Where the rank-th largest (1-based) of a 256-bin digit histogram lies: its digit, the count
/// of that digit, and its rank among the keys with that digit. One warp scans the counts from
/// the top, lane l owning digits 255 - 8l .. 248 - 8l (exactly one lane's range holds the rank);
/// all 32 lanes must call it and all get the result. rank <= the histogram's total.
struct radix_digit {
  int digit;
  unsigned count;
  int rank;
};
__device__ inline radix_digit warp_find_digit(const unsigned* hist, int rank) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  unsigned own[8];
  unsigned sum = 0;
#pragma unroll
  for (int b = 0; b < 8; ++b) {
    own[b] = hist[255 - 8 * lane - b];
    sum += own[b];
  }
  __syncwarp();  // every lane has read the histogram before the caller may clear it
  unsigned incl = sum;
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned x = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += x;
  }
  unsigned above = incl - sum;
  const auto r = static_cast<unsigned>(rank);
  const bool here = above < r && r <= incl;
  int digit = 0;
  unsigned count = 0;
  if (here) {
#pragma unroll
    for (int b = 0; b < 8; ++b) {
      if (above + own[b] >= r) {
        digit = 255 - 8 * lane - b;
        count = own[b];
        break;
      }
      above += own[b];
    }
  }
  const int src = __ffs(__ballot_sync(0xffffffffu, here)) - 1;
  return {__shfl_sync(0xffffffffu, digit, src), __shfl_sync(0xffffffffu, count, src),
          static_cast<int>(r - __shfl_sync(0xffffffffu, above, src))};
}

/// The `rank`-th largest (1-based) of a[0, count), by 8 passes of an 8-bit radix select over
/// shared memory. Returns the key; `sh.rank` is left as its rank among keys equal to it.
/// All threads of the block must call it; rank <= count.
__device__ inline rank_key block_kth_largest(const rank_key* a, int count, int rank,
                                             radix_scratch& sh) {
  rank_key prefix = 0, mask = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) sh.hist[i] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
      const rank_key v = a[i];
      if ((v & mask) == prefix) atomicAdd(&sh.hist[(v >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // warp 0 finds the digit holding the rank-th largest
      const radix_digit d = warp_find_digit(sh.hist, rank);
      if (threadIdx.x == 0) {
        sh.prefix = prefix | (static_cast<rank_key>(d.digit) << shift);
        sh.rank = d.rank;
      }
    }
    __syncthreads();
    prefix = sh.prefix;
    rank = sh.rank;
    mask |= rank_key{255} << shift;
  }
  return prefix;
}

/// Folds one score tile into the running top-k of each query row (one block per row).
/// best: rows x k rank keys (0 = empty); scores: rows x ld f32, columns [0, cols) valid, column
/// j is key id0 + j. Scores are filtered `Step` at a time against the k-th best; survivors
/// collect in a buffer of 2 * Step and are merged (radix select of the k best of the running
/// top-k + survivors) only when the next step could overflow it, or at the end of the row.
/// Shared: cand[k + 2 * Step] (running top-k, then the survivors), sel[k].
template <int Step>
__global__ void __launch_bounds__(knn_threads)
    knn_merge_tile_kernel(const float* __restrict__ scores, std::int64_t ld, int cols,
                          std::uint32_t id0, rank_key* __restrict__ best, int k) {
  constexpr int capacity = 2 * Step;
  extern __shared__ rank_key smem[];
  rank_key* cand = smem;
  rank_key* sel = smem + k + capacity;
  __shared__ radix_scratch rs;
  __shared__ int pending;
  __shared__ int above;
  __shared__ rank_key threshold;

  const std::int64_t row = blockIdx.x;
  rank_key* brow = best + row * k;
  if (threadIdx.x == 0) {
    threshold = ~rank_key{0};
    pending = 0;
  }
  __syncthreads();
  rank_key local_min = ~rank_key{0};
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    cand[i] = brow[i];
    local_min = min(local_min, cand[i]);
  }
  atomicMin(&threshold, local_min);
  __syncthreads();

  const float* srow = scores + row * ld;
  for (int c0 = 0; c0 < cols; c0 += Step) {
    const int c1 = min(cols, c0 + Step);
    const rank_key thr = threshold;
    for (int j = c0 + static_cast<int>(threadIdx.x); j < c1; j += blockDim.x) {
      const rank_key key = make_rank_key(srow[j], id0 + static_cast<std::uint32_t>(j));
      // Keys are distinct, so one not above the k-th best can never enter the top-k.
      if (key > thr) cand[k + atomicAdd(&pending, 1)] = key;
    }
    __syncthreads();
    const int c = pending;
    __syncthreads();  // everyone has read `pending` before the merge resets it
    if (c == 0 || (c <= capacity - Step && c1 < cols)) continue;  // uniform across the block
    const rank_key kth = block_kth_largest(cand, k + c, k, rs);
    if (threadIdx.x == 0) above = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < k + c; i += blockDim.x) {
      if (cand[i] > kth) sel[atomicAdd(&above, 1)] = cand[i];
    }
    __syncthreads();
    // Keys equal to the k-th are one real key or copies of the empty key 0: identical values,
    // so which copies are kept does not matter.
    for (int i = above + static_cast<int>(threadIdx.x); i < k; i += blockDim.x) sel[i] = kth;
    __syncthreads();
    for (int i = threadIdx.x; i < k; i += blockDim.x) cand[i] = sel[i];
    if (threadIdx.x == 0) {
      threshold = kth;
      pending = 0;
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < k; i += blockDim.x) brow[i] = cand[i];
}

/// Sorts each row's `count` keys best first (bitonic sort of `width` = next power of two >=
/// count keys in shared memory) and writes the first k scores and ids (k <= count: the fused
/// path's rows hold one top-k per key slice).
template <class Key>
__global__ void __launch_bounds__(1024)
    knn_finalize_kernel(const Key* __restrict__ best, int count, int k, int width,
                        float* __restrict__ out_scores, std::uint32_t* __restrict__ out_ids) {
  extern __shared__ Key a[];
  const std::int64_t row = blockIdx.x;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    a[i] = i < count ? best[row * count + i] : 0;
  }
  __syncthreads();
  for (int size = 2; size <= width; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < width; i += blockDim.x) {
        const int j = i ^ stride;
        if (j > i) {
          const bool descending = (i & size) == 0;
          const Key x = a[i], y = a[j];
          if (descending ? x < y : x > y) {
            a[i] = y;
            a[j] = x;
          }
        }
      }
      __syncthreads();
    }
  }
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    out_scores[row * k + i] = rank_key_score(a[i]);
    out_ids[row * k + i] = rank_key_id(a[i]);
  }
}

template <class T>
constexpr cudaDataType_t cuda_data_type() {
  if constexpr (std::is_same_v<T, float>) {
    return CUDA_R_32F;
  } else if constexpr (std::is_same_v<T, half>) {
    return CUDA_R_16F;
  } else {
    return CUDA_R_16BF;
  }
}

inline void check_cublas(cublasStatus_t st, const char* expr, const char* file, int line) {
  if (st != CUBLAS_STATUS_SUCCESS) [[unlikely]] {
    throw cuda_error(cudaErrorUnknown, kvsift::detail::concat(expr, " failed at ", file, ":", line,
                                                              ": ", cublasGetStatusName(st), " (",
                                                              cublasGetStatusString(st), ")"));
  }
}

#define KVSIFT_CUBLAS_CHECK(expr) \
  ::kvsift::cuda::detail::check_cublas((expr), #expr, __FILE__, __LINE__)

}  // namespace kvsift::cuda::detail

#include <kvsift/cuda/detail/knn_fused.inl>

namespace kvsift::cuda::detail {

/// Whether the fused kernel serves this call (see knn_policy) on `device`: 16-bit elements,
/// d in {64, 128, 256}, k <= 128, 16-byte aligned rows, compute capability 8.0+ (mma.sync for
/// bf16) and enough opt-in shared memory (fused_knn_smem_bytes: 59-107 KiB on compute
/// capability 9.0, where 227 KiB are available, 59-83 KiB below, within an A100's 163 KiB).
template <class T>  // half or bfloat16; knn() asks only for those
bool fused_knn_applies(matrix_view<const T> queries, matrix_view<const T> keys, int k,
                       const knn_policy& policy, int device) {
  const std::size_t d = keys.cols();
  if (!policy.fused || static_cast<std::int64_t>(queries.rows()) < policy.fused_min_queries ||
      k > max_fused_knn_k || (d != 64 && d != 128 && d != 256)) {
    return false;
  }
  const auto aligned = [](const void* p, std::size_t stride) {
    return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && stride % 8 == 0;
  };
  if (!aligned(queries.data(), queries.stride()) || !aligned(keys.data(), keys.stride())) {
    return false;
  }
  int major = 0, smem = 0;
  KVSIFT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  KVSIFT_CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return major >= 8 &&
         static_cast<std::size_t>(smem) >= fused_knn_smem_bytes(static_cast<int>(d), major);
}

struct knn_layout {
  std::int64_t qt, kt;
  std::size_t scores_bytes, best_bytes;
  std::size_t bytes;  // the workspace: the tiled path's, or the fused path's minimum if larger
};

inline knn_layout knn_workspace_layout(std::int64_t m, std::int64_t n, int k, const knn_policy& p) {
  kvsift::detail::require(m > 0, "knn: expected at least one query, got ", m);
  kvsift::detail::require(n > 0, "knn: expected a non-empty key set, got ", n, " keys");
  kvsift::detail::require(k > 0 && k <= max_knn_k, "knn: expected 1 <= k <= ", max_knn_k,
                          ", got k = ", k);
  kvsift::detail::require(p.query_tile > 0 && p.key_tile > 0,
                          "knn: expected positive tile sizes, got query_tile = ", p.query_tile,
                          ", key_tile = ", p.key_tile);
  knn_layout l{};
  l.qt = std::min(p.query_tile, m);
  l.kt = std::min(p.key_tile, n);
  l.scores_bytes = align_up(static_cast<std::size_t>(l.qt * l.kt) * sizeof(float));
  l.best_bytes =
      align_up(static_cast<std::size_t>(l.qt) * static_cast<std::size_t>(k) * sizeof(rank_key));
  // The fused path (k <= 128) needs min(m, 128) queries' running results and survivor buffers
  // at least; the tiled path's workspace holds more unless n is below about 512.
  l.bytes = l.scores_bytes + l.best_bytes;
  if (k <= max_fused_knn_k) {
    const auto rows = static_cast<std::size_t>(std::min<std::int64_t>(m, fknn_rows));
    l.bytes =
        std::max(l.bytes, rows * static_cast<std::size_t>(k + fknn_buffer) * sizeof(rank_key));
  }
  return l;
}

/// How the fused kernel covers m queries x n keys: `rows` queries per launch, each launch a grid
/// of ceil(rows / 128) blocks x `slices` key slices of `slice_keys` keys.
struct fused_knn_plan {
  std::int64_t rows = 0;  // 0: the fused kernel cannot run in this workspace
  int slices = 1;
  int slice_keys = 0;
};

/// The plan within a workspace of `bytes` (knn_workspace_size's): per query and slice, k running
/// results and fknn_buffer survivors of 8 bytes. Few queries are split over key slices until the
/// grid fills `blocks` (two per SM: the kernel's occupancy), as far as the final sort of
/// slices x k keys per row (max_knn_k) and slices of at least 16 chunks allow. Whole blocks of
/// 128 queries, in launches of equal size (a short last launch would leave the GPU idle).
inline fused_knn_plan plan_fused_knn(std::int64_t m, std::int64_t n, int k, std::size_t bytes,
                                     std::int64_t blocks) {
  fused_knn_plan p;
  if (n >= (std::int64_t{1} << 31) - fknn_cols) return p;
  const std::int64_t row_blocks = (m + fknn_rows - 1) / fknn_rows;
  const std::int64_t by_grid = std::max<std::int64_t>(1, blocks / row_blocks);
  const std::int64_t by_sort = max_knn_k / k;
  const std::int64_t by_keys = std::max<std::int64_t>(1, n / (16 * fknn_cols));
  p.slices = static_cast<int>(std::min({by_grid, by_sort, by_keys}));
  const std::int64_t chunks = (n + fknn_cols - 1) / fknn_cols;
  p.slice_keys = static_cast<int>((chunks + p.slices - 1) / p.slices * fknn_cols);
  const std::size_t per_query =
      static_cast<std::size_t>(p.slices) * static_cast<std::size_t>(k + fknn_buffer) * 8;
  std::int64_t rows = std::min<std::int64_t>(static_cast<std::int64_t>(bytes / per_query),
                                             std::int64_t{1} << 30);  // int in the kernel
  if (rows >= m) {
    p.rows = m;
    return p;
  }
  rows -= rows % fknn_rows;
  if (rows == 0) return p;
  const std::int64_t launches = (m + rows - 1) / rows;
  const std::int64_t even = (m + launches - 1) / launches;
  p.rows = std::min(rows, (even + fknn_rows - 1) / fknn_rows * fknn_rows);
  return p;
}

/// The TMA descriptor of the keys for the fused kernel's sm_90a build: rows of D 16-bit
/// elements at the keys' pitch, boxes of 64 dimensions x `tma_stage_keys` rows written with the
/// 128-byte swizzle (the panels wgmma reads), rows past the end read as zeros. On a device below
/// compute capability 9.0 (`major` < 9) no build uses it and it is left zeroed. The driver's
/// encoder is looked up through the runtime, so nothing links against libcuda.
/// @throw cuda_error if the driver has no encoder or rejects the layout
template <class T, int D>
CUtensorMap fused_key_map(matrix_view<const T> keys, int major) {
  CUtensorMap map{};
  if (major < 9) return map;
  using encode_fn =
      CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const encode_fn encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    KVSIFT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                       cudaEnableDefault, &found));
#else  // before 12.5 only the plain lookup exists (deprecated from 12.5 on)
    KVSIFT_CUDA_CHECK(
        cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found));
#endif
    if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
      throw cuda_error(cudaErrorNotSupported, "knn: the CUDA driver has no cuTensorMapEncodeTiled");
    }
    return reinterpret_cast<encode_fn>(fn);
  }();
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(keys.rows())};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(keys.stride()) * sizeof(T)};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(fknn_shape<D>::tma_stage_keys)};
  const cuuint32_t unit[2] = {1, 1};
  const CUresult r = encode(
      &map,
      std::is_same_v<T, half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
      2, const_cast<T*>(keys.data()), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    throw cuda_error(cudaErrorInvalidValue, "knn: cuTensorMapEncodeTiled failed with CUresult " +
                                                std::to_string(static_cast<int>(r)));
  }
  return map;
}

/// Sorts rows [0, rows) of `best` (`count` rank keys each) and writes their first k scores and
/// ids (knn_finalize_kernel, one block per row).
inline void launch_knn_finalize(const rank_key* best, int count, int k, std::int64_t rows,
                                float* out_scores, std::uint32_t* out_ids, cudaStream_t stream) {
  int width = 1;
  while (width < count) width <<= 1;
  const int threads = std::max(32, std::min(1024, width));
  knn_finalize_kernel<rank_key>
      <<<static_cast<unsigned>(rows), threads, static_cast<std::size_t>(width) * sizeof(rank_key),
         stream>>>(best, count, k, width, out_scores, out_ids);
  KVSIFT_CUDA_CHECK(cudaGetLastError());
}

/// The fused path of knn(): launches of plan.rows queries, each the fused kernel into `best` and
/// `buffer` and the final sort into the outputs. The device's compute capability (`major`: the
/// launch's shared memory and whether a tensor map is needed) is asked once by the caller and the
/// keys' tensor map encoded once per call, not per launch.
template <class T, int D>
void run_fused_knn(matrix_view<const T> queries, matrix_view<const T> keys, int k,
                   const fused_knn_plan& plan, rank_key* best, rank_key* buffer, float* out_scores,
                   std::uint32_t* out_ids, int device, int major, cudaStream_t stream) {
  const std::size_t smem = fused_knn_smem_bytes(D, major);
  allow_shared_memory<knn_fused_kernel<T, D>>(device, static_cast<int>(smem),
                                              cudaSharedmemCarveoutMaxShared);
  const CUtensorMap map = fused_key_map<T, D>(keys, major);
  const auto m = static_cast<std::int64_t>(queries.rows());
  for (std::int64_t q0 = 0; q0 < m; q0 += plan.rows) {
    const std::int64_t qn = std::min(plan.rows, m - q0);
    const dim3 grid(static_cast<unsigned>((qn + fknn_rows - 1) / fknn_rows),
                    static_cast<unsigned>(plan.slices));
    knn_fused_kernel<T, D><<<grid, fknn_threads, smem, stream>>>(
        queries.row(static_cast<std::size_t>(q0)), static_cast<std::int64_t>(queries.stride()),
        static_cast<int>(qn), keys.data(), static_cast<std::int64_t>(keys.stride()),
        static_cast<int>(keys.rows()), plan.slice_keys, k, best, buffer, map);
    KVSIFT_CUDA_CHECK(cudaGetLastError());
    launch_knn_finalize(best, plan.slices * k, k, qn, out_scores + q0 * k, out_ids + q0 * k,
                        stream);
  }
}

}  // namespace kvsift::cuda::detail

namespace kvsift::cuda {

inline std::size_t knn_workspace_size(std::int64_t m, std::int64_t n, int k,
                                      const knn_policy& policy) {
  return detail::knn_workspace_layout(m, n, k, policy).bytes;
}

template <Element T>
void knn(matrix_view<const T> queries, matrix_view<const T> keys, int k, float* out_scores,
         id_t* out_ids, void* workspace, std::size_t workspace_bytes, cublasHandle_t handle,
         cudaStream_t stream, const knn_policy& policy) {
  static_assert(sizeof(id_t) == sizeof(std::uint32_t));
  const auto m = static_cast<std::int64_t>(queries.rows());
  const auto n = static_cast<std::int64_t>(keys.rows());
  const auto l = detail::knn_workspace_layout(m, n, k, policy);
  require_dim(keys.cols(), queries.cols(), "knn: query dimension vs key dimension");
  kvsift::detail::require(keys.cols() > 0, "knn: expected a positive dimension, got 0");
  kvsift::detail::require(k <= n, "knn: expected k <= n = ", n, ", got k = ", k);
  kvsift::detail::require(n <= std::int64_t{invalid_id}, "knn: at most ", invalid_id,
                          " keys supported, got ", n);
  const std::size_t need = l.bytes;
  kvsift::detail::require(workspace_bytes >= need, "knn: workspace of ", workspace_bytes,
                          " bytes is too small, expected >= ", need);
  kvsift::detail::require(handle != nullptr, "knn: cuBLAS handle is null");
  int device = 0;
  KVSIFT_CUDA_CHECK(cudaGetDevice(&device));
  detail::require_stream_on(stream, device, "knn");
  detail::require_device_pointer(queries.data(), device, "knn", "queries");
  detail::require_device_pointer(keys.data(), device, "knn", "keys");
  detail::require_device_pointer(out_scores, device, "knn", "out_scores");
  detail::require_device_pointer(out_ids, device, "knn", "out_ids");
  detail::require_device_pointer(workspace, device, "knn", "workspace");

  // The fused path needs no score tile: the whole workspace holds running results and survivor
  // buffers, so a launch serves as many queries as fit (default workspace, k = 100: 94336).
  if constexpr (!std::is_same_v<T, float>) {
    detail::fused_knn_plan plan;  // rows = 0: the tiled path
    if (detail::fused_knn_applies(queries, keys, k, policy, device)) {
      int sms = 0;
      KVSIFT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      plan = detail::plan_fused_knn(m, n, k, need, 2 * sms);
    }
    if (plan.rows > 0) {
      // Running top-k lists (slices x k per query), then the survivor buffers.
      auto* best = static_cast<detail::rank_key*>(workspace);
      auto* buffer = best + plan.rows * plan.slices * k;
      int major = 0;
      KVSIFT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
      switch (keys.cols()) {
        case 64:
          detail::run_fused_knn<T, 64>(queries, keys, k, plan, best, buffer, out_scores, out_ids,
                                       device, major, stream);
          break;
        case 128:
          detail::run_fused_knn<T, 128>(queries, keys, k, plan, best, buffer, out_scores, out_ids,
                                        device, major, stream);
          break;
        default:
          detail::run_fused_knn<T, 256>(queries, keys, k, plan, best, buffer, out_scores, out_ids,
                                        device, major, stream);
      }
      return;
    }
  }

  auto* scores = static_cast<float*>(workspace);
  auto* best = reinterpret_cast<detail::rank_key*>(static_cast<char*>(workspace) + l.scores_bytes);
  const int d = static_cast<int>(keys.cols());
  const cudaDataType_t type = detail::cuda_data_type<T>();
  const float one = 1.0f, zero = 0.0f;
  KVSIFT_CUBLAS_CHECK(cublasSetStream(handle, stream));
  KVSIFT_CUBLAS_CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
  const std::size_t merge_smem =
      (2 * static_cast<std::size_t>(k) + 2 * detail::knn_step) * sizeof(detail::rank_key);
  static_assert((2 * max_knn_k + 2 * detail::knn_step) * sizeof(detail::rank_key) <= 48 * 1024);

  for (std::int64_t q0 = 0; q0 < m; q0 += l.qt) {
    const std::int64_t qn = std::min(l.qt, m - q0);
    KVSIFT_CUDA_CHECK(cudaMemsetAsync(
        best, 0, static_cast<std::size_t>(qn) * k * sizeof(detail::rank_key), stream));
    for (std::int64_t k0 = 0; k0 < n; k0 += l.kt) {
      const std::int64_t kn = std::min(l.kt, n - k0);
      // Row-major S (qn x kn) = Q K^T is column-major S^T = K Q^T: A = keys (column-major
      // d x kn, transposed), B = queries (column-major d x qn).
      KVSIFT_CUBLAS_CHECK(
          cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(kn), static_cast<int>(qn),
                       d, &one, keys.row(static_cast<std::size_t>(k0)), type,
                       static_cast<int>(keys.stride()), queries.row(static_cast<std::size_t>(q0)),
                       type, static_cast<int>(queries.stride()), &zero, scores, CUDA_R_32F,
                       static_cast<int>(kn), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      detail::knn_merge_tile_kernel<detail::knn_step>
          <<<static_cast<unsigned>(qn), detail::knn_threads, merge_smem, stream>>>(
              scores, kn, static_cast<int>(kn), static_cast<std::uint32_t>(k0), best, k);
      KVSIFT_CUDA_CHECK(cudaGetLastError());
    }
    detail::launch_knn_finalize(best, k, k, qn, out_scores + q0 * k, out_ids + q0 * k, stream);
  }
}

/// Device state shared by copies of one engine.
struct knn_engine::state {
  std::mutex mutex;
  bool ready = false;
  cublasHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  detail::grow_buffer queries, keys, scores, ids, workspace;
  int device = 0;

  ~state() {
    if (!ready) return;
    const detail::quiet_device_guard guard(device);  // freed on the device they live on
    for (auto* b : {&queries, &keys, &scores, &ids, &workspace}) b->release();
    cublasDestroy(handle);
    cudaStreamDestroy(stream);
  }
};

inline knn_engine::knn_engine(knn_engine_params params)
    : params_(params), state_(std::make_shared<state>()) {}

template <Element T>
knn_result knn_engine::search(matrix_view<const float> queries, matrix_view<const T> keys,
                              std::size_t k) const {
  kvsift::detail::validate_knn(queries, keys.rows(), keys.cols(), k);
  // The KnnEngine contract (like cpu_knn_engine): k > n is not an error, rows are padded with
  // invalid_id and the worst score. The kernels run with k_run = min(k, n) and the host pads, so
  // only k_run is bounded by the kernel limit.
  const std::size_t k_run = std::min(k, keys.rows());
  kvsift::detail::require(k_run <= static_cast<std::size_t>(max_knn_k),
                          "knn_engine: expected k <= ", max_knn_k, " (or k > n = ", keys.rows(),
                          ", padded), got k = ", k);
  const std::size_t m = queries.rows(), n = keys.rows(), d = keys.cols();
  // Sizes of the result (m x k, host) and of the device buffers, checked before any copy.
  const std::size_t result_cells = kvsift::checked_mul(m, k, "knn_engine: m x k results");
  (void)kvsift::checked_bytes<float>(result_cells, "knn_engine: m x k results");
  require_finite(queries, "knn_engine: queries");
  require_finite(keys, "knn_engine: keys");
  const int ki = static_cast<int>(k_run);
  const std::size_t ws_bytes = knn_workspace_size(static_cast<std::int64_t>(m),
                                                  static_cast<std::int64_t>(n), ki, params_.policy);

  // Queries in the key element type, contiguous (the only host-side copy).
  std::vector<T> q(m * d);
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < d; ++j) q[i * d + j] = T(queries(i, j));
  }

  std::lock_guard lock(state_->mutex);
  detail::device_guard guard(params_.device);
  state& s = *state_;
  if (!s.ready) {
    s.device = params_.device;
    KVSIFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    if (const cublasStatus_t st = cublasCreate(&s.handle); st != CUBLAS_STATUS_SUCCESS) {
      cudaStreamDestroy(s.stream);
      detail::check_cublas(st, "cublasCreate", __FILE__, __LINE__);
    }
    s.ready = true;
  }
  auto* dq = static_cast<T*>(s.queries.reserve(m * d * sizeof(T)));
  auto* dk = static_cast<T*>(s.keys.reserve(n * d * sizeof(T)));
  auto* ds = static_cast<float*>(s.scores.reserve(m * k_run * sizeof(float)));
  auto* di = static_cast<id_t*>(s.ids.reserve(m * k_run * sizeof(id_t)));
  void* dw = s.workspace.reserve(ws_bytes);
  KVSIFT_CUDA_CHECK(
      cudaMemcpyAsync(dq, q.data(), m * d * sizeof(T), cudaMemcpyHostToDevice, s.stream));
  KVSIFT_CUDA_CHECK(cudaMemcpy2DAsync(dk, d * sizeof(T), keys.data(), keys.stride() * sizeof(T),
                                      d * sizeof(T), n, cudaMemcpyHostToDevice, s.stream));
  knn<T>(matrix_view<const T>(dq, m, d), matrix_view<const T>(dk, n, d), ki, ds, di, dw, ws_bytes,
         s.handle, s.stream, params_.policy);
  knn_result out;
  out.rows = m;
  out.k = k;
  out.ids.assign(result_cells, invalid_id);
  out.scores.assign(result_cells, -std::numeric_limits<float>::infinity());
  // Rows of k_run results land at the start of each k-wide output row (a pitched copy); the
  // padding (k_run < k only when k > n) keeps invalid_id and -inf, as in cpu_knn_engine.
  KVSIFT_CUDA_CHECK(cudaMemcpy2DAsync(out.ids.data(), k * sizeof(id_t), di, k_run * sizeof(id_t),
                                      k_run * sizeof(id_t), m, cudaMemcpyDeviceToHost, s.stream));
  KVSIFT_CUDA_CHECK(cudaMemcpy2DAsync(out.scores.data(), k * sizeof(float), ds,
                                      k_run * sizeof(float), k_run * sizeof(float), m,
                                      cudaMemcpyDeviceToHost, s.stream));
  KVSIFT_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  return out;
}

}  // namespace kvsift::cuda
