#pragma once
// A portable f32 SIMD vector as the compiler's own vector extension (GCC and Clang), as wide as
// the instruction set the translation unit is compiled for: 16 lanes with AVX-512, 8 with AVX,
// 4 on any other x86-64 (SSE2) or AArch64 (NEON). It needs no header: a library of SIMD
// wrappers costs every includer 0.5-1 s of compile time (<immintrin.h> alone is ~0.6 s), and
// the kernels here use only loads, stores, +, * and a horizontal sum, which the compiler maps to
// the ISA itself (a * b + c contracts to an FMA where the target has one).

#include <cstddef>
#include <cstring>

namespace kvsift::detail::simd {

#if defined(__AVX512F__)
inline constexpr std::size_t width = 16;
#elif defined(__AVX__)
inline constexpr std::size_t width = 8;
#else
inline constexpr std::size_t width = 4;  // SSE2 / NEON, or plain scalar code on other targets
#endif

using vfloat = float __attribute__((vector_size(width * sizeof(float))));

/// Unaligned load / store (memcpy compiles to one vector move).
[[nodiscard]] inline vfloat load(const float* p) noexcept {
  vfloat v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, vfloat v) noexcept { std::memcpy(p, &v, sizeof v); }

/// All lanes x. `x - 0` is exact for every x (-0 included), so the compiler folds it to a
/// bare broadcast; `vfloat{} + x` would keep an add (+0 + -0 is +0), and a lane-by-lane
/// initialisation becomes a shuffle chain on SSE2.
[[nodiscard]] inline vfloat splat(float x) noexcept { return x - vfloat{}; }

namespace hsum_detail {
// Explicit widths: GCC ignores vector_size on an alias template with a dependent size.
using v2 = float __attribute__((vector_size(2 * sizeof(float))));
using v4 = float __attribute__((vector_size(4 * sizeof(float))));

// Adds the upper half onto the lower half until one lane is left. The halves are taken with
// memcpy, which the compiler turns into register extracts (vextractf128 and the like); a
// store-and-reload lane loop stalls on store forwarding and costs more than a short dot
// product (5x on d = 64 with AVX-512, measured).
template <class Half, class V>
[[nodiscard]] inline Half halves_sum(V v) noexcept {
  Half lo, hi;
  std::memcpy(&lo, &v, sizeof lo);
  std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
  return lo + hi;
}
[[nodiscard]] inline float fold(v2 v) noexcept { return v[0] + v[1]; }
[[nodiscard]] inline float fold(v4 v) noexcept { return fold(halves_sum<v2>(v)); }
// Wider types only where the ISA has them: passing them by value elsewhere is an ABI warning.
#if defined(__AVX__)
using v8 = float __attribute__((vector_size(8 * sizeof(float))));
[[nodiscard]] inline float fold(v8 v) noexcept { return fold(halves_sum<v4>(v)); }
#endif
#if defined(__AVX512F__)
using v16 = float __attribute__((vector_size(16 * sizeof(float))));
[[nodiscard]] inline float fold(v16 v) noexcept { return fold(halves_sum<v8>(v)); }
#endif
}  // namespace hsum_detail

/// Sum of the lanes, pairwise: halves folded onto each other, the order a shuffle-based
/// reduction uses.
[[nodiscard]] inline float hsum(vfloat v) noexcept { return hsum_detail::fold(v); }

}  // namespace kvsift::detail::simd
