#pragma once
// The bookkeeping every replacement policy shares: key <-> slot maps, deduplication and
// hit/miss classification of a step's selection, validation, and admission of misses into
// free slots (lowest slot first). A policy only decides which non-selected pages to evict.
//
// The page limit: a policy may hold at most `limit() <= capacity()` pages. Buffer elasticity
// moves pages between requests by changing their pairs' limits; a lowered limit is enforced at
// the next step, whose demand then covers the pages over the limit as well as the misses, so
// the policy's own rule picks what leaves. The slots stay addressable up to capacity(), so the
// GPU layout (a fixed stride of slots per pair) never moves.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/memory/replacement_policy.hpp"

namespace kvsift::detail {

class slot_cache {
 public:
  slot_cache() = default;
  // Validated in the first member initialiser, so bad sizes throw before anything sized by
  // them is allocated (a capacity of 2^40 threw bad_alloc instead of invalid_argument).
  slot_cache(std::size_t capacity, std::size_t keys, const char* who)
      : who_(validated(capacity, keys, who)),
        slot_of_(keys, invalid_id),
        key_of_(capacity, invalid_id),
        mark_(keys, 0),
        limit_(capacity) {}

  [[nodiscard]] std::size_t capacity() const noexcept { return key_of_.size(); }
  [[nodiscard]] std::size_t keys() const noexcept { return slot_of_.size(); }
  [[nodiscard]] std::size_t resident() const noexcept { return resident_; }
  [[nodiscard]] std::size_t limit() const noexcept { return limit_; }
  /// @throw invalid_argument if limit > capacity() (nothing changes).
  void set_limit(std::size_t limit) {
    require(limit <= capacity(), who_, "::set_limit: expected a page limit <= the capacity of ",
            capacity(), " slots, got ", limit);
    limit_ = limit;
  }
  /// Slot holding `key`, or invalid_id. @throw out_of_range for key >= keys().
  [[nodiscard]] id_t slot_of(id_t key) const {
    require<out_of_range>(key < slot_of_.size(), who_, "::slot_of: expected a page id < ",
                          slot_of_.size(), ", got ", key);
    return slot_of_[key];
  }
  [[nodiscard]] id_t key_in(std::size_t slot) const noexcept { return key_of_[slot]; }

  /// Validates `selected` and splits it into distinct hits (slots, `hit_slot` flags set) and
  /// distinct misses (first-appearance order). Changes no policy state on a throw.
  void classify(std::span<const id_t> selected) {
    for (std::size_t i = 0; i < selected.size(); ++i) {
      require<out_of_range>(selected[i] < slot_of_.size(), who_, "::step: expected page ids < ",
                            slot_of_.size(), ", got ", selected[i], " at position ", i);
    }
    ++epoch_;
    if (epoch_ == 0) {  // wrapped: old marks could alias
      std::fill(mark_.begin(), mark_.end(), 0);
      epoch_ = 1;
    }
    hits_.clear();
    misses_.clear();
    for (const id_t k : selected) {
      if (mark_[k] == epoch_) continue;
      mark_[k] = epoch_;
      (slot_of_[k] == invalid_id ? misses_ : hits_).push_back(k);
    }
    require(hits_.size() + misses_.size() <= limit_, who_, "::step: page demand of ",
            hits_.size() + misses_.size(), " distinct pages exceeds the page limit of ", limit_,
            " (capacity ", capacity(), " slots)");
    hit_slot_.assign(capacity(), 0);
    for (const id_t k : hits_) hit_slot_[slot_of_[k]] = 1;
  }

  [[nodiscard]] const std::vector<id_t>& hits() const noexcept { return hits_; }
  [[nodiscard]] const std::vector<id_t>& misses() const noexcept { return misses_; }
  [[nodiscard]] bool selected_slot(std::size_t s) const noexcept { return hit_slot_[s] != 0; }
  /// Evictions this step needs: the misses beyond the free pages under the limit, plus the
  /// pages a lowered limit left over it. Never more than the non-selected resident pages
  /// (classify checked hits + misses <= limit).
  [[nodiscard]] std::size_t demand() const noexcept {
    const std::size_t after = resident_ + misses_.size();
    return after > limit_ ? after - limit_ : 0;
  }

  void evict(std::size_t slot, replacement_step& out) {
    const id_t k = key_of_[slot];
    out.evicted_keys.push_back(k);
    out.evicted_slots.push_back(static_cast<id_t>(slot));
    slot_of_[k] = invalid_id;
    key_of_[slot] = invalid_id;
    --resident_;
  }

  /// Admits the misses into free slots, lowest slot first; `on_admit(slot)` lets the policy
  /// set its recency state.
  template <class F>
  void admit(replacement_step& out, F&& on_admit) {
    std::size_t slot = 0;
    for (const id_t k : misses_) {
      while (key_of_[slot] != invalid_id) ++slot;
      key_of_[slot] = k;
      slot_of_[k] = static_cast<id_t>(slot);
      ++resident_;
      out.admitted_keys.push_back(k);
      out.admitted_slots.push_back(static_cast<id_t>(slot));
      on_admit(slot);
    }
  }

 private:
  static const char* validated(std::size_t capacity, std::size_t keys, const char* who) {
    require(capacity > 0, who, ": capacity must be > 0, got 0");
    require(keys > 0, who, ": the number of logical pages must be > 0, got 0");
    require(keys < invalid_id && capacity < invalid_id, who,
            ": at most 2^32 - 2 pages and slots, got ", keys, " and ", capacity);
    return who;
  }

  const char* who_ = "";
  std::vector<id_t> slot_of_;  // key -> slot (the GPU page table of this head)
  std::vector<id_t> key_of_;   // slot -> key
  std::vector<std::uint32_t> mark_;
  std::uint32_t epoch_ = 0;
  std::size_t resident_ = 0;
  std::size_t limit_ = 0;
  std::vector<id_t> hits_, misses_;
  std::vector<std::uint8_t> hit_slot_;
};

/// The page-cache queries every replacement policy offers, answered by its slot_cache: a
/// policy derives from this and keeps only its eviction rule. Constructed before the
/// policy's own members, so bad sizes throw before the policy allocates anything.
class policy_pages {
 public:
  /// GPU slots of the pair.
  [[nodiscard]] std::size_t capacity() const noexcept { return cache_.capacity(); }
  /// Logical pages [0, keys()).
  [[nodiscard]] std::size_t keys() const noexcept { return cache_.keys(); }
  /// Pages held now.
  [[nodiscard]] std::size_t resident() const noexcept { return cache_.resident(); }
  /// Pages this policy may hold, <= capacity() (capacity() until set_limit).
  [[nodiscard]] std::size_t limit() const noexcept { return cache_.limit(); }
  /// Sets the page limit (buffer elasticity's per-pair share). A lower limit than resident()
  /// is enforced by the next step, which evicts the excess by the policy's rule. O(1).
  /// @throw invalid_argument if limit > capacity() (nothing changes).
  void set_limit(std::size_t limit) { cache_.set_limit(limit); }
  /// Slot holding `key`, or invalid_id. @throw out_of_range for key >= keys().
  [[nodiscard]] id_t slot_of(id_t key) const { return cache_.slot_of(key); }

 protected:
  /// @throw invalid_argument if capacity or keys is 0 (`who` names the policy).
  policy_pages(std::size_t capacity, std::size_t keys, const char* who)
      : cache_(capacity, keys, who) {}

  slot_cache cache_;
};

}  // namespace kvsift::detail
