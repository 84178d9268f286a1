#pragma once
// Bounded, sorted candidate pool for best-first graph search (the "L" pool of beam search).
// Sorted array + binary-search insertion beats a pair of heaps for the pool sizes used here
// (tens to a few thousand): memmove is cheap and the "closest unexpanded" cursor is O(1)
// amortised. At large pools the tail moves add up (8% of a build's CPU time at L = 500), so a
// search can also hand over one expansion's candidates at once (`insert_batch`): one merge.

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"

namespace kvsift {

/// A scored candidate; `key` is a rank key (larger is better, see `to_key`).
struct candidate {
  float key;
  id_t id;
  bool expanded;
};

/// Keeps the `capacity` best candidates by key (ties: lower id first), with a cursor to the
/// best not-yet-expanded one. Not thread-safe; one per search workspace.
class candidate_pool {
 public:
  candidate_pool() = default;
  explicit candidate_pool(std::size_t capacity) { reset(capacity); }

  /// Empties the pool and sets its capacity. O(1) amortised.
  /// @throw invalid_argument if capacity == 0.
  void reset(std::size_t capacity) {
    detail::require(capacity > 0, "candidate_pool: capacity must be > 0, got 0");
    capacity_ = capacity;
    data_.clear();
    // The reservation is a hint, bounded so that a huge capacity (a pool of L = 2^62 for a
    // small index) neither wraps capacity + 1 nor throws length_error; beyond the bound the
    // vector grows as candidates arrive, and a search never holds more than the index size.
    data_.reserve(std::min(capacity, max_reserved) + 1);
    cursor_ = 0;
  }

  /// Inserts unless the pool is full and `key` is not better than the worst. O(capacity).
  /// The caller guarantees `id` is not already present (a visited set does that).
  /// @return true if inserted.
  bool insert(float key, id_t id) {
    if (!admits(key, id)) return false;
    auto it = std::upper_bound(data_.begin(), data_.end(), candidate{key, id, false}, order);
    const auto pos = static_cast<std::size_t>(it - data_.begin());
    data_.insert(it, candidate{key, id, false});
    if (data_.size() > capacity_) data_.pop_back();
    if (pos < cursor_) cursor_ = pos;
    return true;
  }

  /// Whether `insert(key, id)` would keep the candidate now. O(1).
  [[nodiscard]] bool admits(float key, id_t id) const noexcept {
    return data_.size() < capacity_ || better(key, id, data_.back());
  }

  /// Inserts a batch of candidates at once, leaving the pool as inserting them one by one would
  /// (the best `capacity` of everything held and given, the cursor at the best unexpanded), but
  /// moving each held candidate at most once, in one backward merge, instead of moving the tail
  /// once per insert. Reorders `batch`; its `expanded` flags are ignored (a new candidate is
  /// unexpanded). The caller guarantees the ids are distinct and not held.
  /// O(b log b + capacity) for a batch of b (quadratic insertion sort only up to b = 64).
  void insert_batch(std::span<candidate> batch) {
    const std::size_t nb = batch.size();
    if (nb == 0) return;
    // Best first. A batch is usually one expansion's admitted neighbours, a few dozen at most,
    // where insertion sort beat std::sort (0.82x against 0.87x of the one-by-one search's
    // latency on the committed sample, development machine); a long list of seeds gets
    // std::sort.
    if (nb > 64) {
      std::sort(batch.begin(), batch.end(), order);
    } else {
      for (std::size_t i = 1; i < nb; ++i) {
        const candidate c = batch[i];
        std::size_t j = i;
        for (; j > 0 && order(c, batch[j - 1]); --j) batch[j] = batch[j - 1];
        batch[j] = c;
      }
    }
    const std::size_t held = data_.size();
    const std::size_t total = std::min(capacity_, held + nb);
    data_.resize(total);
    // From the back: slot i + j is where the next candidate (held[i - 1] or batch[j - 1],
    // whichever is worse) ends; slots at or past `total` are the candidates that drop out.
    std::size_t i = held, j = nb;
    while (j > 0) {
      const candidate& c = batch[j - 1];
      for (; i > 0 && order(c, data_[i - 1]); --i) {
        if (i + j - 1 < total) data_[i + j - 1] = data_[i - 1];
      }
      if (i + j - 1 < total) data_[i + j - 1] = candidate{c.key, c.id, false};
      --j;
    }
    // batch[0] ended at slot i: the best position any insert took.
    if (i < total && i < cursor_) cursor_ = i;
  }

  [[nodiscard]] bool has_unexpanded() const noexcept { return cursor_ < data_.size(); }
  /// An unexpanded candidate among the best `limit`. O(1).
  [[nodiscard]] bool has_unexpanded(std::size_t limit) const noexcept {
    return cursor_ < std::min(data_.size(), limit);
  }

  /// The best unexpanded candidate, left in place. Precondition: has_unexpanded().
  [[nodiscard]] const candidate& peek_unexpanded() const noexcept { return data_[cursor_]; }

  /// Marks the best unexpanded candidate expanded and returns it. Precondition:
  /// has_unexpanded().
  candidate pop_unexpanded() noexcept {
    candidate& c = data_[cursor_];
    c.expanded = true;
    const candidate out = c;
    while (cursor_ < data_.size() && data_[cursor_].expanded) ++cursor_;
    return out;
  }

  [[nodiscard]] std::size_t size() const noexcept { return data_.size(); }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] bool full() const noexcept { return data_.size() == capacity_; }
  [[nodiscard]] const candidate& operator[](std::size_t i) const noexcept { return data_[i]; }
  /// Worst key held (only meaningful when non-empty).
  [[nodiscard]] float worst_key() const noexcept { return data_.back().key; }

 private:
  static bool better(float key, id_t id, const candidate& b) noexcept {
    return key > b.key || (key == b.key && id < b.id);
  }
  static bool order(const candidate& a, const candidate& b) noexcept {
    return better(a.key, a.id, b);
  }

  static constexpr std::size_t max_reserved = std::size_t{1} << 20;

  std::vector<candidate> data_;
  std::size_t capacity_ = 0;
  std::size_t cursor_ = 0;
};

}  // namespace kvsift
