#pragma once
// Per-call parameters and results of the graph and exact searches: part of the search
// vocabulary (<kvsift/search/vocabulary.hpp>), which index/ may include without pulling in a
// search algorithm.

#include <cstddef>
#include <limits>
#include <vector>

#include "kvsift/core/ids.hpp"
#include "kvsift/search/search_workspace.hpp"

namespace kvsift {

/// Per-call parameters of beam search.
struct beam_search_params {
  std::size_t k = 10;   ///< results wanted (> 0)
  std::size_t L = 100;  ///< pool size (>= k): larger is slower and more accurate
  /// Expand at most this many neighbours of each node, its first ones (0 = all). Builders put
  /// the most useful neighbours first (RoarGraph: projection edges before connectivity edges,
  /// a re-pruned row in rank order with the fill last), so a cap searches a sparser subgraph
  /// of the same index: fewer vectors scored per hop, at some loss of recall. On easy data a dense
  /// graph overshoots the recall wanted even at the smallest pool (L = k); the cap is the cheaper
  /// knob below that point.
  std::size_t degree_cap = 0;
  /// Expand only the best `expand_limit` entries of the pool (0 = L: every entry, the classic
  /// beam search, whose hops are at least L once the pool fills). The search stops once those
  /// are expanded; the pool's lower ranks are scored but not expanded, and the best k of the
  /// pool are still returned, so a limit below k is allowed. It pays with a start near the
  /// answer: seeded (`extra_entries`) with the previous decode step's results of the same
  /// head, 60 cut the keys scored for recall@100 0.95 from 8.9% to 5.7% on Gemma-3 layer 11
  /// at 32K tokens (docs/algorithms.md); without such seeds, on hard data recall falls as fast
  /// as the keys scored, while on easy data (a dense graph overshooting at L = k) it is the
  /// knob below the smallest pool: the SmolLM2 sample reaches recall@10 0.95 at 182 keys
  /// scored instead of 248 (docs/peers.md). <= L.
  std::size_t expand_limit = 0;
  /// Expand at most this many nodes (0 = no cap): the search stops after `max_hops` hops and
  /// returns the best k of its pool. A cap bounds the longest walks; a batch that waits for
  /// its slowest search (the GPU's decode search, `kvsift::cuda::decode_search_params::
  /// max_hops`, the same rule) gains from it the most (docs/decode_search.md).
  std::size_t max_hops = 0;
  /// With a filter: whether a neighbour that fails it is walked through to its own neighbours
  /// (true, default: ACORN's 2-hop rule, which crosses excluded regions) or marked visited and
  /// dropped (false: the walk over the graph with the failing ids deleted from every row, each
  /// expansion one batch of row requests as without a filter). false suits filters that exclude
  /// few ids, such as a decode step's sinks and window; the GPU's decode search has the same
  /// switch (`kvsift::cuda::decode_search_params::walk_through`) and, at expand_width 1, the same
  /// results either way. Seeds that fail the filter are walked through in both modes.
  bool walk_through = true;
  /// Also enter the walk at ids [0, entry_prefix) (those below the graph's size), after the
  /// graph's entry points and the call's extra entries, walked through when they fail the
  /// filter as any seed. Meant for a decode step's attention sinks (its first tokens, left out of
  /// the retrieval because attended anyway): on Gemma-3's layer 11 they are hubs next to most
  /// queries' best keys, so the walk starts near its answer; on its layers 5 and 17 they are not,
  /// and it changed little (docs/decode_search.md). 0 = none.
  std::size_t entry_prefix = 0;
};

/// Per-call parameters of DIPR search. Scores are raw metric scores (for inner product: the
/// unscaled logit q.k), so beta is in the same units.
struct dipr_params {
  float beta = 1.0f;    ///< range width (>= 0, finite)
  std::size_t l0 = 64;  ///< capacity threshold of the exploration phase (> 0)
  /// Hard cap on in-range candidates and on the answer (0 = 64 * l0). A search that reaches
  /// it stops, returns the best `max_candidates` found and sets `capped`.
  std::size_t max_candidates = 0;
  /// Window seeding: the best raw score the caller has already seen elsewhere (e.g. in the
  /// static window on the GPU). NaN = none. Tightens pruning from the first hop.
  float seed_score = std::numeric_limits<float>::quiet_NaN();
  /// Expand at most this many neighbours of each node (0 = all); as beam_search_params.
  std::size_t degree_cap = 0;
  /// Expand at most this many nodes (0 = no cap): a search about to expand one more stops
  /// and sets `capped`, as at `max_candidates`. That cap bounds a nearly flat query's walk
  /// only through the keys in range, which it visits ~max_degree rows per hop to find; this
  /// one bounds the walk itself (the GPU decode search's `max_hops`, the same rule: a batch
  /// waits for its longest walk; docs/decode_search.md).
  std::size_t max_hops = 0;
  /// With a filter: walk through failing neighbours (true, default) or drop them; as
  /// beam_search_params::walk_through.
  bool walk_through = true;
  /// Also enter the walk at ids [0, entry_prefix); as beam_search_params::entry_prefix.
  std::size_t entry_prefix = 0;
};

/// Output of a DIPR search; reuse one object across calls to avoid allocation.
struct dipr_result {
  std::vector<id_t> ids;      ///< best-first
  std::vector<float> scores;  ///< raw metric scores, best-first
  search_stats stats;
  float best_score = 0;  ///< best raw score seen (including seed_score)
  bool capped = false;   ///< hit max_candidates or max_hops: the answer may be incomplete
};

}  // namespace kvsift
