#include "kvsift/core/element.hpp"

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace {

using kvsift::bfloat16;
using kvsift::half;

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }

// Reference f32 -> f16 rounding (nearest even) computed in double from the decoded values of
// every candidate: independent of the library's bit manipulation.
double half_value(std::uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exp == 0x1f) return mant ? std::nan("") : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

}  // namespace

TEST_CASE("half: exact round trip of every finite f16 value", "[core][element]") {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float f = half::to_float(h);
    const double ref = half_value(h);
    if (std::isnan(ref)) {
      CHECK(std::isnan(f));
      CHECK(std::isnan(half::to_float(half::from_float(f))));
      continue;
    }
    REQUIRE(static_cast<double>(f) == ref);
    REQUIRE(half::from_float(f) == h);  // includes -0, subnormals, +-Inf
  }
}

TEST_CASE("half: rounds to nearest even", "[core][element]") {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
  CHECK(half::from_float(1.0f + 0x1p-11f) == 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
  CHECK(half::from_float(1.0f + 3 * 0x1p-11f) == 0x3c02);
  // Just above halfway rounds up.
  CHECK(half::from_float(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01);
  // Mantissa carry into the exponent: largest below 2 rounds up to 2.
  CHECK(half::from_float(2.0f - 0x1p-12f) == 0x4000);

  // Random floats in the f16 range against the double-precision reference.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mag(-16.0f, 14.9f);
  for (int i = 0; i < 20000; ++i) {
    const float f =
        std::ldexp(1.0f + std::generate_canonical<float, 24>(rng), static_cast<int>(mag(rng))) *
        (i % 2 ? -1.0f : 1.0f);
    const std::uint16_t h = half::from_float(f);
    const double got = half_value(h);
    // Neighbours one ulp away must not be strictly closer, and on a tie the mantissa is even.
    const std::uint16_t up = static_cast<std::uint16_t>(h + 1),
                        down = static_cast<std::uint16_t>(h - 1);
    const double err = std::fabs(got - f);
    INFO("f = " << f << " h = " << h);
    REQUIRE(err <= std::fabs(half_value(up) - f));
    REQUIRE(err <= std::fabs(half_value(down) - f));
    if (err == std::fabs(half_value(up) - f) || err == std::fabs(half_value(down) - f)) {
      REQUIRE((h & 1) == 0);
    }
  }
}

TEST_CASE("half: overflow, NaN, subnormals, signed zero", "[core][element]") {
  CHECK(half::from_float(65504.0f) == 0x7bff);
  CHECK(half::from_float(65519.0f) == 0x7bff);  // below the halfway point to 65536
  CHECK(half::from_float(65520.0f) == 0x7c00);  // halfway: ties to even = Inf
  CHECK(half::from_float(1e6f) == 0x7c00);
  CHECK(half::from_float(-1e6f) == 0xfc00);
  CHECK(half::from_float(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(half::from_float(-std::numeric_limits<float>::infinity()) == 0xfc00);
  CHECK(std::isinf(static_cast<float>(half(1e30f))));

  const std::uint16_t qn = half::from_float(std::numeric_limits<float>::quiet_NaN());
  CHECK(std::isnan(half::to_float(qn)));
  // A signalling-style NaN whose payload lies entirely in the low 13 bits must stay a NaN.
  const float low_payload_nan = std::bit_cast<float>(0x7f800001u);
  REQUIRE(std::isnan(low_payload_nan));
  CHECK(std::isnan(half::to_float(half::from_float(low_payload_nan))));

  // Subnormals: smallest 2^-24, largest (1023 * 2^-24).
  CHECK(half::from_float(0x1p-24f) == 0x0001);
  CHECK(half::from_float(1023 * 0x1p-24f) == 0x03ff);
  CHECK(half::from_float(0x1p-14f) == 0x0400);  // smallest normal
  CHECK(half::from_float(0x1p-25f) == 0x0000);  // halfway to 2^-24: ties to even (0)
  CHECK(half::from_float(0x1p-25f * 1.0001f) == 0x0001);
  CHECK(half::from_float(3 * 0x1p-25f) == 0x0002);  // 1.5 * 2^-24: tie to even 2
  CHECK(half::from_float(0x1p-26f) == 0x0000);
  CHECK(half::from_float(-0x1p-30f) == 0x8000);  // underflow keeps the sign
  CHECK(half::to_float(0x0001) == 0x1p-24f);

  CHECK(half::from_float(-0.0f) == 0x8000);
  CHECK(std::signbit(half::to_float(0x8000)));
  CHECK(half::to_float(0x8000) == 0.0f);
}

TEST_CASE("bfloat16: round trips, rounding, overflow, NaN, subnormals", "[core][element]") {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float f = bfloat16::to_float(h);
    REQUIRE(bits_of(f) == (b << 16));
    if (std::isnan(f)) {
      REQUIRE(std::isnan(bfloat16::to_float(bfloat16::from_float(f))));
    } else {
      REQUIRE(bfloat16::from_float(f) == h);
    }
  }
  // Ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
  CHECK(bfloat16::from_float(1.0f + 0x1p-8f) == 0x3f80);
  CHECK(bfloat16::from_float(1.0f + 3 * 0x1p-8f) == 0x3f82);
  CHECK(bfloat16::from_float(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);
  // Overflow: above the largest finite bf16 halfway point goes to Inf.
  CHECK(bfloat16::from_float(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(bfloat16::from_float(-std::numeric_limits<float>::max()) == 0xff80);
  CHECK(bfloat16::from_float(std::bit_cast<float>(0x7f7f7fffu)) == 0x7f7f);
  // NaN whose payload is only in the low 16 bits must not become Inf.
  const float low_nan = std::bit_cast<float>(0x7f800001u);
  CHECK(std::isnan(bfloat16::to_float(bfloat16::from_float(low_nan))));
  CHECK(std::isnan(static_cast<float>(bfloat16(-std::numeric_limits<float>::quiet_NaN()))));
  // Subnormal f32 values round like any other.
  CHECK(bfloat16::from_float(std::bit_cast<float>(0x00010000u)) == 0x0001);
  CHECK(bfloat16::from_float(std::bit_cast<float>(0x00018000u)) == 0x0002);
  CHECK(bfloat16::from_float(std::bit_cast<float>(0x00008000u)) == 0x0000);
  CHECK(bfloat16::from_float(-0.0f) == 0x8000);
}

TEST_CASE("element helpers: to_float/from_float and element_type", "[core][element]") {
  CHECK(kvsift::to_float(1.5f) == 1.5f);
  CHECK(kvsift::to_float(kvsift::from_float<half>(0.1f)) == half::to_float(half::from_float(0.1f)));
  CHECK(kvsift::from_float<bfloat16>(3.0f).bits == 0x4040);
  CHECK(kvsift::element_type_of<float>() == kvsift::element_type::f32);
  CHECK(kvsift::element_type_of<const half>() == kvsift::element_type::f16);
  CHECK(kvsift::element_type_of<bfloat16>() == kvsift::element_type::bf16);
  CHECK(kvsift::to_string(kvsift::element_type::bf16) == "bf16");
}
