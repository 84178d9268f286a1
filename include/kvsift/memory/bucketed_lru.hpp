#pragma once
// Bucketed LRU (Spin): recency is a small bounded age per page instead of a global clock, so
// one step is a few linear passes over the head's slots and maps onto one GPU thread block:
// promote hits to the newest bucket, age everything else by one (saturating), histogram the
// ages of the evictable pages, take the smallest recency threshold whose cumulative count
// covers the demand, evict at or below it, admit the misses into the freed slots.
//
// This is the CPU reference: cuda/include/kvsift/cuda/bucketed_lru.cuh produces the same
// evictions and admissions on the same trace.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvsift/memory/detail/slot_cache.hpp"
#include "kvsift/memory/replacement_policy.hpp"

namespace kvsift {

/// A bucket count the bucketed LRU supports: at least 2 (newest and oldest must differ) and
/// ages must fit a byte.
template <std::size_t Buckets>
concept valid_bucket_count = Buckets >= 2 && Buckets <= 256;

/// Bucketed LRU for one (request, KV head). Age 0 is the newest bucket, Buckets - 1 the
/// oldest (saturating). Tie rule inside the threshold bucket: lowest slot first.
/// Thread safety: const members safe concurrently; step needs external synchronisation.
template <std::size_t Buckets = 64>
requires valid_bucket_count<Buckets>
class bucketed_lru : public detail::policy_pages {
 public:
  static constexpr std::size_t buckets = Buckets;

  /// `capacity` GPU slots for logical pages [0, keys).
  /// @throw invalid_argument if capacity or keys is 0.
  bucketed_lru(std::size_t capacity, std::size_t keys)
      : policy_pages(capacity, keys, "bucketed_lru"), age_(capacity, 0) {}

  // capacity(), keys(), resident(), limit(), set_limit(), slot_of(): detail::policy_pages.
  /// Page in `slot` (invalid_id if free) and its age bucket.
  [[nodiscard]] id_t key_in(std::size_t slot) const noexcept { return cache_.key_in(slot); }
  [[nodiscard]] std::uint8_t age_of(std::size_t slot) const noexcept { return age_[slot]; }

  /// One decode step. `out` is overwritten. O(capacity + |selected| + Buckets).
  /// @throw out_of_range for a page id >= keys(); invalid_argument if the distinct selected
  ///        pages exceed limit() (nothing changes on a throw).
  void step(std::span<const id_t> selected, replacement_step& out) {
    cache_.classify(selected);
    out.clear();
    out.hits = cache_.hits().size();
    std::array<std::size_t, Buckets> hist{};
    const std::size_t cap = capacity();
    for (std::size_t s = 0; s < cap; ++s) {
      if (cache_.key_in(s) == invalid_id) continue;
      if (cache_.selected_slot(s)) {
        age_[s] = 0;
      } else {
        if (age_[s] + 1u < Buckets) ++age_[s];
        ++hist[age_[s]];
      }
    }
    std::size_t need = cache_.demand();
    if (need > 0) {
      // Smallest recency threshold (= largest age) whose cumulative count covers the demand.
      std::size_t threshold = Buckets;
      std::size_t older = 0;  // evictable pages strictly older than the threshold
      while (older + hist[threshold - 1] < need) older += hist[--threshold];
      --threshold;
      std::size_t at_threshold = need - older;  // taken from the threshold bucket, low slot first
      for (std::size_t s = 0; s < cap && need > 0; ++s) {
        if (cache_.key_in(s) == invalid_id || cache_.selected_slot(s)) continue;
        const bool take = age_[s] > threshold || (age_[s] == threshold && at_threshold > 0);
        if (!take) continue;
        if (age_[s] == threshold) --at_threshold;
        cache_.evict(s, out);
        --need;
      }
    }
    cache_.admit(out, [&](std::size_t s) { age_[s] = 0; });
  }

 private:
  std::vector<std::uint8_t> age_;
};

static_assert(ReplacementPolicy<bucketed_lru<>>);

}  // namespace kvsift
