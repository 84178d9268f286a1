#pragma once
// Kernel and host dispatch behind <kvsift/cuda/decode_search.cuh> (internal).
//
// Two kernels walk the same way. decode_search_kernel runs one search per warp, as in
// graph_search.inl, whose pool order and scoring it shares (every mode);
// decode_search_block_kernel runs one top-k search per block of four warps (see its comment).
// Per search, shared memory holds the query (f32), the pool (L for top-k, l0 for DIPR) twice (a
// merge writes the other copy), the candidate list of max(width, 32) * expand_width entries
// and, when the graphs are small enough (n <= 2^18 keys: at most 32 KiB of bits), the visited
// bitset. Otherwise the visited bitset lives in the workspace (global memory, L2 in practice).
// The workspace also holds, for DIPR, an expanded bitset, the in-range max-heap and the
// in-range list the answer is filtered from.
//
// A decode batch gives the GPU only 4-8 warps per SM, so a search's time is its chain of
// dependent latencies, and each choice below shortens it (H200, 512 queries over 131072-key
// graphs, L 256, expand_width 8: 1.31 ms before, 0.81 ms after; docs/decode_search.md):
// - the visited set in shared memory: a global atomic costs an L2 round trip per expansion;
// - a wide expansion loads the rows of all its nodes before any visited-set update, instead of
//   one node after the other (one latency per 256 ids, not two per node); a filtered walk
//   falls back to one node after the other only for a step that meets a fresh filtered-out id
//   (or never, with walk_through = false);
// - the merge sorts the survivors (warp bitonic sort, O(n log^2 n / 32) per lane) instead of
//   ranking each against every other (O(n^2 / 32), which dominated the first steps of a wide
//   expansion: hundreds of candidates, all surviving into a pool that is not yet full);
// - a lane scores a row with all of the row's loads issued before the first FMA.
//
// Where the CPU search depends on the order of visits (DIPR's running best and its cap; the
// 2-hop rule's visited marks and gather cap), the warp processes candidates 32 at a time in
// that order: prefix maxima and ballot prefix counts give each lane the state the CPU would
// have when it reaches that candidate.

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>

#include <kvsift/core/error.hpp>
#include <kvsift/cuda/detail/fast_divider.cuh>
#include <kvsift/cuda/detail/graph_search.inl>
#include <kvsift/cuda/detail/kernel_attributes.cuh>
#include <kvsift/cuda/detail/vec.cuh>
#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda::detail {

inline constexpr int ds_warps_per_block = 4;
// The block kernel (top-k): one search per block of four warps, eight blocks per SM (64
// registers per thread), so a decode batch of 1024 searches runs at once on 132 SMs; or, for
// batches of at most four searches per SM, a block of eight warps, four blocks per SM.
inline constexpr int ds_block_threads = 128;
/// Survivor counts up to which the block kernel's merge ranks each survivor by counting over
/// the unsorted survivors; above it, up to one survivor per thread, the warps sort theirs in
/// registers and ranks are searched in the sorted runs (ds_merge), and only larger merges sort
/// the block. Counting up to 64 and 128 survivors was slower at 1024 searches than sorting them
/// (H200: 0.485 and 0.507-0.517 ms against 0.471-0.481 ms;
/// bench/results/h200_decode_search_rank_merge_threshold.txt).
inline constexpr int ds_rank_merge_max = 32;
/// The block kernel's block-wide counts: [0, 4) counts, [4, 12) one per warp (up to 8 warps),
/// [12, 12 + 256) the merge's insertion points, one per thread of the widest block (eight
/// warps). 268 ints keep the region after them 16-byte aligned.
inline constexpr int ds_said_ints = 12 + 256;
/// The block kernel's register budget: 64 per thread, 1024 threads per SM (eight blocks of
/// four warps, or four of eight).
inline constexpr int ds_block_sm_threads = 1024;
/// Block-kernel threads per search: eight warps when every search of the launch runs at once
/// with four such blocks per SM, four warps otherwise (warps_per_search = 0). On the H200 at
/// 128K tokens, L 256, expand_width 16: 512 searches 0.411 / 0.462 ms with eight warps against
/// 0.445 / 0.484 ms with four (widths 16 / 8), 256 searches 0.253 against 0.305 ms (width 16,
/// L 200); 1024 searches need two waves of eight-warp blocks: 0.840 ms at width 8, L 256,
/// against 0.696 ms with four warps (docs/decode_search.md).
inline int ds_block_threads_for(int warps_per_search, std::int64_t m, int sms) {
  if (warps_per_search == 8) return 256;
  if (warps_per_search == 4) return 128;
  return m <= std::int64_t{sms} * (ds_block_sm_threads / 256) ? 256 : 128;
}

/// Key rows of a dense matrix: graph g's key i is row base + i.
///
/// A source's row(g, base, id) is at(base, id, locate(g, id)): locate() is the load a row's
/// address waits for (a paged source's page-table entry; nothing here, `locates` false) and
/// at() the arithmetic after it, so a kernel can load the entry early and keep it (below: the
/// block kernel's step gather).
template <class T>
struct ds_dense_source {
  static constexpr bool locates = false;
  const T* keys;
  std::int64_t ld;
  __device__ std::int32_t locate(int, std::uint32_t) const { return 0; }
  __device__ const T* at(std::int64_t base, std::uint32_t id, std::int32_t) const {
    return keys + static_cast<std::size_t>(base + id) * static_cast<std::size_t>(ld);
  }
  __device__ const T* row(int g, std::int64_t base, std::uint32_t id) const {
    return at(base, id, locate(g, id));
  }
  /// Keys graph g can address (the adjacency bounds them; no page table to overflow).
  __device__ std::int64_t capacity(int) const { return INT64_MAX; }
};

/// Key rows in head-wise pages: graph g's key t is token t of page-table row g. Null for a
/// page id outside the pool (the caller flags it).
template <class T>
struct ds_paged_source {
  static constexpr bool locates = true;
  paged_kv_ref<T> kv;
  int page_shift = -1;  // log2(page_size) for a power of two, else -1

  /// (kv.page_size > 0: the callers check it first.)
  explicit ds_paged_source(const paged_kv_ref<T>& v) : kv(v) {
    const auto size = static_cast<std::uint32_t>(v.page_size);
    if (std::has_single_bit(size)) page_shift = std::countr_zero(size);
  }
  // Every vector scored looks its page up: a shift rather than a 32-bit division (a routine
  // of about twenty instructions) for the usual power-of-two page sizes.
  __device__ std::uint32_t page_index(std::uint32_t id) const {
    return page_shift >= 0 ? id >> page_shift : id / static_cast<std::uint32_t>(kv.page_size);
  }
  /// The page holding key `id` of graph g (its page-table entry).
  __device__ std::int32_t locate(int g, std::uint32_t id) const { return entry(g, page_index(id)); }
  __device__ const T* at(std::int64_t, std::uint32_t id, std::int32_t page) const {
    return in_page(id, page_index(id), page);
  }
  // One page index for both the table and the slot: written as at(locate()), the compiler kept
  // a division for the index and a remainder for the slot (two ~20-instruction routines per
  // row) when the page size is not a power of two.
  __device__ const T* row(int g, std::int64_t, std::uint32_t id) const {
    const std::uint32_t index = page_index(id);
    return in_page(id, index, entry(g, index));
  }
  __device__ std::int64_t capacity(int) const {
    return static_cast<std::int64_t>(kv.max_pages_per_head) * kv.page_size;
  }

 private:
  __device__ std::int32_t entry(int g, std::uint32_t index) const {
    return kv.page_table[static_cast<std::int64_t>(g) * kv.max_pages_per_head + index];
  }
  /// Key `id`'s row in `page`, its page index being `index`; null for a page outside the pool.
  __device__ const T* in_page(std::uint32_t id, std::uint32_t index, std::int32_t page) const {
    if (page < 0 || page >= kv.num_pages) return nullptr;
    const std::uint32_t slot = page_shift >= 0
                                   ? id & ((1u << page_shift) - 1u)
                                   : id - index * static_cast<std::uint32_t>(kv.page_size);
    return kv.k_pages + (static_cast<std::size_t>(page) * kv.page_size + slot) *
                            static_cast<std::size_t>(kv.head_dim);
  }
};

/// What the kernel needs of the parameters, resolved on the host.
struct ds_config {
  int pool = 0;      // L (top-k) or l0 (DIPR)
  int k = 0;         // top-k results
  int capacity = 0;  // output row length: k or max_results
  float beta = 0.0f;
  int expand = 1;               // top-k: pool entries expanded per step
  int limit = 0;                // pool entries that may be expanded (expand_limit or the pool)
  int max_hops = 0;             // nodes a search may expand (0 = no cap)
  int prefix = 0;               // ids [0, prefix) of each graph entered after the seeds
  bool walk_through = true;     // filtered top-k: failing neighbours walked through (2-hop)
  bool block = false;           // top-k on decode_search_block_kernel (4 or 8 warps per search)
  int warps_per_search = 0;     // as asked (0: the launch picks 4 or 8 by the batch size)
  int inc = 0;                  // candidate list length, max(width, 32) * expand
  int cols = 0;                 // neighbours read per row: the width, or degree_cap if smaller
  fast_divider by_cols{};       // block kernel: a step's flat id index -> its node
  int words = 0;                // visited bitset words (multiple of 4)
  std::int64_t slot_words = 0;  // uint32 words of workspace per running search
  int slots = 0;
  int d = 0;
  walk_layout lay{};
  int pool_off = 0;   // shared-memory byte offsets within a warp's region: pool, second pool,
  int pool2_off = 0;  // candidate list, visited bitset (-1: the bitset is in the workspace)
  int inc_off = 0;
  int visited_off = -1;
  int said_off = 0;  // block kernel: ds_said_ints ints of block-wide counts
  bool vec = false;
};

