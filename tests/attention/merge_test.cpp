#include "kvsift/attention/merge.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "attention_reference.hpp"

namespace {

constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();

kvsift::partial_state random_state(std::size_t d, std::mt19937& rng, float lse_sigma = 3.0f) {
  std::normal_distribution<float> dist;
  kvsift::partial_state s(d);
  for (auto& x : s.o) x = dist(rng);
  s.lse = lse_sigma * dist(rng);
  return s;
}

bool all_finite(const kvsift::partial_state& s) {
  for (float x : s.o) {
    if (!std::isfinite(x)) return false;
  }
  return !std::isnan(s.lse);
}

/// Merge of two states in double, from the definition.
kvsift_test::reference_state merge_reference(const kvsift::partial_state& a,
                                             const kvsift::partial_state& b) {
  const double m = std::max(a.lse, b.lse);
  const double lse = m + std::log(std::exp(a.lse - m) + std::exp(b.lse - m));
  kvsift_test::reference_state r;
  r.lse = lse;
  for (std::size_t j = 0; j < a.dim(); ++j) {
    r.o.push_back(std::exp(a.lse - lse) * a.o[j] + std::exp(b.lse - lse) * b.o[j]);
  }
  return r;
}

}  // namespace

TEST_CASE("merge follows the log-sum-exp rule", "[attention][merge]") {
  std::mt19937 rng(1);
  for (std::size_t d : {1u, 7u, 64u, 128u}) {
    for (int rep = 0; rep < 20; ++rep) {
      const auto a = random_state(d, rng);
      const auto b = random_state(d, rng);
      kvsift_test::check_close(kvsift::merge(a, b), merge_reference(a, b), 1e-6);
      auto acc = a;
      kvsift::merge_into(acc, b);
      kvsift_test::check_close(acc, merge_reference(a, b), 1e-6);
    }
  }
}

TEST_CASE("merge is commutative and associative", "[attention][merge]") {
  std::mt19937 rng(2);
  for (int rep = 0; rep < 50; ++rep) {
    const std::size_t d = 1 + rng() % 130;
    const auto a = random_state(d, rng);
    const auto b = random_state(d, rng);
    const auto c = random_state(d, rng);
    kvsift_test::check_close(kvsift::merge(a, b), kvsift::merge(b, a), 1e-6);
    const auto left = kvsift::merge(kvsift::merge(a, b), c);
    const auto right = kvsift::merge(a, kvsift::merge(b, c));
    kvsift_test::check_close(left, right, 2e-6);
    const std::vector<kvsift::partial_state> all = {c, a, b};
    kvsift_test::check_close(kvsift::merge_n(all), left, 2e-6);
  }
}

TEST_CASE("the empty state is the identity and two empties stay empty", "[attention][merge]") {
  std::mt19937 rng(3);
  const auto s = random_state(16, rng);
  const kvsift::partial_state e(16);
  for (const auto& r : {kvsift::merge(s, e), kvsift::merge(e, s)}) {
    CHECK(r.o == s.o);  // exact: no rounding through weights 1 and 0
    CHECK(r.lse == s.lse);
  }
  const auto ee = kvsift::merge(e, e);
  CHECK(ee.is_empty());
  CHECK(ee.o == std::vector<float>(16, 0.0f));
  const std::vector<kvsift::partial_state> empties(4, e);
  const auto n = kvsift::merge_n(empties);
  CHECK(n.is_empty());
  CHECK(all_finite(n));
  CHECK(n.o == std::vector<float>(16, 0.0f));
  const std::vector<kvsift::partial_state> mixed = {e, s, e};
  const auto m = kvsift::merge_n(mixed);
  CHECK(m.o == s.o);
  CHECK(m.lse == s.lse);
  const auto none = kvsift::merge_n(std::span<const kvsift::partial_state_view>{}, 8);
  CHECK(none.dim() == 8);
  CHECK(none.is_empty());
}

TEST_CASE("merge stays finite and exact-ish for extreme lse", "[attention][merge]") {
  std::mt19937 rng(4);
  auto a = random_state(32, rng);
  auto b = random_state(32, rng);
  // Far apart: the smaller side underflows to weight 0, the result is the larger side.
  a.lse = 1e4f;
  b.lse = -1e4f;
  const auto r = kvsift::merge(a, b);
  CHECK(all_finite(r));
  CHECK(r.lse == a.lse);
  for (std::size_t j = 0; j < 32; ++j) CHECK(r.o[j] == Approx(a.o[j]).epsilon(1e-7));
  // Both large and close: weights must not lose precision to f32 subtraction at 1e4.
  a.lse = 1e4f;
  b.lse = 1e4f + 1.0f;
  const auto c = kvsift::merge(a, b);
  CHECK(all_finite(c));
  kvsift_test::check_close(c, merge_reference(a, b), 1e-6);
  a.lse = -1e4f;
  b.lse = -1e4f - 2.0f;
  kvsift_test::check_close(kvsift::merge(a, b), merge_reference(a, b), 1e-6);
  // Merging a state with itself (aliasing input and output) keeps o and adds log 2.
  auto self = a;
  kvsift::merge_into(self, self);
  CHECK(self.lse == Approx(a.lse + std::log(2.0f)));
  for (std::size_t j = 0; j < 32; ++j) CHECK(self.o[j] == Approx(a.o[j]).epsilon(1e-6));
}

TEST_CASE("merge rejects mismatched dims and NaN or +inf lse", "[attention][merge]") {
  std::mt19937 rng(5);
  const auto a = random_state(8, rng);
  const auto b = random_state(9, rng);
  using Catch::Matchers::Contains;
  REQUIRE_THROWS_AS(kvsift::merge(a, b), kvsift::dimension_mismatch);
  REQUIRE_THROWS_WITH(kvsift::merge(a, b), Contains("expected dimension 8, got 9"));
  auto acc = a;
  REQUIRE_THROWS_AS(kvsift::merge_into(acc, b), kvsift::dimension_mismatch);
  CHECK(acc.o == a.o);
  const std::vector<kvsift::partial_state> v = {a, a, b};
  REQUIRE_THROWS_WITH(kvsift::merge_n(v), Contains("expected dimension 8, got 9 for state 2"));
  REQUIRE_THROWS_WITH(kvsift::merge_n(std::span<const kvsift::partial_state>{}),
                      Contains("expected at least 1 state, got 0"));

  auto bad = a;
  bad.lse = nan_f;
  acc = a;
  REQUIRE_THROWS_AS(kvsift::merge_into(acc, bad), kvsift::non_finite_value);
  CHECK(acc.o == a.o);  // unchanged on throw
  CHECK(acc.lse == a.lse);
  REQUIRE_THROWS_WITH(kvsift::merge(bad, a), Contains("got nan"));
  bad.lse = std::numeric_limits<float>::infinity();
  REQUIRE_THROWS_WITH(kvsift::merge(a, bad), Contains("got inf"));
  const std::vector<kvsift::partial_state> w = {a, bad};
  REQUIRE_THROWS_WITH(kvsift::merge_n(w), Contains("for state 1"));
  // An empty state with a NaN lse is still NaN: rejected, not treated as empty.
  kvsift::partial_state e(8);
  e.lse = nan_f;
  REQUIRE_THROWS_AS(kvsift::merge(e, kvsift::partial_state(8)), kvsift::non_finite_value);
}
