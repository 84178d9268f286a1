#pragma once
// Partitions over head-wise pages (Spin): a partition is the unit an algorithm selects (a
// block, a cluster, a single token) and spans one or more fixed-size pages of one KV head.
// partition_map keeps the four tables of one (request, KV head) and runs the Retrieve lookup
// path: selected partitions -> pages -> hits / misses through a ReplacementPolicy -> the list
// of (CPU page -> GPU page) copies the page gather executes.
//
// Tier split (what an engine places where; this CPU reference keeps all four on the host):
//   meta-partition (token count, residency)   small, read every step          -> GPU
//   GPU page table (slot per page, recency)   the policy's state, every step  -> GPU
//   partition offsets (page range per part.)  O(partitions), read per step    -> pinned host
//   CPU page table (page -> host page id)     O(pages), read only on misses   -> pinned host

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/memory/replacement_policy.hpp"

namespace kvsift {

/// Token counts of the partitions in storage order. `packed` partitions share pages (token
/// granularity: a partition = one token, 16 per page); otherwise every partition starts on a
/// fresh page (blocks, clusters). Uniform = every partition exactly `page_tokens` tokens.
struct partition_spec {
  std::vector<std::uint32_t> token_counts;
  std::size_t page_tokens = 16;
  bool packed = false;

  /// `partitions` partitions of `tokens_each` tokens.
  [[nodiscard]] static partition_spec uniform(std::size_t partitions, std::uint32_t tokens_each,
                                              std::size_t page_tokens, bool packed = false) {
    return {std::vector<std::uint32_t>(partitions, tokens_each), page_tokens, packed};
  }

  /// Token slot where each partition starts in the page sequence (slot s is token s % page_tokens
  /// of page s / page_tokens), plus the end slot. The one place the page layout is decided.
  /// O(partitions). @throw invalid_argument for no partitions, a zero token count, or
  ///        page_tokens == 0.
  [[nodiscard]] std::vector<std::size_t> start_slots() const {
    detail::require(!token_counts.empty(), "partition_spec: expected partitions, got 0");
    detail::require(page_tokens > 0, "partition_spec: page_tokens must be > 0, got 0");
    std::vector<std::size_t> start(token_counts.size() + 1);
    std::size_t slot = 0;
    for (std::size_t p = 0; p < token_counts.size(); ++p) {
      detail::require(token_counts[p] > 0, "partition_spec: partition ", p, " has 0 tokens");
      if (!packed) slot = (slot + page_tokens - 1) / page_tokens * page_tokens;
      start[p] = slot;
      slot += token_counts[p];
    }
    start.back() = slot;
    return start;
  }
};

/// One entry of the copy list: host page `cpu_page` goes to GPU page `gpu_page`.
struct page_copy {
  std::uint64_t cpu_page = 0;
  std::uint64_t gpu_page = 0;
};

/// What Retrieve produced for one step.
struct retrieve_result {
  std::size_t partition_hits = 0;  ///< selected partitions whose pages were all resident
  std::size_t page_demand = 0;     ///< distinct pages the selection needs
  replacement_step step;           ///< page hits, evictions, admissions
  std::vector<page_copy> copies;   ///< one per admitted page, in admission order
};

/// The four tables of one (request, KV head) plus a replacement policy over its GPU pages.
/// Thread safety: const members safe concurrently; retrieve / set_cpu_pages need external
/// synchronisation (one map per (request, head), so steps of different heads run in parallel).
template <ReplacementPolicy Policy>
class partition_map {
 public:
  /// Builds the meta-partition and partition-offset tables; the CPU page table starts as the
  /// identity (pages stored contiguously from host page 0). O(partitions).
  /// @throw invalid_argument for no partitions, a zero token count, page_tokens == 0, or a
  ///        policy whose page count differs from the layout's.
  partition_map(const partition_spec& spec, Policy policy) : policy_(std::move(policy)) {
    const std::vector<std::size_t> start = spec.start_slots();  // validates the spec
    const std::size_t n = spec.token_counts.size();
    tokens_.assign(spec.token_counts.begin(), spec.token_counts.end());
    first_page_.resize(n + 1);
    last_page_.resize(n);
    for (std::size_t p = 0; p < n; ++p) {
      first_page_[p] = start[p] / spec.page_tokens;
      last_page_[p] = (start[p] + tokens_[p] - 1) / spec.page_tokens;
    }
    pages_ = (start.back() + spec.page_tokens - 1) / spec.page_tokens;
    first_page_[n] = pages_;
    detail::require(policy_.keys() == pages_, "partition_map: the layout has ", pages_,
                    " pages, the policy manages ", policy_.keys());
    resident_.assign(n, 0);
    cpu_page_.resize(pages_);
    for (std::size_t i = 0; i < pages_; ++i) cpu_page_[i] = i;
  }

