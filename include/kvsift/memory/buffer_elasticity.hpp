#pragma once
// Buffer elasticity (Spin): the GPU page budget shared by the active requests. A request's
// allocation is its mandatory pages (what this step's selection needs, never taken away)
// plus buffering pages (recently used pages kept to raise the hit ratio). A new request is
// admitted only if both its mandatory and its buffering pages fit in the free pages; when a
// request's mandatory demand grows beyond the free pages, buffering pages are reclaimed from
// the active requests in proportion to their length (a longer request, with more pages to
// choose from, gives more back). Pages a request no longer needs go to the free pool, and
// `distribute_free` lends them back out as buffering pages, again in proportion to length.
//
// The page replacement runs per (request, KV head) pair, so a request's allocation reaches the
// replacement policies as per-pair page limits (`pair_page_limits`): each pair keeps its own
// mandatory pages and an equal share of the request's buffering pages. A limit that falls
// (pages reclaimed by another request) is enforced by the pair's next replacement step, which
// evicts the excess by its own rule (`bucketed_lru::set_limit`, and on the GPU
// `cuda::bucketed_lru_ref::limits`).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/error.hpp"

namespace kvsift {

/// Buffering pages one request gave up in a reclaim.
struct reclaimed_pages {
  std::uint64_t request = 0;
  std::size_t pages = 0;
};

/// Page accounting for a GPU buffer of `total_pages`. Thread safety: const members safe
/// concurrently; mutation needs external synchronisation.
class buffer_elasticity {
 public:
  struct allocation {
    std::size_t length = 0;     ///< tokens (the reclaim weight)
    std::size_t mandatory = 0;  ///< pages this step's selection needs
    std::size_t buffer = 0;     ///< buffering pages
  };

  /// @throw invalid_argument if total_pages == 0.
  explicit buffer_elasticity(std::size_t total_pages) : total_(total_pages), free_(total_pages) {
    detail::require(total_pages > 0, "buffer_elasticity: total_pages must be > 0, got 0");
  }

  [[nodiscard]] std::size_t total_pages() const noexcept { return total_; }
  [[nodiscard]] std::size_t free_pages() const noexcept { return free_; }
  [[nodiscard]] std::size_t active() const noexcept { return requests_.size(); }
  /// @throw out_of_range for an unknown request.
  [[nodiscard]] const allocation& allocation_of(std::uint64_t request) const {
    return find(request, "allocation_of")->second;
  }

  /// Admits `request` if mandatory + buffer pages are free; returns false (nothing changes)
  /// otherwise. O(log active). @throw invalid_argument for a request already active or
  /// length == 0.
  bool admit(std::uint64_t request, std::size_t length, std::size_t mandatory, std::size_t buffer) {
    detail::require(requests_.count(request) == 0, "buffer_elasticity::admit: request ", request,
                    " is already active");
    detail::require(length > 0, "buffer_elasticity::admit: length must be > 0, got 0");
    if (mandatory > free_ || buffer > free_ - mandatory) return false;
    requests_[request] = {length, mandatory, buffer};
    free_ -= mandatory + buffer;
    return true;
  }

  /// Sets the request's mandatory pages for this step (and its length). Growth comes from the
  /// free pages first, then from the request's own buffer, then from the other requests'
  /// buffers in proportion to their length (listed in `taken`). Shrinking frees pages.
  /// O(active). @throw out_of_range for an unknown request; invalid_argument for length == 0
  /// (a request's length is its reclaim weight, as in admit) or when the demand exceeds what
  /// free and buffering pages can cover (nothing changes).
  void set_mandatory(std::uint64_t request, std::size_t length, std::size_t mandatory,
                     std::vector<reclaimed_pages>& taken) {
    auto it = find(request, "set_mandatory");
    detail::require(length > 0, "buffer_elasticity::set_mandatory: length must be > 0, got 0");
    taken.clear();
    allocation& a = it->second;
    if (mandatory <= a.mandatory) {
      free_ += a.mandatory - mandatory;
      a.mandatory = mandatory;
      a.length = length;
      return;
    }
    std::size_t grow = mandatory - a.mandatory;
    std::size_t others = 0;
    for (const auto& [id, r] : requests_) others += id == request ? 0 : r.buffer;
    detail::require(grow <= free_ + a.buffer + others,
                    "buffer_elasticity::set_mandatory: page "
                    "demand of ",
                    mandatory, " pages exceeds the buffer (",
                    a.mandatory + free_ + a.buffer + others, " pages available to request ",
                    request, ")");
    a.length = length;
    const std::size_t from_free = std::min(grow, free_);
    free_ -= from_free;
    grow -= from_free;
    const std::size_t from_own = std::min(grow, a.buffer);
    a.buffer -= from_own;
    grow -= from_own;
    if (grow > 0) take_proportionally(grow, request, taken);
    a.mandatory = mandatory;
  }

