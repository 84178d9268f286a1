#include <catch2/catch.hpp>

#include <random>
#include <set>
#include <vector>

#include "../test_support.hpp"
#include "kvsift/memory/bucketed_lru.hpp"
#include "kvsift/memory/exact_lru.hpp"
#include "kvsift/memory/partition_map.hpp"

using kvsift::id_t;
using kvsift::invalid_id;
using kvsift::partition_spec;
using kvsift_test::message_of;

TEST_CASE("partition_map lays out uniform, non-uniform and packed partitions", "[memory]") {
  using map_t = kvsift::partition_map<kvsift::exact_lru>;
  map_t uniform(partition_spec::uniform(5, 16, 16), kvsift::exact_lru(2, 5));
  REQUIRE(uniform.pages() == 5);
  REQUIRE(uniform.first_page(3) == 3);
  REQUIRE(uniform.last_page(3) == 3);

  // Blocks of 5, 40, 16 tokens on 16-token pages, each block on fresh pages: 1 + 3 + 1 pages.
  map_t blocks(partition_spec{{5, 40, 16}, 16, false}, kvsift::exact_lru(4, 5));
  REQUIRE(blocks.pages() == 5);
  REQUIRE(blocks.first_page(1) == 1);
  REQUIRE(blocks.last_page(1) == 3);
  REQUIRE(blocks.first_page(2) == 4);
  REQUIRE(blocks.token_count(1) == 40);

  // Tokens packed 16 per page: token 17 lives on page 1.
  map_t tokens(partition_spec::uniform(40, 1, 16, true), kvsift::exact_lru(2, 3));
  REQUIRE(tokens.pages() == 3);
  REQUIRE(tokens.first_page(17) == 1);
  REQUIRE(tokens.last_page(17) == 1);
}

TEST_CASE("partition_map retrieve: hits, misses, copies and residency against an oracle",
          "[memory]") {
  std::mt19937 rng(5);
  std::vector<std::uint32_t> counts(60);
  for (auto& c : counts) c = 1 + rng() % 40;  // non-uniform: 1 to 3 pages each
  const partition_spec spec{counts, 16, false};
  std::size_t pages_total = 0;
  for (const auto c : counts) pages_total += (c + 15) / 16;
  kvsift::partition_map<kvsift::bucketed_lru<16>> map(spec,
                                                      kvsift::bucketed_lru<16>(40, pages_total));
  std::vector<std::uint64_t> host(map.pages());
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = 1000 + 3 * i;  // scattered host pages
  map.set_cpu_pages(host);
  std::vector<id_t> gpu_holds(40, invalid_id);  // what each GPU page holds, from the copy lists
  kvsift::retrieve_result r;
  for (int step = 0; step < 300; ++step) {
    std::set<id_t> sel_set;
    while (sel_set.size() < 8) sel_set.insert(static_cast<id_t>(rng() % 60));
    const std::vector<id_t> sel(sel_set.begin(), sel_set.end());
    std::set<id_t> pages;
    std::size_t expect_partition_hits = 0;
    for (const id_t p : sel) {
      bool hit = true;
      for (std::size_t g = map.first_page(p); g <= map.last_page(p); ++g) {
        pages.insert(static_cast<id_t>(g));
        hit = hit && map.policy().slot_of(static_cast<id_t>(g)) != invalid_id;
      }
      expect_partition_hits += hit;
    }
    map.retrieve(sel, r);
    REQUIRE(r.page_demand == pages.size());
    REQUIRE(r.partition_hits == expect_partition_hits);
    REQUIRE(r.copies.size() == r.step.misses());
    for (const auto& c : r.copies) {
      REQUIRE(c.gpu_page < 40);
      REQUIRE((c.cpu_page - 1000) % 3 == 0);
      gpu_holds[c.gpu_page] = static_cast<id_t>((c.cpu_page - 1000) / 3);
    }
    // Every selected page is on the GPU, in the page the copy list put it in.
    for (const id_t g : pages) REQUIRE(gpu_holds[map.policy().slot_of(g)] == g);
    for (std::size_t p = 0; p < 60; ++p) {
      bool all = true;
      for (std::size_t g = map.first_page(p); g <= map.last_page(p); ++g)
        all = all && map.policy().slot_of(static_cast<id_t>(g)) != invalid_id;
      if (map.resident(p)) REQUIRE(all);  // residency never claims a missing page
      if (sel_set.count(static_cast<id_t>(p))) REQUIRE(map.resident(p));
    }
  }
}

TEST_CASE("partition_map rejects bad input", "[memory]") {
  using map_t = kvsift::partition_map<kvsift::exact_lru>;
  REQUIRE_THROWS_AS(map_t(partition_spec{{}, 16, false}, kvsift::exact_lru(1, 1)),
                    kvsift::invalid_argument);
  REQUIRE_THROWS_AS(map_t(partition_spec{{3, 0}, 16, false}, kvsift::exact_lru(1, 2)),
                    kvsift::invalid_argument);
  REQUIRE_THAT(message_of<kvsift::invalid_argument>(
                   [] { map_t(partition_spec::uniform(4, 16, 16), kvsift::exact_lru(2, 5)); }),
               Catch::Contains("the layout has 4 pages, the policy manages 5"));
  map_t map(partition_spec::uniform(4, 32, 16), kvsift::exact_lru(3, 8));
  kvsift::retrieve_result r;
  REQUIRE_THAT(message_of<kvsift::out_of_range>([&] {
                 map.retrieve(std::vector<id_t>{0, 4}, r);
               }),
               Catch::Contains("expected partition ids < 4, got 4 at position 1"));
  // Two partitions of two pages each need 4 GPU pages, the buffer has 3.
  REQUIRE_THAT(message_of<kvsift::invalid_argument>([&] {
                 map.retrieve(std::vector<id_t>{0, 1}, r);
               }),
               Catch::Contains("exceeds the page limit of 3"));
  REQUIRE_FALSE(map.resident(0));
  REQUIRE_THROWS_AS(map.resident(4), kvsift::out_of_range);
  REQUIRE_THROWS_AS(map.cpu_page(8), kvsift::out_of_range);
  REQUIRE_THROWS_AS(map.set_cpu_pages(std::vector<std::uint64_t>(7)), kvsift::dimension_mismatch);
}

TEST_CASE("partition_map set_page_limit: a lowered limit evicts at the next retrieve", "[memory]") {
  using map_t = kvsift::partition_map<kvsift::exact_lru>;
  map_t map(partition_spec::uniform(10, 16, 16), kvsift::exact_lru(8, 10));
  kvsift::retrieve_result r;
  for (id_t p = 0; p < 6; ++p) map.retrieve(std::vector<id_t>{p}, r);
  REQUIRE(map.policy().resident() == 6);
  map.set_page_limit(3);
  REQUIRE(map.policy().limit() == 3);
  map.retrieve(std::vector<id_t>{5}, r);  // a hit; the three least recent others leave
  REQUIRE(r.step.evicted_keys == std::vector<id_t>{0, 1, 2});
  REQUIRE(map.policy().resident() == 3);
  REQUIRE_FALSE(map.resident(0));  // the meta-partition table followed the evictions
  REQUIRE(map.resident(3));
  REQUIRE_THAT(message_of<kvsift::invalid_argument>([&] { map.set_page_limit(9); }),
               Catch::Contains("expected a page limit <= the capacity of 8 slots, got 9"));
  REQUIRE(map.policy().limit() == 3);
}
