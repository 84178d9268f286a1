#include "kvsift/attention/detail/attention_kernels.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kvsift/core/element.hpp"

namespace {

// y = a x + y over 16-bit rows must give what it gives over the rows widened to f32 first:
// the sparse attention's value sums do not depend on whether the unit converts in registers
// (`converts_in_registers`; the kvsift_f16c_tests binary runs this file compiled with F16C and
// AVX2, where both 16-bit types do).
template <class T>
void check_axpy_bit_equal_to_widened_rows() {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (std::size_t n = 1; n <= 600; n += (n < 70 ? 1 : 13)) {
    std::vector<float> x(n), y(n);
    for (auto& v : x) v = nd(rng) * 4.0f;
    for (auto& v : y) v = nd(rng);
    std::vector<T> xs;
    for (float v : x) xs.push_back(kvsift::from_float<T>(v));
    std::vector<float> widened(n);
    kvsift::detail::widen(xs.data(), widened.data(), n);
    const float a = nd(rng);
    std::vector<float> got = y, want = y;
    kvsift::detail::axpy_mixed(a, xs.data(), got.data(), n);
    kvsift::detail::axpy_f32(a, widened.data(), want.data(), n);
    std::size_t differ = 0, off = 0;  // off: against a + x y in double (both kernels share code)
    for (std::size_t i = 0; i < n; ++i) {
      differ += std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i]);
      const double exact = double(a) * double(widened[i]) + double(y[i]);
      const double tol = 2.0 * std::numeric_limits<float>::epsilon() *
                         (std::fabs(double(a) * double(widened[i])) + std::fabs(double(y[i])));
      off += std::fabs(double(got[i]) - exact) > tol;
    }
    INFO("n = " << n);
    REQUIRE(differ == 0);
    REQUIRE(off == 0);
  }
}

}  // namespace

TEST_CASE("axpy over 16-bit rows equals axpy over the widened rows, bit for bit",
          "[attention][kernels]") {
  INFO("f16 / bf16 convert in registers: "
       << kvsift::detail::converts_in_registers<kvsift::half> << " / "
       << kvsift::detail::converts_in_registers<kvsift::bfloat16>);
  SECTION("f16") { check_axpy_bit_equal_to_widened_rows<kvsift::half>(); }
  SECTION("bf16") { check_axpy_bit_equal_to_widened_rows<kvsift::bfloat16>(); }
}
