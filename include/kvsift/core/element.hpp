#pragma once
// Element types for stored vectors: f32, IEEE f16 and bf16. Storage is 16-bit; all
// arithmetic happens in f32 after conversion, which is exact for both 16-bit formats.

#include <bit>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace kvsift {

/// IEEE 754 binary16, storage only. Conversion to float is exact; from float rounds to
/// nearest even, overflows to +-Inf and keeps NaN a NaN.
struct half {
  std::uint16_t bits = 0;

  constexpr half() = default;
  explicit half(float f) noexcept : bits(from_float(f)) {}
  explicit operator float() const noexcept { return to_float(bits); }

  static float to_float(std::uint16_t h) noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu;
    std::uint32_t mant = h & 0x3ffu;
    std::uint32_t out;
    if (exp == 0x1fu) {
      out = sign | 0x7f800000u | (mant << 13);  // Inf / NaN
    } else if (exp != 0) {
      out = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
      out = sign;
    } else {  // subnormal: normalise
      std::uint32_t e = 113;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --e;
      }
      out = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
    return std::bit_cast<float>(out);
  }

  static std::uint16_t from_float(float f) noexcept {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    const std::uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {  // Inf or NaN (keep a quiet NaN)
      return static_cast<std::uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    }
    if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow
    if (ax < 0x33000001u) return static_cast<std::uint16_t>(sign);             // underflow to zero
    std::uint32_t exp = ax >> 23;
    std::uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    std::uint32_t shift;
    std::uint32_t base;
    if (exp < 113) {  // result is subnormal
      shift = 126 - exp;
      base = 0;
    } else {
      shift = 13;
      base = (exp - 112) << 10;
      mant &= 0x7fffffu;
    }
    std::uint32_t r = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | (base + r));  // carry into exponent is correct
  }
};

/// bfloat16 (top half of an f32), storage only; from float rounds to nearest even.
struct bfloat16 {
  std::uint16_t bits = 0;

  constexpr bfloat16() = default;
  explicit bfloat16(float f) noexcept : bits(from_float(f)) {}
  explicit operator float() const noexcept { return to_float(bits); }

  static float to_float(std::uint16_t b) noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
  }
  static std::uint16_t from_float(float f) noexcept {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
    const std::uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
    return static_cast<std::uint16_t>(rounded >> 16);
  }
};

/// Element type tag, as stored in index files and reported by stores.
enum class element_type : std::uint32_t { f32 = 0, f16 = 1, bf16 = 2 };

constexpr std::string_view to_string(element_type t) noexcept {
  switch (t) {
    case element_type::f32:
      return "f32";
    case element_type::f16:
      return "f16";
    case element_type::bf16:
      return "bf16";
  }
  return "unknown";
}

namespace detail {
template <class T>
inline constexpr bool is_element_v =
    std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;
}  // namespace detail

/// The element types kvsift stores vectors in: f32, f16 and bf16, const-qualified or not.
template <class T>
concept Element = detail::is_element_v<std::remove_const_t<T>>;

template <Element T>
constexpr element_type element_type_of() noexcept {
  using U = std::remove_const_t<T>;
  if constexpr (std::is_same_v<U, float>) {
    return element_type::f32;
  } else if constexpr (std::is_same_v<U, half>) {
    return element_type::f16;
  } else {
    return element_type::bf16;
  }
}

/// Converts any element to f32 (exact).
template <Element T>
inline float to_float(T v) noexcept {
  if constexpr (std::is_same_v<std::remove_const_t<T>, float>) {
    return v;
  } else {
    return static_cast<float>(v);
  }
}

/// Converts f32 to element type T (round to nearest even for 16-bit types).
template <Element T>
inline std::remove_const_t<T> from_float(float v) noexcept {
  return std::remove_const_t<T>(v);
}

static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2);
static_assert(std::is_trivially_copyable_v<half> && std::is_trivially_copyable_v<bfloat16>);

}  // namespace kvsift
