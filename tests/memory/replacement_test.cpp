#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "../test_support.hpp"
#include "kvsift/memory/belady.hpp"
#include "kvsift/memory/bucketed_lru.hpp"
#include "kvsift/memory/exact_lru.hpp"

using kvsift::id_t;
using kvsift::invalid_id;
using kvsift::replacement_step;
using kvsift_test::message_of;

namespace {

// Steps of `per_step` distinct pages from [0, keys): a hot set that drifts plus random noise.
std::vector<std::vector<id_t>> drifting_trace(std::size_t steps, std::size_t keys,
                                              std::size_t per_step, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<id_t>> trace(steps);
  for (std::size_t t = 0; t < steps; ++t) {
    std::set<id_t> s;
    const std::size_t base = (t / 8) * 3;
    while (s.size() < per_step) {
      const bool hot = rng() % 4 != 0;
      s.insert(static_cast<id_t>(hot ? (base + rng() % (2 * per_step)) % keys : rng() % keys));
    }
    trace[t].assign(s.begin(), s.end());
    std::shuffle(trace[t].begin(), trace[t].end(), rng);
  }
  return trace;
}

// Invariants every policy keeps after every step.
template <class P>
void check_invariants(const P& p, const std::vector<id_t>& selected, const replacement_step& st) {
  std::set<id_t> distinct(selected.begin(), selected.end());
  REQUIRE(st.hits + st.misses() == distinct.size());
  REQUIRE(p.resident() <= p.capacity());
  std::set<id_t> slots;
  for (const id_t k : distinct) {
    const id_t s = p.slot_of(k);
    REQUIRE(s != invalid_id);
    REQUIRE(s < p.capacity());
    slots.insert(s);
  }
  REQUIRE(slots.size() == distinct.size());  // no two selected pages share a slot
  for (const id_t k : st.evicted_keys) {
    REQUIRE(distinct.count(k) == 0);  // a selected page is never evicted
    REQUIRE(p.slot_of(k) == invalid_id);
  }
  REQUIRE(std::is_sorted(st.evicted_slots.begin(), st.evicted_slots.end()));
  for (std::size_t i = 0; i < st.admitted_keys.size(); ++i) {
    REQUIRE(p.slot_of(st.admitted_keys[i]) == st.admitted_slots[i]);
  }
}

/// Two policies did the same step, entry for entry.
void require_same_step(const replacement_step& a, const replacement_step& b) {
  REQUIRE(a.hits == b.hits);
  REQUIRE(a.evicted_keys == b.evicted_keys);
  REQUIRE(a.evicted_slots == b.evicted_slots);
  REQUIRE(a.admitted_keys == b.admitted_keys);
  REQUIRE(a.admitted_slots == b.admitted_slots);
}

template <class P>
std::size_t run_hits(P& p, const std::vector<std::vector<id_t>>& trace) {
  replacement_step st;
  std::size_t hits = 0;
  for (const auto& s : trace) {
    p.step(s, st);
    check_invariants(p, s, st);
    hits += st.hits;
  }
  return hits;
}

}  // namespace

