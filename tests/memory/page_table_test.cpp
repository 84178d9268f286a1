#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <random>
#include <tuple>

#include "../test_support.hpp"
#include "kvsift/memory/page_table.hpp"
#include "kvsift/memory/segment_allocator.hpp"

using kvsift::no_page;
using kvsift::page_key;
using kvsift::page_table;
using kvsift::page_table_params;
using kvsift_test::message_of;

TEST_CASE("segment_allocator hands out every segment once and takes them back", "[memory]") {
  kvsift::segment_allocator a(130);  // not a multiple of 64: the tail bits must stay unusable
  std::vector<bool> seen(130, false);
  for (int i = 0; i < 130; ++i) {
    const auto id = a.allocate();
    REQUIRE(id < 130);
    REQUIRE_FALSE(seen[id]);
    seen[id] = true;
    REQUIRE(a.in_use(id));
  }
  REQUIRE(a.free_count() == 0);
  const auto msg = message_of<kvsift::pool_exhausted>([&] { (void)a.allocate(); });
  REQUIRE_THAT(msg, Catch::Contains("130"));
  a.release(77);
  REQUIRE(a.allocate() == 77);
  for (std::size_t i = 0; i < 130; ++i) a.release(i);
  REQUIRE(a.free_count() == 130);
  REQUIRE_THAT(message_of<kvsift::invalid_argument>([&] { a.release(5); }),
               Catch::Contains("double free of segment 5"));
  REQUIRE_THAT(message_of<kvsift::out_of_range>([&] { a.release(130); }),
               Catch::Contains("< 130, got 130"));
  REQUIRE_THROWS_AS(kvsift::segment_allocator(0), kvsift::invalid_argument);
}

TEST_CASE("page_table matches a map oracle under random map/unmap/release", "[memory]") {
  const page_table_params p{4, 2, 3, 100, 16, 40};  // 4*2*3*7 = 168 possible segments, 40 pooled
  page_table t(p);
  using key_t = std::tuple<unsigned, unsigned, unsigned, unsigned>;
  std::map<key_t, kvsift::page_id> oracle;
  std::mt19937 rng(7);
  auto rand_key = [&] {
    return page_key{static_cast<std::uint32_t>(rng() % 4), static_cast<std::uint32_t>(rng() % 2),
                    static_cast<std::uint32_t>(rng() % 3), static_cast<std::uint32_t>(rng() % 40)};
  };
  for (int it = 0; it < 20000; ++it) {
    const page_key k = rand_key();
    const key_t kk{k.request, k.layer, k.head, k.page};
    const auto op = rng() % 10;
    if (op < 5) {
      const auto phys = static_cast<kvsift::page_id>(rng() % 100000);
      if (oracle.count(kk)) {
        REQUIRE_THROWS_AS(t.map(k, phys), kvsift::invalid_argument);
      } else {
        try {
          t.map(k, phys);
          oracle[kk] = phys;
        } catch (const kvsift::pool_exhausted&) {
          REQUIRE(t.free_segments() == 0);  // only when no segment is left
        }
      }
    } else if (op < 8) {
      if (oracle.count(kk)) {
        REQUIRE(t.unmap(k) == oracle[kk]);
        oracle.erase(kk);
      } else {
        REQUIRE_THROWS_AS(t.unmap(k), kvsift::invalid_argument);
      }
    } else if (op < 9) {
      const auto r = rng() % 4;
      t.release_request(r);
      std::erase_if(oracle, [&](const auto& e) { return std::get<0>(e.first) == r; });
    }
    REQUIRE(t.mapped_pages() == oracle.size());
    const page_key q = rand_key();
    const auto found = oracle.find({q.request, q.layer, q.head, q.page});
    REQUIRE(t.lookup(q) == (found == oracle.end() ? no_page : found->second));
  }
  for (std::size_t r = 0; r < 4; ++r) t.release_request(r);
  REQUIRE(t.mapped_pages() == 0);
  REQUIRE(t.free_segments() == p.pool_segments);  // no leak: the pool is full again
}

TEST_CASE("page_table metadata grows with mapped pages, not the logical space", "[memory]") {
  // 32 requests x 4 layers x 8 heads x 8192 pages; every request maps its first 10%.
  page_table_params p{32, 4, 8, 8192, 512, 0};
  p.pool_segments = 32 * 4 * 8 * 2;  // ceil(820 / 512) segments per head
  page_table t(p);
  for (std::uint32_t r = 0; r < 32; ++r)
    for (std::uint32_t l = 0; l < 4; ++l)
      for (std::uint32_t h = 0; h < 8; ++h)
        for (std::uint32_t g = 0; g < 820; ++g) t.map({r, l, h, g}, g);
  const double flat = 32.0 * 4 * 8 * 8192 * sizeof(kvsift::page_id);
  REQUIRE(flat / static_cast<double>(t.metadata_bytes()) > 3.0);
  REQUIRE(t.lookup({31, 3, 7, 819}) == 819);
  REQUIRE(t.lookup({31, 3, 7, 820}) == no_page);
  REQUIRE(t.ref().lookup({5, 1, 2, 100}) == 100);
}

