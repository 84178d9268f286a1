#pragma once
// Bucketed LRU step for every (request, KV head) pair of a decode step in one launch: the GPU
// twin of <kvsift/memory/bucketed_lru.hpp>. One thread block per pair runs the CPU reference's
// passes (classify, age + histogram, threshold, evict with the lowest-slot tie rule, admit
// into the lowest free slots) with block-wide scans, so evictions and admissions are identical
// to the CPU's, entry for entry, on the same trace.
//
// Per-pair page limits (buffer elasticity's shares, `kvsift::pair_page_limits`): every pair
// has `capacity` slots, but pair p may hold at most limits[p] pages; a lowered limit is
// enforced by the next step, which evicts the excess by the same rule (the CPU's `set_limit`).
//
// Device-side errors (a page id out of range, more distinct selected pages than the pair's
// limit, a limit above the capacity) are reported per pair in `status` and leave that pair's
// state unchanged; other pairs proceed.
//
// Thread safety: no state outside the arguments; concurrent calls need disjoint state.

#include <cuda_runtime.h>

#include <cstdint>

#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda {

/// Per-pair result code written to `lru_step_io::status`.
enum lru_status : int {
  lru_ok = 0,
  lru_page_out_of_range = 1,      ///< a selected page id >= pages (state unchanged)
  lru_demand_exceeds_buffer = 2,  ///< distinct selected pages > the pair's limit (unchanged)
  lru_limit_out_of_range = 3      ///< limits[pair] > capacity (state unchanged)
};

/// Device state of `pairs` bucketed LRUs (row-major by pair). Initialise `keys` and `slot_of`
/// to 0xFF bytes (empty) and `ages` to 0. Trivially copyable.
struct bucketed_lru_ref {
  std::uint32_t* keys = nullptr;     ///< [pairs][capacity]: page in each slot, ~0u if free
  std::uint8_t* ages = nullptr;      ///< [pairs][capacity]: age bucket, 0 = newest
  std::uint32_t* slot_of = nullptr;  ///< [pairs][pages]: GPU page table, ~0u if not resident
  std::uint32_t pairs = 0;
  std::uint32_t capacity = 0;  ///< GPU pages per pair, <= max_capacity
  std::uint32_t pages = 0;     ///< logical pages per pair, < 2^31
  /// [pairs] or null: pages pair p may hold, <= capacity (device or pinned memory, read once
  /// per step; null: every pair may fill its capacity)
  const std::uint32_t* limits = nullptr;
  static constexpr std::uint32_t max_capacity = 8192;
};

/// Inputs and outputs of one step, all device memory. Pair p's selection is
/// selected[offsets[p] .. offsets[p + 1]); its admissions go to the same index range of the
/// admission arrays (never more entries than its selection), its evictions to that range too
/// or, with `eviction_stride`, to their own range (see there), in the CPU's order.
struct lru_step_io {
  const std::uint32_t* selected = nullptr;
  /// [pairs + 1], non-decreasing, each pair's selection < 2^31 entries (device data: not
  /// checked)
  const std::uint64_t* offsets = nullptr;
  std::uint32_t* evicted_keys = nullptr;
  std::uint32_t* evicted_slots = nullptr;
  std::uint32_t* admitted_keys = nullptr;
  std::uint32_t* admitted_slots = nullptr;
  std::uint32_t* counts = nullptr;  ///< [pairs][3]: hits, evictions, admissions
  int* status = nullptr;            ///< [pairs]: lru_status
  /// 0: pair p's evictions go to its selection's range (there are never more of them than
  /// selected pages while no limit falls). Otherwise pair p's evictions go to
  /// [p * eviction_stride, ...): required, >= capacity, with `limits`, since a lowered limit
  /// can evict more pages than the pair selects (up to capacity).
  std::uint64_t eviction_stride = 0;
};

/**
 * @brief One bucketed LRU step for all pairs: one launch, one block of 512 threads per pair.
 * @param buckets age buckets, in [2, 256] (the CPU reference's `Buckets`)
 * @throw kvsift::invalid_argument null pointers, capacity 0 or > max_capacity, pages 0 or
 *        >= 2^31, buckets outside [2, 256] (a zero-bucket timestamp range included), limits
 *        without an eviction_stride >= capacity, or an eviction_stride below the capacity,
 *        a stream or pointer of another device than the current one (limits: or pageable host
 *        memory)
 * @throw kvsift::cuda_error the launch failed
 * @note O(capacity + |selection|) per pair; pairs == 0 launches nothing. Asynchronous: the
 *       limits are read by the kernel, so they may change for the next step once it has run.
 */
void bucketed_lru_step(const bucketed_lru_ref& state, const lru_step_io& io, int buckets,
                       cudaStream_t stream);

}  // namespace kvsift::cuda

#include <kvsift/cuda/detail/bucketed_lru.inl>