TEST_CASE("bucketed_lru evicts the oldest bucket first, lowest slot on ties", "[memory]") {
  kvsift::bucketed_lru<4> lru(4, 10);
  replacement_step st;
  const std::vector<id_t> s0{5, 6, 7, 8};
  lru.step(s0, st);
  REQUIRE(st.misses() == 4);
  REQUIRE(st.admitted_slots == std::vector<id_t>{0, 1, 2, 3});
  const std::vector<id_t> s1{6, 8};  // 5, 7 age to 1
  lru.step(s1, st);
  REQUIRE(st.hits == 2);
  REQUIRE(st.evicted_keys.empty());
  const std::vector<id_t> s2{8, 1};  // ages: 5:2 6:1 7:2 -> evict 5 (oldest, lowest slot)
  lru.step(s2, st);
  REQUIRE(st.evicted_keys == std::vector<id_t>{5});
  REQUIRE(st.admitted_keys == std::vector<id_t>{1});
  REQUIRE(st.admitted_slots == std::vector<id_t>{0});
  REQUIRE(lru.age_of(2) == 2);
  // Saturation: 7 stays at the oldest bucket (3) and ties with 6 once 6 ages there too.
  for (int i = 0; i < 3; ++i) lru.step(std::vector<id_t>{8, 1}, st);
  REQUIRE(lru.age_of(1) == 3);
  REQUIRE(lru.age_of(2) == 3);
  lru.step(std::vector<id_t>{8, 1, 9}, st);  // one eviction among the tied pair: slot 1 (page 6)
  REQUIRE(st.evicted_keys == std::vector<id_t>{6});
  REQUIRE(st.admitted_slots == std::vector<id_t>{1});
  lru.step(std::vector<id_t>{3, 3, 4, 3}, st);  // duplicates count once; 7 and 9 go (ages 4 > 1)
  REQUIRE(st.admitted_keys == std::vector<id_t>{3, 4});
  REQUIRE(st.evicted_keys.size() == 2);
}

TEST_CASE("bucketed_lru equals exact_lru while no age saturates", "[memory]") {
  // Ages are exact recencies until they reach the last bucket, and both break ties by slot.
  const auto trace = drifting_trace(200, 300, 24, 3);
  kvsift::bucketed_lru<256> bucketed(64, 300);
  kvsift::exact_lru exact(64, 300);
  replacement_step a, b;
  for (const auto& s : trace) {
    bucketed.step(s, a);
    exact.step(s, b);
    require_same_step(a, b);
  }
}

TEST_CASE("replacement policies keep their invariants; Belady bounds the LRUs", "[memory]") {
  for (unsigned seed = 1; seed <= 4; ++seed) {
    const auto trace = drifting_trace(300, 500, 16 + seed * 4, seed);
    kvsift::bucketed_lru<8> bucketed(48, 500);
    kvsift::exact_lru exact(48, 500);
    kvsift::belady opt(48, 500, trace);
    const auto hb = run_hits(bucketed, trace);
    const auto he = run_hits(exact, trace);
    const auto ho = run_hits(opt, trace);
    REQUIRE(ho >= he);
    REQUIRE(ho >= hb);
    REQUIRE(he > 0);
  }
}

TEST_CASE("belady matches a brute-force optimum on tiny traces", "[memory]") {
  // Exhaustive search over every eviction choice (capacity 3, 6 pages, 7 steps of 1-2 pages).
  std::mt19937 rng(11);
  for (int rep = 0; rep < 20; ++rep) {
    std::vector<std::vector<id_t>> trace(7);
    for (auto& s : trace) {
      s.push_back(static_cast<id_t>(rng() % 6));
      if (rng() % 2) {
        const auto k = static_cast<id_t>(rng() % 6);
        if (k != s[0]) s.push_back(k);
      }
    }
    auto best = [&](auto&& self, std::size_t t, std::set<id_t> cache) -> std::size_t {
      if (t == trace.size()) return 0;
      std::size_t hits = 0;
      std::vector<id_t> miss;
      for (const id_t k : trace[t]) {
        if (cache.count(k) != 0) {
          ++hits;
        } else {
          miss.push_back(k);
        }
      }
      std::vector<id_t> evictable;
      for (const id_t k : cache)
        if (std::find(trace[t].begin(), trace[t].end(), k) == trace[t].end())
          evictable.push_back(k);
      const std::size_t need = cache.size() + miss.size() > 3 ? cache.size() + miss.size() - 3 : 0;
      std::size_t result = 0;
      // every subset of `evictable` of size `need`
      for (unsigned mask = 0; mask < (1u << evictable.size()); ++mask) {
        if (static_cast<std::size_t>(__builtin_popcount(mask)) != need) continue;
        auto next = cache;
        for (std::size_t i = 0; i < evictable.size(); ++i)
          if (mask >> i & 1) next.erase(evictable[i]);
        for (const id_t k : miss) next.insert(k);
        result = std::max(result, self(self, t + 1, next));
      }
      return hits + result;
    };
    kvsift::belady opt(3, 6, trace);
    REQUIRE(run_hits(opt, trace) == best(best, 0, {}));
  }
}

