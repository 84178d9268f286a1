#include "kvsift/core/visited_set.hpp"

#include <catch2/catch.hpp>
#include <vector>

TEST_CASE("visited_set insert, contains, reset", "[core][visited_set]") {
  kvsift::visited_set v(10);
  CHECK(v.capacity() >= 10);
  CHECK_FALSE(v.contains(3));
  CHECK(v.try_insert(3));
  CHECK_FALSE(v.try_insert(3));
  CHECK(v.contains(3));
  v.insert(9);
  CHECK(v.contains(9));
  CHECK_FALSE(v.contains(0));
  v.reset(10);
  CHECK_FALSE(v.contains(3));
  CHECK_FALSE(v.contains(9));
  v.reset(100);  // growth keeps the set empty
  CHECK(v.capacity() >= 100);
  for (kvsift::id_t i = 0; i < 100; ++i) REQUIRE_FALSE(v.contains(i));
}

TEST_CASE("visited_set is empty after every reset", "[core][visited_set]") {
  kvsift::visited_set v(8);
  v.insert(5);
  for (int i = 0; i < 70000; ++i) {
    v.reset(8);
    if (v.contains(5) || v.contains(0)) {
      FAIL("stale membership after " << i + 1 << " resets");
    }
    v.insert(static_cast<kvsift::id_t>(i % 4));
    if (!v.contains(static_cast<kvsift::id_t>(i % 4))) FAIL("insert lost after reset " << i);
  }
  CHECK(v.try_insert(7));
  CHECK_FALSE(v.try_insert(7));
}

TEST_CASE("visited_set clears every word it dirtied, across sizes", "[core][visited_set]") {
  // Ids in many 64-bit words, several per word, and a word's first and last bit: a reset must
  // clear each of those words (the dirty list), also when the next search is over fewer ids
  // and the one after over more again.
  kvsift::visited_set v(1000);
  std::vector<kvsift::id_t> ids;
  for (kvsift::id_t i = 0; i < 1000; i += 7) ids.push_back(i);
  ids.push_back(63);
  ids.push_back(64);
  ids.push_back(999);
  for (kvsift::id_t id : ids) v.insert(id);
  for (kvsift::id_t id : ids) REQUIRE(v.contains(id));
  CHECK_FALSE(v.contains(1));
  v.reset(10);
  for (kvsift::id_t i = 0; i < 10; ++i) REQUIRE_FALSE(v.contains(i));
  CHECK(v.try_insert(9));
  v.reset(1000);
  for (kvsift::id_t i = 0; i < 1000; ++i) REQUIRE_FALSE(v.contains(i));
  // Growing keeps the set empty and the old bits cleared.
  for (kvsift::id_t id : ids) v.insert(id);
  v.reset(100000);
  CHECK(v.capacity() >= 100000);
  for (kvsift::id_t i = 0; i < 100000; ++i) REQUIRE_FALSE(v.contains(i));
  CHECK(v.try_insert(99999));
  CHECK(v.contains(99999));
}