inline ds_config ds_resolve(const graph_set_ref& set, std::int64_t m, const decode_search_params& p,
                            const char* who) {
  using kvsift::detail::require;
  ds_config c;
  const bool dipr = p.mode == decode_search_mode::dipr;
  if (dipr) {
    require(std::isfinite(p.beta) && p.beta >= 0.0f, who, ": expected finite beta >= 0, got ",
            p.beta);
    require(p.l0 >= 1 && p.l0 <= max_decode_search_L, who,
            ": expected 1 <= l0 <= ", max_decode_search_L, ", got ", p.l0);
    require(
        p.max_results == 0 || (p.max_results >= p.l0 && p.max_results <= max_decode_search_results),
        who, ": expected l0 = ", p.l0, " <= max_results <= ", max_decode_search_results,
        " (or 0 for 64 * l0), got ", p.max_results);
    require(p.expand_width >= 1 && p.expand_width <= max_decode_dipr_expand_width, who,
            ": expected 1 <= expand_width <= ", max_decode_dipr_expand_width, " for DIPR, got ",
            p.expand_width);
    require(p.expand_limit == 0, who, ": expand_limit is for top-k; expected 0 for DIPR, got ",
            p.expand_limit);
    require(p.max_hops >= 0, who, ": expected max_hops >= 0 (0 = no cap), got ", p.max_hops);
    c.max_hops = p.max_hops;
    c.walk_through = p.walk_through;
    c.pool = p.l0;
    c.limit = p.l0;
    c.expand = p.expand_width;
    c.capacity =
        p.max_results != 0 ? p.max_results : std::min(64 * p.l0, max_decode_search_results);
    c.beta = p.beta;
  } else {
    require(p.mode == decode_search_mode::topk, who, ": unknown search mode");
    require(p.k >= 1, who, ": expected k >= 1, got ", p.k);
    require(p.L >= p.k && p.L <= max_decode_search_L, who, ": expected k = ", p.k,
            " <= L <= ", max_decode_search_L, ", got L = ", p.L);
    require(p.expand_width >= 1 && p.expand_width <= max_decode_expand_width, who,
            ": expected 1 <= expand_width <= ", max_decode_expand_width, ", got ", p.expand_width);
    require(p.expand_limit >= 0 && p.expand_limit <= p.L, who,
            ": expected 0 <= expand_limit <= L = ", p.L, " (0 = L), got ", p.expand_limit);
    require(p.max_hops >= 0, who, ": expected max_hops >= 0 (0 = no cap), got ", p.max_hops);
    c.pool = p.L;
    c.limit = p.expand_limit != 0 ? p.expand_limit : p.L;
    c.k = p.k;
    c.max_hops = p.max_hops;
    c.expand = p.expand_width;
    c.walk_through = p.walk_through;
    c.capacity = p.k;
  }
  require(set.width >= 1 && set.width <= max_graph_search_width, who,
          ": expected 1 <= adjacency width <= ", max_graph_search_width, ", got ", set.width);
  require(set.max_keys > 0 && set.max_keys < std::int64_t{walk_expanded}, who,
          ": expected 1 <= max_keys < ", walk_expanded, ", got ", set.max_keys);
  require(m > 0 && m <= std::int64_t{INT_MAX}, who, ": expected 1 <= queries <= ", INT_MAX,
          ", got ", m);
  require(p.degree_cap >= 0, who, ": expected degree_cap >= 0 (0 = all), got ", p.degree_cap);
  require(p.entry_prefix >= 0 && p.entry_prefix <= max_decode_search_seeds, who,
          ": expected 0 <= entry_prefix <= ", max_decode_search_seeds, ", got ", p.entry_prefix);
  c.prefix = p.entry_prefix;
  require(p.warps_per_search == 0 || p.warps_per_search == 1 ||
              ((p.warps_per_search == 4 || p.warps_per_search == 8) && !dipr),
          who,
          dipr ? ": expected warps_per_search 0 or 1 for DIPR, got "
               : ": expected warps_per_search 0, 1, 4 or 8, got ",
          p.warps_per_search);
  c.block = !dipr && p.warps_per_search != 1;
  c.warps_per_search = p.warps_per_search;
  c.cols = p.degree_cap == 0 ? set.width : std::min(set.width, p.degree_cap);
  c.by_cols = fast_divider(c.cols);
  c.inc = std::max(set.width, 32) * c.expand;
  c.words = static_cast<int>(walk_words(set.max_keys));
  const std::int64_t cap_even = (c.capacity + 1) / 2 * 2;  // 16-byte aligned lists
  c.slot_words = c.words + (dipr ? c.words + 2 * 2 * cap_even : 0);
  c.slots = static_cast<int>(walk_slots(m));
  return c;
}

/// The decode kernels' score of a key row: walk_score_parts' order with N = 4 partial sums,
/// computed by S = 1 or 4 lanes (part < S; the caller adds the lanes with
/// walk_combine_lanes<S>), so the block kernel, which scores a row of 16-byte vectors with four
/// lanes, and the warp kernel score every row bit for bit alike. Four 16-byte loads in flight
/// per round, not eight: at 64 registers per thread the block kernel spilled with eight (52 / 84
/// bytes of spill stores / loads in its eight-warp paged version, none with four), and without
/// the spills the search is faster although a row of 128 f16 takes four rounds instead of two
/// (H200, 512 searches, L 256, width 16: 0.397 against 0.418 ms, alternated;
/// docs/decode_search.md).
template <bool L2, int S, class T>
__device__ __forceinline__ float ds_score_part(const float* q, const T* __restrict__ a, int d,
                                               int part) {
  const T* const rows[1] = {a};
  float acc[1];
  walk_score_parts<L2, 4, S, 4, 1>(q, rows, d, part, acc);
  return acc[0];
}

/// Raw scores of a f32 query (shared memory) against two key rows (either may be null: its
/// score is left alone), in ds_score_part's order of summation. All sixteen 16-byte vectors of
/// both rows at d = 128 f16 are loaded before the first is used, so the pair costs one memory
/// latency: the warp kernel scores this way, and loading them together took 512 queries (L 256,
/// expand_width 8, H200) from 1.00 to 0.81 ms when this routine was first written.
template <bool L2, class T>
__device__ __forceinline__ void ds_score_pair(const float* q, const T* __restrict__ a,
                                              const T* __restrict__ b, int d, bool vec, float& sa,
                                              float& sb) {
  if (vec) {
    const T* const rows[2] = {a, b};
    float acc[2];
    walk_score_parts<L2, 4, 1, 16, 2>(q, rows, d, 0, acc);
    if (a != nullptr) sa = acc[0];
    if (b != nullptr) sb = acc[1];
    return;
  }
  if (a != nullptr) sa = walk_score<L2>(q, a, d, false);
  if (b != nullptr) sb = walk_score<L2>(q, b, d, false);
}

/// Inclusive prefix maximum over the warp's lanes.
__device__ __forceinline__ float ds_prefix_max(float x, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x = fmaxf(x, y);
  }
  return x;
}

/// Maximum over the warp's lanes, in every lane.
__device__ __forceinline__ float ds_warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

/// Max-heap (ranks_before order) in global memory, operated by one lane.
__device__ inline void ds_heap_push(walk_entry* h, int& n, walk_entry e) {
  int i = n++;
  while (i > 0) {
    const int parent = (i - 1) >> 1;
    if (!walk_better(e.key, e.id, h[parent].key, h[parent].id)) break;
    h[i] = h[parent];
    i = parent;
  }
  h[i] = e;
}

__device__ inline void ds_heap_pop(walk_entry* h, int& n) {
  const walk_entry last = h[--n];
  int i = 0;
  for (;;) {
    int c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && walk_better(h[c + 1].key, h[c + 1].id, h[c].key, h[c].id)) ++c;
    if (!walk_better(h[c].key, h[c].id, last.key, last.id)) break;
    h[i] = h[c];
    i = c;
  }
  if (n > 0) h[i] = last;
}

__device__ __forceinline__ bool ds_test(const std::uint32_t* bits, std::uint32_t v) {
  return (bits[v >> 5] >> (v & 31u)) & 1u;
}

__device__ __forceinline__ void ds_mark(std::uint32_t* bits, std::uint32_t v) {
  atomicOr(&bits[v >> 5], 1u << (v & 31u));
}

/// Compare-exchange of a[i] and a[j] (i < j): the better one ends at i. j >= n is padding that
/// ranks after everything, so nothing moves.
__device__ __forceinline__ void ds_order(walk_entry* a, int n, int i, int j) {
  if (j >= n) return;
  const walk_entry x = a[i], y = a[j];
  if (walk_better(y.key, y.id, x.key, x.id)) {
    a[i] = y;
    a[j] = x;
  }
}

/// Barrier of the threads that run one search: a warp, or a whole block of `Threads`.
template <int Threads>
__device__ __forceinline__ void ds_sync() {
  if constexpr (Threads == 32) {
    __syncwarp();
  } else {
    __syncthreads();
  }
}

/// Sorts a[0, n) best first in place (entries distinct in the pool order). Every thread of
/// the search (`rank` in [0, Threads)) calls it. A bitonic sort in the form whose comparators
/// all put the better entry at the lower index (each merge starts by comparing i with its
/// mirror in the block), so the padding to the next power of two is virtual: it ranks last
/// and never moves. O(n log^2 n / Threads) compare-exchanges per thread.
template <int Threads>
__device__ inline void ds_sort(walk_entry* a, int n, int rank) {
  if (n <= 1) return;
  const int log_n = 32 - __clz(n - 1);  // padded length 2^log_n
  const int half = 1 << (log_n - 1);    // comparators per stage
  for (int lk = 1; lk <= log_n; ++lk) {
    const int lh = lk - 1;  // log2 of half a block
    for (int t = rank; t < half; t += Threads) {
      const int blk = t >> lh, off = t & ((1 << lh) - 1);
      ds_order(a, n, (blk << lk) + off, (blk << lk) + (1 << lk) - 1 - off);
    }
    ds_sync<Threads>();
    for (int ls = lh - 1; ls >= 0; --ls) {
      for (int t = rank; t < half; t += Threads) {
        const int i = ((t >> ls) << (ls + 1)) + (t & ((1 << ls) - 1));
        ds_order(a, n, i, i + (1 << ls));
      }
      ds_sync<Threads>();
    }
  }
}

/// walk_compact_survivors for a block of `Threads` (warps of 32): the same in-place ordered
/// compaction, a chunk of `Threads` candidates at a time, each chunk read whole (one barrier)
/// before any thread writes.
template <int Threads>
__device__ inline int ds_block_compact_survivors(const walk_entry* pool, int cnt, int L,
                                                 walk_entry* inc, int n, int rank, int* warp_keep) {
  constexpr int warps = Threads / 32;
  const int lane = rank & 31, warp = rank >> 5;
  const bool is_full = cnt == L;
  const float worst_key = is_full ? pool[L - 1].key : 0.0f;
  const std::uint32_t worst_id = is_full ? pool[L - 1].id : 0u;
  int keep_n = 0;
  for (int j0 = 0; j0 < n; j0 += Threads) {
    const int j = j0 + rank;
    walk_entry e{0.0f, invalid_id};
    bool keep = false;
    if (j < n) {
      e = inc[j];
      keep = e.id != invalid_id && (!is_full || walk_better(e.key, e.id, worst_key, worst_id));
    }
    const unsigned b = __ballot_sync(0xffffffffu, keep);
    if (lane == 0) warp_keep[warp] = __popc(b);
    __syncthreads();
    int before = 0, total = 0;
#pragma unroll
    for (int w = 0; w < warps; ++w) {
      const int k = warp_keep[w];
      before += w < warp ? k : 0;
      total += k;
    }
    if (keep) inc[keep_n + before + __popc(b & ((1u << lane) - 1u))] = e;
    keep_n += total;
    __syncthreads();
  }
  return keep_n;
}

/// Entries of a[0, len) (in any order, distinct) that rank before e.
__device__ __forceinline__ int ds_count_better_unsorted(const walk_entry* a, int len,
                                                        walk_entry e) {
  int better = 0;
  for (int j = 0; j < len; ++j) better += walk_better(a[j].key, a[j].id, e.key, e.id) ? 1 : 0;
  return better;
}

/// The id of a lane with no survivor in ds_warp_sort, ranked after every real entry. No
/// survivor has it: bit 31 is the expanded flag, and survivors are fresh.
inline constexpr std::uint32_t ds_pad_id = 0xffffffffu;

/// Sorts the warp's 32 entries (one per lane) best first across the lanes: a bitonic network of
/// shuffles, no shared memory and no barrier; `ds_pad_id` lanes end last. 15 compare-exchange
/// stages of two shuffles each.
__device__ __forceinline__ void ds_warp_sort(walk_entry& e, int lane) {
#pragma unroll
  for (int k = 2; k <= 32; k <<= 1) {
#pragma unroll
    for (int j = k >> 1; j > 0; j >>= 1) {
      const float ok = __shfl_xor_sync(0xffffffffu, e.key, j);
      const std::uint32_t oi = __shfl_xor_sync(0xffffffffu, e.id, j);
      const bool mine_better =
          e.id != ds_pad_id && (oi == ds_pad_id || walk_better(e.key, e.id, ok, oi));
      // The lower lane of a pair keeps the better entry in a block sorted best first (lane & k
      // clear), the worse one in a block sorted the other way; its partner the other one.
      const bool keep = (((lane & j) == 0) == ((lane & k) == 0)) == mine_better;
      if (!keep) {
        e.key = ok;
        e.id = oi;
      }
    }
  }
}

