#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "../test_support.hpp"
#include "kvsift/reorder/prefix_reorder.hpp"
#include "kvsift/reorder/prefix_trie.hpp"

namespace {

using Catch::Matchers::Contains;
using kvsift::token_id;
using kvsift_test::message_of;
using seq = std::vector<token_id>;

// Brute-force LRU prefix cache: a list of cached sequences' prefixes as token sets, the
// oracle for prefix_trie's eviction. Each cached token is a prefix (a vector) with a time.
struct lru_oracle {
  std::size_t capacity;
  std::vector<std::pair<seq, std::uint64_t>> entries;  // one entry per cached prefix
  std::uint64_t clock = 0;
  std::size_t access(const seq& s) {
    ++clock;
    std::size_t hits = 0;
    for (std::size_t len = 1; len <= s.size(); ++len) {
      const seq p(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(len));
      auto it = std::find_if(entries.begin(), entries.end(), [&](auto& e) { return e.first == p; });
      if (it != entries.end() && hits == len - 1) ++hits;
      if (it == entries.end())
        entries.push_back({p, clock});
      else
        it->second = clock;
    }
    while (entries.size() > capacity) {
      // LRU leaf: the oldest prefix that no other cached prefix extends; ties: the longest.
      auto victim = entries.end();
      for (auto it = entries.begin(); it != entries.end(); ++it) {
        const bool leaf = std::none_of(entries.begin(), entries.end(), [&](auto& e) {
          return e.first.size() == it->first.size() + 1 &&
                 std::equal(it->first.begin(), it->first.end(), e.first.begin());
        });
        if (!leaf) continue;
        if (victim == entries.end() || it->second < victim->second ||
            (it->second == victim->second && it->first.size() > victim->first.size()))
          victim = it;
      }
      entries.erase(victim);
    }
    return hits;
  }
};

}  // namespace

TEST_CASE("prefix_trie: longest cached prefix", "[reorder]") {
  kvsift::prefix_trie t;
  CHECK(t.access(seq{1, 2, 3, 4}) == 0);
  CHECK(t.longest_prefix(seq{1, 2, 3, 4, 5}) == 4);
  CHECK(t.longest_prefix(seq{1, 2, 9}) == 2);
  CHECK(t.longest_prefix(seq{2}) == 0);
  CHECK(t.longest_prefix(seq{}) == 0);
  CHECK(t.access(seq{1, 2, 7}) == 2);
  CHECK(t.size() == 5);
}

TEST_CASE("prefix_trie: LRU eviction matches a brute-force LRU over prefixes", "[reorder]") {
  std::mt19937 rng(1);
  for (const std::size_t cap : {3, 8, 20}) {
    kvsift::prefix_trie t(cap);
    lru_oracle o{cap, {}, 0};
    for (int i = 0; i < 300; ++i) {
      seq s(1 + rng() % 6);
      for (auto& x : s) x = rng() % 3;  // a small alphabet: many shared prefixes
      REQUIRE(t.access(s) == o.access(s));
      REQUIRE(t.size() == std::min<std::size_t>(cap, o.entries.size()));
    }
  }
}

TEST_CASE("estimate_hit_rate: counts skipped prefill tokens", "[reorder]") {
  const std::vector<seq> reqs{{1, 2, 3}, {1, 2, 4}, {5}, {1, 2, 3}};
  const auto e = kvsift::estimate_hit_rate(reqs);
  CHECK(e.total_tokens == 10);
  CHECK(e.hit_tokens == 2 + 3);
  CHECK(e.rate() == Approx(0.5));
  // Capacity 3: {1,2,4} evicts 3, {5} evicts 4, so the last request hits only {1,2}.
  CHECK(kvsift::estimate_hit_rate(reqs, 3).hit_tokens == 2 + 2);
}

