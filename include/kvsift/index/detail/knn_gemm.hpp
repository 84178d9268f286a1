#pragma once
// The block product behind the CPU kNN engine: scores = Q_block * K_block^T, as a packed GEMM
// in the GotoBLAS arrangement. Queries are packed into panels of `gemm_mr` rows and keys into
// panels of `gemm_nr` columns, both dimension-major, so the micro-kernel streams two contiguous
// arrays and keeps a gemm_mr x gemm_nr tile of sums in registers. A key panel (d x gemm_nr floats,
// 16 KiB at d = 256 with AVX2) stays in L1 while every query panel of the block (in L2) passes over
// it.
//
// Each score is one sum over the dimensions in index order, whatever the block sizes or the
// thread count, so results do not depend on the engine's tuning (Eigen's GEMM, which this
// replaces, splits the sum differently at different block sizes). 16-bit keys are widened
// while they are packed, so the inner loop is the same f32 FMA loop for every element type.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "kvsift/core/detail/simd.hpp"
#include "kvsift/core/detail/simd_kernels.hpp"
#include "kvsift/core/element.hpp"

namespace kvsift::detail {

// Query rows per micro tile: 2 * gemm_mr accumulators + 2 key vectors + 1 broadcast must fit
// the register file (16 vector registers before AVX-512, 32 with it).
#if defined(__AVX512F__)
inline constexpr std::size_t gemm_mr = 12;
#else
inline constexpr std::size_t gemm_mr = 6;
#endif
inline constexpr std::size_t gemm_nr = 2 * simd::width;  // key columns per micro tile

// GCC and Clang both read `#pragma GCC unroll`; nvcc's front end rejects it, and in CUDA
// translation units this engine is only a test oracle, so there the loop stays rolled.
#if defined(__CUDACC__)
#define KVSIFT_GEMM_UNROLL
#else
#define KVSIFT_GEMM_UNROLL _Pragma("GCC unroll 16")
#endif

/// Floats a packed block of `rows` rows needs at panel height `panel` (rows rounded up).
[[nodiscard]] inline constexpr std::size_t packed_floats(std::size_t rows, std::size_t panel,
                                                         std::size_t d) noexcept {
  return (rows + panel - 1) / panel * panel * d;
}

/// Packs `rows` rows of `src` (row stride `stride`, any element type, widened to f32) into
/// panels of `panel` rows: panel b holds, for each dimension p, the p-th value of its rows
/// (zero past the last row). `out` holds packed_floats(rows, panel, d) floats.
template <Element T>
inline void pack_panels(const T* src, std::size_t rows, std::size_t d, std::size_t stride,
                        std::size_t panel, float* out) {
  float row_f32[widen_chunk];
  for (std::size_t b0 = 0; b0 < rows; b0 += panel) {
    float* dst = out + b0 * d;  // the panel of rows [b0, b0 + panel)
    const std::size_t valid = std::min(panel, rows - b0);
    if (valid < panel) std::fill(dst, dst + panel * d, 0.0f);
    for (std::size_t r = 0; r < valid; ++r) {
      const T* row = src + (b0 + r) * stride;
      for (std::size_t p0 = 0; p0 < d; p0 += widen_chunk) {
        const std::size_t n = std::min(widen_chunk, d - p0);
        const float* vals;
        if constexpr (std::is_same_v<std::remove_const_t<T>, float>) {
          vals = row + p0;
        } else {
          widen(row + p0, row_f32, n);
          vals = row_f32;
        }
        for (std::size_t p = 0; p < n; ++p) dst[(p0 + p) * panel + r] = vals[p];
      }
    }
  }
}

/// One gemm_mr x gemm_nr tile: c[i * ldc + j] = sum_p a[p][i] * b[p][j] for i < rows,
/// j < cols (a, b: one packed panel each).
inline void gemm_micro(const float* a, const float* b, std::size_t d, float* c, std::size_t ldc,
                       std::size_t rows, std::size_t cols) noexcept {
  using simd::vfloat;
  constexpr std::size_t w = simd::width;
  vfloat acc[gemm_mr][2] = {};
  for (std::size_t p = 0; p < d; ++p) {
    const vfloat b0 = simd::load(b + p * gemm_nr);
    const vfloat b1 = simd::load(b + p * gemm_nr + w);
    const float* ap = a + p * gemm_mr;
    // Fully unrolled so the accumulators live in registers (at -O2 a rolled loop keeps the
    // array in memory: a store and a load per FMA, 6x slower; an index-sequence fold was
    // measured 3x slower than this under GCC 13).
    KVSIFT_GEMM_UNROLL
    for (std::size_t i = 0; i < gemm_mr; ++i) {
      const vfloat ai = simd::splat(ap[i]);
      acc[i][0] += ai * b0;
      acc[i][1] += ai * b1;
    }
  }
  if (rows == gemm_mr && cols == gemm_nr) {
    for (std::size_t i = 0; i < gemm_mr; ++i) {
      simd::store(c + i * ldc, acc[i][0]);
      simd::store(c + i * ldc + w, acc[i][1]);
    }
    return;
  }
  float tile[gemm_mr][gemm_nr];
  for (std::size_t i = 0; i < gemm_mr; ++i) {
    simd::store(&tile[i][0], acc[i][0]);
    simd::store(&tile[i][w], acc[i][1]);
  }
  for (std::size_t i = 0; i < rows; ++i) std::memcpy(c + i * ldc, tile[i], cols * sizeof(float));
}

/// scores[i * ldc + j] = <query i, key j> for a packed block of `qn` queries and `kn` keys.
/// Key panels outside, query panels inside: the key panel is the operand kept in L1.
inline void gemm_packed(const float* apack, std::size_t qn, const float* bpack, std::size_t kn,
                        std::size_t d, float* scores, std::size_t ldc) noexcept {
  for (std::size_t j0 = 0; j0 < kn; j0 += gemm_nr) {
    const float* b = bpack + j0 * d;
    const std::size_t cols = std::min(gemm_nr, kn - j0);
    for (std::size_t i0 = 0; i0 < qn; i0 += gemm_mr) {
      gemm_micro(apack + i0 * d, b, d, scores + i0 * ldc + j0, ldc, std::min(gemm_mr, qn - i0),
                 cols);
    }
  }
}

}  // namespace kvsift::detail
