#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "../test_support.hpp"
#include "kvsift/memory/bucketed_lru.hpp"
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

TEST_CASE("pair_page_limits splits each request's allocation over its KV heads", "[memory]") {
  buffer_elasticity b(100);
  REQUIRE(b.admit(1, 1000, 10, 7));
  REQUIRE(b.admit(2, 1000, 6, 0));
  const std::vector<std::uint64_t> reqs{2, 1};
  const std::vector<std::size_t> mandatory{1, 2, 3, 4, 3, 0};  // 3 KV heads: 6 for 2, 7 for 1
  std::vector<std::uint32_t> limits(6);
  // Request 1's pairs add up to 7 mandatory pages, its allocation says 10: refused.
  REQUIRE_THAT(message_of<kvsift::invalid_argument>(
                   [&] { kvsift::pair_page_limits(b, reqs, mandatory, limits); }),
               Catch::Contains("request 1 has an allocation of 10 mandatory pages") &&
                   Catch::Contains("add up to 7"));
  REQUIRE(limits == std::vector<std::uint32_t>(6, 0));  // nothing written
  std::vector<reclaimed_pages> taken;
  b.set_mandatory(1, 1000, 7, taken);
  kvsift::pair_page_limits(b, reqs, mandatory, limits);
  // Request 2: no buffer. Request 1: 7 + 3 freed = 10 buffering pages over 3 heads: 4, 3, 3.
  REQUIRE(b.allocation_of(1).buffer == 7);
  REQUIRE(limits == std::vector<std::uint32_t>{1, 2, 3, 4 + 3, 3 + 2, 0 + 2});
}

TEST_CASE("pair_page_limits rejects bad shapes and unknown requests", "[memory][rel]") {
  buffer_elasticity b(100);
  REQUIRE(b.admit(1, 10, 2, 1));
  std::vector<std::uint32_t> limits(2);
  const std::vector<std::uint64_t> one{1};
  const std::vector<std::size_t> two{1, 1};
  REQUIRE_THROWS_AS(kvsift::pair_page_limits(b, {}, two, limits), kvsift::invalid_argument);
  REQUIRE_THAT(message_of<kvsift::invalid_argument>([&] {
                 kvsift::pair_page_limits(b, std::vector<std::uint64_t>{1, 1, 1}, two, limits);
               }),
               Catch::Contains("got 2 for 3 requests"));
  std::vector<std::uint32_t> short_limits(1);
  REQUIRE_THAT(message_of<kvsift::invalid_argument>(
                   [&] { kvsift::pair_page_limits(b, one, two, short_limits); }),
               Catch::Contains("expected 2 limits, got 1"));
  REQUIRE_THROWS_AS(kvsift::pair_page_limits(b, std::vector<std::uint64_t>{9}, two, limits),
                    kvsift::out_of_range);
  const std::size_t huge = ~std::size_t{0};
  REQUIRE_THROWS_AS(kvsift::pair_page_limits(b, one, std::vector<std::size_t>{huge, 3}, limits),
                    kvsift::invalid_argument);  // the sum overflows
  buffer_elasticity big(std::size_t{1} << 40);
  REQUIRE(big.admit(5, 10, std::size_t{1} << 33, 0));
  REQUIRE_THAT(message_of<kvsift::invalid_argument>([&] {
                 kvsift::pair_page_limits(
                     big, std::vector<std::uint64_t>{5},
                     std::vector<std::size_t>{std::size_t{1} << 32, std::size_t{1} << 32}, limits);
               }),
               Catch::Contains("do not fit a 32-bit limit"));
}

