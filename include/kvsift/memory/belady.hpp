#pragma once
// Belady's offline optimum (MIN): given the whole future trace, evict the pages whose next use
// is farthest away (never used again first; ties: lowest slot). An upper bound on the hit
// ratio of any online policy, reported next to the LRU variants.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "kvsift/core/error.hpp"
#include "kvsift/memory/detail/slot_cache.hpp"
#include "kvsift/memory/replacement_policy.hpp"

namespace kvsift {

/// Belady for one (request, KV head) over a known trace: step i must be called with trace
/// step i. Thread safety: const members safe concurrently; step needs external
/// synchronisation.
class belady : public detail::policy_pages {
 public:
  /// Copies the trace. O(total accesses). @throw invalid_argument if capacity or keys is 0;
  /// out_of_range for a page id >= keys in the trace.
  belady(std::size_t capacity, std::size_t keys, std::vector<std::vector<id_t>> trace)
      : policy_pages(capacity, keys, "belady"), trace_(std::move(trace)), uses_(keys) {
    for (std::size_t t = 0; t < trace_.size(); ++t) {
      for (const id_t k : trace_[t]) {
        detail::require<out_of_range>(k < keys, "belady: expected page ids < ", keys, ", got ", k,
                                      " in trace step ", t);
        if (uses_[k].empty() || uses_[k].back() != t) uses_[k].push_back(t);
      }
    }
  }

  // capacity(), keys(), resident(), limit(), set_limit(), slot_of(): detail::policy_pages.

  /// Step number `t` of the trace; `selected` must equal trace step t.
  /// O(capacity log(trace length)). @throw invalid_argument past the end of the trace or for a
  /// selection other than the trace's; otherwise as bucketed_lru::step.
  void step(std::span<const id_t> selected, replacement_step& out) {
    detail::require(now_ < trace_.size(), "belady::step: the trace has ", trace_.size(),
                    " steps, step ", now_, " requested");
    const auto& expected = trace_[now_];
    detail::require(std::equal(selected.begin(), selected.end(), expected.begin(), expected.end()),
                    "belady::step: selection of step ", now_,
                    " differs from the trace given at construction");
    cache_.classify(selected);
    out.clear();
    out.hits = cache_.hits().size();
    if (const std::size_t need = cache_.demand(); need > 0) {
      victims_.clear();
      for (std::size_t s = 0; s < capacity(); ++s) {
        if (cache_.key_in(s) != invalid_id && !cache_.selected_slot(s)) {
          victims_.push_back({next_use(cache_.key_in(s)), s});
        }
      }
      std::nth_element(victims_.begin(), victims_.begin() + static_cast<std::ptrdiff_t>(need - 1),
                       victims_.end(), [](const victim& a, const victim& b) {
                         return a.next != b.next ? a.next > b.next : a.slot < b.slot;
                       });
      victims_.resize(need);
      std::sort(victims_.begin(), victims_.end(),
                [](const victim& a, const victim& b) { return a.slot < b.slot; });
      for (const victim& v : victims_) cache_.evict(v.slot, out);
    }
    cache_.admit(out, [](std::size_t) {});
    ++now_;
  }

 private:
  struct victim {
    std::size_t next;
    std::size_t slot;
  };

  // First use of `k` after the current step (never: max).
  [[nodiscard]] std::size_t next_use(id_t k) const {
    const auto& u = uses_[k];
    const auto it = std::upper_bound(u.begin(), u.end(), now_);
    return it == u.end() ? std::numeric_limits<std::size_t>::max() : *it;
  }

  std::vector<std::vector<id_t>> trace_;
  std::vector<std::vector<std::size_t>> uses_;  // ascending steps using each page
  std::size_t now_ = 0;
  std::vector<victim> victims_;
};

static_assert(ReplacementPolicy<belady>);

}  // namespace kvsift