/// Entries of the runs a[32w, 32w + min(32, n - 32w)) for w < ceil(n / 32), each sorted best
/// first, that rank before x: one branch-free search of six probes per run, the runs' probes
/// interleaved (independent loads in flight, not a chain per run).
template <int MaxRuns>
__device__ __forceinline__ int ds_count_better_runs(const walk_entry* a, int n, walk_entry x) {
  int pos[MaxRuns];
#pragma unroll
  for (int w = 0; w < MaxRuns; ++w) pos[w] = 0;
#pragma unroll
  for (int s = 32; s > 0; s >>= 1) {
#pragma unroll
    for (int w = 0; w < MaxRuns; ++w) {
      const int p = pos[w] + s - 1;
      if (p < min(32, n - 32 * w)) {
        const walk_entry y = a[32 * w + p];
        if (walk_better(y.key, y.id, x.key, x.id)) pos[w] += s;
      }
    }
  }
  int total = 0;
#pragma unroll
  for (int w = 0; w < MaxRuns; ++w) total += pos[w];
  return total;
}

/// Merges the scored candidates inc[0, n) (ids distinct and not in the pool; invalid_id marks
/// one to ignore) with the sorted pool[0, cnt) of capacity L and returns the new count. When
/// the pool is full only candidates better than its worst survive. The merged pool is written
/// to `other` (room for L entries) and the two pointers are swapped, unless nothing survived.
/// `inc` is clobbered (survivors compacted to its front, sorted unless few). Every entry's
/// final position is its index plus a binary search in the other sorted list (for a block and
/// at most Threads survivors: see below); positions are distinct, so all threads write at
/// once. Every thread of the search calls it; a block passes shared scratch for one int per
/// warp and Threads ints of insertion points. `cursor`, where given (shared),
/// is lowered to the merged pool's first new entry: the entries before it keep their places.
template <int Threads>
__device__ inline int ds_merge(walk_entry*& pool, walk_entry*& other, int cnt, int L,
                               walk_entry* inc, int n, int rank, int* warp_keep = nullptr,
                               int* ins = nullptr, int* cursor = nullptr) {
  int keep_n = 0;
  if constexpr (Threads == 32) {
    keep_n = walk_compact_survivors(pool, cnt, L, inc, n, rank);
  } else {
    keep_n = ds_block_compact_survivors<Threads>(pool, cnt, L, inc, n, rank, warp_keep);
  }
  if (keep_n == 0) return cnt;
  if (Threads > 32 && keep_n <= Threads) {
    // Up to a survivor per thread: no block sort (a bitonic sort pays a block barrier per
    // stage, 21-28 of them for 33-128 survivors). A survivor's position is its rank among the
    // survivors plus its insertion point in the pool (a binary search). The rank: for at most
    // ds_rank_merge_max survivors counted over the unsorted survivors; for more, each warp
    // sorts its 32 in registers (ds_warp_sort) and a survivor counts the better entries of
    // every warp's run (one barrier). The insertion points, stored by rank, ascend, and a pool
    // entry moves down by the number of them at or before its index (an entry and a survivor
    // are never equal): a binary search over them, and none for the entries before the best
    // survivor's point, which keep their places.
    if (keep_n <= ds_rank_merge_max) {
      for (int j = rank; j < keep_n; j += Threads) {
        const walk_entry e = inc[j];
        const int r = ds_count_better_unsorted(inc, keep_n, e);
        const int at = walk_count_better(pool, cnt, e.key, e.id);
        ins[r] = at;
        if (at + r < L) other[at + r] = e;
      }
    } else {
      walk_entry e{0.0f, ds_pad_id};
      if (rank < keep_n) e = inc[rank];
      if ((rank & ~31) < keep_n) {  // a warp with survivors (warp-uniform)
        ds_warp_sort(e, rank & 31);
        if (rank < keep_n) inc[rank] = e;
      }
      ds_sync<Threads>();
      if (rank < keep_n) {
        const int r = ds_count_better_runs<Threads / 32>(inc, keep_n, e);
        const int at = walk_count_better(pool, cnt, e.key, e.id);
        ins[r] = at;
        if (at + r < L) other[at + r] = e;
      }
    }
    ds_sync<Threads>();
    const int first = ins[0];
    if (cursor != nullptr && rank == 0) *cursor = min(*cursor, first);
    for (int i = rank; i < cnt; i += Threads) {
      int moved = 0;
      if (i >= first) {  // ins[0] <= i: count the insertion points <= i
        int lo = 1, hi = keep_n;
        while (lo < hi) {
          const int mid = (lo + hi) >> 1;
          if (ins[mid] <= i) {
            lo = mid + 1;
          } else {
            hi = mid;
          }
        }
        moved = lo;
      }
      if (i + moved < L) other[i + moved] = pool[i];
    }
  } else {
    ds_sort<Threads>(inc, keep_n, rank);
    for (int i = rank; i < cnt; i += Threads) {
      const walk_entry e = pool[i];
      const int pos = i + walk_count_better(inc, keep_n, e.key, e.id);
      if (pos < L) other[pos] = e;
    }
    for (int j = rank; j < keep_n; j += Threads) {
      const walk_entry e = inc[j];
      const int pos = j + walk_count_better(pool, cnt, e.key, e.id);
      if (pos < L) other[pos] = e;
      // The best survivor's position is the first new entry (thread 0 at j = 0, so no
      // search of its own).
      if (cursor != nullptr && j == 0) *cursor = min(*cursor, pos);
    }
  }
  ds_sync<Threads>();
  walk_entry* const t = pool;
  pool = other;
  other = t;
  return min(L, cnt + keep_n);
}

/// Nodes the next step of a top-k walk may expand: `expand`, or fewer when the hop cap
/// (max_hops, 0 = none) leaves fewer after `hops` expansions; 0 ends the walk.
__device__ inline int ds_step_nodes(const ds_config& c, int hops) {
  return c.max_hops != 0 ? min(c.expand, c.max_hops - hops) : c.expand;
}

/// A step's nodes, run by one warp: the first `expand` unexpanded entries of pool[from, cnt)
/// are marked expanded and their ids written to picks[0, np); returns np. `next`, where given,
/// is set (by lane 0) to the start of the last 32 entries looked at: every entry before it is
/// expanded, so the next pick may start there. The caller syncs before another warp reads
/// `picks`.
__device__ inline int ds_pick(walk_entry* pool, int cnt, int from, int expand, std::uint32_t* picks,
                              int lane, int* next = nullptr) {
  const unsigned lower_lanes = (1u << lane) - 1u;
  int np = 0;
  int at = from;
  for (int i0 = from; i0 < cnt && np < expand; i0 += 32) {
    at = i0;
    const int i = i0 + lane;
    const bool un = i < cnt && (pool[i].id & walk_expanded) == 0u;
    const unsigned b = __ballot_sync(0xffffffffu, un);
    const int r = np + __popc(b & lower_lanes);
    if (un && r < expand) {
      picks[r] = pool[i].id;
      pool[i].id |= walk_expanded;
    }
    np = min(expand, np + __popc(b));
  }
  if (next != nullptr) {
    __syncwarp();  // (`next` may be where the lanes read `from`)
    if (lane == 0) *next = at;
  }
  return np;
}

/// A search's output row from `count` to `capacity`: invalid_id and the worst score. Written
/// by the `Stride` threads of its team (`rank` in [0, Stride)).
template <bool L2, int Stride>
__device__ inline void ds_write_padding(const decode_search_outputs& out, std::size_t row0,
                                        int count, int capacity, int rank) {
  const float worst = L2 ? -neg_inf() : neg_inf();
  for (int i = count + rank; i < capacity; i += Stride) {
    out.ids[row0 + i] = invalid_id;
    if (out.scores != nullptr) out.scores[row0 + i] = worst;
  }
}

/// A top-k search's output row: the best `count` pool entries, then the padding. (A DIPR
/// search writes its own entries, then the padding.)
template <bool L2, int Stride>
__device__ inline void ds_write_topk(const decode_search_outputs& out, std::size_t row0,
                                     const walk_entry* pool, int count, int capacity, int rank) {
  for (int i = rank; i < count; i += Stride) {
    out.ids[row0 + i] = pool[i].id & ~walk_expanded;
    if (out.scores != nullptr) out.scores[row0 + i] = L2 ? -pool[i].key : pool[i].key;
  }
  ds_write_padding<L2, Stride>(out, row0, count, capacity, rank);
}

/// One search's view of its graph for the node expansions: the graph's adjacency rows, its key
/// count, the filter range and the visited bitset. Warp-uniform.
struct ds_graph_walk {
  const id_t* adj;  // row of key 0; `width` ids per row
  int width;
  int cols;  // neighbours read per row (degree_cap)
  std::uint32_t n;
  std::uint32_t first, last;  // the filter's range (Filtered only)
  std::uint32_t* visited;
  bool through;  // walk_through: a failing neighbour is walked through (else marked, dropped)

  template <bool Filtered>
  __device__ bool in_filter(std::uint32_t v) const {
    return !Filtered || (v >= first && v < last);
  }
};

/// The 2-hop walk-through of a filtered-out node v (the CPU's ACORN rule): its unvisited
/// passing neighbours, at most `room` of them (all when room < 0), are marked and appended to
/// inc[at, ...) in row order. Returns how many. Warp-synchronous.
template <bool Filtered>
__device__ int ds_through(const ds_graph_walk& w, std::uint32_t v, walk_entry* inc, int at,
                          int room, int lane, std::uint32_t& status) {
  constexpr unsigned full = 0xffffffffu;
  const unsigned lower_lanes = (1u << lane) - 1u;
  const id_t* nb = w.adj + static_cast<std::size_t>(v) * w.width;
  int got = 0;
  for (int r0 = 0; r0 < w.cols && (room < 0 || got < room); r0 += 32) {
    const int r = r0 + lane;
    std::uint32_t x = invalid_id;
    bool cand = false;
    if (r < w.cols) {
      x = nb[r];
      if (x != invalid_id && x >= w.n) {
        status |= decode_status_bad_id;
      } else if (x != invalid_id) {
        cand = !ds_test(w.visited, x) && w.in_filter<Filtered>(x);
      }
    }
    const unsigned b = __ballot_sync(full, cand);
    const int before = __popc(b & lower_lanes);
    const bool take = cand && (room < 0 || got + before < room);
    if (take) {
      ds_mark(w.visited, x);
      inc[at + got + before].id = x;
    }
    got += room < 0 ? __popc(b) : min(__popc(b), room - got);
    __syncwarp();
  }
  return got;
}

