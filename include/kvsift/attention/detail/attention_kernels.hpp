#pragma once
// Small f32 vector kernels used by the merge and by sparse attention: the weighted sums of
// output rows. On the compiler's vector extension (core/detail/simd.hpp), like the metric
// kernels, so they follow the translation unit's ISA.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kvsift/core/detail/simd.hpp"
#include "kvsift/core/detail/simd_kernels.hpp"

namespace kvsift::detail {

/// y = a * x + y for a row `x` of f32, or of bf16 / f16 converted in registers
/// (`converts_in_registers`); the tail as one more padded vector step, as the metric kernels'
/// (`tail_vectors`), so every element type gives the same sums.
template <class U>
inline void axpy_row(float a, const U* x, float* y, std::size_t n) noexcept {
  constexpr std::size_t w = simd::width;
  const simd::vfloat va = simd::splat(a);
  std::size_t i = 0;
  for (; i + w <= n; i += w) simd::store(y + i, va * load_as_f32(x + i) + simd::load(y + i));
  if (i < n) {
    simd::vfloat ty, tx;
    tail_vectors(y + i, x + i, n - i, ty, tx);
    alignas(64) float out[w];
    simd::store(out, va * tx + ty);
    std::copy_n(out, n - i, y + i);
  }
}

/// y = a * x + y.
inline void axpy_f32(float a, const float* x, float* y, std::size_t n) noexcept {
  axpy_row(a, x, y, n);
}

/// y = a * y.
inline void scale_f32(float a, float* y, std::size_t n) noexcept {
  constexpr std::size_t w = simd::width;
  const simd::vfloat va = simd::splat(a);
  std::size_t i = 0;
  for (; i + w <= n; i += w) simd::store(y + i, va * simd::load(y + i));
  for (; i < n; ++i) y[i] *= a;
}

/// y = a * x + b * y. The merge's inner loop: one read of each input, one write.
inline void axpby_f32(float a, const float* x, float b, float* y, std::size_t n) noexcept {
  constexpr std::size_t w = simd::width;
  const simd::vfloat va = simd::splat(a), vb = simd::splat(b);
  std::size_t i = 0;
  for (; i + w <= n; i += w) {
    simd::store(y + i, va * simd::load(x + i) + vb * simd::load(y + i));
  }
  // The tail walks pointers: indexing y[i] here made GCC 12 (-O3, after inlining a merge of
  // states of known size) warn that a far iteration "invokes undefined behavior", a false
  // positive of -Waggressive-loop-optimizations that -Werror builds of includers would hit.
  const float* xp = x + i;
  for (float* yp = y + i; yp != y + n; ++yp, ++xp) *yp = a * *xp + b * *yp;
}

/// y = a * x + y for a row `x` of any element type: converted in registers where
/// `converts_in_registers`, else widened chunk by chunk on the stack, so the inner loop stays
/// a pure f32 FMA loop. Both give the same y.
template <Element T>
inline void axpy_mixed(float a, const T* x, float* y, std::size_t n) noexcept {
  using U = std::remove_const_t<T>;
  if constexpr (converts_in_registers<U>) {
    axpy_row(a, x, y, n);
  } else {
    alignas(64) float buf[widen_chunk];
    for (std::size_t i = 0; i < n; i += widen_chunk) {
      const std::size_t m = std::min(widen_chunk, n - i);
      widen(x + i, buf, m);
      axpy_f32(a, buf, y + i, m);
    }
  }
}

}  // namespace kvsift::detail