TEST_CASE("replacement policies reject bad input before changing state", "[memory]") {
  REQUIRE_THROWS_AS(kvsift::bucketed_lru<>(0, 10), kvsift::invalid_argument);
  REQUIRE_THROWS_AS(kvsift::exact_lru(4, 0), kvsift::invalid_argument);
  static_assert(!kvsift::valid_bucket_count<0>);  // a zero-bucket timestamp range
  static_assert(!kvsift::valid_bucket_count<1>);
  kvsift::bucketed_lru<> lru(2, 10);
  replacement_step st;
  lru.step(std::vector<id_t>{1}, st);
  REQUIRE_THAT(message_of<kvsift::out_of_range>([&] {
                 lru.step(std::vector<id_t>{2, 10}, st);
               }),
               Catch::Contains("expected page ids < 10, got 10 at position 1"));
  REQUIRE_THAT(message_of<kvsift::invalid_argument>([&] {
                 lru.step(std::vector<id_t>{2, 3, 4}, st);
               }),
               Catch::Contains("page demand of 3 distinct pages exceeds the page limit of 2"));
  REQUIRE(lru.resident() == 1);
  REQUIRE(lru.slot_of(1) == 0);
  REQUIRE(lru.slot_of(2) == invalid_id);
  REQUIRE_THROWS_AS(lru.slot_of(10), kvsift::out_of_range);

  kvsift::exact_lru exact(2, 10);
  REQUIRE_THROWS_AS(exact.step(std::vector<id_t>{11}, st), kvsift::out_of_range);
  REQUIRE_THROWS_AS(exact.step(std::vector<id_t>{1, 2, 3}, st), kvsift::invalid_argument);

  REQUIRE_THROWS_AS(kvsift::belady(2, 10, {{1, 10}}), kvsift::out_of_range);
  kvsift::belady opt(2, 10, {{1, 2}});
  REQUIRE_THAT(message_of<kvsift::invalid_argument>([&] { opt.step(std::vector<id_t>{1}, st); }),
               Catch::Contains("differs from the trace"));
  opt.step(std::vector<id_t>{1, 2}, st);
  REQUIRE_THAT(message_of<kvsift::invalid_argument>([&] { opt.step(std::vector<id_t>{1}, st); }),
               Catch::Contains("the trace has 1 steps"));
  REQUIRE(kvsift::exact_lru(3, 3).resident() == 0);  // empty selections are fine
  kvsift::exact_lru e2(3, 3);
  e2.step({}, st);
  REQUIRE(st.hits == 0);
  REQUIRE(st.misses() == 0);
}

TEST_CASE("a constant page limit equals a smaller capacity, entry for entry", "[memory]") {
  // Admission takes the lowest free slots and at most `limit` pages are ever held, so a policy
  // of 64 slots limited to 40 must do exactly what a policy of 40 slots does.
  const auto trace = drifting_trace(300, 400, 24, 5);
  auto same = [&](auto limited, auto small) {
    limited.set_limit(40);
    REQUIRE(limited.limit() == 40);
    replacement_step a, b;
    std::size_t evictions = 0;
    for (const auto& s : trace) {
      limited.step(s, a);
      small.step(s, b);
      require_same_step(a, b);
      REQUIRE(limited.resident() <= 40);
      evictions += a.evicted_keys.size();
    }
    REQUIRE(evictions > 1000);  // the limit, not the capacity, bounded the trace
  };
  same(kvsift::bucketed_lru<8>(64, 400), kvsift::bucketed_lru<8>(40, 400));
  same(kvsift::exact_lru(64, 400), kvsift::exact_lru(40, 400));
  same(kvsift::belady(64, 400, trace), kvsift::belady(40, 400, trace));
}

