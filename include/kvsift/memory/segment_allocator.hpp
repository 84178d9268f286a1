#pragma once
// A fixed pool of equally sized segments handed out by a bitmap allocator: one bit per
// segment, so the bookkeeping of a pool of N segments is N/8 bytes and nothing is allocated
// after construction (the page table's second level lives in such a pool).

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvsift/core/error.hpp"

namespace kvsift {

/// Every segment (or page) of a pre-allocated pool is in use.
class pool_exhausted : public invalid_argument {
 public:
  using invalid_argument::invalid_argument;
};

/// Bitmap allocator over segment ids [0, capacity). Allocation is next-fit: the lowest free id
/// at or after the one after the last allocated, wrapping around, so a freshly freed id is not
/// reused while other ids are free (a stale reference then fails loudly as a double free
/// instead of aliasing new data). The hint used to be a word index, so an id freed in the
/// current word came back at once; the documented intent is kept and the code now matches it.
/// Thread safety: const members safe concurrently; allocate/release need external locking.
class segment_allocator {
 public:
  segment_allocator() = default;

  /// @throw invalid_argument if capacity == 0.
  explicit segment_allocator(std::size_t capacity)
      : capacity_(capacity), free_(capacity), words_((capacity + 63) / 64, ~std::uint64_t{0}) {
    detail::require(capacity > 0, "segment_allocator: capacity must be > 0, got 0");
    // Bits past the end of the pool stay 0 (never free).
    if (const std::size_t tail = capacity % 64; tail != 0) {
      words_.back() = (std::uint64_t{1} << tail) - 1;
    }
  }

  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::size_t free_count() const noexcept { return free_; }
  [[nodiscard]] std::size_t used_count() const noexcept { return capacity_ - free_; }
  /// Bytes of bookkeeping (the bitmap).
  [[nodiscard]] std::size_t metadata_bytes() const noexcept {
    return words_.size() * sizeof(std::uint64_t);
  }

  /// True if `id` is allocated. @throw out_of_range if id >= capacity.
  [[nodiscard]] bool in_use(std::size_t id) const {
    check(id, "in_use");
    return (words_[id / 64] >> (id % 64) & 1u) == 0;
  }

  /// Takes a free segment (next-fit, see the class comment). O(capacity / 64) worst case,
  /// O(1) typical. @throw pool_exhausted if every segment is in use (nothing changes).
  [[nodiscard]] std::size_t allocate() {
    detail::require<pool_exhausted>(free_ > 0, "segment_allocator: pool exhausted, all ", capacity_,
                                    " segments in use");
    const std::size_t n = words_.size();
    const std::size_t w0 = hint_ / 64;
    // Bits at or after the hint in its own word first, then the following words, then (after
    // wrapping around) the low bits of the hint's word.
    const std::uint64_t high = ~std::uint64_t{0} << (hint_ % 64);
    for (std::size_t i = 0; i <= n; ++i) {
      const std::size_t w = (w0 + i) % n;
      const std::uint64_t mask = i == 0 ? high : (i == n ? ~high : ~std::uint64_t{0});
      const std::uint64_t avail = words_[w] & mask;
      if (avail != 0) {
        const auto bit = static_cast<std::size_t>(std::countr_zero(avail));
        words_[w] &= ~(std::uint64_t{1} << bit);
        --free_;
        const std::size_t id = w * 64 + bit;
        hint_ = id + 1 == capacity_ ? 0 : id + 1;
        return id;
      }
    }
    detail::fail<pool_exhausted>("segment_allocator: bitmap inconsistent");  // unreachable
  }

  /// Returns `id` to the pool. O(1).
  /// @throw out_of_range if id >= capacity; invalid_argument on a double free.
  void release(std::size_t id) {
    check(id, "release");
    auto& word = words_[id / 64];
    const std::uint64_t bit = std::uint64_t{1} << (id % 64);
    detail::require((word & bit) == 0, "segment_allocator::release: double free of segment ", id,
                    " (expected an allocated segment, got a free one)");
    word |= bit;
    ++free_;
  }

 private:
  void check(std::size_t id, const char* what) const {
    detail::require<out_of_range>(id < capacity_, "segment_allocator::", what,
                                  ": expected a segment id < ", capacity_, ", got ", id);
  }

  std::size_t capacity_ = 0;
  std::size_t free_ = 0;
  std::size_t hint_ = 0;              // the id after the last allocated: where next-fit starts
  std::vector<std::uint64_t> words_;  // bit set = free
};

}  // namespace kvsift
