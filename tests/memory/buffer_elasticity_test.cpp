#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "../test_support.hpp"
#include "kvsift/memory/buffer_elasticity.hpp"

using kvsift::buffer_elasticity;
using kvsift::reclaimed_pages;
using kvsift_test::message_of;

namespace {

std::size_t pages_of(const std::vector<reclaimed_pages>& taken, std::uint64_t id) {
  for (const auto& t : taken)
    if (t.request == id) return t.pages;
  return 0;
}

}  // namespace

TEST_CASE("buffer_elasticity admits only when mandatory and buffer pages fit", "[memory]") {
  buffer_elasticity b(100);
  REQUIRE(b.admit(1, 1000, 20, 30));
  REQUIRE(b.free_pages() == 50);
  REQUIRE_FALSE(b.admit(2, 1000, 40, 20));  // 60 > 50: refused, nothing changes
  REQUIRE(b.free_pages() == 50);
  REQUIRE(b.active() == 1);
  REQUIRE(b.admit(2, 3000, 40, 10));
  REQUIRE(b.free_pages() == 0);
  b.release(1);
  b.release(2);
  REQUIRE(b.free_pages() == 100);  // everything back
}

TEST_CASE("buffer_elasticity reclaims buffering pages in proportion to length", "[memory]") {
  buffer_elasticity b(1000);
  REQUIRE(b.admit(1, 1000, 10, 100));
  REQUIRE(b.admit(2, 3000, 10, 100));
  std::vector<reclaimed_pages> taken;
  b.reclaim(40, taken);
  REQUIRE(pages_of(taken, 1) == 10);
  REQUIRE(pages_of(taken, 2) == 30);
  REQUIRE(b.free_pages() == 1000 - 220 + 40);
  // A short request with a large buffer and a long one with a small buffer: the long one's
  // share is capped at its buffer and the rest comes from the short one.
  buffer_elasticity c(1000);
  REQUIRE(c.admit(7, 100, 0, 50));
  REQUIRE(c.admit(8, 900, 0, 5));
  c.reclaim(20, taken);
  REQUIRE(pages_of(taken, 8) == 5);
  REQUIRE(pages_of(taken, 7) == 15);
  REQUIRE(c.allocation_of(8).buffer == 0);
}

TEST_CASE("buffer_elasticity: mandatory growth uses free, own, then others' buffers", "[memory]") {
  buffer_elasticity b(100);
  REQUIRE(b.admit(1, 500, 10, 20));
  REQUIRE(b.admit(2, 500, 10, 20));
  REQUIRE(b.admit(3, 1500, 10, 20));  // free: 10
  std::vector<reclaimed_pages> taken;
  b.set_mandatory(1, 600, 50, taken);  // +40: 10 free, 20 own, 10 from 2 and 3 (1 : 3)
  REQUIRE(b.free_pages() == 0);
  REQUIRE(b.allocation_of(1).buffer == 0);
  REQUIRE(pages_of(taken, 2) + pages_of(taken, 3) == 10);
  REQUIRE(pages_of(taken, 3) >= 3 * pages_of(taken, 2) - 1);
  b.set_mandatory(1, 600, 5, taken);  // shrinking frees pages
  REQUIRE(taken.empty());
  REQUIRE(b.free_pages() == 45);
  // Invariant under random operations: pages are conserved.
  std::mt19937 rng(3);
  for (int i = 0; i < 2000; ++i) {
    const std::uint64_t id = 1 + rng() % 3;
    try {
      b.set_mandatory(id, 100 + rng() % 1000, rng() % 60, taken);
    } catch (const kvsift::invalid_argument&) {
    }
    std::size_t used = 0;
    for (std::uint64_t r = 1; r <= 3; ++r) {
      used += b.allocation_of(r).mandatory + b.allocation_of(r).buffer;
    }
    REQUIRE(used + b.free_pages() == 100);
  }
}

TEST_CASE("buffer_elasticity rejects bad input", "[memory]") {
  REQUIRE_THROWS_AS(buffer_elasticity(0), kvsift::invalid_argument);
  buffer_elasticity b(10);
  REQUIRE(b.admit(1, 10, 2, 3));
  REQUIRE_THROWS_AS(b.admit(1, 10, 1, 1), kvsift::invalid_argument);  // already active
  REQUIRE_THROWS_AS(b.admit(2, 0, 1, 1), kvsift::invalid_argument);   // zero length
  std::vector<reclaimed_pages> taken;
  REQUIRE_THAT(message_of<kvsift::invalid_argument>([&] { b.reclaim(4, taken); }),
               Catch::Contains("asked for 4 pages, the active requests hold 3"));
  REQUIRE_THAT(message_of<kvsift::invalid_argument>([&] { b.set_mandatory(1, 10, 11, taken); }),
               Catch::Contains("page demand of 11 pages exceeds the buffer"));
  REQUIRE(b.allocation_of(1).mandatory == 2);  // unchanged
  REQUIRE(b.free_pages() == 5);
  REQUIRE_THROWS_AS(b.release(9), kvsift::out_of_range);
  REQUIRE_THROWS_AS(b.set_mandatory(9, 1, 1, taken), kvsift::out_of_range);
  REQUIRE_THROWS_AS((void)b.allocation_of(9), kvsift::out_of_range);
}

// Regression: set_mandatory stored length 0 (a reclaim weight of 0: 0/0 = NaN cast to
// size_t), and lengths summed in size_t wrapped, so shares came out far off proportion.
TEST_CASE("buffer_elasticity: zero and overflow-sized lengths", "[memory][rel]") {
  buffer_elasticity b(1000);
  REQUIRE(b.admit(1, 10, 5, 100));
  std::vector<reclaimed_pages> taken;
  const auto msg = message_of<kvsift::invalid_argument>([&] { b.set_mandatory(1, 0, 6, taken); });
  CHECK_THAT(msg, Catch::Contains("length must be > 0") && Catch::Contains("got 0"));
  CHECK(b.allocation_of(1).length == 10);  // nothing changed
  CHECK(b.allocation_of(1).mandatory == 5);
  CHECK(b.free_pages() == 895);

  // Lengths 2^64 - 1 and 2^63 - 1 (their sum wraps) share a reclaim of 30 pages 2 : 1.
  buffer_elasticity c(1000);
  REQUIRE(c.admit(1, std::numeric_limits<std::size_t>::max(), 0, 100));
  REQUIRE(c.admit(2, std::numeric_limits<std::size_t>::max() / 2, 0, 100));
  c.reclaim(30, taken);
  REQUIRE(taken.size() == 2);
  CHECK(taken[0].request == 1);
  CHECK(taken[0].pages == 20);
  CHECK(taken[1].request == 2);
  CHECK(taken[1].pages == 10);
  CHECK(c.free_pages() == 830);
}