/// Expansion of node u, the CPU's: its fresh neighbours are marked and appended to
/// inc[at, ...) in the CPU's visit order; returns how many. With a filter, a fresh failing
/// neighbour is walked through (2-hop) and the row's degree caps what the expansion gathers.
/// Warp-synchronous.
template <bool Filtered>
__device__ int ds_expand_one(const ds_graph_walk& w, std::uint32_t u, walk_entry* inc, int at,
                             int lane, std::uint32_t& status) {
  constexpr unsigned full = 0xffffffffu;
  const unsigned lower_lanes = (1u << lane) - 1u;
  const id_t* nbrs = w.adj + static_cast<std::size_t>(u) * w.width;
  const int cols = w.cols;
  int fresh_n = 0;
  if (!Filtered || !w.through) {
    // All of the row's ids are loaded, then all visited-set updates issued, before any
    // result is used: one load latency and one atomic latency per expansion, not one per
    // 32 neighbours. Without the walk-through a failing id is marked visited and dropped.
    constexpr int rounds = max_graph_search_width / 32;
    std::uint32_t v[rounds];
    std::uint32_t was[rounds];
#pragma unroll
    for (int t = 0; t < rounds; ++t) {
      const int r = t * 32 + lane;
      v[t] = r < cols ? nbrs[r] : invalid_id;
    }
#pragma unroll
    for (int t = 0; t < rounds; ++t) {
      was[t] = ~0u;
      if (v[t] != invalid_id && v[t] >= w.n) {
        status |= decode_status_bad_id;
      } else if (v[t] != invalid_id) {
        was[t] = atomicOr(&w.visited[v[t] >> 5], 1u << (v[t] & 31u));
      }
    }
#pragma unroll
    for (int t = 0; t < rounds; ++t) {
      if (t * 32 >= cols) continue;  // (not break: the loop stays fully unrolled)
      const bool fresh = ((was[t] >> (v[t] & 31u)) & 1u) == 0u && w.in_filter<Filtered>(v[t]);
      const unsigned b = __ballot_sync(full, fresh);
      if (fresh) inc[at + fresh_n + __popc(b & lower_lanes)].id = v[t];
      fresh_n += __popc(b);
    }
    __syncwarp();
    return fresh_n;
  } else {
    // The row's degree (ids before the padding) caps what one expansion gathers (ACORN).
    int deg = cols;
    for (int r0 = 0; r0 < cols; r0 += 32) {
      const int r = r0 + lane;
      const unsigned b = __ballot_sync(full, r < cols && nbrs[r] == invalid_id);
      if (b != 0u) {
        deg = r0 + __ffs(b) - 1;
        break;
      }
    }
    int i = 0;
    while (i < deg && fresh_n < deg) {
      const int r = i + lane;
      const std::uint32_t v = r < deg ? nbrs[r] : invalid_id;
      bool unvisited = false;
      if (r < deg) {
        if (v >= w.n) {
          status |= decode_status_bad_id;
        } else {
          unvisited = !ds_test(w.visited, v);
        }
      }
      const bool pass = unvisited && w.in_filter<Filtered>(v);
      const unsigned fb = __ballot_sync(full, unvisited && !pass);
      const int stop = fb != 0u ? __ffs(fb) - 1 : 32;
      const unsigned pb = __ballot_sync(full, pass && lane < stop);
      const int room = deg - fresh_n;
      const int before = __popc(pb & lower_lanes);
      if (pass && lane < stop && before < room) {
        ds_mark(w.visited, v);
        inc[at + fresh_n + before].id = v;
      }
      fresh_n += min(__popc(pb), room);
      __syncwarp();
      if (fresh_n >= deg) break;
      if (stop == 32) {
        i += 32;
        continue;
      }
      const std::uint32_t fv = __shfl_sync(full, v, stop);
      if (lane == 0) ds_mark(w.visited, fv);
      __syncwarp();
      fresh_n += ds_through<Filtered>(w, fv, inc, at + fresh_n, deg - fresh_n, lane, status);
      i += stop + 1;
    }
    return fresh_n;
  }
}

/// Seeds entry point s: marks it and puts it at inc[at] when it passes the filter, else walks
/// through it (its passing unvisited neighbours). Returns the candidates added; 0 for an
/// invalid, out-of-range (status bit) or already visited s. Warp-synchronous.
template <bool Filtered>
__device__ int ds_seed(const ds_graph_walk& w, std::uint32_t s, walk_entry* inc, int at, int lane,
                       std::uint32_t& status) {
  if (s == invalid_id) return 0;
  if (s >= w.n) {
    status |= decode_status_bad_id;
    return 0;
  }
  if (ds_test(w.visited, s)) return 0;
  __syncwarp();
  if (lane == 0) ds_mark(w.visited, s);
  int nv = 0;
  if (w.in_filter<Filtered>(s)) {
    if (lane == 0) inc[at].id = s;
    nv = 1;
  }
  __syncwarp();
  if (nv == 0) nv = ds_through<Filtered>(w, s, inc, at, -1, lane, status);
  return nv;
}

/// The fallback seeding of a filtered search that no entry point reached: the unvisited ids
/// of [b0, b0 + 32) inside the filter, at most `room` of them, marked and appended to
/// inc[at, ...) in id order. Returns how many. Warp-synchronous.
__device__ inline int ds_seed_ids(const ds_graph_walk& w, std::uint32_t b0, int room,
                                  walk_entry* inc, int at, int lane) {
  const unsigned lower_lanes = (1u << lane) - 1u;
  const std::uint32_t v = b0 + static_cast<std::uint32_t>(lane);
  const bool cand = v < w.last && !ds_test(w.visited, v);
  const unsigned b = __ballot_sync(0xffffffffu, cand);
  const int before = __popc(b & lower_lanes);
  if (cand && before < room) {
    ds_mark(w.visited, v);
    inc[at + before].id = v;
  }
  __syncwarp();
  return min(__popc(b), room);
}

/// Seed e of query qi over graph g of n keys: the graph's entry points first, then the query's
/// seeds and extra seeds, then the ids [0, entry_prefix) below n (invalid_id, skipped, for those at
/// or above).
__device__ __forceinline__ std::uint32_t ds_seed_id(const graph_set_ref& set,
                                                    const decode_queries& qs, int g, int qi, int e,
                                                    std::int64_t n) {
  if (e < set.max_entries) return set.entries[static_cast<std::size_t>(g) * set.max_entries + e];
  e -= set.max_entries;
  if (e < qs.seeds_ld) return qs.seeds[static_cast<std::size_t>(qi) * qs.seeds_ld + e];
  e -= qs.seeds_ld;
  if (e < qs.extra_seeds_ld) {
    return qs.extra_seeds[static_cast<std::size_t>(qi) * qs.extra_seeds_ld + e];
  }
  e -= qs.extra_seeds_ld;
  return e < n ? static_cast<std::uint32_t>(e) : invalid_id;
}

/// Keys of graph g (sizes[g], or all its rows), or -1 when sizes[g] exceeds its rows.
__device__ __forceinline__ std::int64_t ds_graph_keys(const graph_set_ref& set, int g) {
  const std::int64_t rows = set.row_offset[g + 1] - set.row_offset[g];
  if (set.sizes == nullptr) return rows;
  const std::int64_t n = set.sizes[g];
  return n <= rows ? n : -1;
}

/// Query qi's graph g: its first row `base`, key count `n` and filter range [first, last)
/// (the whole graph without a filter). False when the query cannot run: a bad graph or filter
/// (status bit) or an empty range (not an error: a context that is all window).
template <bool Filtered, class Src>
__device__ bool ds_query_graph(const graph_set_ref& set, const Src& src, const decode_queries& qs,
                               int qi, int g, std::int64_t& base, std::int64_t& n,
                               std::uint32_t& first, std::uint32_t& last, std::uint32_t& status) {
  bool ok = g >= 0 && g < set.num_graphs;
  if (ok) {
    base = set.row_offset[g];
    n = ds_graph_keys(set, g);
    ok = base >= 0 && n >= 0 && n <= set.max_keys && n <= src.capacity(g);
  }
  if (!ok) status |= decode_status_bad_graph;
  first = 0;
  last = ok ? static_cast<std::uint32_t>(n) : 0u;
  if constexpr (Filtered) {
    first = qs.filter_first[qi];
    last = qs.filter_last[qi];
    if (ok && !(first <= last && last <= n)) {
      status |= decode_status_bad_query;
      ok = false;
    } else if (first == last) {
      ok = false;
    }
  }
  return ok;
}

