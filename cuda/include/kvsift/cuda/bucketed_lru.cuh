#pragma once
// Bucketed LRU step for every (request, KV head) pair of a decode step in one launch: the GPU
// twin of <kvsift/memory/bucketed_lru.hpp>. One thread block per pair runs the CPU reference's
// passes (classify, age + histogram, threshold, evict with the lowest-slot tie rule, admit
// into the lowest free slots) with block-wide scans, so evictions and admissions are identical
// to the CPU's, entry for entry, on the same trace.
//
// Device-side errors (a page id out of range, more distinct selected pages than slots) are
// reported per pair in `status` and leave that pair's state unchanged; other pairs proceed.
//
// Thread safety: no state outside the arguments; concurrent calls need disjoint state.

#include <cuda_runtime.h>

#include <cstdint>

#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda {

/// Per-pair result code written to `lru_step_io::status`.
enum lru_status : int {
  lru_ok = 0,
  lru_page_out_of_range = 1,     ///< a selected page id >= pages (state unchanged)
  lru_demand_exceeds_buffer = 2  ///< distinct selected pages > capacity (state unchanged)
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
  static constexpr std::uint32_t max_capacity = 8192;
};

/// Inputs and outputs of one step, all device memory. Pair p's selection is
/// selected[offsets[p] .. offsets[p + 1]); its evictions / admissions go to the same index range
/// of the four output arrays (never more entries than its selection), in the CPU's order.
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
};

/**
 * @brief One bucketed LRU step for all pairs: one launch, one block of 512 threads per pair.
 * @param buckets age buckets, in [2, 256] (the CPU reference's `Buckets`)
 * @throw kvsift::invalid_argument null pointers, capacity 0 or > max_capacity, pages 0 or
 *        >= 2^31, buckets outside [2, 256] (a zero-bucket timestamp range included)
 * @throw kvsift::cuda_error the launch failed
 * @note O(capacity + |selection|) per pair; pairs == 0 launches nothing. Asynchronous.
 */
void bucketed_lru_step(const bucketed_lru_ref& state, const lru_step_io& io, int buckets,
                       cudaStream_t stream);

}  // namespace kvsift::cuda

#include <kvsift/cuda/detail/bucketed_lru.inl>
