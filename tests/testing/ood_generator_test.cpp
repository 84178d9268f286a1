#include "kvsift/testing/ood_generator.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>

#include "../test_support.hpp"

// make_ood's argument checks: every one before the workload is allocated, with the expected and
// the actual value in the message (it is reachable from Python as kvsift.make_ood).

using Catch::Matchers::Contains;
using kvsift_test::message_of;

TEST_CASE("make_ood refuses non-finite parameters", "[testing]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const float bad : {nan, inf, -inf}) {
    kvsift::testing::ood_params p{.keys = 10, .queries = 2, .dim = 8};
    p.key_offset = bad;
    CHECK_THROWS_AS(kvsift::testing::make_ood(p), kvsift::non_finite_value);
    p = {.keys = 10, .queries = 2, .dim = 8};
    p.query_offset = bad;
    CHECK_THROWS_AS(kvsift::testing::make_ood(p), kvsift::non_finite_value);
    p = {.keys = 10, .queries = 2, .dim = 8};
    p.topic_scale = bad;
    CHECK_THROWS_AS(kvsift::testing::make_ood(p), kvsift::non_finite_value);
    p = {.keys = 10, .queries = 2, .dim = 8};
    p.noise = bad;
    CHECK_THROWS_AS(kvsift::testing::make_ood(p), kvsift::non_finite_value);
  }
  kvsift::testing::ood_params p{.keys = 10, .queries = 2, .dim = 8};
  p.noise = nan;
  CHECK_THAT(message_of<kvsift::non_finite_value>([&] { (void)kvsift::testing::make_ood(p); }),
             Contains("expected finite key_offset, query_offset, topic_scale and noise, got 4, "
                      "4, 2, nan"));
}

TEST_CASE("make_ood refuses an overflow-sized workload before allocating", "[testing]") {
  constexpr std::size_t big = std::size_t{1} << 40;
  kvsift::testing::ood_params p{.keys = big, .queries = 1, .dim = 2};
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { (void)kvsift::testing::make_ood(p); }),
             Contains("expected (keys + queries + topics) * dim <= 2^40 floats, got (1099511627776 "
                      "+ 1 + 256) * 2"));
  // Each count alone past the cap, so their sum cannot wrap around to a small value.
  p = {.keys = 1, .queries = std::numeric_limits<std::size_t>::max() - 255, .dim = 2};
  CHECK_THROWS_AS(kvsift::testing::make_ood(p), kvsift::invalid_argument);
  p = {.keys = 1, .queries = 1, .dim = std::numeric_limits<std::size_t>::max()};
  CHECK_THROWS_AS(kvsift::testing::make_ood(p), kvsift::invalid_argument);
  // The largest accepted product is still a valid request (not allocated here: the check
  // alone is what is tested, at a size that allocates nothing large).
  p = {.keys = 1000, .queries = 10, .dim = 4, .topics = 8};
  const auto d = kvsift::testing::make_ood(p);
  CHECK(d.keys.size() == 4000);
  CHECK(d.queries.size() == 40);
}
