#pragma once
// Exact maximum-inner-product kNN on the GPU: step 1 of the RoarGraph build.
//
// Two paths. For 16-bit keys of dimension 64, 128 or 256, k <= 128 and at least 4096 queries,
// one fused kernel computes the scores with tensor cores and keeps each query's running top-k
// without writing scores to memory (detail/knn_fused.inl; H200, 131072^2 x 128 f16, k = 100:
// 27.7 ms against 74.2 ms for the tiled path; docs/performance.md). Otherwise (the tiled path)
// scores come from a cuBLAS GEMM (inputs f32 / f16 / bf16, f32 accumulation) computed one
// (query tile x key tile) block at a time, so memory stays bounded by the tile sizes whatever
// m and n are. After each key tile a merge kernel (one block per query row) folds the tile's
// scores into the row's running top-k: scores not above the row's current k-th best are
// dropped on load; survivors collect in shared memory and, when the buffer could overflow or
// the row ends, go with the running top-k through a block-wide 8-bit radix select. After the
// first tiles almost every score is dropped on load. The tiled path serves every k <= 1024
// (H100, 131072^2 x 128, f16: k = 100 in 2.9x and k = 1000 in 4.7x the time of the GEMM alone;
// bench/results/h100_knn_bench.txt). Ranking is exactly the CPU engine's
// (<kvsift/index/knn.hpp>) on both paths: higher score first, ties to the lower id, NaN scores
// as -inf, -0 equal to +0. Every (score, id) pair is packed into one 64-bit key that orders the
// same way, which makes all keys distinct and the selection deterministic.
//
// Two entry points:
// - `knn(...)`: device views in, device outputs; the caller provides the workspace (size it
//   with `knn_workspace_size`), the cuBLAS handle and the stream. It never allocates.
// - `knn_engine`: host views in, `knn_result` out; models `kvsift::KnnEngine`, so
//   `roargraph_builder<inner_product, kvsift::cuda::knn_engine>` runs step 1 on the GPU.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

// The host headers below are plain C++ (no Eigen: the KnnEngine concept lives apart from the
// CPU engine). nvcc warns (554)
// that the const-to-const conversion operator of matrix_view<const T> is never called: it is
// disabled by its requires-clause, which that diagnostic does not see.
#pragma nv_diagnostic push
#pragma nv_diag_suppress 554
#include <kvsift/core/element.hpp>
#include <kvsift/core/ids.hpp>
#include <kvsift/core/matrix_view.hpp>
#include <kvsift/index/knn_engine.hpp>
#include <kvsift/index/knn_result.hpp>
#pragma nv_diagnostic pop
#include <kvsift/cuda/error.cuh>
#include <kvsift/cuda/graph_search.cuh>

