#pragma once
// SIMD kernels behind the metrics, on the compiler's vector extension (core/detail/simd.hpp):
// as wide as the instruction set the translation unit is compiled for (SSE2 on any x86-64;
// AVX2 / AVX-512 with -march flags, see the KVSIFT_NATIVE build option). 16-bit keys are
// converted to f32 in registers where the ISA has the instructions for it (F16C for f16, AVX2
// for bf16), else widened in small stack chunks, so the inner loop stays a pure f32 FMA loop.

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

/// `simd::width` consecutive elements of a stored row as f32 lanes, converted in registers:
/// a load for f32, F16C's conversion for f16 (where the translation unit has F16C), a
/// zero-extension and shift for bf16 (where it has AVX2: without it GCC 12 builds the 4-lane
/// conversion from scalar moves, and bf16 search over 32768 keys x 256 was 1.05-1.40x slower
/// than through the buffer; with AVX2 it was even, with AVX-512 faster; docs/algorithms.md).
/// Exact, as `widen` is.
template <class U>
inline constexpr bool converts_in_registers = std::is_same_v<U, float>
#if defined(__AVX2__)
                                              || std::is_same_v<U, bfloat16>
#endif
#if defined(__F16C__)
                                              || std::is_same_v<U, half>
#endif
    ;

template <class U>
[[nodiscard]] inline simd::vfloat load_as_f32(const U* p) noexcept {
  constexpr std::size_t w = simd::width;
  if constexpr (std::is_same_v<U, float>) {
    return simd::load(p);
  } else if constexpr (std::is_same_v<U, bfloat16>) {
    static_assert(converts_in_registers<U>, "bf16 converts in registers only with AVX2");
    using vu16 = std::uint16_t __attribute__((vector_size(w * sizeof(std::uint16_t))));
    using vu32 = std::uint32_t __attribute__((vector_size(w * sizeof(std::uint32_t))));
    vu16 h;
    std::memcpy(&h, p, sizeof h);
    const vu32 bits = __builtin_convertvector(h, vu32) << 16;
    simd::vfloat f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  } else {
    static_assert(converts_in_registers<U>, "f16 converts in registers only with F16C");
    simd::vfloat f;
#if defined(__F16C__)
#if defined(__AVX512F__)
    // The zero-masked form with every lane selected: the same instruction, but the plain
    // `_mm512_cvtph_ps` passes `_mm512_undefined_ps()`, which GCC < 13 reports as
    // -Wmaybe-uninitialized (bug 105593) in every includer built with -march=native -Werror.
    const __m512 c = _mm512_maskz_cvtph_ps(static_cast<__mmask16>(0xffff),
                                           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__AVX__)
    const __m256 c = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
    const __m128 c = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
#endif
    static_assert(sizeof c == sizeof f);
    std::memcpy(&f, &c, sizeof f);
#endif
    return f;
  }
}

/// The last n < simd::width elements of a and of a row b as vectors padded with zeros: the
/// kernels add their terms as one more vector step (a padded lane adds +0). A scalar loop over
/// them, as before, compiled differently for f32 and 16-bit rows (GCC 12 -O3 -mavx2 -mfma:
/// scores of d = 4 differed in the last bit), while one vector step is the same instructions
/// for every element type.
template <class U>
inline void tail_vectors(const float* a, const U* b, std::size_t n, simd::vfloat& ta,
                         simd::vfloat& tb) noexcept {
  alignas(64) float pa[simd::width] = {}, pb[simd::width] = {};
  for (std::size_t j = 0; j < n; ++j) {
    pa[j] = a[j];
    pb[j] = to_float(b[j]);  // exact, as the conversions above
  }
  ta = simd::load(pa);
  tb = simd::load(pb);
}

/// a . b for a f32 `a` and a row `b` of f32, or of bf16 / f16 converted in registers
/// (`converts_in_registers`): the same sums as over the widened row, bit for bit.
template <class U>
inline float dot_row(const float* a, const U* b, std::size_t d) noexcept {
  using simd::load;
  constexpr std::size_t w = simd::width;
  std::size_t i = 0;
  simd::vfloat s0{}, s1{}, s2{}, s3{};  // four chains hide FMA latency
  for (; i + 4 * w <= d; i += 4 * w) {
    s0 += load(a + i) * load_as_f32(b + i);
    s1 += load(a + i + w) * load_as_f32(b + i + w);
    s2 += load(a + i + 2 * w) * load_as_f32(b + i + 2 * w);
    s3 += load(a + i + 3 * w) * load_as_f32(b + i + 3 * w);
  }
  for (; i + w <= d; i += w) s0 += load(a + i) * load_as_f32(b + i);
  if (i < d) {
    simd::vfloat ta, tb;
    tail_vectors(a + i, b + i, d - i, ta, tb);
    s0 += ta * tb;
  }
  return simd::hsum((s0 + s1) + (s2 + s3));
}

/// |a - b|^2, as `dot_row`.
template <class U>
inline float l2sq_row(const float* a, const U* b, std::size_t d) noexcept {
  using simd::load;
  constexpr std::size_t w = simd::width;
  std::size_t i = 0;
  simd::vfloat s0{}, s1{};
  for (; i + 2 * w <= d; i += 2 * w) {
    const simd::vfloat t0 = load(a + i) - load_as_f32(b + i);
    const simd::vfloat t1 = load(a + i + w) - load_as_f32(b + i + w);
    s0 += t0 * t0;
    s1 += t1 * t1;
  }
  for (; i + w <= d; i += w) {
    const simd::vfloat t = load(a + i) - load_as_f32(b + i);
    s0 += t * t;
  }
  if (i < d) {
    simd::vfloat ta, tb;
    tail_vectors(a + i, b + i, d - i, ta, tb);
    const simd::vfloat t = ta - tb;
    s0 += t * t;
  }
  return simd::hsum(s0 + s1);
}

inline float dot_f32(const float* a, const float* b, std::size_t d) noexcept {
  return dot_row(a, b, d);
}
inline float l2sq_f32(const float* a, const float* b, std::size_t d) noexcept {
  return l2sq_row(a, b, d);
}

/// Applies a row kernel (`kernel(q, row, n)`, generic over the row's element type, as
/// `dot_row`) to (f32 query, T key). f32 rows go to it whole. 16-bit rows go chunk by chunk
/// (`widen_chunk` elements, the chunks' sums added in order): converted in registers where
/// `converts_in_registers`, else widened into a stack buffer first. The two give the same
/// value: the conversion is exact and the kernel's sums are the same. In registers a score
/// neither stores nor reloads the widened row (through the buffer the CPU insert over f16 keys
/// was 1.4x slower than over f32 on the H200 host's Xeon; in registers f16 search took 0.68-0.83
/// of its time before; docs/algorithms.md).
template <Element T, class Kernel>
inline float mixed(const float* q, const T* x, std::size_t d, Kernel kernel) noexcept {
  using U = std::remove_const_t<T>;
  if constexpr (std::is_same_v<U, float>) {
    return kernel(q, x, d);
  } else {
    float acc = 0.0f;
    for (std::size_t i = 0; i < d; i += widen_chunk) {
      const std::size_t n = std::min(widen_chunk, d - i);
      if constexpr (converts_in_registers<U>) {
        acc += kernel(q + i, x + i, n);
      } else {
        alignas(64) float buf[widen_chunk];
        widen(x + i, buf, n);
        acc += kernel(q + i, buf, n);
      }
    }
    return acc;
  }
}

}  // namespace kvsift::detail