template <class T, class Src, bool L2, bool Dipr, bool Filtered>
__global__ void __launch_bounds__(ds_warps_per_block * 32)
    decode_search_kernel(graph_set_ref set, Src src, decode_queries qs, int m, ds_config c,
                         decode_search_outputs out, std::uint32_t* ws) {
  extern __shared__ __align__(16) unsigned char ds_smem[];
  constexpr unsigned full = 0xffffffffu;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int slot = static_cast<int>(blockIdx.x) * ds_warps_per_block + warp;
  if (slot >= c.slots) return;  // warp-level only: the kernel has no block barrier
  unsigned char* base_smem = ds_smem + static_cast<std::size_t>(warp) * c.lay.warp_bytes;
  float* const q = reinterpret_cast<float*>(base_smem);
  walk_entry* pool = reinterpret_cast<walk_entry*>(base_smem + c.pool_off);
  walk_entry* other = reinterpret_cast<walk_entry*>(base_smem + c.pool2_off);  // merge target
  walk_entry* const inc = reinterpret_cast<walk_entry*>(base_smem + c.inc_off);
  std::uint32_t* const slot_ws = ws + static_cast<std::size_t>(slot) * c.slot_words;
  std::uint32_t* const visited =
      c.visited_off >= 0 ? reinterpret_cast<std::uint32_t*>(base_smem + c.visited_off) : slot_ws;
  std::uint32_t* const expanded = slot_ws + c.words;
  walk_entry* const heap = reinterpret_cast<walk_entry*>(expanded + c.words);
  walk_entry* const range = heap + (c.capacity + 1) / 2 * 2;
  const unsigned lower_lanes = (1u << lane) - 1u;
  const int d = c.d;
  const int width = set.width;  // row stride of the adjacency
  const int cols = c.cols;      // neighbours read per row (degree_cap)
  std::uint32_t status = 0;

  for (int qi = slot; qi < m; qi += c.slots) {
    const int g = qs.graph[qi];
    std::int64_t base = 0, n = 0;
    std::uint32_t first = 0, last = 0;
    bool ok = ds_query_graph<Filtered>(set, src, qs, qi, g, base, n, first, last, status);
    float best = neg_inf();  // DIPR: best key seen
    bool seeded = false;
    if constexpr (Dipr) {
      if (qs.seed_score != nullptr) {
        const float s = qs.seed_score[qi];
        if (isinf(s)) {
          status |= decode_status_bad_query;
          ok = false;
        } else if (!isnan(s)) {
          seeded = true;
          best = walk_key<L2>(s);
        }
      }
    }
    bool finite = true;
    if (ok) {
      for (int j = lane; j < d; j += 32) {
        const float x = qs.q[static_cast<std::size_t>(qi) * qs.ld + j];
        finite &= isfinite(x);
        q[j] = x;
      }
      finite = __all_sync(full, finite);
    }
    const bool run = ok && finite && n > 0;
    int cnt = 0;         // pool entries
    int rn = 0, hn = 0;  // DIPR: in-range list and heap entries
    int rc = 0;          // DIPR, expand_width > 1: in-range entries examined for expansion
    bool capped = false;
    std::uint32_t scored = 0;

    if (run) {
      uint4* v4 = reinterpret_cast<uint4*>(visited);
      for (int w = lane; w < c.words / 4; w += 32) v4[w] = make_uint4(0u, 0u, 0u, 0u);
      if constexpr (Dipr) {
        uint4* e4 = reinterpret_cast<uint4*>(expanded);
        for (int w = lane; w < c.words / 4; w += 32) e4[w] = make_uint4(0u, 0u, 0u, 0u);
      }
      __syncwarp();
    }
    auto in_filter = [&](std::uint32_t v) { return !Filtered || (v >= first && v < last); };
    auto row_of = [&](std::uint32_t v) { return src.row(g, base, v); };
    const id_t* adj = set.adjacency + static_cast<std::size_t>(base) * width;

    // Scores inc[0, nv) a lane per row, two rows per lane per round with their loads
    // interleaved: a round costs one memory latency for up to 64 rows instead of two. (A team
    // of 16 lanes per row, each lane one 16-byte vector, was measured slower: 1.25-1.32 ms
    // against 0.85 ms for 512 queries at L 256, expand_width 8; it needs more rounds for the
    // same rows, and a round's latency is what a step waits for:
    // bench/results/h200_decode_search_variants.txt. A later team variant with all 16 loads
    // of a lane in flight and a butterfly reduction tied on dense keys, 0.757 vs 0.754 ms, and
    // lost on paged ones, 1.491 vs 0.813 ms: every lane of a team repeats the page-table
    // lookups of its 16 rows; h200_decode_search_team_scoring.txt.)
    auto score_rows = [&](int nv) {
      for (int j0 = 0; j0 < nv; j0 += 64) {
        const int ja = j0 + lane, jb = ja + 32;
        const T* ra = ja < nv ? row_of(inc[ja].id) : nullptr;
        const T* rb = jb < nv ? row_of(inc[jb].id) : nullptr;
        if ((ja < nv && ra == nullptr) || (jb < nv && rb == nullptr)) {
          status |= decode_status_bad_id;
        }
        float sa = 0.0f, sb = 0.0f;
        ds_score_pair<L2>(q, ra, rb, d, c.vec, sa, sb);
        if (ja < nv) inc[ja].key = ra != nullptr ? walk_key<L2>(sa) : neg_inf();
        if (jb < nv) inc[jb].key = rb != nullptr ? walk_key<L2>(sb) : neg_inf();
      }
    };

    // Visits inc[0, nv) in order: score each, then the CPU's `visit` for each (pool insert;
    // DIPR: running best, in-range push, cap).
    auto visit = [&](int nv) {
      score_rows(nv);
      __syncwarp();
      if constexpr (Dipr) {
        for (int j0 = 0; j0 < nv; j0 += 32) {
          const int j = j0 + lane;
          const bool live = j < nv && !capped;
          const walk_entry e = live ? inc[j] : walk_entry{neg_inf(), invalid_id};
          const float run_best = fmaxf(best, ds_prefix_max(e.key, lane));
          const bool in_range = live && e.key >= run_best - c.beta;
          const unsigned rb = __ballot_sync(full, in_range);
          // The visit that brings the in-range count to the cap is the last one made.
          const int room = c.capacity - rn;
          int last_lane = 31;
          if (__popc(rb) >= room && !capped) {
            unsigned b = rb;
            for (int t = 1; t < room; ++t) b &= b - 1;  // drop the lowest room - 1 bits
            last_lane = __ffs(b) - 1;
            capped = true;
          }
          const bool done = live && lane <= last_lane;
          if (!done && j < nv) inc[j].id = invalid_id;  // not visited: no pool insert
          const bool take = in_range && lane <= last_lane;
          const unsigned tb = __ballot_sync(full, take);
          if (take) range[rn + __popc(tb & lower_lanes)] = e;
          if (lane == 0 && c.expand == 1) {  // the wider walk reads the list, not the heap
            for (unsigned b = tb; b != 0u; b &= b - 1) {
              ds_heap_push(heap, hn, inc[j0 + __ffs(b) - 1]);
            }
          }
          hn = __shfl_sync(full, hn, 0);
          rn += __popc(tb);
          scored += static_cast<std::uint32_t>(__popc(__ballot_sync(full, done)));
          best = fmaxf(best, ds_warp_max(done ? e.key : neg_inf()));
          __syncwarp();
        }
      } else {
        scored += static_cast<std::uint32_t>(nv);
      }
      cnt = ds_merge<32>(pool, other, cnt, c.pool, inc, nv, lane);
    };

    const ds_graph_walk gw{adj,   width, cols,    static_cast<std::uint32_t>(n),
                           first, last,  visited, c.walk_through};
    auto expand = [&](std::uint32_t u, int at) {
      return ds_expand_one<Filtered>(gw, u, inc, at, lane, status);
    };

    // Top-k: the best `expand` unexpanded pool entries from `from` (the first unexpanded one)
    // are marked expanded, then every id of their rows is loaded before any visited-set
    // update, and every update issued before any result is used: a step costs one row-load
    // latency per 256 ids, not one load and one update latency per expanded node. Fresh
    // neighbours come out in (node, column) order, as from one-by-one expansions; an id in two
    // of the rows is taken once, by whichever lane's update lands first (the candidate set,
    // hence the merged pool, does not depend on which).
    //
    // With a filter the batch is exact only while every fresh id passes: a fresh failing id
    // starts a 2-hop walk-through whose result depends on what the earlier expansions of the
    // step marked, and the expansion's gather cap counts the 2-hop ids. So a chunk is checked
    // for fresh failing ids before its updates are issued (each filtered-out id is met fresh
    // once per search, and a decode step's window is few ids); if there is one, the updates of
    // the earlier chunks, which are exactly the ids gathered so far, are undone and the step's
    // nodes are expanded one by one with the CPU's rule. Either way the step gathers what the
    // CPU's expansions of the same nodes would. With walk_through = false no chunk is checked:
    // failing ids are marked and dropped at the compaction.
    auto expand_batch = [&](int from, int want, int& np) {
      // The nodes go to the other pool buffer, free until the merge; they are pool entries, so
      // there are at most L of them, and that buffer holds 2L ids.
      std::uint32_t* const picks = reinterpret_cast<std::uint32_t*>(other);
      np = ds_pick(pool, min(cnt, c.limit), from, want, picks, lane);
      __syncwarp();
      const int total = np * cols;
      int fresh_n = 0;
      constexpr int U = 8;  // row ids in flight per lane
      for (int f0 = 0; f0 < total; f0 += 32 * U) {
        std::uint32_t v[U];
        std::uint32_t was[U];
#pragma unroll
        for (int t = 0; t < U; ++t) {
          const int f = f0 + t * 32 + lane;
          v[t] = invalid_id;
          if (f < total) {
            const int r = f / cols;
            v[t] = adj[static_cast<std::size_t>(picks[r]) * width + (f - r * cols)];
          }
        }
        if (Filtered && c.walk_through) {
          bool stray = false;  // a fresh id that fails the filter
#pragma unroll
          for (int t = 0; t < U; ++t) {
            stray |=
                v[t] < static_cast<std::uint32_t>(n) && !in_filter(v[t]) && !ds_test(visited, v[t]);
          }
          if (__any_sync(full, stray)) {
            for (int j = lane; j < fresh_n; j += 32) {
              const std::uint32_t w = inc[j].id;
              atomicAnd(&visited[w >> 5], ~(1u << (w & 31u)));
            }
            __syncwarp();
            fresh_n = 0;
            for (int r = 0; r < np; ++r) fresh_n += expand(picks[r], fresh_n);
            return fresh_n;
          }
        }
#pragma unroll
        for (int t = 0; t < U; ++t) {
          was[t] = ~0u;
          if (v[t] != invalid_id && v[t] >= static_cast<std::uint32_t>(n)) {
            status |= decode_status_bad_id;
          } else if (v[t] != invalid_id) {
            was[t] = atomicOr(&visited[v[t] >> 5], 1u << (v[t] & 31u));
          }
        }
#pragma unroll
        for (int t = 0; t < U; ++t) {
          // Without the walk-through a failing id is marked (above) and dropped here.
          const bool fresh = ((was[t] >> (v[t] & 31u)) & 1u) == 0u && in_filter(v[t]);
          const unsigned b = __ballot_sync(full, fresh);
          if (fresh) inc[fresh_n + __popc(b & lower_lanes)].id = v[t];
          fresh_n += __popc(b);
        }
      }
      __syncwarp();
      return fresh_n;
    };

    // The first pool entry at or after `from` not yet expanded (INT_MAX if none), warp-uniform.
    auto unexpanded_from = [&](int from) {
      int at = INT_MAX;
      const int upto = min(cnt, c.limit);  // top-k: only the best expand_limit are expanded
      for (int i = from + lane; i < upto; i += 32) {
        if ((pool[i].id & walk_expanded) == 0u) {
          at = i;
          break;
        }
      }
      return __reduce_min_sync(full, at);
    };

    if (run) {
      // Seeds: the graph's entry points, the query's own and extra seeds, ids [0, prefix), in
      // order, each visited or walked through.
      int seeded_n = 0;
      for (int e = 0; e < set.max_entries + qs.seeds_ld + qs.extra_seeds_ld + c.prefix && !capped;
           ++e) {
        const std::uint32_t s = ds_seed_id(set, qs, g, qi, e, n);
        const int nv = ds_seed<Filtered>(gw, s, inc, 0, lane, status);
        seeded_n += nv;
        if (nv > 0) visit(nv);
      }
      if constexpr (Filtered) {
        // No seed passed: the first passing ids in id order, as many as the pool holds.
        const int want = c.pool;
        if (seeded_n == 0) {
          for (std::uint32_t b0 = first;; b0 += 32) {
            const int nv = ds_seed_ids(gw, b0, want - seeded_n, inc, 0, lane);
            seeded_n += nv;
            if (nv > 0) visit(nv);
            if (seeded_n >= want || capped || last - b0 <= 32) break;  // (no wrap past last)
          }
        }
      }

      int hops = 0;  // nodes expanded (max_hops)
      for (;;) {
        if (capped) break;
        int pick = unexpanded_from(0);
        std::uint32_t next = invalid_id;
        if constexpr (Dipr) {
          if (c.expand > 1) {
            // The wider DIPR walk: the best `expand` unexpanded beam entries while there are
            // any, else the next `expand` in-range entries in discovery order that are still
            // within beta of the best and not yet expanded, their fresh neighbours visited as
            // one batch. Fewer sequential steps and no heap; the in-range region is flooded
            // in another order than the CPU's best-first one, so results may differ from it.
            int nv = 0;
            int took = 0;
            bool out_of_hops = false;  // capped by max_hops once this batch is visited
            const bool from_beam = pick != INT_MAX;  // a batch is beam entries or range entries
            while (took < c.expand && !capped) {
              std::uint32_t u = invalid_id;
              if (from_beam) {
                if (pick == INT_MAX) break;
                u = pool[pick].id;
                __syncwarp();
                if (lane == 0) pool[pick].id = u | walk_expanded;
                __syncwarp();
                pick = unexpanded_from(pick + 1);
              } else {
                // The next in-range entry from the cursor that is still in range.
                const float threshold = best - c.beta;
                int found = -1;
                while (rc < rn) {
                  const int j = rc + lane;
                  const bool cand =
                      j < rn && range[j].key >= threshold && !ds_test(expanded, range[j].id);
                  const unsigned b = __ballot_sync(full, cand);
                  if (b != 0u) {
                    found = rc + __ffs(b) - 1;
                    rc = found + 1;
                    break;
                  }
                  rc = min(rc + 32, rn);
                }
                if (found < 0) break;
                u = range[found].id;
              }
              std::uint32_t was = 0;
              if (lane == 0) was = atomicOr(&expanded[u >> 5], 1u << (u & 31u));
              was = __shfl_sync(full, was, 0);
              ++took;
              if ((was >> (u & 31u)) & 1u) continue;        // reached through both parts
              if (c.max_hops != 0 && hops >= c.max_hops) {  // as the CPU: about to expand one more
                out_of_hops = true;
                break;
              }
              ++hops;
              nv += expand(u, nv);
            }
            if (took == 0) break;
            if (nv > 0) visit(nv);
            if (out_of_hops) capped = true;
            continue;
          }
          const bool beam = pick != INT_MAX;
          const walk_entry top = hn > 0 ? heap[0] : walk_entry{neg_inf(), invalid_id};
          const bool in_range = hn > 0 && top.key >= best - c.beta;
          if (beam && (!in_range || pool[pick].key >= top.key)) {
            next = pool[pick].id;
            __syncwarp();
            if (lane == 0) pool[pick].id = next | walk_expanded;
          } else if (in_range) {
            next = top.id;
            __syncwarp();
            if (lane == 0) ds_heap_pop(heap, hn);
            hn = __shfl_sync(full, hn, 0);
          } else {
            break;
          }
          __syncwarp();
          std::uint32_t was = 0;
          if (lane == 0) was = atomicOr(&expanded[next >> 5], 1u << (next & 31u));
          was = __shfl_sync(full, was, 0);
          if ((was >> (next & 31u)) & 1u) continue;     // reached through both parts
          if (c.max_hops != 0 && hops >= c.max_hops) {  // the CPU's rule: one more is too many
            capped = true;
            break;
          }
          ++hops;
        } else {
          // The best `expand` unexpanded entries in pool order, their fresh neighbours visited
          // as one batch (expand = 1 is the CPU's walk), while the hop cap leaves any.
          const int want = ds_step_nodes(c, hops);
          if (pick == INT_MAX || want <= 0) break;
          int np = 0;
          const int nv = expand_batch(pick, want, np);
          hops += np;
          if (nv > 0) visit(nv);
          continue;
        }
        __syncwarp();
        const int nv = expand(next, 0);
        if (nv > 0) visit(nv);
      }
    }

    // Outputs.
    const std::size_t row0 = static_cast<std::size_t>(qi) * c.capacity;
    int count = 0;
    if constexpr (Dipr) {
      const bool any = best != neg_inf();
      const float threshold = best - c.beta;
      for (int j0 = 0; j0 < rn; j0 += 32) {
        const int j = j0 + lane;
        const bool keep = any && j < rn && range[j].key >= threshold;
        const unsigned b = __ballot_sync(full, keep);
        if (keep) {
          const int at = count + __popc(b & lower_lanes);
          out.ids[row0 + at] = range[j].id;
          if (out.scores != nullptr) out.scores[row0 + at] = L2 ? -range[j].key : range[j].key;
        }
        count += __popc(b);
      }
      if (lane == 0 && out.best_scores != nullptr) {
        const float worst = L2 ? -neg_inf() : neg_inf();
        out.best_scores[qi] = (best == neg_inf() && !seeded) ? worst : (L2 ? -best : best);
      }
      if (capped) status |= decode_status_capped;
      ds_write_padding<L2, 32>(out, row0, count, c.capacity, lane);
    } else {
      count = min(c.k, cnt);
      ds_write_topk<L2, 32>(out, row0, pool, count, c.capacity, lane);
    }
    if (lane == 0) {
      out.counts[qi] = static_cast<std::uint32_t>(count);
      if (out.scored != nullptr) out.scored[qi] = scored;
      if (out.capped != nullptr) out.capped[qi] = capped ? 1u : 0u;
    }
    __syncwarp();  // the next search reuses this warp's shared memory and workspace
  }
  status = __reduce_or_sync(full, status);
  if (lane == 0 && status != 0u && out.status != nullptr) atomicOr(out.status, status);
}

