#pragma once
// The ReplacementPolicy concept and the per-step result every policy produces.
//
// A policy manages the GPU pages (slots) of one (request, KV head): `capacity` slots holding
// logical pages (keys) in [0, keys). Each decode step it receives the pages selected for the
// step, classifies them as hits or misses, evicts as many resident pages as the misses need
// (never a page selected this step) and admits the misses into the freed slots.

#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

#include "kvsift/core/ids.hpp"

namespace kvsift {

/// What one step did. Evictions are listed in ascending slot order, admissions in the order
/// the missed pages first appear in the step's selection, so two implementations of the same
/// policy (CPU and CUDA) can be compared entry by entry.
struct replacement_step {
  std::size_t hits = 0;              ///< distinct selected pages already resident
  std::vector<id_t> evicted_keys;    ///< pages evicted this step ...
  std::vector<id_t> evicted_slots;   ///< ... and the slots they freed
  std::vector<id_t> admitted_keys;   ///< missed pages now resident ...
  std::vector<id_t> admitted_slots;  ///< ... in these slots (copy destinations)

  [[nodiscard]] std::size_t misses() const noexcept { return admitted_keys.size(); }
  void clear() noexcept {
    hits = 0;
    evicted_keys.clear();
    evicted_slots.clear();
    admitted_keys.clear();
    admitted_slots.clear();
  }
};

/// A page replacement policy for one (request, KV head). `step` validates its input before
/// any state changes (out-of-range page ids, more distinct pages than slots, a selection
/// that does not match an offline policy's trace).
template <class P>
concept ReplacementPolicy = requires(P& p, const P& cp, std::span<const id_t> selected,
                                     replacement_step& out, id_t key) {
  { p.step(selected, out) } -> std::same_as<void>;
  { cp.capacity() } -> std::convertible_to<std::size_t>;
  { cp.keys() } -> std::convertible_to<std::size_t>;
  { cp.resident() } -> std::convertible_to<std::size_t>;
  { cp.slot_of(key) } -> std::convertible_to<id_t>;
};

}  // namespace kvsift