TEST_CASE("page_table rejects bad shapes, keys and the pool running out", "[memory]") {
  REQUIRE_THROWS_AS(page_table(page_table_params{0, 1, 1, 1, 1, 1}), kvsift::invalid_argument);
  REQUIRE_THROWS_AS(page_table(page_table_params{1, 1, 1, 1, 0, 1}), kvsift::invalid_argument);
  REQUIRE_THAT(message_of<kvsift::invalid_argument>([] {
                 page_table(page_table_params{1, 1, 1, 64, 24, 1});
               }),
               Catch::Contains("power of two below 2^31, got 24"));
  REQUIRE_THROWS_AS(page_table(page_table_params{1, 1, 1, 1, 1, 0}), kvsift::invalid_argument);
  page_table t(page_table_params{2, 1, 1, 64, 16, 1});
  REQUIRE_THAT(message_of<kvsift::out_of_range>([&] {
                 (void)t.lookup({0, 0, 0, 64});
               }),
               Catch::Contains("(2, 1, 1, 64), got (0, 0, 0, 64)"));
  REQUIRE_THROWS_AS(t.map({2, 0, 0, 0}, 1), kvsift::out_of_range);
  REQUIRE_THROWS_AS(t.map({0, 0, 0, 0}, no_page), kvsift::invalid_argument);
  REQUIRE_THROWS_AS(t.release_request(2), kvsift::out_of_range);
  t.map({0, 0, 0, 0}, 9);
  REQUIRE_THROWS_AS(t.map({0, 0, 0, 0}, 10), kvsift::invalid_argument);  // double map
  REQUIRE_THROWS_AS(t.map({0, 0, 0, 16}, 10), kvsift::pool_exhausted);   // second segment
  REQUIRE(t.lookup({0, 0, 0, 16}) == no_page);                           // unchanged
  REQUIRE(t.mapped_pages() == 1);
  t.release_request(0);
  t.map({1, 0, 0, 16}, 10);  // the segment is back in the pool
  REQUIRE(t.lookup({1, 0, 0, 16}) == 10);

  // Batched lookup: validates every key before writing anything.
  const std::vector<page_key> keys{{1, 0, 0, 16}, {1, 0, 0, 17}, {0, 0, 0, 3}};
  std::vector<kvsift::page_id> out(3, 123);
  t.lookup(keys, out);
  REQUIRE(out == std::vector<kvsift::page_id>{10, no_page, no_page});
  std::vector<kvsift::page_id> out2(3, 123);
  const std::vector<page_key> bad{{1, 0, 0, 16}, {0, 1, 0, 0}};
  REQUIRE_THROWS_AS(t.lookup(bad, out2), kvsift::out_of_range);
  REQUIRE(out2[0] == 123);
  REQUIRE_THROWS_AS(t.lookup(keys, std::span<kvsift::page_id>(out2).first(2)),
                    kvsift::dimension_mismatch);
}

// Regression: requests * layers * heads * segments wrapped (2^32 x 2^32 = 0), so the
// directory came out empty while map() indexed it with 32-bit-truncated layers and heads.
TEST_CASE("page_table rejects a directory size that overflows", "[memory][rel]") {
  page_table_params p;
  p.requests = std::size_t{1} << 32;
  p.layers = std::size_t{1} << 32;
  p.heads = 1;
  p.pages_per_head = 1;
  p.pool_segments = 1;
  auto msg = message_of<kvsift::invalid_argument>([&] { page_table t(p); });
  CHECK_THAT(msg, Catch::Contains("directory") && Catch::Contains("4294967296 x 4294967296") &&
                      Catch::Contains("overflows"));
  p.requests = 3;
  p.layers = std::size_t{1} << 62;
  p.heads = 4;  // 3 x 2^62 x 4 = 3 x 2^64: wraps to 0 through an intermediate that fits
  msg = message_of<kvsift::invalid_argument>([&] { page_table t(p); });
  CHECK_THAT(msg, Catch::Contains("overflows"));
}

// Regression: the class comment promises that a freshly freed id is not reused at once, but
// the hint was a word index, so an id freed in the current word came straight back.
TEST_CASE("segment_allocator does not hand a freed id straight back", "[memory][rel]") {
  kvsift::segment_allocator a(200);
  for (std::size_t i = 0; i < 10; ++i) REQUIRE(a.allocate() == i);
  a.release(3);
  CHECK(a.allocate() == 10);  // next-fit: 3 waits until the cursor comes round
  CHECK(a.allocate() == 11);
  // Only when everything after the cursor is taken does the search wrap round to 3.
  for (std::size_t i = 12; i < 200; ++i) REQUIRE(a.allocate() == i);
  CHECK(a.allocate() == 3);
  CHECK(a.free_count() == 0);
  a.release(150);
  a.release(7);
  CHECK(a.allocate() == 7);  // the cursor sits just after 3: 7 comes before 150
  CHECK(a.allocate() == 150);
}
