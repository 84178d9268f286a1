#include "kvsift/core/visited_set.hpp"

#include <catch2/catch.hpp>

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

TEST_CASE("visited_set survives epoch wrap-around", "[core][visited_set]") {
  kvsift::visited_set v(8);
  v.insert(5);  // stays tagged with epoch 1 forever
  for (int i = 0; i < 70000; ++i) {
    v.reset(8);
    // After every reset the set is empty, including across the 16-bit epoch wrap where an
    // old tag could alias the new epoch.
    if (v.contains(5) || v.contains(0)) {
      FAIL("stale membership after " << i + 1 << " resets");
    }
    v.insert(static_cast<kvsift::id_t>(i % 4));
    if (!v.contains(static_cast<kvsift::id_t>(i % 4))) FAIL("insert lost after reset " << i);
  }
  CHECK(v.try_insert(7));
  CHECK_FALSE(v.try_insert(7));
}
