#pragma once
// The executable planner: a `plan` (<kvsift/search/planner.hpp>) names an index kind and a
// query kind; a plan_executor maps that pair onto the library's calls for one (request, layer,
// KV head) and one query head, and then attends:
//
//   retrieve:  search the chosen index with the chosen query, restricted to the tokens outside
//              the static window ([window.initial, context - window.recent), and below the
//              plan's id_below prefix when it has one) -> retrieved ids, best first
//   attend:    dense attention over the window's two ranges + sparse attention over the
//              retrieved ids, merged with the log-sum-exp rule -> the step's output state
//
// A plan of index or query kind "full" attends densely to [0, context) instead.
//
// The planner is data, not code: users register index and query kinds of their own. The
// executor follows: `add` registers (or replaces) the retrieval function of an (index, query)
// pair, so a plan naming a user kind runs once its retrieval is registered; a plan naming a
// pair with no retrieval throws, naming the pairs that have one.
//
// Before this header kvsift-bench --plan and the Python end-to-end example each held their
// own copy of this mapping; both now call the executor.

#include <cmath>
#include <cstddef>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvsift/attention/merge.hpp"
#include "kvsift/attention/partial_state.hpp"
#include "kvsift/attention/quality.hpp"
#include "kvsift/attention/sparse_attention.hpp"
#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/detail/std_function.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/core/metric.hpp"
#include "kvsift/core/vector_store.hpp"
#include "kvsift/index/block_index.hpp"
#include "kvsift/index/flat_index.hpp"
#include "kvsift/index/graph_index.hpp"
#include "kvsift/search/plan.hpp"
#include "kvsift/search/predicate.hpp"
#include "kvsift/search/search_params.hpp"
#include "kvsift/search/search_workspace.hpp"

namespace kvsift {

/// The indexes an engine built for one (request, layer, KV head), borrowed: any may be null,
/// and a plan that needs a null one throws naming it. The executor never owns them.
template <class Flat, class GraphIndex, class Coarse = block_index<>>
struct plan_resources {
  using flat_type = Flat;
  using graph_type = GraphIndex;
  using coarse_type = Coarse;
  const Flat* flat = nullptr;         ///< exact index over the keys ("flat")
  const GraphIndex* graph = nullptr;  ///< RoarGraph over the keys ("graph")
  const Coarse* coarse = nullptr;     ///< block summaries ("coarse")
};

/// Resources over borrowed f32 keys: what kvsift-bench and the Python module build.
using default_plan_resources =
    plan_resources<flat_index<view_store<float>>, graph_index<view_store<float>>, block_index<>>;

/// Per-call parameters of an executed step. A plan's own "beta", "l0" and "k_blocks" params
/// win over the defaults here; everything else comes from here.
struct plan_step_params {
  std::size_t context = 0;     ///< the query sees tokens [0, context) (> 0, <= K/V tokens)
  static_window window{0, 0};  ///< attended densely and never retrieved (default: none)
  /// Keep the best `budget` retrieved ids (0, the default: keep all). Block answers are cut
  /// at token granularity, best block first.
  std::size_t budget = 0;
  std::size_t topk = 0;       ///< k of top-k on the flat/graph index (0: budget, which must be > 0)
  std::size_t beam = 100;     ///< graph top-k pool L (raised to k when smaller)
  std::size_t k_blocks = 16;  ///< coarse top-k blocks when the plan has no "k_blocks"
  /// DIPR: beta and l0 when the plan has none; max_candidates, seed_score, degree_cap as given.
  dipr_params dipr{};
  /// execute(): seed DIPR with the best raw score q.k over the window tokens (the window is
  /// attended anyway, so its best score tightens pruning from the first hop).
  bool seed_from_window = false;
  /// Graph top-k: beam_search_params::walk_through (whether ids outside the retrieval range,
  /// the sinks and the window, are walked through); DIPR takes dipr.walk_through.
  bool walk_through = true;
  /// Graph top-k: beam_search_params::entry_prefix (e.g. window.initial: also enter the walk at
  /// the sinks); DIPR takes dipr.entry_prefix.
  std::size_t entry_prefix = 0;
  attention_params attention{};  ///< scale and bias of the sparse/dense attention (no bias)
};

/// What a retrieval returns; reuse one object across calls to avoid allocation.
struct plan_retrieval {
  std::vector<id_t> ids;            ///< retrieved token ids, best first, all inside `range`
  std::vector<float> scores;        ///< raw scores of `ids` (flat, graph); empty for coarse plans
  bool everything = false;          ///< a full-attention plan: attend [0, context); ids stay empty
  std::size_t scanned = 0;          ///< vectors (flat, graph) or blocks (coarse) scored
  bool capped = false;              ///< DIPR hit max_candidates or max_hops
  id_range range;                   ///< the token range searched (empty when first >= last)
  std::vector<std::size_t> blocks;  ///< coarse plans: the blocks chosen, best first
};

/// What a registered retrieval function receives besides the resources.
struct plan_request {
  const plan& chosen;
  std::span<const float> query;  ///< finite, checked
  id_range range;                ///< within [0, context), maybe empty (first >= last:
                                 ///< retrieve nothing); clip it to the index size
  const plan_step_params& params;
};

/// The output of one executed step for one query head.
struct plan_step_output {
  partial_state state;  ///< attention over the window and the retrieved ids (or everything)
  plan_retrieval retrieval;
};

/// Maps (index kind, query kind) onto retrieval functions; the built-in pairs are
/// full-{full,topk,dipr}, {flat,graph,coarse}-{topk,dipr}, registered for the members
/// `Resources` has (`flat`, `graph`, `coarse`). Thread safety: retrieve/execute are const and
/// safe concurrently (one workspace per thread) when the registered functions are (the
/// built-ins are); `add` mutates and needs external synchronisation.
template <class Resources>
class plan_executor {
 public:
  /// Fills `out.ids` (and scanned/capped/blocks) for the request; `out` arrives cleared.
  using retrieve_fn = std::function<void(const Resources&, const plan_request&, search_workspace&,
                                         plan_retrieval&)>;