/// Top-k with a block of NT threads (four or eight warps) per search: the same walk as
/// decode_search_kernel (same seeds, same batches of `expand` nodes, same candidates, so the
/// same pool, ids, scores and vectors scored), with a step's row-id loads, visited-set updates,
/// scoring and merge spread over the block's warps instead of one. A decode batch leaves the
/// GPU 2-8 searches per SM, so a warp per search leaves most of each SM idle while the search's
/// chain of dependent latencies runs; more warps shorten every link of that chain (eight when
/// a wide step's ~200 fresh rows would take a block of four two rounds). What stays sequential (the
/// seeding, the one-by-one fallback of a filtered step that meets a fresh filtered-out id, the
/// choice of a step's nodes) runs on warp 0 with the same warp functions as the warp kernel.
/// One block per running search (grid = slots); block barriers, so every branch around one is
/// block-uniform.
template <class T, class Src, bool L2, bool Filtered, int NT>
__global__ void __launch_bounds__(NT, ds_block_sm_threads / NT)
    decode_search_block_kernel(graph_set_ref set, Src src, decode_queries qs, int m, ds_config c,
                               decode_search_outputs out, std::uint32_t* ws) {
  extern __shared__ __align__(16) unsigned char ds_smem[];
  // said[0]: a count gathered by atomics (fresh ids); [1]: a count warp 0 hands to the block;
  // [2]: warp 0's "no more seeds"; [3]: the pick cursor (below); [4, 4 + NT / 32): the merge's
  // per-warp counts; [12, 12 + NT): its insertion points. (In the dynamic region: a kernel with
  // static shared memory could not be given the device's whole opt-in size.)
  int* const said = reinterpret_cast<int*>(ds_smem + c.said_off);
  constexpr unsigned full = 0xffffffffu;
  static_assert(NT % 32 == 0 && 4 + NT / 32 <= 12, "said[4, 12) holds a count per warp");
  static_assert(12 + NT <= ds_said_ints, "said[12, 12 + NT) holds an insertion point per thread");
  const int rank = static_cast<int>(threadIdx.x);
  const int lane = rank & 31, warp = rank >> 5;
  float* const q = reinterpret_cast<float*>(ds_smem);
  walk_entry* pool = reinterpret_cast<walk_entry*>(ds_smem + c.pool_off);
  walk_entry* other = reinterpret_cast<walk_entry*>(ds_smem + c.pool2_off);
  walk_entry* const inc = reinterpret_cast<walk_entry*>(ds_smem + c.inc_off);
  std::uint32_t* const visited = c.visited_off >= 0
                                     ? reinterpret_cast<std::uint32_t*>(ds_smem + c.visited_off)
                                     : ws + static_cast<std::size_t>(blockIdx.x) * c.slot_words;
  const int d = c.d;
  const int width = set.width;
  const int cols = c.cols;
  std::uint32_t status = 0;

  for (int qi = static_cast<int>(blockIdx.x); qi < m; qi += static_cast<int>(gridDim.x)) {
    const int g = qs.graph[qi];
    std::int64_t base = 0, n = 0;
    std::uint32_t first = 0, last = 0;
    const bool ok = ds_query_graph<Filtered>(set, src, qs, qi, g, base, n, first, last, status);
    bool finite = true;
    if (ok) {
      for (int j = rank; j < d; j += NT) {
        const float x = qs.q[static_cast<std::size_t>(qi) * qs.ld + j];
        finite &= isfinite(x);
        q[j] = x;
      }
    }
    // The pick cursor: every pool entry before said[3] is expanded, so a step's pick starts
    // there instead of at the pool's front (a pick moves it to its last 32 entries, a merge
    // back to its first new entry). At L 272 and 8 nodes a step, the pick's scan from the
    // front was about a tenth of the dense search's time.
    if (rank == 0) said[3] = 0;
    finite = __syncthreads_and(finite) != 0;
    const bool run = ok && finite && n > 0;
    int cnt = 0;
    std::uint32_t scored = 0;
    if (run) {
      uint4* v4 = reinterpret_cast<uint4*>(visited);
      for (int w = rank; w < c.words / 4; w += NT) v4[w] = make_uint4(0u, 0u, 0u, 0u);
      __syncthreads();
    }
    const id_t* adj = set.adjacency + static_cast<std::size_t>(base) * width;
    const ds_graph_walk gw{adj,   width, cols,    static_cast<std::uint32_t>(n),
                           first, last,  visited, c.walk_through};

    // Scores inc[0, nv), four threads per row (one for rows not in 16-byte vectors), and
    // merges them into the pool.
    // Block-uniform.
    auto visit = [&](int nv, bool located = false) {
      // Four lanes per row whenever the rows are 16-byte vectors: a row's chain of load rounds
      // is four times shorter and its loads coalesce (four lanes read 64 contiguous bytes). The
      // block used to split rows only when one pass held them all (S = 4 up to NT / 4 rows,
      // 2 up to NT / 2, else 1); in several passes it is faster still. H200, 128K tokens,
      // L 256, top-100 search of 1024 queries (width 8): 0.448 against 0.590 ms; of 512
      // (width 16): 0.243 against 0.313 ms; S >= 2 always: 0.459 / 0.256 ms
      // (bench/results/h200_decode_search_lanes_per_row.txt). The score is the same whatever S
      // (ds_score_part).
      auto score = [&]<int S>() {
        for (int j0 = 0; j0 < nv; j0 += NT / S) {  // block-uniform trip count (shuffles)
          const int j = j0 + rank / S;
          const T* r = nullptr;
          if (j < nv) {
            const std::uint32_t id = inc[j].id;
            r = Src::locates && located ? src.at(base, id, __float_as_int(inc[j].key))
                                        : src.row(g, base, id);
          }
          if (j < nv && r == nullptr) status |= decode_status_bad_id;
          float x = 0.0f;
          if (r != nullptr) {
            x = c.vec ? ds_score_part<L2, S>(q, r, d, rank % S) : walk_score<L2>(q, r, d, false);
          }
          x = walk_combine_lanes<S>(x);
          // The row's S lanes read its page from inc[j].key, which the first one overwrites
          // next: the shuffles above do not order shared-memory accesses, a warp barrier does.
          if (Src::locates && located && S > 1) __syncwarp();
          if (j < nv && rank % S == 0) inc[j].key = r != nullptr ? walk_key<L2>(x) : neg_inf();
        }
      };
      if (c.vec) {
        score.template operator()<4>();
      } else {
        score.template operator()<1>();
      }
      __syncthreads();
      scored += static_cast<std::uint32_t>(nv);
      cnt = ds_merge<NT>(pool, other, cnt, c.pool, inc, nv, rank, said + 4, said + 12, said + 3);
    };

    // Warp 0 gathers, the block visits: the gathered candidates, as long as inc holds them,
    // are visited together (the pool keeps the best L of their union, whatever the order of
    // visits), so a block barrier is paid per batch rather than per seed. Visits the
    // said[slot] candidates in inc (gathered by warp 0, or by the block's atomics in a step);
    // called after the barrier that follows those writes.
    auto visit_gathered = [&](int slot, bool located = false) {
      const int nv = said[slot];
      if (nv > 0) {
        visit(nv, located);
      } else {
        __syncthreads();  // said[] is rewritten by warp 0 next
      }
      return nv;
    };

    if (run) {
      // Seeds: the entry points, the query's own and extra seeds, ids [0, prefix), in order, each
      // visited or walked through.
      int seeded_n = 0;
      int e = 0;  // warp 0's cursor
      const int seeds_n = set.max_entries + qs.seeds_ld + qs.extra_seeds_ld + c.prefix;
      // A seed adds one candidate, or up to `cols` when it fails the filter (walked through).
      const int per_seed = Filtered ? cols : 1;
      for (;;) {
        if (warp == 0) {
          int nv = 0;
          // Seeds 32 at a time, one visited-set update per lane (the pool keeps the best L of
          // the union, whatever the order of the visits), while no fresh seed of a chunk fails
          // the filter; a chunk with one goes one seed after the other (a failing seed is
          // walked through, and what that gathers depends on the order). Routed seeds are
          // hundreds per query (route_seeds.cuh); one by one, each cost warp 0 a visited-set
          // test, a mark and two warp barriers while the rest of the block waited.
          while (e < seeds_n) {
            const int chunk = min(32, seeds_n - e);
            std::uint32_t s = lane < chunk ? ds_seed_id(set, qs, g, qi, e + lane, n) : invalid_id;
            if (s != invalid_id && s >= gw.n) {
              status |= decode_status_bad_id;
              s = invalid_id;
            }
            const bool fresh = s != invalid_id && !ds_test(visited, s);
            if (__any_sync(full, fresh && !gw.in_filter<Filtered>(s))) {
              int t = 0;
              for (; t < chunk && nv + per_seed <= c.inc; ++t) {
                nv += ds_seed<Filtered>(gw, ds_seed_id(set, qs, g, qi, e + t, n), inc, nv, lane,
                                        status);
              }
              e += t;
              if (t < chunk) break;
              continue;
            }
            if (nv + 32 > c.inc) break;
            bool take = false;
            if (fresh) {
              const std::uint32_t bit = 1u << (s & 31u);
              take = (atomicOr(&visited[s >> 5], bit) & bit) == 0u;  // an id twice: once
            }
            const unsigned b = __ballot_sync(full, take);
            if (take) inc[nv + __popc(b & ((1u << lane) - 1u))].id = s;
            nv += __popc(b);
            e += chunk;
            __syncwarp();
          }
          if (lane == 0) {
            said[1] = nv;
            said[2] = e >= seeds_n;
          }
        }
        __syncthreads();
        const bool last_batch = said[2] != 0;
        seeded_n += visit_gathered(1);
        if (last_batch) break;
      }
      if constexpr (Filtered) {
        // No seed passed: the first passing ids in id order, as many as the pool holds.
        const int want = c.pool;
        std::uint32_t b0 = first;  // warp 0's cursor
        bool more = seeded_n == 0;
        while (more) {
          if (warp == 0) {
            int nv = 0;
            bool end = false;
            for (;;) {
              nv += ds_seed_ids(gw, b0, want - seeded_n - nv, inc, nv, lane);
              end = seeded_n + nv >= want || last - b0 <= 32;  // (no wrap past last)
              if (end || nv + 32 > c.inc) break;
              b0 += 32;
            }
            if (!end) b0 += 32;
            if (lane == 0) {
              said[1] = nv;
              said[2] = end;
            }
          }
          __syncthreads();
          more = said[2] == 0;
          seeded_n += visit_gathered(1);
        }
      }

      // Steps: warp 0 takes the best `expand` unexpanded pool entries; the block loads their
      // rows' ids, marks them visited and collects the fresh ones (in any order: the merge
      // sorts them); a filtered step that meets a fresh filtered-out id is redone one node
      // after the other by warp 0 (the walk-through depends on that order), as in the warp
      // kernel.
      for (int hops = 0;;) {
        // The step's nodes go to the other pool buffer, free until the merge (which swaps the
        // two: so taken afresh every step).
        std::uint32_t* const picks = reinterpret_cast<std::uint32_t*>(other);
        const int want = ds_step_nodes(c, hops);
        if (want <= 0) break;
        if (warp == 0) {
          const int np = ds_pick(pool, min(cnt, c.limit), said[3], want, picks, lane, said + 3);
          if (lane == 0) {
            said[0] = 0;
            said[1] = np;
          }
        }
        __syncthreads();
        const int np = said[1];
        if (np == 0) break;
        hops += np;
        const int total = np * cols;
        constexpr int U = 5;  // row ids per thread in flight: 8 rows of 70 in one chunk
        bool redo = false;
        for (int f0 = 0; f0 < total && !redo; f0 += NT * U) {
          std::uint32_t v[U];
#pragma unroll
          for (int t = 0; t < U; ++t) {
            const int f = f0 + t * NT + rank;
            v[t] = invalid_id;
            if (f < total) {
              const int r = static_cast<int>(c.by_cols.div(static_cast<std::uint32_t>(f)));
              v[t] = adj[static_cast<std::size_t>(picks[r]) * width + (f - r * cols)];
            }
          }
          if constexpr (Filtered) {
            if (c.walk_through) {
              bool stray = false;  // a fresh id that fails the filter
#pragma unroll
              for (int t = 0; t < U; ++t) {
                stray |= v[t] < gw.n && !gw.in_filter<Filtered>(v[t]) && !ds_test(visited, v[t]);
              }
              redo = __syncthreads_or(stray) != 0;
              if (redo) break;
            }
          }
          std::uint32_t was[U];
#pragma unroll
          for (int t = 0; t < U; ++t) {
            was[t] = ~0u;
            if (v[t] != invalid_id && v[t] >= gw.n) {
              status |= decode_status_bad_id;
            } else if (v[t] != invalid_id) {
              was[t] = atomicOr(&visited[v[t] >> 5], 1u << (v[t] & 31u));
            }
          }
          // Without the walk-through a failing id is marked (above) and dropped here.
          bool fresh[U];
          int mine = 0;
          // Paged keys: a fresh id's page-table entry is loaded here, in flight during the
          // count and the slot claim below, and kept in its inc entry's key until the score
          // overwrites it. A scoring pass then loads key rows directly instead of the entry
          // first. H200, alternated with the kernel before: the decode step (filtered search)
          // at 1024 searches 0.556-0.557 against 0.574-0.580 ms, the plain search unchanged
          // (h200_decode_search_gather_pages.txt).
          std::int32_t where[U];
#pragma unroll
          for (int t = 0; t < U; ++t) {
            fresh[t] = ((was[t] >> (v[t] & 31u)) & 1u) == 0u && gw.in_filter<Filtered>(v[t]);
            mine += fresh[t] ? 1 : 0;
            where[t] = Src::locates && fresh[t] ? src.locate(g, v[t]) : 0;
          }
          int upto = mine;  // inclusive prefix over the warp
#pragma unroll
          for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(full, upto, o);
            if (lane >= o) upto += y;
          }
          int at = 0;
          if (lane == 31 && upto > 0) at = atomicAdd(&said[0], upto);
          at = __shfl_sync(full, at, 31) + upto - mine;
#pragma unroll
          for (int t = 0; t < U; ++t) {
            if (fresh[t]) {
              if constexpr (Src::locates) inc[at].key = __int_as_float(where[t]);
              inc[at++].id = v[t];
            }
          }
        }
        if (redo) {
          // Undo this step's updates (exactly the ids gathered so far), then warp 0 expands
          // the nodes one by one with the CPU's rule.
          const int gathered = said[0];
          for (int j = rank; j < gathered; j += NT) {
            const std::uint32_t x = inc[j].id;
            atomicAnd(&visited[x >> 5], ~(1u << (x & 31u)));
          }
          __syncthreads();
          if (warp == 0) {
            int nv = 0;
            for (int r = 0; r < np; ++r) {
              nv += ds_expand_one<Filtered>(gw, picks[r], inc, nv, lane, status);
            }
            if (lane == 0) said[0] = nv;
          }
        }
        __syncthreads();
        visit_gathered(0, !redo);  // (the one-by-one expansions gather ids only)
      }
    }

    // Outputs.
    const std::size_t row0 = static_cast<std::size_t>(qi) * c.capacity;
    const int count = min(c.k, cnt);
    ds_write_topk<L2, NT>(out, row0, pool, count, c.capacity, rank);
    if (rank == 0) {
      out.counts[qi] = static_cast<std::uint32_t>(count);
      if (out.scored != nullptr) out.scored[qi] = scored;
      if (out.capped != nullptr) out.capped[qi] = 0u;  // top-k: never capped
    }
    __syncthreads();  // the next search reuses the block's shared memory and workspace
  }
  status = __reduce_or_sync(full, status);
  if (lane == 0 && status != 0u && out.status != nullptr) atomicOr(out.status, status);
}

