#include "kvsift/core/metric.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {

template <class T>
std::vector<T> to_elements(const std::vector<float>& v) {
  std::vector<T> out;
  for (float x : v) out.push_back(kvsift::from_float<T>(x));
  return out;
}

template <class T>
void check_metrics_against_reference() {
  std::mt19937 rng(123);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (std::size_t d = 1; d <= 300; d += (d < 40 ? 1 : 7)) {
    std::vector<float> q(d), x(d);
    for (auto& v : q) v = nd(rng);
    for (auto& v : x) v = nd(rng);
    const std::vector<T> xs = to_elements<T>(x);
    double dot = 0, l2 = 0, abs_dot = 0;
    for (std::size_t j = 0; j < d; ++j) {
      const double xj = kvsift::to_float(xs[j]);  // the widened stored value
      dot += static_cast<double>(q[j]) * xj;
      abs_dot += std::fabs(static_cast<double>(q[j]) * xj);
      l2 += (q[j] - xj) * (q[j] - xj);
    }
    // f32 accumulation error bound ~ d * eps * sum|terms|; use a tight multiple of it.
    const double eps = std::numeric_limits<float>::epsilon();
    const double tol_dot = 2.0 * static_cast<double>(d) * eps * abs_dot + 1e-30;
    const double tol_l2 = 2.0 * static_cast<double>(d) * eps * l2 + 1e-30;
    INFO("d = " << d);
    REQUIRE(std::fabs(kvsift::inner_product::score(q.data(), xs.data(), d) - dot) <= tol_dot);
    REQUIRE(std::fabs(kvsift::l2::score(q.data(), xs.data(), d) - l2) <= tol_l2);
  }
}

}  // namespace

TEST_CASE("metrics match a double-precision reference", "[core][metric]") {
  SECTION("f32") { check_metrics_against_reference<float>(); }
  SECTION("f16") { check_metrics_against_reference<kvsift::half>(); }
  SECTION("bf16") { check_metrics_against_reference<kvsift::bfloat16>(); }
}

TEST_CASE("metrics on exactly representable data are exact", "[core][metric]") {
  // Small integers: every partial sum is exact in f32, whatever the summation order.
  for (std::size_t d : {1u, 7u, 15u, 16u, 17u, 33u, 64u, 255u, 256u, 257u, 300u}) {
    std::vector<float> q(d), x(d);
    long long dot = 0, l2 = 0;
    for (std::size_t j = 0; j < d; ++j) {
      q[j] = static_cast<float>(static_cast<int>(j % 7) - 3);
      x[j] = static_cast<float>(static_cast<int>((j * 5) % 9) - 4);
      dot += static_cast<long long>(q[j] * x[j]);
      l2 += static_cast<long long>((q[j] - x[j]) * (q[j] - x[j]));
    }
    const auto xh = to_elements<kvsift::half>(x);
    const auto xb = to_elements<kvsift::bfloat16>(x);
    INFO("d = " << d);
    CHECK(kvsift::inner_product::score(q.data(), x.data(), d) == static_cast<float>(dot));
    CHECK(kvsift::inner_product::score(q.data(), xh.data(), d) == static_cast<float>(dot));
    CHECK(kvsift::inner_product::score(q.data(), xb.data(), d) == static_cast<float>(dot));
    CHECK(kvsift::l2::score(q.data(), x.data(), d) == static_cast<float>(l2));
    CHECK(kvsift::l2::score(q.data(), xh.data(), d) == static_cast<float>(l2));
    CHECK(kvsift::l2::score(q.data(), xb.data(), d) == static_cast<float>(l2));
  }
  const float q = 1.0f;
  CHECK(kvsift::inner_product::score(&q, &q, 0) == 0.0f);
}

