#include "kvsift/core/candidate_pool.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <random>
#include <utility>
#include <vector>

TEST_CASE("candidate_pool keeps the best L with lower id first on ties", "[core][candidate_pool]") {
  std::mt19937 rng(5);
  for (std::size_t cap : {1u, 2u, 7u, 50u}) {
    kvsift::candidate_pool pool(cap);
    std::vector<std::pair<float, kvsift::id_t>> all;
    std::vector<kvsift::id_t> ids(300);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<kvsift::id_t>(i);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (kvsift::id_t id : ids) {
      const float key = static_cast<float>(rng() % 20);  // many ties
      const bool fits_before = !pool.full() || key > pool.worst_key() ||
                               (key == pool.worst_key() && id < pool[pool.size() - 1].id);
      CHECK(pool.insert(key, id) == fits_before);
      all.emplace_back(key, id);
    }
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    REQUIRE(pool.size() == std::min(cap, all.size()));
    CHECK(pool.capacity() == cap);
    for (std::size_t i = 0; i < pool.size(); ++i) {
      INFO("cap " << cap << " i " << i);
      CHECK(pool[i].key == all[i].first);
      CHECK(pool[i].id == all[i].second);
    }
  }
}

TEST_CASE("candidate_pool cursor returns the best unexpanded", "[core][candidate_pool]") {
  kvsift::candidate_pool pool(4);
  CHECK_FALSE(pool.has_unexpanded());
  pool.insert(5.0f, 10);
  pool.insert(3.0f, 11);
  auto c = pool.pop_unexpanded();
  CHECK(c.id == 10);
  CHECK(c.expanded);
  CHECK(pool[0].expanded);
  // A better candidate than the expanded one moves the cursor back.
  pool.insert(9.0f, 12);
  c = pool.pop_unexpanded();
  CHECK(c.id == 12);
  c = pool.pop_unexpanded();
  CHECK(c.id == 11);
  CHECK_FALSE(pool.has_unexpanded());
  // A worse one after everything is expanded is next.
  pool.insert(1.0f, 13);
  REQUIRE(pool.has_unexpanded());
  CHECK(pool.pop_unexpanded().id == 13);
  CHECK(pool.full());
  // Pool is full with all expanded; an insert that evicts the worst is still popped.
  CHECK(pool.insert(4.0f, 14));
  CHECK(pool.size() == 4);
  CHECK(pool.worst_key() == 3.0f);
  REQUIRE(pool.has_unexpanded());
  CHECK(pool.pop_unexpanded().id == 14);
  CHECK_FALSE(pool.has_unexpanded());
  CHECK_FALSE(pool.insert(2.0f, 15));  // worse than the worst of a full pool
  CHECK_FALSE(pool.insert(3.0f, 16));  // tie with worst (id 11), higher id loses
  CHECK(pool.insert(3.0f, 1));         // tie with worst, lower id wins
  CHECK(pool[3].id == 1);

  pool.reset(2);
  CHECK(pool.size() == 0);
  CHECK_FALSE(pool.has_unexpanded());
  CHECK_THROWS_AS(pool.reset(0), kvsift::invalid_argument);
  CHECK_THROWS_AS(kvsift::candidate_pool(0), kvsift::invalid_argument);
}

TEST_CASE("candidate_pool cursor order matches sorted order under random use",
          "[core][candidate_pool]") {
  std::mt19937 rng(11);
  kvsift::candidate_pool pool(16);
  std::vector<kvsift::id_t> popped_order;
  kvsift::id_t next = 0;
  for (int round = 0; round < 200; ++round) {
    for (int j = 0; j < 3; ++j) pool.insert(static_cast<float>(rng() % 50), next++);
    if (pool.has_unexpanded()) {
      // The popped candidate is the best unexpanded one in the pool.
      std::size_t best = pool.size();
      for (std::size_t i = 0; i < pool.size(); ++i) {
        if (!pool[i].expanded) {
          best = i;
          break;
        }
      }
      REQUIRE(best < pool.size());
      const auto expect = pool[best].id;
      CHECK(pool.pop_unexpanded().id == expect);
    }
  }
}

// Regression: reset reserved capacity + 1 entries up front, so a huge capacity wrapped
// (SIZE_MAX + 1 = 0) or threw length_error instead of giving a pool bounded by what is
// inserted.
TEST_CASE("candidate_pool with a huge capacity keeps everything inserted", "[core][rel]") {
  for (const std::size_t cap : {std::numeric_limits<std::size_t>::max(), std::size_t{1} << 62}) {
    kvsift::candidate_pool p(cap);
    CHECK(p.capacity() == cap);
    for (kvsift::id_t i = 0; i < 100; ++i) CHECK(p.insert(static_cast<float>(i % 7), i));
    CHECK(p.size() == 100);
    CHECK(p[0].key == 6.0f);
    CHECK(p[0].id == 6);
  }
}

// insert_batch must leave the pool exactly as inserting the batch one by one does: the same
// candidates in the same order, the same expanded flags, the same next pop. Checked against a
// twin pool fed by insert() under random batches (empty, larger than the pool, long enough for the
// sort instead of insertion, candidates that do not fit, many ties) interleaved with pops.
TEST_CASE("candidate_pool insert_batch equals one insert per candidate", "[core][candidate_pool]") {
  std::mt19937 rng(23);
  for (const std::size_t cap : {1u, 2u, 7u, 50u, 500u}) {
    kvsift::candidate_pool batched(cap), single(cap);
    std::vector<kvsift::id_t> ids(4000);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<kvsift::id_t>(i);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::size_t next = 0;
    std::vector<kvsift::candidate> batch;
    while (next < ids.size()) {
      const std::size_t b =
          std::min<std::size_t>(rng() % 8 == 0 ? rng() % 300 : rng() % 41, ids.size() - next);
      batch.clear();
      for (std::size_t j = 0; j < b; ++j) {
        const kvsift::id_t id = ids[next++];
        const float key = static_cast<float>(rng() % 64);  // many ties
        single.insert(key, id);
        batch.push_back({key, id, /*expanded=*/j % 2 == 0});  // flags ignored
      }
      batched.insert_batch(batch);
      REQUIRE(batched.size() == single.size());
      for (std::size_t i = 0; i < single.size(); ++i) {
        INFO("cap " << cap << " slot " << i);
        REQUIRE(batched[i].id == single[i].id);
        REQUIRE(batched[i].key == single[i].key);
        REQUIRE(batched[i].expanded == single[i].expanded);
      }
      for (std::size_t pops = rng() % 4; pops > 0 && single.has_unexpanded(); --pops) {
        REQUIRE(batched.has_unexpanded());
        REQUIRE(batched.pop_unexpanded().id == single.pop_unexpanded().id);
      }
      REQUIRE(batched.has_unexpanded() == single.has_unexpanded());
    }
  }
}