TEST_CASE("plan_batch: column order by score, row sort, dedup with a map back", "[reorder]") {
  // column 0: unique short ids; column 1: a long value shared by many rows; column 2: mid.
  const std::string lng = "a long repeated description of many words";
  const kvsift::table_rows rows{{"r1", lng, "x y"}, {"r2", "b", "x y"}, {"r1", lng, "x y"},
                                {"r3", lng, "z"},   {"r4", "b", "x y"}, {"r5", lng, "z"}};
  const auto sc = kvsift::column_scores(rows);
  CHECK(sc[0].distinct == 5);
  CHECK(sc[1].distinct == 2);
  CHECK(sc[1].avg_tokens == Approx((4 * 7 + 2) / 6.0));
  CHECK(sc[1].score == Approx((4 * 7 + 2) / 6.0 * 6 / 2));
  const auto plan = kvsift::plan_batch(rows);
  CHECK(plan.columns == std::vector<std::size_t>{1, 2, 0});
  // Sorted by (col1, col2, col0), rows 0 and 2 collapsed.
  CHECK(plan.requests == std::vector<std::size_t>{0, 3, 5, 1, 4});
  REQUIRE(plan.request_of_row.size() == rows.size());
  for (std::size_t r = 0; r < rows.size(); ++r) {
    CHECK(rows[plan.requests[plan.request_of_row[r]]] == rows[r]);  // the map restores each row
  }
  kvsift::token_vocab v;
  const auto toks = kvsift::request_tokens(rows, plan, v, {"id", "desc", "tag"});
  REQUIRE(toks.size() == 5);
  CHECK(toks[0].size() == 1 + 7 + 1 + 2 + 1 + 1);
  const auto orig =
      kvsift::request_tokens(rows, kvsift::plan_batch(rows, {false, false, false}), v);
  CHECK(kvsift::estimate_hit_rate(toks).rate() > 2 * kvsift::estimate_hit_rate(orig).rate());
}

TEST_CASE("plan_batch: never loses or duplicates a row", "[reorder]") {
  std::mt19937 rng(2);
  kvsift::table_rows rows(200, std::vector<std::string>(4));
  for (auto& r : rows)
    for (auto& f : r) f = std::string(1 + rng() % 3, static_cast<char>('a' + rng() % 3));
  for (const bool cols : {false, true})
    for (const bool sort : {false, true})
      for (const bool dedup : {false, true}) {
        const auto plan = kvsift::plan_batch(rows, {cols, sort, dedup});
        auto perm = plan.columns;
        std::sort(perm.begin(), perm.end());
        CHECK(perm == std::vector<std::size_t>{0, 1, 2, 3});
        std::vector<std::size_t> reqs = plan.requests;
        std::sort(reqs.begin(), reqs.end());
        CHECK(std::adjacent_find(reqs.begin(), reqs.end()) == reqs.end());
        if (!dedup) CHECK(reqs.size() == rows.size());
        std::set<std::vector<std::string>> distinct(rows.begin(), rows.end());
        if (dedup) CHECK(reqs.size() == distinct.size());
        for (std::size_t r = 0; r < rows.size(); ++r) {
          REQUIRE(plan.request_of_row[r] < plan.requests.size());
          REQUIRE(rows[plan.requests[plan.request_of_row[r]]] == rows[r]);
        }
        if (sort) {
          for (std::size_t i = 1; i < plan.requests.size(); ++i) {
            std::vector<std::string> a, b;
            for (auto c : plan.columns) {
              a.push_back(rows[plan.requests[i - 1]][c]);
              b.push_back(rows[plan.requests[i]][c]);
            }
            REQUIRE(a <= b);
          }
        }
      }
}

TEST_CASE("reorder: split_words and bad input", "[reorder]") {
  const auto w = kvsift::split_words("America/New_York, +4043-07400  Eastern (most areas)");
  CHECK(w == std::vector<std::string_view>{"America", "New", "York", "4043", "07400", "Eastern",
                                           "most", "areas"});
  CHECK(kvsift::split_words("").empty());
  CHECK(kvsift::split_words(" ,. ").empty());
  const kvsift::table_rows ragged{{"a", "b"}, {"c", "d"}, {"e"}};
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { (void)kvsift::plan_batch(ragged); }),
             Contains("expected 2 fields (as row 0), got 1 in row 2"));
  const kvsift::table_rows ok{{"a", "b"}};
  kvsift::token_vocab v;
  CHECK_THAT(message_of<kvsift::invalid_argument>(
                 [&] { (void)kvsift::request_tokens(ok, kvsift::plan_batch(ok), v, {"h"}); }),
             Contains("header of 2 names, got 1"));
  kvsift::batch_plan bad{{0, 5}, {0}, {0}};
  CHECK_THAT(
      message_of<kvsift::invalid_argument>([&] { (void)kvsift::request_tokens(ok, bad, v); }),
      Contains("plan column 5 is not below 2"));
  bad = {{0, 1}, {3}, {0}};
  CHECK_THAT(
      message_of<kvsift::invalid_argument>([&] { (void)kvsift::request_tokens(ok, bad, v); }),
      Contains("plan row 3 is not below 1"));
  CHECK_THAT(message_of<kvsift::invalid_argument>([] { kvsift::prefix_trie t(0); }),
             Contains("capacity > 0"));
  const auto empty = kvsift::plan_batch({});
  CHECK(empty.requests.empty());
  CHECK(kvsift::estimate_hit_rate(std::vector<seq>{}).rate() == 0.0);
}