  /// Reclaims `pages` buffering pages from all active requests in proportion to their length
  /// into the free pool (e.g. to admit a new request). O(active * rounds).
  /// @throw invalid_argument if fewer buffering pages exist (nothing changes).
  void reclaim(std::size_t pages, std::vector<reclaimed_pages>& taken) {
    std::size_t buffers = 0;
    for (const auto& [id, r] : requests_) buffers += r.buffer;
    detail::require(pages <= buffers, "buffer_elasticity::reclaim: asked for ", pages,
                    " pages, the active requests hold ", buffers, " buffering pages");
    taken.clear();
    take_proportionally(pages, no_request, taken);
    free_ += pages;
  }

  /// Hands every free page to the active requests as buffering pages, in proportion to their
  /// length (floor shares, then one page each to the longest requests, lowest id on ties, until
  /// none is left), listed in `given`. Pages freed by shrinking demands or finished requests
  /// sit in the free pool until this is called: an engine calls it once per step, after the
  /// requests' `set_mandatory`, so the whole budget keeps buffering. Nothing happens without
  /// active requests. O(active log active).
  void distribute_free(std::vector<reclaimed_pages>& given) {
    given.clear();
    if (requests_.empty() || free_ == 0) return;
    double weight = 0;
    for (const auto& [id, r] : requests_) weight += static_cast<double>(r.length);
    std::size_t handed = 0;
    std::vector<std::pair<std::uint64_t, std::size_t>> share;  // (request, pages)
    share.reserve(requests_.size());
    for (const auto& [id, r] : requests_) {
      // In double as in take_proportionally; the floor never exceeds what is left.
      const double ideal = static_cast<double>(free_) * (static_cast<double>(r.length) / weight);
      const std::size_t n = std::min(free_ - handed, static_cast<std::size_t>(ideal));
      share.emplace_back(id, n);
      handed += n;
    }
    if (handed < free_) {  // the remainder (< active pages), one page each, longest first
      std::vector<std::size_t> order(share.size());  // indices into `share`, in id order
      std::iota(order.begin(), order.end(), std::size_t{0});
      std::vector<std::size_t> length;
      for (const auto& [id, r] : requests_) length.push_back(r.length);
      std::stable_sort(order.begin(), order.end(),
                       [&](std::size_t a, std::size_t b) { return length[a] > length[b]; });
      // (Floating-point floors can leave one page more than there are requests: wrap.)
      for (std::size_t i = 0; handed < free_; ++i, ++handed) {
        ++share[order[i % order.size()]].second;
      }
    }
    for (const auto& [id, n] : share) {
      if (n == 0) continue;
      requests_[id].buffer += n;
      given.push_back({id, n});
    }
    free_ = 0;
  }

  /// Ends `request`: all its pages return to the free pool. @throw out_of_range if unknown.
  void release(std::uint64_t request) {
    auto it = find(request, "release");
    free_ += it->second.mandatory + it->second.buffer;
    requests_.erase(it);
  }

 private:
  static constexpr std::uint64_t no_request = ~std::uint64_t{0};

  std::map<std::uint64_t, allocation>::iterator find(std::uint64_t request, const char* what) {
    auto it = requests_.find(request);
    detail::require<out_of_range>(it != requests_.end(), "buffer_elasticity::", what, ": request ",
                                  request, " is not active");
    return it;
  }
  std::map<std::uint64_t, allocation>::const_iterator find(std::uint64_t request,
                                                           const char* what) const {
    auto it = requests_.find(request);
    detail::require<out_of_range>(it != requests_.end(), "buffer_elasticity::", what, ": request ",
                                  request, " is not active");
    return it;
  }