TEST_CASE("a lowered page limit evicts the excess by the policy's own rule", "[memory]") {
  kvsift::bucketed_lru<8> lru(6, 20);
  replacement_step st;
  for (id_t k = 0; k < 5; ++k) lru.step(std::vector<id_t>{k}, st);  // page k in slot k, age 4 - k
  lru.set_limit(3);  // nothing happens until the next step
  REQUIRE(lru.resident() == 5);
  lru.step(std::vector<id_t>{4}, st);  // a hit: the two oldest pages (0 and 1) leave
  REQUIRE(st.hits == 1);
  REQUIRE(st.evicted_keys == std::vector<id_t>{0, 1});
  REQUIRE(st.admitted_keys.empty());
  REQUIRE(lru.resident() == 3);
  lru.step(std::vector<id_t>{7}, st);  // a miss at the limit: the oldest left (2) makes room
  REQUIRE(st.evicted_keys == std::vector<id_t>{2});
  REQUIRE(st.admitted_slots == std::vector<id_t>{0});  // the lowest free slot
  lru.set_limit(6);  // raised: misses fill free slots again, nothing evicted
  lru.step(std::vector<id_t>{8, 9}, st);
  REQUIRE(st.evicted_keys.empty());
  REQUIRE(lru.resident() == 5);

  kvsift::exact_lru exact(6, 20);
  for (id_t k = 0; k < 6; ++k) exact.step(std::vector<id_t>{k}, st);
  exact.set_limit(2);
  exact.step({}, st);  // an empty step still enforces the limit: the four least recent go
  REQUIRE(st.evicted_keys == std::vector<id_t>{0, 1, 2, 3});
  exact.set_limit(0);
  exact.step({}, st);
  REQUIRE(exact.resident() == 0);
}

TEST_CASE("a page limit rejects bad input before changing state", "[memory][rel]") {
  kvsift::bucketed_lru<8> lru(4, 10);
  replacement_step st;
  lru.step(std::vector<id_t>{1, 2}, st);
  REQUIRE_THAT(message_of<kvsift::invalid_argument>([&] { lru.set_limit(5); }),
               Catch::Contains("expected a page limit <= the capacity of 4 slots, got 5"));
  REQUIRE(lru.limit() == 4);
  lru.set_limit(2);
  REQUIRE_THAT(message_of<kvsift::invalid_argument>([&] {
                 lru.step(std::vector<id_t>{1, 3, 4}, st);
               }),
               Catch::Contains("page demand of 3 distinct pages exceeds the page limit of 2") &&
                   Catch::Contains("capacity 4"));
  REQUIRE(lru.resident() == 2);  // unchanged
  REQUIRE(lru.slot_of(3) == invalid_id);
  REQUIRE_THROWS_AS(lru.set_limit(std::size_t{1} << 40), kvsift::invalid_argument);
  kvsift::belady opt(2, 10, {{1}});
  REQUIRE_THROWS_AS(opt.set_limit(3), kvsift::invalid_argument);
}

// Regression: the slot maps were allocated before the sizes were validated, so an
// overflow-sized capacity threw bad_alloc (or took the memory) instead of invalid_argument.
TEST_CASE("replacement policies validate sizes before allocating", "[memory][rel]") {
  constexpr std::size_t huge = std::size_t{1} << 50;  // 4 PiB of slots: no allocation can succeed
  auto msg = kvsift_test::message_of<kvsift::invalid_argument>([] { kvsift::exact_lru(huge, 10); });
  CHECK_THAT(msg, Catch::Contains("exact_lru") && Catch::Contains("1125899906842624"));
  msg = kvsift_test::message_of<kvsift::invalid_argument>([] { kvsift::bucketed_lru<>(4, huge); });
  CHECK_THAT(msg, Catch::Contains("bucketed_lru") && Catch::Contains("1125899906842624"));
}
