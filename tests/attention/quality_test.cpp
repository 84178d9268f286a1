#include "kvsift/attention/quality.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "../test_support.hpp"
#include "attention_reference.hpp"

namespace {

using kvsift::id_t;
using kvsift_test::kv_data;
using kvsift_test::message_of;
using kvsift_test::reference_attention;

std::vector<id_t> iota_ids(std::size_t n) {
  std::vector<id_t> ids(n);
  std::iota(ids.begin(), ids.end(), id_t{0});
  return ids;
}

}  // namespace

TEST_CASE("attended_tokens is the window plus the retrieved ids, each once", "[attention]") {
  const std::vector<id_t> retrieved{50, 3, 50, 97, 20};
  const auto ids = kvsift::attended_tokens(100, retrieved, {.initial = 4, .recent = 2});
  CHECK(ids == std::vector<id_t>{0, 1, 2, 3, 20, 50, 97, 98, 99});

  SECTION("a window wider than the context is the whole context") {
    CHECK(kvsift::attended_tokens(10, {}, {.initial = 8, .recent = 8}) == iota_ids(10));
  }
  SECTION("an empty window leaves the retrieved ids alone") {
    CHECK(kvsift::attended_tokens(100, retrieved, {.initial = 0, .recent = 0}) ==
          std::vector<id_t>{3, 20, 50, 97});
  }
  SECTION("an empty context attends nothing") { CHECK(kvsift::attended_tokens(0, {}).empty()); }
  SECTION("an id past the context is rejected, naming it") {
    const std::vector<id_t> bad{5, 100};
    const auto msg = message_of<kvsift::out_of_range>(
        [&] { (void)kvsift::attended_tokens(100, bad, {.initial = 4, .recent = 2}); });
    CHECK_THAT(msg, Catch::Contains("retrieved[1] = 100"));
  }
}

TEST_CASE("selection_quality matches a double reference", "[attention]") {
  std::mt19937 rng(7);
  const kv_data<float> data(2, 300, 16, rng, 2.0f);
  const auto kv = data.view();
  const auto q = kvsift_test::random_values<float>(16, rng);
  const std::size_t context = 250;  // tokens past the context are never read
  const std::vector<id_t> retrieved{130, 7, 200};
  const auto attended = kvsift::attended_tokens(context, retrieved, {.initial = 10, .recent = 20});

  const auto got = kvsift::selection_quality(q, 1, context, attended, kv, 0.5f);
  const auto full = reference_attention(q, 1, iota_ids(context), kv, 0.5);
  const auto part = reference_attention(q, 1, attended, kv, 0.5);
  double err = 0, norm = 0;
  for (std::size_t j = 0; j < 16; ++j) {
    err += (part.o[j] - full.o[j]) * (part.o[j] - full.o[j]);
    norm += full.o[j] * full.o[j];
  }
  CHECK(got.recovery == Approx(std::exp(part.lse - full.lse)).epsilon(1e-4));
  CHECK(got.rel_l2_error == Approx(std::sqrt(err / norm)).epsilon(1e-3));
  CHECK(got.recovery < 1.0);

  SECTION("attending the whole context is exact") {
    const auto all = kvsift::selection_quality(q, 1, context, iota_ids(context), kv, 0.5f);
    CHECK(all.recovery == Approx(1.0).epsilon(1e-5));
    CHECK(all.rel_l2_error < 1e-5);
  }
  SECTION("attending nothing recovers nothing and misses the whole output") {
    const auto none = kvsift::selection_quality(q, 1, context, {}, kv, 0.5f);
    CHECK(none.recovery == 0.0);
    CHECK(none.rel_l2_error == Approx(1.0));
  }
  SECTION("bad input is rejected before any work") {
    CHECK_THROWS_AS(kvsift::selection_quality(q, 1, 301, attended, kv), kvsift::out_of_range);
    const std::vector<id_t> past{3, 260};
    CHECK_THAT(message_of<kvsift::out_of_range>(
                   [&] { (void)kvsift::selection_quality(q, 1, context, past, kv); }),
               Catch::Contains("attended[1] = 260"));
    CHECK_THROWS_AS(kvsift::selection_quality(q, 2, context, attended, kv), kvsift::out_of_range);
    const std::vector<float> short_q(15, 0.0f);
    CHECK_THROWS_AS(kvsift::selection_quality(short_q, 1, context, attended, kv),
                    kvsift::dimension_mismatch);
    auto nan_q = q;
    nan_q[3] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_AS(kvsift::selection_quality(nan_q, 1, context, attended, kv),
                    kvsift::non_finite_value);
  }
}

TEST_CASE("compare_states validates its inputs", "[attention]") {
  const kvsift::partial_state full({1.0f, 0.0f}, 0.0f);
  const kvsift::partial_state wrong_dim({1.0f, 0.0f, 0.0f}, 0.0f);
  CHECK_THROWS_AS(kvsift::compare_states(full, wrong_dim), kvsift::dimension_mismatch);
  CHECK_THROWS_AS(kvsift::compare_states(kvsift::partial_state(2), full), kvsift::invalid_argument);
  const auto same = kvsift::compare_states(full, full);
  CHECK(same.recovery == 1.0);
  CHECK(same.rel_l2_error == 0.0);
}
