#include "kvsift/attention/partial_state.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

namespace {
constexpr float neg_inf = -std::numeric_limits<float>::infinity();
}

TEST_CASE("partial_state constructors give empty states", "[attention][partial_state]") {
  const kvsift::partial_state def;
  CHECK(def.dim() == 0);
  CHECK(def.is_empty());
  kvsift::partial_state s(5);
  CHECK(s.dim() == 5);
  CHECK(s.is_empty());
  CHECK(s.o == std::vector<float>(5, 0.0f));
  s.o[2] = 1.0f;
  s.lse = 0.5f;
  CHECK_FALSE(s.is_empty());
  const kvsift::partial_state_view v = s;
  CHECK(v.dim() == 5);
  CHECK(v.lse == 0.5f);
  CHECK(v.o.data() == s.o.data());
  CHECK_FALSE(v.is_empty());
  const kvsift::partial_state copy(v);
  CHECK(copy.o == s.o);
  CHECK(copy.lse == s.lse);
  s.reset(3);
  CHECK(s.dim() == 3);
  CHECK(s.is_empty());
  CHECK(s.o == std::vector<float>(3, 0.0f));
  CHECK(kvsift::partial_state_view{}.is_empty());
}

TEST_CASE("base-2 LSE is FlashInfer's log2-sum-exp2 of logits * log2(e)",
          "[attention][partial_state]") {
  const std::vector<double> logits = {1.5, -2.0, 3.25, 0.0, 7.0};
  double nat = 0;
  double b2 = 0;
  const double log2e = 1.4426950408889634;
  for (double s : logits) {
    nat += std::exp(s);
    b2 += std::exp2(s * log2e);  // FlashInfer: exp2 of logits pre-multiplied by log2(e)
  }
  const auto lse = static_cast<float>(std::log(nat));
  const auto lse2 = static_cast<float>(std::log2(b2));
  CHECK(kvsift::lse_to_base2(lse) == Approx(lse2).epsilon(1e-6));
  CHECK(kvsift::lse_from_base2(lse2) == Approx(lse).epsilon(1e-6));
  for (float x : {-1e4f, -3.0f, 0.0f, 0.1f, 42.0f, 1e4f}) {
    CHECK(kvsift::lse_from_base2(kvsift::lse_to_base2(x)) == Approx(x).epsilon(1e-6).margin(0));
  }
  CHECK(kvsift::lse_to_base2(neg_inf) == neg_inf);
  CHECK(kvsift::lse_from_base2(neg_inf) == neg_inf);
}