namespace {

// The stored row widened into f32 chunk by chunk (`widen_chunk` elements, the chunks' sums
// added in order): what the metrics computed for 16-bit rows before they converted in
// registers, and what they must still compute, bit for bit.
template <class T, class Kernel>
float widened_reference(const float* q, const T* x, std::size_t d, Kernel kernel) {
  std::vector<float> buf(kvsift::detail::widen_chunk);
  float acc = 0.0f;
  for (std::size_t i = 0; i < d; i += kvsift::detail::widen_chunk) {
    const std::size_t n = std::min(kvsift::detail::widen_chunk, d - i);
    kvsift::detail::widen(x + i, buf.data(), n);
    acc += kernel(q + i, buf.data(), n);
  }
  return acc;
}

template <class T>
void check_bit_equal_to_widened_rows() {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> special(0, 40);
  const float specials[] = {0.0f, -0.0f, 6e-8f, -3e-6f, 65504.0f, 1e30f, -2.5e-39f};
  for (std::size_t d = 1; d <= 600; d += (d < 70 ? 1 : 13)) {
    std::vector<float> q(d), x(d);
    for (auto& v : q) v = nd(rng);
    for (auto& v : x) {  // normal values, with zeros, subnormals and extremes mixed in
      const int s = special(rng);
      v = s < 7 ? specials[s] : nd(rng) * 8.0f;
    }
    const std::vector<T> xs = to_elements<T>(x);
    const float dot = kvsift::inner_product::score(q.data(), xs.data(), d);
    const float l2 = kvsift::l2::score(q.data(), xs.data(), d);
    const float dot_ref = widened_reference(q.data(), xs.data(), d, kvsift::detail::dot_f32);
    const float l2_ref = widened_reference(q.data(), xs.data(), d, kvsift::detail::l2sq_f32);
    INFO("d = " << d << ", dot " << dot << " vs " << dot_ref << ", l2 " << l2 << " vs " << l2_ref);
    REQUIRE(std::bit_cast<std::uint32_t>(dot) == std::bit_cast<std::uint32_t>(dot_ref));
    REQUIRE(std::bit_cast<std::uint32_t>(l2) == std::bit_cast<std::uint32_t>(l2_ref));
  }
}

}  // namespace

TEST_CASE("16-bit rows score as their widened f32 rows, bit for bit", "[core][metric]") {
  // f16 converts in registers where the unit has F16C, bf16 where it has AVX2 (the
  // kvsift_f16c_tests binary runs this file compiled with both); otherwise they go through the
  // buffer.
  INFO("f16 / bf16 convert in registers: "
       << kvsift::detail::converts_in_registers<kvsift::half> << " / "
       << kvsift::detail::converts_in_registers<kvsift::bfloat16>);
  SECTION("f16") { check_bit_equal_to_widened_rows<kvsift::half>(); }
  SECTION("bf16") { check_bit_equal_to_widened_rows<kvsift::bfloat16>(); }
}

TEST_CASE("to_key / from_key / worst_score", "[core][metric]") {
  using kvsift::from_key;
  using kvsift::inner_product;
  using kvsift::l2;
  using kvsift::to_key;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(to_key<inner_product>(2.5f) == 2.5f);
  CHECK(to_key<l2>(2.5f) == -2.5f);
  CHECK(from_key<l2>(to_key<l2>(3.0f)) == 3.0f);
  CHECK(from_key<inner_product>(to_key<inner_product>(-3.0f)) == -3.0f);
  // Better scores get larger keys.
  CHECK(to_key<inner_product>(2.0f) > to_key<inner_product>(1.0f));
  CHECK(to_key<l2>(1.0f) > to_key<l2>(2.0f));
  // NaN ranks last: its key is below every finite key and not above the worst.
  CHECK(to_key<inner_product>(nan) == -inf);
  CHECK(to_key<l2>(nan) == -inf);
  CHECK(to_key<inner_product>(nan) < to_key<inner_product>(-1e38f));
  CHECK(to_key<l2>(nan) < to_key<l2>(1e38f));
  CHECK(kvsift::worst_score<inner_product>() == -inf);
  CHECK(kvsift::worst_score<l2>() == inf);
  CHECK(from_key<l2>(to_key<l2>(nan)) == kvsift::worst_score<l2>());
  CHECK(from_key<inner_product>(to_key<inner_product>(nan)) ==
        kvsift::worst_score<inner_product>());
}