namespace kvsift::cuda {

/// Largest k the GPU engine supports (the final sort runs in one block of shared memory).
inline constexpr int max_knn_k = 1024;

/// Tile sizes of the streamed GEMM. The workspace holds one query_tile x key_tile f32 score
/// block plus query_tile x k running results (8 bytes each), and at k <= 128 at least what the
/// fused kernel needs for min(m, 128) queries ((k + 256) x 8 bytes each). The defaults (8192 x
/// 8192: 256 MiB of scores) saturate an H100; smaller tiles bound memory further at some speed.
///
/// With `fused` (the default), at least `fused_min_queries` queries, 16-bit elements, d in
/// {64, 128, 256}, k <= `max_fused_knn_k`, 16-byte aligned data and row strides that are
/// multiples of 8 elements, one kernel computes
/// the scores on tensor cores and selects the top-k without writing a score to memory; the tile
/// sizes then only size the workspace (the fused kernel runs as many queries per launch as its
/// running results and survivor buffers, (k + 256) x 8 bytes per query, fit in it). Same results as
/// the tiled path on integer data; on real data the f32 sums may differ from cuBLAS's in the last
/// bits.
struct knn_policy {
  std::int64_t query_tile = 8192;  ///< queries per GEMM block, >= 1
  std::int64_t key_tile = 8192;    ///< keys per GEMM block, >= 1
  bool fused = true;               ///< use the fused kernel where it applies
  /// Fewer queries take the tiled path: the fused kernel's merges cost more than the scores'
  /// round trip there (H200, n = 131072, k = 100: 1024 queries 1.33 ms fused vs 0.68 ms tiled,
  /// 4096 queries 2.12 vs 2.51 ms; bench/results/h200_knn_fused.txt).
  std::int64_t fused_min_queries = 4096;
};

/// Largest k of the fused kernel (`knn_policy::fused`); larger k take the tiled path.
inline constexpr int max_fused_knn_k = 128;

/**
 * @brief Bytes of workspace `knn` needs for m queries, n keys and k neighbours.
 * @throw kvsift::invalid_argument m, n or k not positive, or a tile size not positive
 * @note O(1); host only, no CUDA call.
 */
inline std::size_t knn_workspace_size(std::int64_t m, std::int64_t n, int k,
                                      const knn_policy& policy = {});

/**
 * @brief Exact top-k keys by inner product for every query, on the GPU.
 *
 * Row i of the outputs holds query i's k best keys, best first (higher score, then lower id).
 *
 * @param queries   device view, m x d (row stride >= d), T = float, half or bfloat16
 * @param keys      device view, n x d, same element type as the queries
 * @param k         1 <= k <= min(n, max_knn_k)
 * @param out_scores device, m * k floats (f32 GEMM scores of the returned keys)
 * @param out_ids   device, m * k ids
 * @param workspace device, >= knn_workspace_size(m, n, k, policy) bytes, 256-byte aligned
 * @param handle    cuBLAS handle; its stream is set to `stream`
 * @param stream    every kernel and GEMM is enqueued here; the call does not synchronise
 *
 * @throw kvsift::invalid_argument no queries or keys, k out of range, too small a workspace,
 *        a null output or workspace, a host pointer, a pointer or stream of another device
 * @throw kvsift::dimension_mismatch query and key dimensions differ
 * @throw kvsift::cuda_error a CUDA or cuBLAS call failed
 * @note Work: 2 m n d flops in the GEMM plus, on the tiled path, one write and read of the m x n
 *       scores (streamed through the workspace, never stored whole); the fused path keeps them
 *       in registers. Validation reads no device memory, so NaN/Inf in device
 *       inputs is not rejected here: NaN scores rank as -inf (use `knn_engine`, which checks
 *       host data). Thread safety: concurrent calls need distinct handles and workspaces.
 */
template <Element T>
void knn(matrix_view<const T> queries, matrix_view<const T> keys, int k, float* out_scores,
         id_t* out_ids, void* workspace, std::size_t workspace_bytes, cublasHandle_t handle,
         cudaStream_t stream, const knn_policy& policy = {});

/// Settings of `knn_engine`.
struct knn_engine_params {
  int device = 0;       ///< CUDA device the engine runs on
  knn_policy policy{};  ///< tile sizes
};

/**
 * @brief GPU kNN engine over host data; models `kvsift::KnnEngine`.
 *
 * `search` validates, uploads queries and keys, runs `knn` and downloads a `knn_result`.
 * Queries arrive as f32 (the concept's contract) and are rounded to the key element type so
 * that 16-bit keys use tensor cores: with f16/bf16 keys, scores can differ from the CPU
 * engine's (which keeps f32 queries) by that rounding (relative 2^-11 for f16, 2^-8 for bf16),
 * and near-ties may then order differently. With f32 keys the GEMM is plain f32 and only the
 * summation order differs from the CPU engine.
 *
 * Thread safety: `search` is const and may be called concurrently; calls on one engine (and its
 * copies, which share the device state) are serialised by a mutex. Copies are cheap. The device
 * buffers grow to the largest call and are kept until the last copy is destroyed.
 * Construction makes no CUDA call, so engines can be created on machines without a GPU.
 */
class knn_engine {
 public:
  knn_engine() : knn_engine(knn_engine_params{}) {}
  explicit knn_engine(knn_engine_params params);

  [[nodiscard]] const knn_engine_params& params() const noexcept { return params_; }

  /**
   * @brief k best keys per query by inner product (ties: lower id), best first. For k > n
   *        each row holds the n keys then invalid_id with score -inf (the KnnEngine contract,
   *        as cpu_knn_engine).
   * @throw kvsift::invalid_argument k == 0, min(k, n) > max_knn_k, no queries or keys, an
   *        m x k result that overflows size_t
   * @throw kvsift::dimension_mismatch query and key dimensions differ
   * @throw kvsift::non_finite_value NaN or Inf in queries or keys (before any CUDA call)
   * @throw kvsift::cuda_error no such device, out of device memory, a failed launch
   * @note O(m n d) on the GPU plus O((m + n) d) host conversion and transfer.
   */
  template <Element T>
  [[nodiscard]] knn_result search(matrix_view<const float> queries, matrix_view<const T> keys,
                                  std::size_t k) const;

  /**
   * @brief A step-3 (connectivity) searcher over `keys` on this engine's device, with an
   *        adjacency of `width` ids per row; models `kvsift::ConnectivityEngine`, so
   *        `roargraph_builder` runs its connectivity searches on the GPU.
   * @throw as the `connectivity_searcher` constructor
   */
  template <Element T>
  [[nodiscard]] connectivity_searcher<T> make_connectivity_searcher(matrix_view<const T> keys,
                                                                    std::size_t width) const {
    return connectivity_searcher<T>(keys, width, params_.device);
  }

 private:
  struct state;
  knn_engine_params params_;
  std::shared_ptr<state> state_;
};

static_assert(KnnEngine<knn_engine>);
static_assert(ConnectivityEngine<knn_engine, float>);

}  // namespace kvsift::cuda

#include <kvsift/cuda/detail/knn.inl>
