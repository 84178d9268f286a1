#pragma once
// Buffer elasticity (Spin): the GPU page budget shared by the active requests. A request's
// allocation is its mandatory pages (what this step's selection needs, never taken away)
// plus buffering pages (recently used pages kept to raise the hit ratio). A new request is
// admitted only if both its mandatory and its buffering pages fit in the free pages; when a
// request's mandatory demand grows beyond the free pages, buffering pages are reclaimed from
// the active requests in proportion to their length (a longer request, with more pages to
// choose from, gives more back).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

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

}  // namespace kvsift
