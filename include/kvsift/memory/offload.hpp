#pragma once
// The memory half of the partition pipeline (Spin): an algorithm groups a KV head's tokens
// into partitions (`partitioning`; the algorithm side, `SparseAlgorithm`, is in
// <kvsift/decode/sparse_algorithm.hpp>), and kvsift supplies the shared steps:
//   offload  (materialise the partitioned K/V into head-wise pages in the host tier; the
//             partition_spec it returns builds the partition_map)
//   retrieve (the partition_map lookup path, then the page gather into the GPU buffer).
//
// This header is the CPU reference: `retrieve` copies pages with memcpy into a host buffer
// standing in for GPU memory; kvsift::cuda::gather_pages executes the same copy list on a GPU.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/memory/partition_map.hpp"
#include "kvsift/memory/replacement_policy.hpp"

namespace kvsift {

/// How an algorithm groups the tokens of one KV head: partition p holds the tokens
/// tokens[offsets[p] .. offsets[p + 1]) in storage order. `packed` partitions share pages
/// (token granularity); otherwise each starts on a fresh page.
struct partitioning {
  std::vector<id_t> tokens;
  std::vector<std::size_t> offsets{0};
  bool packed = false;

  [[nodiscard]] std::size_t partitions() const noexcept {
    return offsets.empty() ? 0 : offsets.size() - 1;
  }
};

/// K/V of one KV head laid out in head-wise pages in the host tier. A page holds page_tokens
/// token slots; a slot is the key row followed by the value row (key_dim + value_dim floats);
/// padding slots are zero with token id invalid_id.
struct offloaded_kv {
  std::size_t page_tokens = 0;
  std::size_t key_dim = 0;
  std::size_t value_dim = 0;
  std::size_t pages = 0;
  partition_spec spec;                    ///< builds the matching partition_map
  std::vector<float> host_pages;          ///< pages x page_tokens x (key_dim + value_dim)
  std::vector<id_t> slot_token;           ///< token id of every slot (invalid_id: padding)
  std::vector<std::uint64_t> token_slot;  ///< slot of every token

  [[nodiscard]] std::size_t slot_floats() const noexcept { return key_dim + value_dim; }
  [[nodiscard]] std::size_t page_floats() const noexcept { return page_tokens * slot_floats(); }
};

/// Materialises the partitioned K/V into pages (the shared `offload` step). O(n * d).
/// @throw invalid_argument for an empty key set, page_tokens == 0, a partitioning that is not
///        a permutation of the tokens in non-empty partitions; dimension_mismatch when keys
///        and values differ in rows; non_finite_value for NaN/Inf in keys or values.
inline offloaded_kv offload(const partitioning& parts, matrix_view<const float> keys,
                            matrix_view<const float> values, std::size_t page_tokens) {
  const std::size_t n = keys.rows();
  detail::require(n > 0, "offload: expected a non-empty key set, got 0 keys");
  detail::require(page_tokens > 0, "offload: page_tokens must be > 0, got 0");
  detail::require<dimension_mismatch>(values.rows() == n, "offload: expected ", n,
                                      " value rows (one per key), got ", values.rows());
  detail::require(parts.tokens.size() == n && parts.partitions() > 0 &&
                      parts.offsets.front() == 0 && parts.offsets.back() == n,
                  "offload: expected a partitioning of all ", n, " tokens, got ",
                  parts.tokens.size(), " tokens in ", parts.partitions(), " partitions");
  require_finite(keys, "offload: keys");
  require_finite(values, "offload: values");
  partition_spec spec{{}, page_tokens, parts.packed};
  std::vector<bool> seen(n, false);
  for (std::size_t p = 0; p < parts.partitions(); ++p) {
    detail::require(parts.offsets[p] < parts.offsets[p + 1], "offload: partition ", p,
                    " is empty or its offsets decrease");
    spec.token_counts.push_back(
        static_cast<std::uint32_t>(parts.offsets[p + 1] - parts.offsets[p]));
  }
  for (const id_t t : parts.tokens) {
    detail::require(t < n && !seen[t], "offload: token ", t,
                    t < n ? " appears twice" : " is out of range", " (", n, " tokens)");
    seen[t] = true;
  }
  const std::vector<std::size_t> start = spec.start_slots();
  offloaded_kv kv;
  kv.page_tokens = page_tokens;
  kv.key_dim = keys.cols();
  kv.value_dim = values.cols();
  kv.pages = (start.back() + page_tokens - 1) / page_tokens;
  kv.host_pages.assign(kv.pages * kv.page_floats(), 0.0f);
  kv.slot_token.assign(kv.pages * page_tokens, invalid_id);
  kv.token_slot.resize(n);
  for (std::size_t p = 0; p < parts.partitions(); ++p) {
    for (std::size_t j = parts.offsets[p]; j < parts.offsets[p + 1]; ++j) {
      const id_t t = parts.tokens[j];
      const std::size_t slot = start[p] + (j - parts.offsets[p]);
      float* dst = kv.host_pages.data() + slot * kv.slot_floats();
      std::memcpy(dst, keys.row(t), kv.key_dim * sizeof(float));
      std::memcpy(dst + kv.key_dim, values.row(t), kv.value_dim * sizeof(float));
      kv.slot_token[slot] = t;
      kv.token_slot[t] = slot;
    }
  }
  kv.spec = std::move(spec);
  return kv;
}

/// The shared `retrieve` step: the partition_map lookup path for `selected`, then the gather
/// of every missed page from kv.host_pages into `gpu_pages` (capacity pages of
/// kv.page_floats() floats; GPU page g of the copy list = policy slot g). `out` receives the
/// lookup result. O(selected pages + policy step + copied bytes).
/// @throw dimension_mismatch if gpu_pages does not hold exactly the policy's capacity in pages
///        or the map's page count differs from kv's; otherwise as partition_map::retrieve.
template <ReplacementPolicy P>
void retrieve(partition_map<P>& map, const offloaded_kv& kv, std::span<const id_t> selected,
              std::span<float> gpu_pages, retrieve_result& out) {
  detail::require<dimension_mismatch>(map.pages() == kv.pages, "retrieve: the map has ",
                                      map.pages(), " pages, the offloaded KV ", kv.pages);
  const std::size_t want = map.policy().capacity() * kv.page_floats();
  detail::require<dimension_mismatch>(gpu_pages.size() == want,
                                      "retrieve: expected a GPU buffer of ", want,
                                      " floats (capacity x page), got ", gpu_pages.size());
  map.retrieve(selected, out);
  for (const page_copy& c : out.copies) {
    std::memcpy(gpu_pages.data() + c.gpu_page * kv.page_floats(),
                kv.host_pages.data() + c.cpu_page * kv.page_floats(),
                kv.page_floats() * sizeof(float));
  }
}

}  // namespace kvsift
