#pragma once
// Kernel and host dispatch behind <kvsift/cuda/bucketed_lru.cuh> (internal).

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include <kvsift/core/error.hpp>
#include <kvsift/cuda/detail/device_buffer.cuh>
#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda::detail {

inline constexpr int lru_threads = 512;
inline constexpr std::uint32_t lru_empty = ~0u;
inline constexpr std::uint32_t lru_pending = 0x80000000u;  // | selection index: claimed miss

// Three 21-bit counters packed in one 64-bit scan element (capacity <= 8192 < 2^21).
__device__ __forceinline__ std::uint64_t pack3(std::uint32_t a, std::uint32_t b, std::uint32_t c) {
  return std::uint64_t{a} | std::uint64_t{b} << 21 | std::uint64_t{c} << 42;
}
__device__ __forceinline__ std::uint32_t field(std::uint64_t v, int i) {
  return static_cast<std::uint32_t>(v >> (21 * i)) & 0x1fffffu;
}

// A template (instantiated for lru_threads only), so that this header-only kernel has one
// definition however many translation units include bucketed_lru.cuh: as a plain __global__
// function, two including units failed to link (multiple definition).
template <int Threads>
__global__ void __launch_bounds__(Threads)
    bucketed_lru_kernel(bucketed_lru_ref st, lru_step_io io, int buckets) {
  static_assert(Threads == lru_threads, "the body's scans are sized by lru_threads");
  using scan_u32 = cub::BlockScan<std::uint32_t, lru_threads>;
  using scan_u64 = cub::BlockScan<std::uint64_t, lru_threads>;
  __shared__ union {
    typename scan_u32::TempStorage u32;
    typename scan_u64::TempStorage u64;
  } scan_tmp;
  __shared__ std::uint32_t hist[256];
  __shared__ std::uint32_t threshold, at_threshold, need;
  extern __shared__ std::uint32_t dyn[];
  std::uint32_t* free_list = dyn;                                  // [capacity]
  auto* hit = reinterpret_cast<std::uint8_t*>(dyn + st.capacity);  // [capacity]

  const std::uint32_t pair = blockIdx.x;
  const std::uint64_t off = io.offsets[pair];
  const auto n = static_cast<std::uint32_t>(io.offsets[pair + 1] - off);
  const std::uint32_t* sel = io.selected + off;
  const std::uint64_t ev_off = io.eviction_stride != 0 ? pair * io.eviction_stride : off;
  std::uint32_t* keys = st.keys + std::uint64_t{pair} * st.capacity;
  std::uint8_t* ages = st.ages + std::uint64_t{pair} * st.capacity;
  std::uint32_t* slot_of = st.slot_of + std::uint64_t{pair} * st.pages;
  const std::uint32_t tid = threadIdx.x;

  // 1. Validate the limit and the ids before touching any state.
  const std::uint32_t limit = st.limits != nullptr ? st.limits[pair] : st.capacity;
  if (limit > st.capacity) {  // uniform across the block: every thread returns
    if (tid == 0) io.status[pair] = lru_limit_out_of_range;
    return;
  }
  bool bad = false;
  for (std::uint32_t i = tid; i < n; i += lru_threads) bad |= sel[i] >= st.pages;
  if (__syncthreads_or(bad)) {
    if (tid == 0) io.status[pair] = lru_page_out_of_range;
    return;
  }
  for (std::uint32_t s = tid; s < st.capacity; s += lru_threads) hit[s] = 0;
  for (std::uint32_t b = tid; b < 256; b += lru_threads) hist[b] = 0;
  __syncthreads();

  // 2. Classify: hits flag their slot; each missed page is claimed by its first position.
  for (std::uint32_t i = tid; i < n; i += lru_threads) {
    const std::uint32_t k = sel[i];
    const std::uint32_t s = slot_of[k];
    if (s < lru_pending) {
      hit[s] = 1;
    } else {
      atomicMin(&slot_of[k], lru_pending | i);
    }
  }
  __syncthreads();

  // 3. Rank the distinct misses in first-appearance order (= the CPU's admission order).
  std::uint32_t misses = 0;
  for (std::uint32_t base = 0; base < n; base += lru_threads) {
    const std::uint32_t i = base + tid;
    const bool first = i < n && slot_of[sel[i]] == (lru_pending | i);
    std::uint32_t rank = 0, total = 0;
    scan_u32(scan_tmp.u32).ExclusiveSum(first ? 1u : 0u, rank, total);
    if (first) io.admitted_keys[off + misses + rank] = sel[i];
    misses += total;
    __syncthreads();
  }
  std::uint32_t hits = 0;
  for (std::uint32_t base = 0; base < st.capacity; base += lru_threads) {
    const std::uint32_t s = base + tid;
    hits += __syncthreads_count(s < st.capacity && hit[s] != 0);
  }
  if (hits + misses > limit) {  // undo the claims: the state is unchanged
    for (std::uint32_t i = tid; i < n; i += lru_threads) {
      if (slot_of[sel[i]] == (lru_pending | i)) slot_of[sel[i]] = lru_empty;
    }
    if (tid == 0) io.status[pair] = lru_demand_exceeds_buffer;
    return;
  }

  // 4. Age (hits to the newest bucket, others +1 saturating) and histogram the evictable.
  std::uint32_t free_slots = 0;
  for (std::uint32_t base = 0; base < st.capacity; base += lru_threads) {
    const std::uint32_t s = base + tid;
    bool empty = false;
    if (s < st.capacity) {
      if (keys[s] == lru_empty) {
        empty = true;
      } else if (hit[s]) {
        ages[s] = 0;
      } else {
        const std::uint32_t a0 = ages[s] + 1u;
        const std::uint32_t a = a0 < static_cast<std::uint32_t>(buckets) ? a0 : buckets - 1u;
        ages[s] = static_cast<std::uint8_t>(a);
        atomicAdd(&hist[a], 1u);
      }
    }
    free_slots += __syncthreads_count(empty);
  }
  // 5. Smallest recency threshold (largest age) whose cumulative count covers the demand:
  // the misses beyond the free pages under the limit plus what a lowered limit left over it.
  // need <= the evictable pages, since hits + misses <= limit.
  if (tid == 0) {
    const std::uint32_t after = st.capacity - free_slots + misses;
    need = after > limit ? after - limit : 0;
    std::uint32_t t = buckets;  // no page is older than buckets - 1: nothing evicted
    std::uint32_t older = 0;
    if (need > 0) {
      while (older + hist[t - 1] < need) older += hist[--t];
      --t;
    }
    threshold = t;
    at_threshold = need - older;
  }
  __syncthreads();

  // 6. Evict (ascending slot; in the threshold bucket the lowest slots) and list free slots.
  std::uint64_t running = 0;  // packed: older evictable, threshold-bucket, free-after-evict
  for (std::uint32_t base = 0; base < st.capacity; base += lru_threads) {
    const std::uint32_t s = base + tid;
    std::uint32_t key = lru_empty, a = 0;
    bool evictable = false;
    if (s < st.capacity) {
      key = keys[s];
      a = ages[s];
      evictable = key != lru_empty && !hit[s];
    }
    const bool older = evictable && a > threshold;
    const bool at_t = evictable && a == threshold;
    std::uint64_t before = 0, total = 0;
    scan_u64(scan_tmp.u64).ExclusiveSum(pack3(older, at_t, 0), before, total);
    before += running;
    const std::uint32_t t_rank = field(before, 1);
    const bool evict = older || (at_t && t_rank < at_threshold);
    const bool is_free = s < st.capacity && (key == lru_empty || evict);
    __syncthreads();
    std::uint64_t fbefore = 0, ftotal = 0;
    scan_u64(scan_tmp.u64).ExclusiveSum(pack3(0, 0, is_free), fbefore, ftotal);
    if (evict) {
      const std::uint32_t e = field(before, 0) + (t_rank < at_threshold ? t_rank : at_threshold);
      io.evicted_keys[ev_off + e] = key;
      io.evicted_slots[ev_off + e] = s;
      slot_of[key] = lru_empty;
      keys[s] = lru_empty;
    }
    if (is_free) free_list[field(running, 2) + field(fbefore, 2)] = s;
    running += total + ftotal;
    __syncthreads();
  }

  // 7. Admit the misses into the lowest free slots.
  for (std::uint32_t r = tid; r < misses; r += lru_threads) {
    const std::uint32_t k = io.admitted_keys[off + r];
    const std::uint32_t s = free_list[r];
    keys[s] = k;
    ages[s] = 0;
    slot_of[k] = s;
    io.admitted_slots[off + r] = s;
  }
  if (tid == 0) {
    io.counts[3 * pair] = hits;
    io.counts[3 * pair + 1] = need;
    io.counts[3 * pair + 2] = misses;
    io.status[pair] = lru_ok;
  }
}

}  // namespace kvsift::cuda::detail

