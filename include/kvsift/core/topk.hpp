#pragma once
// Bounded top-k selection by rank key (larger is better; ties: lower id wins). Used by exact
// scans and the kNN engine; a binary heap whose top is the current worst keeps each rejected
// candidate at one comparison.

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kvsift/core/ids.hpp"

namespace kvsift {

struct scored_id {
  float key;
  id_t id;
};

/// Strict "a ranks before b": higher key, then lower id.
inline bool ranks_before(const scored_id& a, const scored_id& b) noexcept {
  return a.key > b.key || (a.key == b.key && a.id < b.id);
}

namespace detail {
/// `ranks_before` as a function object, for std::sort and the heap algorithms: they inline it.
/// Given the function pointer, GCC 12 emitted a call per comparison (`kvsift::ranks_before`
/// showed as a function of its own in build and insert profiles).
struct rank_order {
  bool operator()(const scored_id& a, const scored_id& b) const noexcept {
    return ranks_before(a, b);
  }
};
}  // namespace detail

/// Keeps the k best of a stream. Not thread-safe. O(log k) per accepted push.
class topk_selector {
 public:
  topk_selector() = default;
  explicit topk_selector(std::size_t k) { reset(k); }

  /// Empties the selector and keeps the k best from now on; k == 0 keeps nothing. The
  /// reservation is bounded (a hint: the heap grows as needed), so a huge k neither throws
  /// length_error nor reserves gigabytes; callers that know n pass min(k, n). O(1) amortised.
  void reset(std::size_t k) {
    k_ = k;
    heap_.clear();
    heap_.reserve(std::min(k, max_reserved));
  }

  /// True if (key, id) would be kept now; cheap pre-filter for hot loops. Always false for
  /// k == 0 (there is no worst kept entry to compare with).
  [[nodiscard]] bool accepts(float key, id_t id) const noexcept {
    return heap_.size() < k_ || (k_ != 0 && ranks_before(scored_id{key, id}, heap_.front()));
  }

  void push(float key, id_t id) {
    if (k_ == 0) return;
    const scored_id s{key, id};
    if (heap_.size() < k_) {
      heap_.push_back(s);
      std::push_heap(heap_.begin(), heap_.end(), detail::rank_order{});
    } else if (ranks_before(s, heap_.front())) {
      std::pop_heap(heap_.begin(), heap_.end(), detail::rank_order{});
      heap_.back() = s;
      std::push_heap(heap_.begin(), heap_.end(), detail::rank_order{});
    }
  }

  [[nodiscard]] std::size_t size() const noexcept { return heap_.size(); }
  /// Worst key kept (valid when size() == k > 0).
  [[nodiscard]] float threshold() const noexcept { return heap_.front().key; }

  /// Sorted best-first; empties the selector. O(k log k).
  std::vector<scored_id>& sorted() {
    std::sort_heap(heap_.begin(), heap_.end(), detail::rank_order{});
    return heap_;
  }

 private:
  static constexpr std::size_t max_reserved = std::size_t{1} << 20;

  std::size_t k_ = 0;
  std::vector<scored_id> heap_;
};

}  // namespace kvsift
