#pragma once
// Two-level page table for head-wise KV pages: (request, layer, KV head, logical page) ->
// physical page id. A small static top-level directory holds one entry per segment of
// `segment_pages` logical pages; second-level segments come on demand from a pre-allocated
// pool managed by a bitmap allocator. Metadata therefore grows with the mapped pages (plus a
// directory of 1/segment_pages of the logical space), not with the worst-case context of every
// request, and a finished request gives its segments back to the pool.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/memory/detail/host_device.hpp"
#include "kvsift/memory/segment_allocator.hpp"

namespace kvsift {

/// Physical page id stored in the table; `no_page` marks an unmapped entry.
using page_id = std::uint32_t;
inline constexpr page_id no_page = std::numeric_limits<page_id>::max();

/// A logical page of one KV head of one layer of one request.
struct page_key {
  std::uint32_t request = 0;
  std::uint32_t layer = 0;
  std::uint32_t head = 0;
  std::uint32_t page = 0;
};

/// Shape of the logical space and size of the segment pool. No defaults for the space: the
/// caller states it. Defaults: 256 pages per segment (1 KiB of page ids).
struct page_table_params {
  std::size_t requests = 0;         ///< batch slots (> 0)
  std::size_t layers = 0;           ///< (> 0)
  std::size_t heads = 0;            ///< KV heads per layer (> 0)
  std::size_t pages_per_head = 0;   ///< logical pages of the longest context (> 0)
  std::size_t segment_pages = 256;  ///< logical pages per segment: a power of two (shift, mask)
  std::size_t pool_segments = 0;    ///< segments pre-allocated for the second level (> 0)
};

/// Trivially copyable lookup handle over the two arrays of a `page_table` (valid while the
/// table lives and is not mutated). Works on device memory too: copy `directory` and `pool`
/// to the GPU and build a handle over the device pointers. No bounds checks (the owning table
/// validates keys); callers pass keys inside the table's shape.
struct page_table_ref {
  const std::uint32_t* directory = nullptr;
  const page_id* pool = nullptr;
  std::uint32_t layers = 0, heads = 0, segments_per_head = 0;
  std::uint32_t segment_shift = 0;  ///< log2(segment_pages)