/// indptr[0] = 0, indptr[i + 1] = indptr[i] + min(counts[i], capacity). One block.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    ds_scan_kernel(const std::uint32_t* counts, std::int64_t m, int capacity,
                   std::int64_t* indptr) {
  __shared__ std::int64_t part[Threads];
  const int t = static_cast<int>(threadIdx.x);
  const std::int64_t per = (m + Threads - 1) / Threads;
  const std::int64_t lo = t * per < m ? t * per : m;
  const std::int64_t hi = lo + per < m ? lo + per : m;
  auto row = [&](std::int64_t i) -> std::int64_t {
    return min(counts[i], static_cast<std::uint32_t>(capacity));
  };
  std::int64_t sum = 0;
  for (std::int64_t i = lo; i < hi; ++i) sum += row(i);
  part[t] = sum;
  __syncthreads();
  for (int o = 1; o < Threads; o <<= 1) {  // Hillis-Steele inclusive scan
    const std::int64_t add = t >= o ? part[t - o] : 0;
    __syncthreads();
    part[t] += add;
    __syncthreads();
  }
  std::int64_t run = part[t] - sum;
  if (t == 0) indptr[0] = 0;
  for (std::int64_t i = lo; i < hi; ++i) {
    run += row(i);
    indptr[i + 1] = run;
  }
}

/// Row i of a CSR token list, at indptr[i]: the padded result row ids[i * cap, + min(counts[i],
/// cap)).
template <class Id>
__global__ void ds_compact_kernel(const Id* ids, const std::uint32_t* counts, std::int64_t m,
                                  int cap, const std::int64_t* indptr, std::int32_t* indices) {
  const std::int64_t total = m * cap;
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = t / cap, j = t % cap;
    if (j < static_cast<std::int64_t>(min(counts[i], static_cast<std::uint32_t>(cap)))) {
      indices[indptr[i] + j] = static_cast<std::int32_t>(ids[t]);
    }
  }
}

/// Padded result rows to CSR: the one-block scan, then the compaction. Arguments checked by
/// the callers.
inline void ds_rows_to_csr(const id_t* ids, const std::uint32_t* counts, std::int64_t m,
                           int capacity, std::int64_t* indptr, std::int32_t* indices,
                           cudaStream_t stream) {
  ds_scan_kernel<1024><<<1, 1024, 0, stream>>>(counts, m, capacity, indptr);
  KVSIFT_CUDA_CHECK(cudaGetLastError());
  const std::int64_t slots = m * capacity;
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((slots + 255) / 256, 8192));
  ds_compact_kernel<id_t><<<blocks, 256, 0, stream>>>(ids, counts, m, capacity, indptr, indices);
  KVSIFT_CUDA_CHECK(cudaGetLastError());
}

