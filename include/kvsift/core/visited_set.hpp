#pragma once
// Epoch-tagged visited set: clearing is O(1) (bump the epoch) instead of O(n) per query,
// which matters when one workspace serves millions of short searches.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvsift/core/ids.hpp"

namespace kvsift {

/// Membership over ids [0, size). Not thread-safe; one per search workspace.
class visited_set {
 public:
  visited_set() = default;
  explicit visited_set(std::size_t n) { reset(n); }

  /// Empties the set and makes room for ids < n. O(1) unless n grows or the epoch wraps.
  void reset(std::size_t n) {
    if (tags_.size() < n) tags_.resize(n, 0);
    if (++epoch_ == 0) {  // wrapped: old tags could alias the new epoch
      std::fill(tags_.begin(), tags_.end(), 0);
      epoch_ = 1;
    }
  }

  [[nodiscard]] bool contains(id_t id) const noexcept { return tags_[id] == epoch_; }
  void insert(id_t id) noexcept { tags_[id] = epoch_; }
  /// Inserts and reports whether the id was new. O(1).
  bool try_insert(id_t id) noexcept {
    if (tags_[id] == epoch_) return false;
    tags_[id] = epoch_;
    return true;
  }
  [[nodiscard]] std::size_t capacity() const noexcept { return tags_.size(); }

 private:
  std::vector<std::uint16_t> tags_;
  std::uint16_t epoch_ = 0;
};

}  // namespace kvsift