TEST_CASE("elastic limits keep every pair's LRU within the shared budget", "[memory]") {
  // Three requests x 2 KV heads share 120 GPU pages. Request 0's demand spikes for a while:
  // its pairs borrow the others' buffering pages, and the others' LRUs must give them back
  // (evict down to their lowered limits) at their next step, so the pages held never exceed
  // the budget and no step fails for want of pages.
  constexpr std::size_t total = 120, heads = 2, keys = 500;
  buffer_elasticity b(total);
  std::vector<kvsift::bucketed_lru<8>> lru;
  for (std::size_t p = 0; p < 3 * heads; ++p) lru.emplace_back(total, keys);
  const std::vector<std::uint64_t> reqs{0, 1, 2};
  for (std::uint64_t r : reqs) REQUIRE(b.admit(r, 1000 * (r + 1), 12, 28));
  std::mt19937 rng(3);
  kvsift::replacement_step st;
  std::vector<reclaimed_pages> taken;
  std::size_t shrink_evictions = 0, max_held = 0;
  for (int step = 0; step < 200; ++step) {
    std::vector<std::vector<kvsift::id_t>> sel(3 * heads);
    std::vector<std::size_t> mandatory(3 * heads);
    for (std::size_t p = 0; p < sel.size(); ++p) {
      const bool spike = p < heads && step >= 50 && step < 120;
      const std::size_t n = spike ? 30 + rng() % 10 : 4 + rng() % 4;
      std::vector<char> seen(keys, 0);
      while (sel[p].size() < n) {
        const auto k = static_cast<kvsift::id_t>((step * 3 + p * 50 + rng() % 60) % keys);
        if (!seen[k]) sel[p].push_back(k), seen[k] = 1;
      }
      mandatory[p] = n;
    }
    for (std::size_t r = 0; r < 3; ++r) {
      b.set_mandatory(r, 1000 * (r + 1), mandatory[r * heads] + mandatory[r * heads + 1], taken);
    }
    b.distribute_free(taken);  // what shrinking demands freed buffers again
    REQUIRE(b.free_pages() == 0);
    std::vector<std::uint32_t> limits(3 * heads);
    kvsift::pair_page_limits(b, reqs, mandatory, limits);
    std::size_t held = 0;
    for (std::size_t p = 0; p < lru.size(); ++p) {
      const std::size_t before = lru[p].resident();
      lru[p].set_limit(limits[p]);
      lru[p].step(sel[p], st);  // never throws: the limit covers the pair's own demand
      if (before + st.misses() > limits[p]) shrink_evictions += st.evicted_keys.size();
      REQUIRE(lru[p].resident() <= limits[p]);
      held += lru[p].resident();
    }
    REQUIRE(held <= total);
    max_held = std::max(max_held, held);
  }
  REQUIRE(shrink_evictions > 0);
  REQUIRE(max_held > 3 * total / 4);  // the buffers were used, not only the mandatory pages
}

TEST_CASE("distribute_free lends every free page out in proportion to length", "[memory]") {
  buffer_elasticity b(100);
  std::vector<reclaimed_pages> given;
  b.distribute_free(given);  // no active request: nothing to lend to
  REQUIRE(given.empty());
  REQUIRE(b.free_pages() == 100);
  REQUIRE(b.admit(1, 1000, 10, 0));
  REQUIRE(b.admit(2, 2000, 10, 0));
  REQUIRE(b.admit(3, 2000, 10, 0));
  b.distribute_free(given);  // 70 free: floors 14, 28, 28; no remainder
  REQUIRE(pages_of(given, 1) == 14);
  REQUIRE(pages_of(given, 2) == 28);
  REQUIRE(pages_of(given, 3) == 28);
  REQUIRE(b.free_pages() == 0);
  std::vector<reclaimed_pages> taken;
  b.set_mandatory(1, 1000, 2, taken);  // 8 pages back to the free pool
  REQUIRE(b.free_pages() == 8);
  b.distribute_free(given);  // floors 1.6, 3.2, 3.2 -> 1, 3, 3; the last page to the longest,
  REQUIRE(pages_of(given, 1) == 1);  // lowest id on ties (request 2)
  REQUIRE(pages_of(given, 2) == 4);
  REQUIRE(pages_of(given, 3) == 3);
  REQUIRE(b.allocation_of(2).buffer == 32);
  std::size_t held = b.free_pages();
  for (std::uint64_t r : {1, 2, 3})
    held += b.allocation_of(r).mandatory + b.allocation_of(r).buffer;
  REQUIRE(held == 100);  // no page made or lost
  b.distribute_free(given);
  REQUIRE(given.empty());  // nothing free: a no-op
}