  [[nodiscard]] KVSIFT_HOST_DEVICE std::uint64_t directory_index(page_key k) const {
    return ((std::uint64_t{k.request} * layers + k.layer) * heads + k.head) * segments_per_head +
           (k.page >> segment_shift);
  }
  /// Entry of `k` inside its segment `seg`.
  [[nodiscard]] KVSIFT_HOST_DEVICE std::uint64_t pool_index(std::uint32_t seg, page_key k) const {
    return (std::uint64_t{seg} << segment_shift) + (k.page & ((1u << segment_shift) - 1));
  }
  /// Physical page of `k`, or no_page. O(1): two dependent loads, no division.
  [[nodiscard]] KVSIFT_HOST_DEVICE page_id lookup(page_key k) const {
    const std::uint32_t seg = directory[directory_index(k)];
    return seg == no_page ? no_page : pool[pool_index(seg, k)];
  }
};

/// Former name of `page_table_ref` (device handles are `*_ref`), kept for one release.
using page_table_view [[deprecated("use kvsift::page_table_ref")]] = page_table_ref;

/// Owning two-level page table (move-only). Thread safety: const members safe concurrently; map,
/// unmap and release_request need external synchronisation.
class page_table {
 public:
  /// Allocates the directory and the whole segment pool up front (nothing is allocated later).
  /// @throw invalid_argument for a zero dimension or pool, segment_pages not a power of two,
  ///        or a directory (requests x layers x heads x segments per head, checked for
  ///        overflow) of 2^32 - 1 entries or more.
  explicit page_table(const page_table_params& p) : p_(p) {
    detail::require(p.requests > 0 && p.layers > 0 && p.heads > 0 && p.pages_per_head > 0,
                    "page_table: expected requests, layers, heads, pages_per_head > 0, got ",
                    p.requests, ", ", p.layers, ", ", p.heads, ", ", p.pages_per_head);
    detail::require(std::has_single_bit(p.segment_pages) && p.segment_pages < (1u << 31),
                    "page_table: segment_pages must be a power of two below 2^31, got ",
                    p.segment_pages);
    detail::require(p.pool_segments > 0, "page_table: pool_segments must be > 0, got 0");
    detail::require(p.pool_segments < no_page && p.pages_per_head < no_page,
                    "page_table: pool_segments and pages_per_head must be < 2^32 - 1, got ",
                    p.pool_segments, " and ", p.pages_per_head);
    segments_per_head_ = checked_ceil_div(p.pages_per_head, p.segment_pages, "page_table");
    // Checked: a wrapped product passed the limit with a too-small directory that map() then
    // wrote past. Since every factor is >= 1, dir < 2^32 also bounds requests, layers and heads,
    // so the 32-bit fields of the view below hold them exactly.
    const std::size_t dir =
        checked_mul(checked_mul(p.requests, p.layers, p.heads, "page_table: directory"),
                    segments_per_head_, "page_table: directory");
    detail::require(dir < no_page, "page_table: directory of ", dir,
                    " entries exceeds the 32-bit limit; raise segment_pages");
    allocator_ = segment_allocator(p.pool_segments);
    directory_.assign(dir, no_page);
    pool_.assign(checked_mul(p.pool_segments, p.segment_pages, "page_table: segment pool"),
                 no_page);
    live_.assign(p.pool_segments, 0);
    // The arrays never reallocate after this point (nor on a move), so the handle is built once.
    ref_ = {directory_.data(),
            pool_.data(),
            static_cast<std::uint32_t>(p.layers),
            static_cast<std::uint32_t>(p.heads),
            static_cast<std::uint32_t>(segments_per_head_),
            static_cast<std::uint32_t>(std::countr_zero(p.segment_pages))};
  }
  // Move-only: a copy's handle would point into the source's arrays.
  page_table(const page_table&) = delete;
  page_table& operator=(const page_table&) = delete;
  page_table(page_table&&) noexcept = default;
  page_table& operator=(page_table&&) noexcept = default;
  ~page_table() = default;

  [[nodiscard]] const page_table_params& params() const noexcept { return p_; }
  [[nodiscard]] std::size_t mapped_pages() const noexcept { return mapped_; }
  [[nodiscard]] std::size_t free_segments() const noexcept { return allocator_.free_count(); }
  /// Bytes of metadata: directory + segment pool + live counters + allocator bitmap.
  [[nodiscard]] std::size_t metadata_bytes() const noexcept {
    return directory_.size() * sizeof(std::uint32_t) + pool_.size() * sizeof(page_id) +
           live_.size() * sizeof(std::uint32_t) + allocator_.metadata_bytes();
  }
  /// Lookup handle over this table's arrays (valid while the table lives).
  [[nodiscard]] page_table_ref ref() const noexcept { return ref_; }
  /// Former name of `ref()`, kept for one release.
  [[deprecated("use page_table::ref()")]] [[nodiscard]] page_table_ref view() const noexcept {
    return ref_;
  }

  /// Physical page of `k`, or no_page if unmapped. O(1).
  /// @throw out_of_range for a key outside the table's shape.
  [[nodiscard]] page_id lookup(page_key k) const {
    check(k, "lookup");
    return ref_.lookup(k);
  }

  /// Batched lookup: out[i] = lookup(keys[i]). All keys are validated before anything is
  /// written, then looked up through a local handle (what a decode step does with its pages).
  /// O(keys.size()). @throw dimension_mismatch if out is shorter than keys; out_of_range for a
  /// key outside the table's shape.
  void lookup(std::span<const page_key> keys, std::span<page_id> out) const {
    detail::require<dimension_mismatch>(out.size() >= keys.size(),
                                        "page_table::lookup: expected an output of at least ",
                                        keys.size(), " entries, got ", out.size());
    for (const page_key& k : keys) check(k, "lookup");
    const page_table_ref v = ref_;
    for (std::size_t i = 0; i < keys.size(); ++i) out[i] = v.lookup(keys[i]);
  }

