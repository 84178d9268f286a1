#pragma once
// Predicates for filtered search. A predicate answers "may this id be returned?"; ids that
// fail are never scored or returned but are still walked through (2-hop expansion), so a
// restrictive filter does not disconnect the graph.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"

namespace kvsift {

/// `p(id) -> bool`. Optionally `p.validate(n)` throws if the predicate refers to ids >= n;
/// searches call it before doing any work.
template <class P>
concept Predicate = std::copy_constructible<P> && requires(const P& p, id_t id) {
  { p(id) } -> std::convertible_to<bool>;
};

/// Calls `p.validate(n)` when the predicate has one.
template <Predicate P>
void validate_predicate(const P& p, std::size_t n) {
  if constexpr (requires { p.validate(n); }) p.validate(n);
}

/// Accepts everything; searches compile the filtering code away for it.
struct no_filter {
  constexpr bool operator()(id_t) const noexcept { return true; }
};

/// Accepts ids < prefix_len: attention over a reused prefix of prefix_len tokens.
struct id_below {
  std::size_t prefix_len = 0;
  constexpr bool operator()(id_t id) const noexcept { return id < prefix_len; }
  /// @throw out_of_range if prefix_len == 0 or prefix_len > n.
  void validate(std::size_t n) const {
    detail::require<out_of_range>(prefix_len > 0 && prefix_len <= n,
                                  "id_below: expected prefix_len in [1, ", n, "], got ",
                                  prefix_len);
  }
};

/// Accepts ids in [first, last).
struct id_range {
  std::size_t first = 0;
  std::size_t last = 0;
  constexpr bool operator()(id_t id) const noexcept { return id >= first && id < last; }
  /// @throw out_of_range unless first < last <= n.
  void validate(std::size_t n) const {
    detail::require<out_of_range>(first < last && last <= n, "id_range: expected 0 <= first < ",
                                  "last <= ", n, ", got [", first, ", ", last, ")");
  }
};

/// Accepts an explicit set of ids (a bitmap: O(1) test, n/8 bytes).
class id_allow_list {
 public:
  id_allow_list() = default;
  /// @param universe number of ids the set ranges over (the index size).
  /// @throw out_of_range if an id >= universe.
  id_allow_list(const std::vector<id_t>& ids, std::size_t universe) : bits_(universe, false) {
    for (id_t id : ids) {
      detail::require<out_of_range>(id < universe, "id_allow_list: expected ids < ", universe,
                                    ", got ", id);
      bits_[id] = true;
    }
  }
  bool operator()(id_t id) const noexcept { return id < bits_.size() && bits_[id]; }
  /// @throw out_of_range if the list was built for a different universe than n.
  void validate(std::size_t n) const {
    detail::require<out_of_range>(bits_.size() == n, "id_allow_list: built for ", bits_.size(),
                                  " ids, index has ", n);
  }

 private:
  std::vector<bool> bits_;
};

/// Accepts the ids whose byte in a borrowed mask is nonzero: one byte per id, the layout of a
/// NumPy or torch bool array, so a caller's mask is used without building a bitmap. Ids beyond
/// the mask are refused, so even an unvalidated use never reads past it. The mask is not
/// copied: it must outlive the searches that use it and not change during one.
/// Complexity: O(1) per test. Thread safety: const, safe to share between searches.
class id_mask {
 public:
  id_mask() = default;
  explicit id_mask(std::span<const std::uint8_t> mask) noexcept : mask_(mask) {}
  bool operator()(id_t id) const noexcept { return id < mask_.size() && mask_[id] != 0; }
  /// @throw dimension_mismatch unless the mask has exactly one entry per id (n).
  void validate(std::size_t n) const {
    detail::require<dimension_mismatch>(mask_.size() == n, "id_mask: expected ", n,
                                        " entries (one per id), got ", mask_.size());
  }
  [[nodiscard]] std::span<const std::uint8_t> mask() const noexcept { return mask_; }

 private:
  std::span<const std::uint8_t> mask_;
};

static_assert(Predicate<no_filter> && Predicate<id_below> && Predicate<id_range> &&
              Predicate<id_allow_list> && Predicate<id_mask>);

}  // namespace kvsift