template <class T, class Src>
void decode_search_launch(const graph_set_ref& set, const Src& src, int dim, bool vec,
                          const void* keys_ptr, const decode_queries& qs, std::int64_t m,
                          const decode_search_params& p, const decode_search_outputs& out,
                          void* workspace, std::size_t workspace_bytes, cudaStream_t stream,
                          bool enqueue = true) {
  using kvsift::detail::require;
  constexpr const char* who = "decode_search";
  static_assert(is_supported_element_v<T>,
                "decode_search: keys must be float, __half or __nv_bfloat16");
  ds_config c = ds_resolve(set, m, p, who);
  require(set.num_graphs >= 1, who, ": expected at least one graph, got ", set.num_graphs);
  require(set.max_entries >= 1 && set.max_entries <= 64, who,
          ": expected 1 <= max_entries <= 64, got ", set.max_entries);
  require(dim > 0, who, ": expected a positive key dimension, got ", dim);
  kvsift::detail::require<dimension_mismatch>(
      qs.ld >= dim, who, ": expected a query row stride >= dim = ", dim, ", got ", qs.ld);
  require(out.ids != nullptr && out.counts != nullptr, who,
          ": the ids and counts outputs are required");
  require((qs.filter_first == nullptr) == (qs.filter_last == nullptr), who,
          ": expected both filter_first and filter_last, or neither");
  require((qs.seeds == nullptr) == (qs.seeds_ld == 0), who,
          ": expected seeds with seeds_ld >= 1, or neither; got ",
          qs.seeds == nullptr ? "no seeds" : "seeds", " and seeds_ld = ", qs.seeds_ld);
  require(qs.seeds_ld >= 0 && qs.seeds_ld <= max_decode_search_seeds, who,
          ": expected 0 <= seeds_ld <= ", max_decode_search_seeds, ", got ", qs.seeds_ld);
  require((qs.extra_seeds == nullptr) == (qs.extra_seeds_ld == 0), who,
          ": expected extra_seeds with extra_seeds_ld >= 1, or neither; got ",
          qs.extra_seeds == nullptr ? "no extra seeds" : "extra seeds",
          " and extra_seeds_ld = ", qs.extra_seeds_ld);
  require(qs.extra_seeds_ld >= 0 && qs.extra_seeds_ld <= max_decode_search_seeds, who,
          ": expected 0 <= extra_seeds_ld <= ", max_decode_search_seeds, ", got ",
          qs.extra_seeds_ld);
  const std::size_t need = static_cast<std::size_t>(c.slots) *
                           static_cast<std::size_t>(c.slot_words) * sizeof(std::uint32_t);
  require(workspace_bytes >= need, who, ": workspace of ", workspace_bytes,
          " bytes is too small, expected >= ", need);
  int device = 0;
  KVSIFT_CUDA_CHECK(cudaGetDevice(&device));
  require_stream_on(stream, device, who);
  require_device_pointer(set.adjacency, device, who, "adjacency");
  require_device_pointer(set.row_offset, device, who, "row offsets");
  if (set.sizes != nullptr) require_device_pointer(set.sizes, device, who, "graph sizes");
  require_device_pointer(set.entries, device, who, "entries");
  require_device_pointer(keys_ptr, device, who, "keys");
  require_device_pointer(qs.q, device, who, "queries");
  require_device_pointer(qs.graph, device, who, "query graphs");
  require_device_pointer(workspace, device, who, "workspace");
  for (const void* o :
       {static_cast<const void*>(qs.seed_score), static_cast<const void*>(qs.seeds),
        static_cast<const void*>(qs.extra_seeds), static_cast<const void*>(qs.filter_first),
        static_cast<const void*>(qs.filter_last), static_cast<const void*>(out.ids),
        static_cast<const void*>(out.scores), static_cast<const void*>(out.counts),
        static_cast<const void*>(out.best_scores), static_cast<const void*>(out.scored),
        static_cast<const void*>(out.status), static_cast<const void*>(out.capped)}) {
    if (o != nullptr) require_device_pointer(o, device, who, "an optional input or output");
  }
  c.d = dim;
  c.vec = vec;
  c.lay.d_pad = (dim + 3) / 4 * 4;
  // A warp's region: query, pool, second pool, candidates[, visited bitset], 16-byte aligned.
  auto align16 = [](std::size_t b) { return (b + 15) / 16 * 16; };
  std::size_t off = align16(sizeof(float) * static_cast<std::size_t>(c.lay.d_pad));
  c.pool_off = static_cast<int>(off);
  off = align16(off + sizeof(walk_entry) * static_cast<std::size_t>(c.pool));
  c.pool2_off = static_cast<int>(off);
  off = align16(off + sizeof(walk_entry) * static_cast<std::size_t>(c.pool));
  c.inc_off = static_cast<int>(off);
  off = align16(off + sizeof(walk_entry) * static_cast<std::size_t>(c.inc));
  if (c.block) {
    c.said_off = static_cast<int>(off);
    off += ds_said_ints * sizeof(int);
  }
  int smem_max = 0, smem_sm = 0, smem_reserved = 0;
  KVSIFT_CUDA_CHECK(
      cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  KVSIFT_CUDA_CHECK(
      cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  KVSIFT_CUDA_CHECK(
      cudaDeviceGetAttribute(&smem_reserved, cudaDevAttrReservedSharedMemoryPerBlock, device));
  // The visited bitset goes to shared memory when it is at most 32 KiB (n <= 2^18) and the
  // searches of two warp-kernel blocks, or one block-kernel block, still fit (8 searches per
  // SM either way: a decode batch of 1024 queries runs at once on 132 SMs); otherwise it stays
  // in the workspace.
  const int searches_per_block = c.block ? 1 : ds_warps_per_block;
  const std::size_t visited_bytes = sizeof(std::uint32_t) * static_cast<std::size_t>(c.words);
  const std::size_t with_visited = (off + visited_bytes) * searches_per_block;
  const std::size_t blocks_per_sm = c.block ? 1 : 2;
  if (visited_bytes <= 32768 && with_visited <= static_cast<std::size_t>(smem_max) &&
      blocks_per_sm * (with_visited + static_cast<std::size_t>(smem_reserved)) <=
          static_cast<std::size_t>(smem_sm)) {
    c.visited_off = static_cast<int>(off);
    off += visited_bytes;
  }
  c.lay.warp_bytes = static_cast<int>(off);
  const std::size_t smem = static_cast<std::size_t>(c.lay.warp_bytes) * searches_per_block;
  require(smem <= static_cast<std::size_t>(smem_max), who, ": pool ", c.pool, ", d = ", dim,
          " and width ", set.width, " need ", smem,
          " bytes of shared memory per block, the device has ", smem_max);
  // Every check has passed: a dry run (the sharded calls' first pass) stops here.
  if (!enqueue) return;
  auto* ws = static_cast<std::uint32_t*>(workspace);
  auto launch = [&]<bool L2, bool Dipr, bool Filtered>() {
    if constexpr (!Dipr) {
      if (c.block) {
        int sms = 0;
        KVSIFT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
        auto run_block = [&]<int NT>() {
          constexpr auto kernel = decode_search_block_kernel<T, Src, L2, Filtered, NT>;
          allow_shared_memory<kernel>(device, smem_max, cudaSharedmemCarveoutDefault);
          // Shared memory for the blocks an SM must hold to run the launch at once (or as many
          // as it can), the rest as L1 for the walk's page-table entries and adjacency rows:
          // B = 16's 512 searches ran 1.05x faster with half the shared memory than with all.
          const auto [most, static_bytes] = resident_limit<kernel, NT>(device);
          const int wanted = static_cast<int>((c.slots + sms - 1) / sms);
          prefer_resident_blocks<kernel>(
              device, wanted < most ? wanted : most,
              smem + static_bytes + static_cast<std::size_t>(smem_reserved), smem_sm);
          kernel<<<static_cast<unsigned>(c.slots), NT, smem, stream>>>(
              set, src, qs, static_cast<int>(m), c, out, ws);
        };
        if (ds_block_threads_for(c.warps_per_search, m, sms) == 256) {
          run_block.template operator()<256>();
        } else {
          run_block.template operator()<ds_block_threads>();
        }
        KVSIFT_CUDA_CHECK(cudaGetLastError());
        return;
      }
    }
    constexpr auto kernel = decode_search_kernel<T, Src, L2, Dipr, Filtered>;
    // All of the unified L1/shared memory as shared: the rows a walk reads are random and
    // rarely hit L1, and the second block per SM needs the room.
    allow_shared_memory<kernel>(device, smem_max, cudaSharedmemCarveoutMaxShared);
    const auto blocks =
        static_cast<unsigned>((c.slots + ds_warps_per_block - 1) / ds_warps_per_block);
    kernel<<<blocks, ds_warps_per_block * 32, smem, stream>>>(set, src, qs, static_cast<int>(m), c,
                                                              out, ws);
    KVSIFT_CUDA_CHECK(cudaGetLastError());
  };
  const bool l2 = p.metric == graph_metric::l2;
  const bool dipr = p.mode == decode_search_mode::dipr;
  const bool filtered = qs.filter_first != nullptr;
  // Eight warp-kernel instantiations and four block-kernel ones; each is a straight-line
  // kernel for its case.
  auto pick = [&]<bool L2>() {
    if (dipr) {
      filtered ? launch.template operator()<L2, true, true>()
               : launch.template operator()<L2, true, false>();
    } else {
      filtered ? launch.template operator()<L2, false, true>()
               : launch.template operator()<L2, false, false>();
    }
  };
  l2 ? pick.template operator()<true>() : pick.template operator()<false>();
}

}  // namespace kvsift::cuda::detail

namespace kvsift::cuda {

inline int decode_search_capacity(const decode_search_params& p) {
  graph_set_ref probe;
  probe.width = 1;
  probe.max_keys = 1;
  return detail::ds_resolve(probe, 1, p, "decode_search").capacity;
}

inline std::size_t decode_search_workspace_size(const graph_set_ref& set, std::int64_t m,
                                                const decode_search_params& p) {
  const detail::ds_config c = detail::ds_resolve(set, m, p, "decode_search_workspace_size");
  return static_cast<std::size_t>(c.slots) * static_cast<std::size_t>(c.slot_words) *
         sizeof(std::uint32_t);
}

namespace detail {

/// decode_search over dense keys; with `enqueue` false, every check and nothing else (the
/// sharded call's first pass, which refuses a bad shard before any shard is enqueued).
template <class T>
void run_decode_search(const graph_set_ref& set, const dense_keys_ref<T>& keys,
                       const decode_queries& queries, std::int64_t m, const decode_search_params& p,
                       const decode_search_outputs& out, void* workspace,
                       std::size_t workspace_bytes, cudaStream_t stream, bool enqueue) {
  kvsift::detail::require(keys.ld >= keys.dim,
                          "decode_search: expected a key row stride >= dim = ", keys.dim, ", got ",
                          keys.ld);
  const bool vec = is_aligned16(keys.keys) && keys.dim % vec_size_v<T> == 0 &&
                   (keys.ld * static_cast<std::int64_t>(sizeof(T))) % 16 == 0;
  decode_search_launch<T>(set, ds_dense_source<T>{keys.keys, keys.ld}, keys.dim, vec, keys.keys,
                          queries, m, p, out, workspace, workspace_bytes, stream, enqueue);
}

/// decode_search over paged keys; `enqueue` as above.
template <class T>
void run_decode_search(const graph_set_ref& set, const paged_kv_ref<T>& kv,
                       const decode_queries& queries, std::int64_t m, const decode_search_params& p,
                       const decode_search_outputs& out, void* workspace,
                       std::size_t workspace_bytes, cudaStream_t stream, bool enqueue) {
  using kvsift::detail::require;
  require(kv.page_size > 0 && kv.max_pages_per_head > 0 && kv.num_pages > 0,
          "decode_search: expected positive page_size, max_pages_per_head and num_pages, got ",
          kv.page_size, ", ", kv.max_pages_per_head, ", ", kv.num_pages);
  require(set.num_graphs <= kv.num_kv_heads, "decode_search: ", set.num_graphs,
          " graphs need as many page-table rows, the view has ", kv.num_kv_heads);
  int device = 0;
  KVSIFT_CUDA_CHECK(cudaGetDevice(&device));
  require_device_pointer(kv.page_table, device, "decode_search", "page table");
  const bool vec = is_aligned16(kv.k_pages) && kv.head_dim % vec_size_v<T> == 0;
  decode_search_launch<T>(set, ds_paged_source<T>{kv}, kv.head_dim, vec, kv.k_pages, queries, m, p,
                          out, workspace, workspace_bytes, stream, enqueue);
}

}  // namespace detail

template <class T>
void decode_search(const graph_set_ref& set, const dense_keys_ref<T>& keys,
                   const decode_queries& queries, std::int64_t m, const decode_search_params& p,
                   const decode_search_outputs& out, void* workspace, std::size_t workspace_bytes,
                   cudaStream_t stream) {
  detail::run_decode_search(set, keys, queries, m, p, out, workspace, workspace_bytes, stream,
                            true);
}

template <class T>
void decode_search(const graph_set_ref& set, const paged_kv_ref<T>& kv,
                   const decode_queries& queries, std::int64_t m, const decode_search_params& p,
                   const decode_search_outputs& out, void* workspace, std::size_t workspace_bytes,
                   cudaStream_t stream) {
  detail::run_decode_search(set, kv, queries, m, p, out, workspace, workspace_bytes, stream, true);
}

inline void decode_results_to_csr(const id_t* ids, const std::uint32_t* counts, std::int64_t m,
                                  int capacity, std::int64_t* indptr, std::int32_t* indices,
                                  cudaStream_t stream) {
  using kvsift::detail::require;
  constexpr const char* who = "decode_results_to_csr";
  require(m >= 1 && m <= (std::int64_t{1} << 20), who, ": expected 1 <= m <= 2^20, got ", m);
  require(capacity >= 1, who, ": expected capacity >= 1, got ", capacity);
  int device = 0;
  KVSIFT_CUDA_CHECK(cudaGetDevice(&device));
  detail::require_stream_on(stream, device, who);
  detail::require_device_pointer(ids, device, who, "ids");
  detail::require_device_pointer(counts, device, who, "counts");
  detail::require_device_pointer(indptr, device, who, "indptr");
  detail::require_device_pointer(indices, device, who, "indices");
  detail::ds_rows_to_csr(ids, counts, m, capacity, indptr, indices, stream);
}

}  // namespace kvsift::cuda
