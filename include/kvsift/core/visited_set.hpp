#pragma once
// Visited set as a bitset with a list of the words it dirtied. One bit per id: a workspace over
// a 131072-key index holds 24 KiB (16 KiB of bits and 8 KiB of word indices) where 16-bit epoch
// tags took 256 KiB, and 1.5 MiB against 16 MiB at 2^23 keys; an engine keeps one per thread.
// Clearing costs the words the last search touched, not O(n), which matters when one workspace
// serves millions of short searches over a large index. Search and build speed were the same
// with either set on the H200 host (docs/algorithms.md, "CPU build speed").

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

  /// Empties the set and makes room for ids < n. O(words the last search dirtied) unless n
  /// grows. @throw std::bad_alloc / std::length_error when n's bitset cannot be allocated.
  void reset(std::size_t n) {
    for (std::size_t i = 0; i < dirty_count_; ++i) bits_[dirty_[i]] = 0;
    dirty_count_ = 0;
    const std::size_t words = n / 64 + (n % 64 != 0 ? 1 : 0);
    if (bits_.size() < words) {
      // The dirty list first, sized to every word so that recording one never reallocates: if
      // the bitset's growth then throws, the list still covers every word the set can hold.
      dirty_.resize(words);
      bits_.resize(words, 0);
    }
  }

  [[nodiscard]] bool contains(id_t id) const noexcept { return (bits_[id / 64] >> (id % 64)) & 1u; }
  void insert(id_t id) noexcept { try_insert(id); }
  /// Inserts and reports whether the id was new. O(1).
  bool try_insert(id_t id) noexcept {
    std::uint64_t& w = bits_[id / 64];
    const std::uint64_t bit = std::uint64_t{1} << (id % 64);
    if ((w & bit) != 0) return false;
    if (w == 0) dirty_[dirty_count_++] = static_cast<std::uint32_t>(id / 64);
    w |= bit;
    return true;
  }
  /// Ids the set can hold without growing (a multiple of 64).
  [[nodiscard]] std::size_t capacity() const noexcept { return bits_.size() * 64; }

 private:
  std::vector<std::uint64_t> bits_;
  std::vector<std::uint32_t> dirty_;  ///< indices of the words set since the last reset
  std::size_t dirty_count_ = 0;
};

}  // namespace kvsift
