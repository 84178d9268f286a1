#pragma once
// SIMD kernels behind the metrics, on the compiler's vector extension (core/detail/simd.hpp):
// as wide as the instruction set the translation unit is compiled for (SSE2 on any x86-64;
// AVX2 / AVX-512 with -march flags, see the KVSIFT_NATIVE build option). 16-bit keys are
// widened to f32 in small stack chunks so the inner loop stays a pure f32 FMA loop.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kvsift/core/detail/simd.hpp"
#include "kvsift/core/element.hpp"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace kvsift::detail {

inline float dot_f32(const float* a, const float* b, std::size_t d) noexcept {
  using simd::load;
  constexpr std::size_t w = simd::width;
  std::size_t i = 0;
  simd::vfloat s0{}, s1{}, s2{}, s3{};  // four chains hide FMA latency
  for (; i + 4 * w <= d; i += 4 * w) {
    s0 += load(a + i) * load(b + i);
    s1 += load(a + i + w) * load(b + i + w);
    s2 += load(a + i + 2 * w) * load(b + i + 2 * w);
    s3 += load(a + i + 3 * w) * load(b + i + 3 * w);
  }
  for (; i + w <= d; i += w) s0 += load(a + i) * load(b + i);
  float acc = simd::hsum((s0 + s1) + (s2 + s3));
  for (; i < d; ++i) acc += a[i] * b[i];
  return acc;
}

inline float l2sq_f32(const float* a, const float* b, std::size_t d) noexcept {
  using simd::load;
  constexpr std::size_t w = simd::width;
  std::size_t i = 0;
  simd::vfloat s0{}, s1{};
  for (; i + 2 * w <= d; i += 2 * w) {
    const simd::vfloat t0 = load(a + i) - load(b + i);
    const simd::vfloat t1 = load(a + i + w) - load(b + i + w);
    s0 += t0 * t0;
    s1 += t1 * t1;
  }
  for (; i + w <= d; i += w) {
    const simd::vfloat t = load(a + i) - load(b + i);
    s0 += t * t;
  }
  float acc = simd::hsum(s0 + s1);
  for (; i < d; ++i) {
    const float t = a[i] - b[i];
    acc += t * t;
  }
  return acc;
}

/// Branch-free exact f16 -> f32 (Giesen's method), used by `widen` without F16C: the
/// data-dependent branches of `half::to_float` cost ~3 ns per element in hot loops, this
/// version lets the compiler keep (and vectorise) the loop branch-free. Subnormals are renormalised
/// with a subtraction of normal floats, so the result stays exact under DAZ/FTZ too.
inline float half_to_float_branchless(std::uint16_t h) noexcept {
  constexpr std::uint32_t shifted_exp = 0x7c00u << 13;
  std::uint32_t o = (h & 0x7fffu) << 13;
  const std::uint32_t exp = o & shifted_exp;
  o += (127u - 15u) << 23;
  const bool inf_nan = exp == shifted_exp;
  const bool sub = exp == 0;
  o += inf_nan ? (128u - 16u) << 23 : 0u;
  o += sub ? 1u << 23 : 0u;
  float f = std::bit_cast<float>(o);
  f -= sub ? std::bit_cast<float>(113u << 23) : 0.0f;
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(f) |
                              (static_cast<std::uint32_t>(h & 0x8000u) << 16));
}

/// Widens `n` 16-bit elements to f32. bf16 is a shift (the compiler vectorises it); f16 uses
/// F16C when the translation unit is compiled with it, else the branch-free conversion.
template <Element T>
inline void widen(const T* src, float* dst, std::size_t n) noexcept {
  using U = std::remove_const_t<T>;
  if constexpr (std::is_same_v<U, float>) {
    std::memcpy(dst, src, n * sizeof(float));
  } else if constexpr (std::is_same_v<U, bfloat16>) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = bfloat16::to_float(src[i].bits);
  } else {
    std::size_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
#endif
    for (; i < n; ++i) dst[i] = half_to_float_branchless(src[i].bits);
  }
}

inline constexpr std::size_t widen_chunk = 256;

/// Applies a f32 kernel to (f32 query, T key) by widening the key chunk by chunk.
template <Element T, class Kernel>
inline float mixed(const float* q, const T* x, std::size_t d, Kernel kernel) noexcept {
  if constexpr (std::is_same_v<std::remove_const_t<T>, float>) {
    return kernel(q, x, d);
  } else {
    alignas(64) float buf[widen_chunk];
    float acc = 0.0f;
    for (std::size_t i = 0; i < d; i += widen_chunk) {
      const std::size_t n = std::min(widen_chunk, d - i);
      widen(x + i, buf, n);
      acc += kernel(q + i, buf, n);
    }
    return acc;
  }
}

}  // namespace kvsift::detail