  /// An executor with the built-in pairs. O(1).
  plan_executor();

  /// Registers (or replaces) the retrieval of plans (index, query).
  /// @throw invalid_argument for an empty name or an empty function.
  void add(const std::string& index, const std::string& query, retrieve_fn fn);

  /// True when plans (index, query) can run. O(log pairs).
  [[nodiscard]] bool can_run(const std::string& index, const std::string& query) const;

  /// "index-query" of every runnable pair, comma-separated (for error messages).
  [[nodiscard]] std::string runnable() const;

  /// Retrieves for query `q` under plan `p` (step 1 of execute). The plan's filter_prefix
  /// restricts the range to ids below it. Complexity: that of the search chosen.
  /// @throw invalid_argument for a pair with no retrieval (names the runnable ones), a null
  ///        resource the plan needs (names it), context == 0, window.initial + window.recent >
  ///        context, a top-k plan with topk == budget == 0, a plan param that is negative or
  ///        not finite; non_finite_value for NaN/Inf in q; dimension_mismatch for a query
  ///        length other than the index's; and whatever the search throws. All checks run
  ///        before any search.
  void retrieve(const plan& p, const Resources& res, std::span<const float> q,
                const plan_step_params& params, search_workspace& ws, plan_retrieval& out) const;

  /// Step 0 of execute: checks the K/V side (context <= kv.tokens(), kv_head, q's length and
  /// values, the scale; no bias) and returns `params` with dipr.seed_score set to the window's
  /// best raw score when seed_from_window. O(window * head_dim).
  /// @throw out_of_range, dimension_mismatch, non_finite_value, invalid_argument as execute.
  template <KvSource S>
  [[nodiscard]] plan_step_params prepare(std::span<const float> q, const S& kv, std::size_t kv_head,
                                         const plan_step_params& params) const;

  /// Step 2 of execute: the retrieval's output state (a full plan: dense over [0, context);
  /// otherwise the window ranges densely and r.ids sparsely, merged). `out`'s allocation is
  /// reused. O((window + r.ids.size()) * head_dim).
  /// @throw out_of_range for a context or window beyond the K/V tokens, or an id >= tokens;
  ///        otherwise as sparse_attention.
  template <KvSource S>
  void attend(const plan_retrieval& r, std::span<const float> q, const S& kv, std::size_t kv_head,
              const plan_step_params& params, partial_state& out) const;

  /// The step for one query head: prepare, retrieve, attend. Dense attention over the window
  /// ranges [0, initial) and [context - recent, context) plus sparse attention over the
  /// retrieved ids of KV head `kv_head` of `kv`, merged in that order (a full plan: dense
  /// attention over [0, context)). On a throw from the retrieval `out.retrieval` is left
  /// empty and `out.state` unchanged.
  /// Complexity: retrieval + O((window + retrieved) * head_dim).
  /// @throw as retrieve, plus out_of_range if context > kv.tokens() or kv_head >=
  ///        kv.kv_heads(), dimension_mismatch if q.size() != kv.head_dim(), and what the
  ///        attention throws (all checked before any search).
  template <KvSource S>
  void execute(const plan& p, const Resources& res, std::span<const float> q, const S& kv,
               std::size_t kv_head, const plan_step_params& params, search_workspace& ws,
               plan_step_output& out) const;

 private:
  std::map<std::pair<std::string, std::string>, retrieve_fn> fns_;
};

/// One executor per Resources type with the built-ins, shared (it is never mutated).
template <class Resources>
[[nodiscard]] const plan_executor<Resources>& default_plan_executor() {
  static const plan_executor<Resources> e;
  return e;
}

/// execute() of the default executor: the one call for a plan with built-in kinds.
template <class Resources, KvSource S>
void execute_plan(const plan& p, const Resources& res, std::span<const float> q, const S& kv,
                  std::size_t kv_head, const plan_step_params& params, search_workspace& ws,
                  plan_step_output& out) {
  default_plan_executor<Resources>().execute(p, res, q, kv, kv_head, params, ws, out);
}

}  // namespace kvsift

#include "kvsift/decode/detail/plan_executor.inl"