namespace kvsift::cuda {

namespace detail {

/// The LRU's own device state (and its limits, device or pinned) belongs to `device`.
inline void require_lru_state_on(const bucketed_lru_ref& state, int device, const char* who) {
  require_device_pointer(state.keys, device, who, "keys");
  require_device_pointer(state.ages, device, who, "ages");
  require_device_pointer(state.slot_of, device, who, "slot_of");
  if (state.limits != nullptr) require_accessible_pointer(state.limits, device, who, "limits");
}

/// bucketed_lru_step; with check_devices false the pointers and stream are taken to be the
/// current device's (offloaded_attention checks the state and owns the step's buffers).
inline void run_bucketed_lru_step(const bucketed_lru_ref& state, const lru_step_io& io, int buckets,
                                  cudaStream_t stream, bool check_devices) {
  kvsift::detail::require(buckets >= 2 && buckets <= 256,
                          "bucketed_lru_step: buckets must be in [2, 256], got ", buckets);
  kvsift::detail::require(state.capacity > 0 && state.capacity <= bucketed_lru_ref::max_capacity,
                          "bucketed_lru_step: capacity must be in [1, ",
                          bucketed_lru_ref::max_capacity, "], got ", state.capacity);
  kvsift::detail::require(state.pages > 0 && state.pages < detail::lru_pending,
                          "bucketed_lru_step: pages must be in [1, 2^31), got ", state.pages);
  kvsift::detail::require(io.eviction_stride == 0 || io.eviction_stride >= state.capacity,
                          "bucketed_lru_step: expected eviction_stride 0 or >= the capacity of ",
                          state.capacity, ", got ", io.eviction_stride);
  kvsift::detail::require(state.limits == nullptr || io.eviction_stride != 0,
                          "bucketed_lru_step: per-pair limits can evict more pages than a pair "
                          "selects: give eviction_stride >= the capacity of ",
                          state.capacity, ", got 0");
  if (state.pairs == 0) return;
  kvsift::detail::require(state.keys && state.ages && state.slot_of && io.selected && io.offsets &&
                              io.evicted_keys && io.evicted_slots && io.admitted_keys &&
                              io.admitted_slots && io.counts && io.status,
                          "bucketed_lru_step: null device pointer for ", state.pairs, " pairs");
  if (check_devices) {
    constexpr const char* who = "bucketed_lru_step";
    const int device = current_device();
    require_stream_on(stream, device, who);
    require_lru_state_on(state, device, who);
    require_device_pointer(io.selected, device, who, "selected");
    require_device_pointer(io.offsets, device, who, "offsets");
    require_device_pointer(io.evicted_keys, device, who, "evicted_keys");
    require_device_pointer(io.evicted_slots, device, who, "evicted_slots");
    require_device_pointer(io.admitted_keys, device, who, "admitted_keys");
    require_device_pointer(io.admitted_slots, device, who, "admitted_slots");
    require_device_pointer(io.counts, device, who, "counts");
    require_device_pointer(io.status, device, who, "status");
  }
  const std::size_t smem = std::size_t{state.capacity} * (sizeof(std::uint32_t) + 1);
  bucketed_lru_kernel<lru_threads><<<state.pairs, lru_threads, smem, stream>>>(state, io, buckets);
  KVSIFT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail

inline void bucketed_lru_step(const bucketed_lru_ref& state, const lru_step_io& io, int buckets,
                              cudaStream_t stream) {
  detail::run_bucketed_lru_step(state, io, buckets, stream, true);
}

}  // namespace kvsift::cuda
