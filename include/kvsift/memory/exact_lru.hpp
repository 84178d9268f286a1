#pragma once
// Exact LRU: a full per-page last-use step, evicting the least recently used pages (ties:
// lowest slot). The reference the bucketed LRU's hit ratio is compared with.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvsift/memory/detail/slot_cache.hpp"
#include "kvsift/memory/replacement_policy.hpp"

namespace kvsift {

/// Exact LRU for one (request, KV head). Thread safety: const members safe concurrently;
/// step needs external synchronisation.
class exact_lru : public detail::policy_pages {
 public:
  /// @throw invalid_argument if capacity or keys is 0.
  exact_lru(std::size_t capacity, std::size_t keys)
      : policy_pages(capacity, keys, "exact_lru"), last_use_(capacity, 0) {}

  // capacity(), keys(), resident(), limit(), set_limit(), slot_of(): detail::policy_pages.

  /// One step. O(capacity log capacity) when evicting, O(capacity + |selected|) otherwise.
  /// @throw as bucketed_lru::step.
  void step(std::span<const id_t> selected, replacement_step& out) {
    cache_.classify(selected);
    out.clear();
    out.hits = cache_.hits().size();
    ++now_;
    for (const id_t k : cache_.hits()) last_use_[cache_.slot_of(k)] = now_;
    if (const std::size_t need = cache_.demand(); need > 0) {
      victims_.clear();
      for (std::size_t s = 0; s < capacity(); ++s) {
        if (cache_.key_in(s) != invalid_id && !cache_.selected_slot(s)) victims_.push_back(s);
      }
      std::nth_element(victims_.begin(), victims_.begin() + static_cast<std::ptrdiff_t>(need - 1),
                       victims_.end(), [&](std::size_t a, std::size_t b) {
                         return last_use_[a] != last_use_[b] ? last_use_[a] < last_use_[b] : a < b;
                       });
      victims_.resize(need);
      std::sort(victims_.begin(), victims_.end());
      for (const std::size_t s : victims_) cache_.evict(s, out);
    }
    cache_.admit(out, [&](std::size_t s) { last_use_[s] = now_; });
  }

 private:
  std::vector<std::uint64_t> last_use_;
  std::uint64_t now_ = 0;
  std::vector<std::size_t> victims_;
};

static_assert(ReplacementPolicy<exact_lru>);

}  // namespace kvsift
