#include "kvsift/core/topk.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <random>
#include <vector>

TEST_CASE("topk_selector matches a std::sort oracle with ties", "[core][topk]") {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    const std::size_t n = 1 + rng() % 400;
    const std::size_t k = 1 + rng() % 60;
    std::vector<kvsift::scored_id> all;
    std::vector<kvsift::id_t> ids(n);
    for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<kvsift::id_t>(i * 3 + 1);
    std::shuffle(ids.begin(), ids.end(), rng);
    kvsift::topk_selector sel(k);
    for (kvsift::id_t id : ids) {
      const float key = static_cast<float>(static_cast<int>(rng() % 16) - 8) * 0.5f;
      all.push_back({key, id});
      if (trial % 2 == 0 || sel.accepts(key, id)) sel.push(key, id);
    }
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
      return a.key > b.key || (a.key == b.key && a.id < b.id);
    });
    const std::size_t want = std::min(n, k);
    REQUIRE(sel.size() == want);
    if (want == k) CHECK(sel.threshold() == all[k - 1].key);
    const auto& got = sel.sorted();
    REQUIRE(got.size() == want);
    for (std::size_t i = 0; i < want; ++i) {
      INFO("trial " << trial << " i " << i);
      CHECK(got[i].key == all[i].key);
      CHECK(got[i].id == all[i].id);
    }
  }
}

TEST_CASE("topk_selector edge cases", "[core][topk]") {
  kvsift::topk_selector zero(0);
  zero.push(1.0f, 1);
  CHECK(zero.size() == 0);

  kvsift::topk_selector s(2);
  s.push(1.0f, 5);
  s.push(1.0f, 3);
  CHECK_FALSE(s.accepts(1.0f, 7));  // tie, higher id than the worst kept
  CHECK(s.accepts(1.0f, 4));        // tie, lower id than the worst kept (5)
  s.push(1.0f, 4);
  const auto& r = s.sorted();
  REQUIRE(r.size() == 2);
  CHECK(r[0].id == 3);
  CHECK(r[1].id == 4);

  CHECK(kvsift::ranks_before({2.0f, 9}, {1.0f, 0}));
  CHECK(kvsift::ranks_before({1.0f, 0}, {1.0f, 1}));
  CHECK_FALSE(kvsift::ranks_before({1.0f, 1}, {1.0f, 1}));

  s.reset(3);
  CHECK(s.size() == 0);
}

// Regression: with k = 0, accepts() read the front of an empty heap.
TEST_CASE("topk_selector with k = 0 keeps nothing and reads nothing", "[core][rel]") {
  kvsift::topk_selector t(0);
  CHECK_FALSE(t.accepts(1.0f, 3));
  CHECK_FALSE(t.accepts(std::numeric_limits<float>::infinity(), 0));
  t.push(1.0f, 3);
  CHECK(t.size() == 0);
  CHECK(t.sorted().empty());
  // A huge k neither throws length_error nor reserves: it keeps everything pushed.
  t.reset(std::numeric_limits<std::size_t>::max());
  for (kvsift::id_t i = 0; i < 5; ++i) {
    REQUIRE(t.accepts(static_cast<float>(i), i));
    t.push(static_cast<float>(i), i);
  }
  CHECK(t.sorted().size() == 5);
}