  // Water-filling: each round gives every request with buffer left floor(want * length /
  // total length) pages, capped at its buffer; a round that rounds everything to zero takes
  // one page from the longest such request (lowest id on ties). The caller checked that
  // enough buffering pages exist.
  void take_proportionally(std::size_t want, std::uint64_t skip,
                           std::vector<reclaimed_pages>& taken) {
    std::map<std::uint64_t, std::size_t> took;
    while (want > 0) {
      // Summed in double: lengths are arbitrary size_t values, and an integer sum wrapped
      // (shares far off proportion, or a weight of 0 and a NaN share cast to size_t).
      double weight = 0;
      for (const auto& [id, r] : requests_) {
        weight += (id != skip && r.buffer > 0) ? static_cast<double>(r.length) : 0.0;
      }
      std::size_t round = 0;
      for (auto& [id, r] : requests_) {
        if (id == skip || r.buffer == 0) continue;
        // Lengths are > 0 (admit, set_mandatory), so weight > 0 and the ratio is in [0, 1];
        // the cap is applied in double so the cast never sees a value beyond it.
        const std::size_t cap = std::min(r.buffer, want - round);
        const double ideal = static_cast<double>(want) * (static_cast<double>(r.length) / weight);
        const std::size_t share =
            ideal >= static_cast<double>(cap) ? cap : static_cast<std::size_t>(ideal);
        r.buffer -= share;
        took[id] += share;
        round += share;
      }
      if (round == 0) {
        auto longest = requests_.end();
        for (auto it = requests_.begin(); it != requests_.end(); ++it) {
          if (it->first == skip || it->second.buffer == 0) continue;
          if (longest == requests_.end() || it->second.length > longest->second.length) {
            longest = it;
          }
        }
        --longest->second.buffer;
        ++took[longest->first];
        round = 1;
      }
      want -= round;
    }
    for (const auto& [id, n] : took) {
      if (n > 0) taken.push_back({id, n});
    }
  }

  std::size_t total_;
  std::size_t free_;
  std::map<std::uint64_t, allocation> requests_;  // ordered: reclaim is deterministic
};

/**
 * @brief Per-pair page limits of the listed requests: pair (i, h), KV head h of requests[i],
 *        gets pair_mandatory[i * kv_heads + h] plus buffer / kv_heads of the request's
 *        buffering pages (the first buffer % kv_heads heads one page more), so a request's
 *        limits add up to its allocation (mandatory + buffer) exactly.
 *
 * Call it after `set_mandatory(request, length, sum of its pairs' mandatory pages)` for every
 * listed request; give `limits[p]` to pair p's policy (`set_limit`) or upload it as the GPU
 * LRU's `limits`. kv_heads = pair_mandatory.size() / requests.size().
 *
 * @throw invalid_argument empty `requests`, pair_mandatory.size() not a non-zero multiple of
 *        requests.size(), limits.size() != pair_mandatory.size(), a request whose pairs'
 *        mandatory pages do not add up to its allocation's mandatory pages, or a limit that
 *        does not fit 32 bits (all checked before `limits` is written)
 * @throw out_of_range a request that is not active
 * @note O(pairs + requests log active). Reads `b` only: safe concurrently with other readers.
 */
inline void pair_page_limits(const buffer_elasticity& b, std::span<const std::uint64_t> requests,
                             std::span<const std::size_t> pair_mandatory,
                             std::span<std::uint32_t> limits) {
  detail::require(!requests.empty(), "pair_page_limits: expected at least one request, got 0");
  const std::size_t kv_heads = pair_mandatory.size() / requests.size();
  detail::require(kv_heads > 0 && pair_mandatory.size() % requests.size() == 0,
                  "pair_page_limits: expected requests x KV heads mandatory counts, got ",
                  pair_mandatory.size(), " for ", requests.size(), " requests");
  detail::require(limits.size() == pair_mandatory.size(), "pair_page_limits: expected ",
                  pair_mandatory.size(), " limits, got ", limits.size());
  constexpr std::size_t max_limit = std::numeric_limits<std::uint32_t>::max();
  for (std::size_t i = 0; i < requests.size(); ++i) {  // validate everything first
    const auto& a = b.allocation_of(requests[i]);
    std::size_t sum = 0;
    for (std::size_t h = 0; h < kv_heads; ++h) {
      sum = checked_add(sum, pair_mandatory[i * kv_heads + h], "pair_page_limits: mandatory pages");
    }
    detail::require(sum == a.mandatory, "pair_page_limits: request ", requests[i],
                    " has an allocation of ", a.mandatory,
                    " mandatory pages, its pairs' mandatory pages add up to ", sum);
    detail::require(a.mandatory <= max_limit && a.buffer <= max_limit - a.mandatory,
                    "pair_page_limits: request ", requests[i], "'s ", a.mandatory + a.buffer,
                    " pages do not fit a 32-bit limit");
  }
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const auto& a = b.allocation_of(requests[i]);
    for (std::size_t h = 0; h < kv_heads; ++h) {
      const std::size_t share = a.buffer / kv_heads + (h < a.buffer % kv_heads ? 1 : 0);
      limits[i * kv_heads + h] =
          static_cast<std::uint32_t>(pair_mandatory[i * kv_heads + h] + share);
    }
  }
}

}  // namespace kvsift
