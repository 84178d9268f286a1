#pragma once
// 16-byte vector loads/stores with conversion to and from f32 registers (internal).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace kvsift::cuda::detail {

/// Element types the kernels accept.
template <class T>
inline constexpr bool is_supported_element_v =
    std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

/// Elements per 16-byte access: 4 for f32, 8 for f16/bf16.
template <class T>
inline constexpr int vec_size_v = static_cast<int>(16 / sizeof(T));

/// Widens the vec_size_v<T> elements held in 16 raw bytes to f32.
template <class T>
__device__ __forceinline__ void widen_vec(const uint4 raw, float (&out)[vec_size_v<T>]) {
  if constexpr (std::is_same_v<T, float>) {
    out[0] = __uint_as_float(raw.x);
    out[1] = __uint_as_float(raw.y);
    out[2] = __uint_as_float(raw.z);
    out[3] = __uint_as_float(raw.w);
  } else {
    const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 f;
      if constexpr (std::is_same_v<T, __half>) {
        __half2 h;
        static_assert(sizeof(h) == sizeof(unsigned));
        __builtin_memcpy(&h, &words[i], sizeof(h));
        f = __half22float2(h);
      } else {
        __nv_bfloat162 h;
        static_assert(sizeof(h) == sizeof(unsigned));
        __builtin_memcpy(&h, &words[i], sizeof(h));
        f = __bfloat1622float2(h);
      }
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
}

/// Loads vec_size_v<T> elements from a 16-byte aligned address and widens them to f32.
template <class T>
__device__ __forceinline__ void load_vec(const T* __restrict__ p, float (&out)[vec_size_v<T>]) {
  widen_vec<T>(*reinterpret_cast<const uint4*>(p), out);
}

/// Narrows vec_size_v<T> f32 values (round to nearest) and stores them 16-byte aligned.
template <class T>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[vec_size_v<T>]) {
  uint4 raw;
  if constexpr (std::is_same_v<T, float>) {
    raw = make_uint4(__float_as_uint(in[0]), __float_as_uint(in[1]), __float_as_uint(in[2]),
                     __float_as_uint(in[3]));
  } else {
    unsigned words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (std::is_same_v<T, __half>) {
        const __half2 h = __floats2half2_rn(in[2 * i], in[2 * i + 1]);
        __builtin_memcpy(&words[i], &h, sizeof(h));
      } else {
        const __nv_bfloat162 h = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
        __builtin_memcpy(&words[i], &h, sizeof(h));
      }
    }
    raw = make_uint4(words[0], words[1], words[2], words[3]);
  }
  *reinterpret_cast<uint4*>(p) = raw;
}

/// max that propagates NaN (fmaxf drops it), so a NaN input cannot masquerade as an empty state.
__device__ __forceinline__ float nan_max(float a, float b) { return (a > b || a != a) ? a : b; }

__device__ __forceinline__ float neg_inf() { return __int_as_float(static_cast<int>(0xff800000u)); }

/// True when `p` is 16-byte aligned (host side check before a vectorised launch).
inline bool is_aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

}  // namespace kvsift::cuda::detail