  [[nodiscard]] std::size_t partitions() const noexcept { return tokens_.size(); }
  [[nodiscard]] std::size_t pages() const noexcept { return pages_; }
  [[nodiscard]] const Policy& policy() const noexcept { return policy_; }
  /// This pair's page limit (buffer elasticity's share, `pair_page_limits`), enforced by the
  /// next `retrieve`. @throw invalid_argument if pages > the policy's capacity (nothing
  /// changes).
  void set_page_limit(std::size_t pages) requires requires(Policy& p) { p.set_limit(pages); }
  { policy_.set_limit(pages); }
  /// Meta-partition table. @throw out_of_range for p >= partitions().
  [[nodiscard]] std::uint32_t token_count(std::size_t p) const { return tokens_[check(p)]; }
  /// True if p was selected and none of its pages was evicted since (conservative: a packed
  /// partition made resident by its neighbours' selections reads false).
  /// @throw out_of_range for p >= partitions().
  [[nodiscard]] bool resident(std::size_t p) const { return resident_[check(p)] != 0; }
  /// Partition offsets: pages [first, last] of partition p. @throw out_of_range.
  [[nodiscard]] std::size_t first_page(std::size_t p) const { return first_page_[check(p)]; }
  [[nodiscard]] std::size_t last_page(std::size_t p) const { return last_page_[check(p)]; }
  /// CPU page table entry of logical page `page`. @throw out_of_range.
  [[nodiscard]] std::uint64_t cpu_page(std::size_t page) const {
    detail::require<out_of_range>(page < pages_, "partition_map::cpu_page: expected a page < ",
                                  pages_, ", got ", page);
    return cpu_page_[page];
  }
  /// Sets the CPU page table (after offload placed the pages). @throw dimension_mismatch.
  void set_cpu_pages(std::span<const std::uint64_t> host_pages) {
    detail::require<dimension_mismatch>(host_pages.size() == pages_,
                                        "partition_map::set_cpu_pages: expected ", pages_,
                                        " entries, got ", host_pages.size());
    cpu_page_.assign(host_pages.begin(), host_pages.end());
  }

  /// The Retrieve lookup path for one step. O(pages of the selection + policy step).
  /// @throw out_of_range for a partition id >= partitions(); invalid_argument (from the
  ///        policy) when the page demand exceeds the GPU buffer. Nothing changes on a throw.
  void retrieve(std::span<const id_t> selected, retrieve_result& out) {
    for (std::size_t i = 0; i < selected.size(); ++i) {
      detail::require<out_of_range>(selected[i] < partitions(),
                                    "partition_map::retrieve: expected partition ids < ",
                                    partitions(), ", got ", selected[i], " at position ", i);
    }
    pages_scratch_.clear();
    out.partition_hits = 0;
    for (const id_t p : selected) {
      bool hit = true;
      for (std::size_t g = first_page_[p]; g <= last_page_[p]; ++g) {
        pages_scratch_.push_back(static_cast<id_t>(g));
        hit = hit && policy_.slot_of(static_cast<id_t>(g)) != invalid_id;
      }
      out.partition_hits += hit ? 1 : 0;
    }
    policy_.step(pages_scratch_, out.step);  // validates the demand before changing anything
    out.page_demand = out.step.hits + out.step.misses();
    out.copies.clear();
    for (std::size_t i = 0; i < out.step.admitted_keys.size(); ++i) {
      out.copies.push_back({cpu_page_[out.step.admitted_keys[i]], out.step.admitted_slots[i]});
    }
    for (const id_t g : out.step.evicted_keys) mark_partitions_of(g, 0);
    for (const id_t p : selected) resident_[p] = 1;
  }

 private:
  std::size_t check(std::size_t p) const {
    detail::require<out_of_range>(p < partitions(), "partition_map: expected a partition id < ",
                                  partitions(), ", got ", p);
    return p;
  }

  // Partitions overlapping page g (several when packed): those with first_page <= g <= last.
  void mark_partitions_of(std::size_t g, std::uint8_t value) {
    auto it = std::upper_bound(first_page_.begin(), first_page_.end() - 1, g);
    for (auto p = static_cast<std::size_t>(it - first_page_.begin()); p-- > 0;) {
      if (last_page_[p] < g) break;
      resident_[p] = value;
    }
  }

  Policy policy_;
  std::vector<std::uint32_t> tokens_;    // meta-partition: token count
  std::vector<std::uint8_t> resident_;   // meta-partition: all pages resident
  std::vector<std::size_t> first_page_;  // partition offsets (n + 1 entries)
  std::vector<std::size_t> last_page_;
  std::vector<std::uint64_t> cpu_page_;  // CPU page table
  std::size_t pages_ = 0;
  std::vector<id_t> pages_scratch_;
};

}  // namespace kvsift