  /// Maps `k` to `phys`, taking a segment from the pool if k's segment has none yet. O(1)
  /// amortised (allocation scans the bitmap). @throw out_of_range for a bad key;
  /// invalid_argument if phys == no_page or k is already mapped; pool_exhausted when a new
  /// segment is needed and none is free (nothing changes on any throw).
  void map(page_key k, page_id phys) {
    check(k, "map");
    detail::require(phys != no_page, "page_table::map: physical page id ", phys,
                    " is the reserved no_page value");
    auto& seg = directory_[ref_.directory_index(k)];
    if (seg == no_page) {
      seg = static_cast<std::uint32_t>(allocator_.allocate());  // throws before any change
    }
    auto& slot = pool_[ref_.pool_index(seg, k)];
    detail::require(slot == no_page, "page_table::map: page ", k.page, " of request ", k.request,
                    " layer ", k.layer, " head ", k.head, " is already mapped to ", slot);
    slot = phys;
    ++live_[seg];
    ++mapped_;
  }

  /// Unmaps `k` and returns its physical page. The segment stays with the request until
  /// release_request (cheap re-mapping during decode). O(1).
  /// @throw out_of_range for a bad key; invalid_argument if k is not mapped.
  page_id unmap(page_key k) {
    check(k, "unmap");
    const std::uint32_t seg = directory_[ref_.directory_index(k)];
    page_id* slot = seg == no_page ? nullptr : &pool_[ref_.pool_index(seg, k)];
    detail::require(slot != nullptr && *slot != no_page, "page_table::unmap: page ", k.page,
                    " of request ", k.request, " layer ", k.layer, " head ", k.head,
                    " is not mapped");
    const page_id phys = *slot;
    *slot = no_page;
    --live_[seg];
    --mapped_;
    return phys;
  }

  /// Unmaps every page of `request` and returns its segments to the pool.
  /// O(layers * heads * segments_per_head * segment_pages) over the request's own segments.
  /// @throw out_of_range if request >= requests.
  void release_request(std::size_t request) {
    detail::require<out_of_range>(request < p_.requests,
                                  "page_table::release_request: expected a request < ", p_.requests,
                                  ", got ", request);
    const std::size_t per_request = p_.layers * p_.heads * segments_per_head_;
    for (std::size_t i = request * per_request; i < (request + 1) * per_request; ++i) {
      const std::uint32_t seg = directory_[i];
      if (seg == no_page) continue;
      mapped_ -= live_[seg];
      live_[seg] = 0;
      std::fill_n(pool_.begin() + std::size_t{seg} * p_.segment_pages, p_.segment_pages, no_page);
      allocator_.release(seg);
      directory_[i] = no_page;
    }
  }

 private:
  // The test is inline and branch-predicted; the message is built out of line, so a checked
  // lookup costs about what an unchecked one does.
  void check(page_key k, const char* what) const {
    // One branch for the four tests (bitwise |): keeps the lookup loop short.
    if ((k.request >= p_.requests) | (k.layer >= p_.layers) | (k.head >= p_.heads) |
        (k.page >= p_.pages_per_head)) [[unlikely]] {
      fail_key(k, what);
    }
  }
  [[noreturn, gnu::cold, gnu::noinline]] void fail_key(page_key k, const char* what) const {
    detail::fail<out_of_range>("page_table::", what, ": expected (request, layer, head, page) < (",
                               p_.requests, ", ", p_.layers, ", ", p_.heads, ", ",
                               p_.pages_per_head, "), got (", k.request, ", ", k.layer, ", ",
                               k.head, ", ", k.page, ")");
  }

  page_table_params p_;
  std::size_t segments_per_head_ = 0;
  std::size_t mapped_ = 0;
  segment_allocator allocator_;
  std::vector<std::uint32_t> directory_;  // segment id per (request, layer, head, segment)
  std::vector<page_id> pool_;             // pool_segments x segment_pages physical ids
  std::vector<std::uint32_t> live_;       // mapped entries per segment
  page_table_ref ref_;
};

}  // namespace kvsift
