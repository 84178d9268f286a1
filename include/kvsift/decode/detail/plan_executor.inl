#pragma once
// Bodies of <kvsift/decode/plan_executor.hpp>.

#include <algorithm>
#include <utility>

#include "kvsift/search/beam_search.hpp"
#include "kvsift/search/dipr_search.hpp"

namespace kvsift {
namespace detail {

/// A plan parameter read as a count: absent -> `fallback`; present -> a finite, non-negative,
/// whole number that fits size_t and is > 0.
inline std::size_t plan_count(const plan& p, const char* key, std::size_t fallback) {
  const auto it = p.params.find(key);
  if (it == p.params.end()) return fallback;
  const double v = it->second;
  require(std::isfinite(v) && v >= 1 && v == std::floor(v) &&
              v < static_cast<double>(std::numeric_limits<std::size_t>::max()),
          "execute_plan: plan '", p.name(), "' expected parameter ", key,
          " to be a whole number >= 1, got ", v);
  return static_cast<std::size_t>(v);
}

inline float plan_beta(const plan& p, float fallback) {
  const auto it = p.params.find("beta");
  if (it == p.params.end()) return fallback;
  require(std::isfinite(it->second) && it->second >= 0, "execute_plan: plan '", p.name(),
          "' expected parameter beta finite and >= 0, got ", it->second);
  return static_cast<float>(it->second);
}

/// The resource a built-in needs, or a clear error naming the member and the plan.
template <class T>
const T& plan_resource(const T* r, const plan& p, const char* member) {
  require(r != nullptr, "execute_plan: plan '", p.name(), "' needs plan_resources::", member,
          ", which is null");
  return *r;
}

/// The request's range clipped to an index of n tokens (the index may cover fewer tokens than
/// the context, e.g. decode-time tokens not yet indexed).
inline id_range plan_clip(id_range r, std::size_t n) { return {r.first, std::min(r.last, n)}; }

inline dipr_params plan_dipr(const plan_request& rq) {
  dipr_params d = rq.params.dipr;
  d.beta = plan_beta(rq.chosen, d.beta);
  d.l0 = plan_count(rq.chosen, "l0", d.l0);
  return d;
}

inline std::size_t plan_topk(const plan_request& rq) {
  const std::size_t k = rq.params.topk != 0 ? rq.params.topk : rq.params.budget;
  require(k > 0, "execute_plan: plan '", rq.chosen.name(),
          "' is a top-k: expected plan_step_params::topk or budget > 0, got 0 and 0");
  return k;
}

// The searches write into dipr_result / block_result; their vectors are swapped in from `out`
// and back, so a reused plan_retrieval allocates nothing once it has capacity.
template <class Search>
void plan_dipr_into(plan_retrieval& out, Search&& search) {
  dipr_result dr;
  dr.ids.swap(out.ids);
  dr.scores.swap(out.scores);
  search(dr);
  out.ids.swap(dr.ids);
  out.scores.swap(dr.scores);
  out.scanned = dr.stats.distance_computations;
  out.capped = dr.capped;
}

template <class Resources>
void register_builtin_plans(plan_executor<Resources>& e) {
  using R = Resources;
  e.add("full", "full", [](const R&, const plan_request&, search_workspace&, plan_retrieval& out) {
    out.everything = true;
  });
  // The "full" index keeps all of the context resident: whatever the query kind, it attends
  // to everything (as kvsift-bench --plan always treated it).
  e.add("full", "topk", [](const R&, const plan_request&, search_workspace&, plan_retrieval& out) {
    out.everything = true;
  });
  e.add("full", "dipr", [](const R&, const plan_request&, search_workspace&, plan_retrieval& out) {
    out.everything = true;
  });
  if constexpr (requires(const R& r) { *r.flat; }) {
    e.add("flat", "topk",
          [](const R& res, const plan_request& rq, search_workspace& ws, plan_retrieval& out) {
            const auto& idx = plan_resource(res.flat, rq.chosen, "flat");
            const std::size_t k = plan_topk(rq);
            require_dim(idx.dim(), rq.query.size(), "execute_plan: query of the flat index");
            const id_range r = plan_clip(rq.range, idx.size());
            if (r.first >= r.last) return;
            out.ids.resize(k);
            out.scores.resize(k);
            out.scanned = idx.topk(rq.query, k, ws, out.ids, out.scores, r).distance_computations;
            std::erase(out.ids, invalid_id);  // the padding, at the end
            out.scores.resize(out.ids.size());
          });
    e.add("flat", "dipr",
          [](const R& res, const plan_request& rq, search_workspace& ws, plan_retrieval& out) {
            const auto& idx = plan_resource(res.flat, rq.chosen, "flat");
            const dipr_params dp = plan_dipr(rq);
            require_dim(idx.dim(), rq.query.size(), "execute_plan: query of the flat index");
            const id_range r = plan_clip(rq.range, idx.size());
            if (r.first >= r.last) return;
            plan_dipr_into(out, [&](dipr_result& dr) { idx.dipr(rq.query, dp, ws, dr, r); });
          });
  }
  if constexpr (requires(const R& r) { *r.graph; }) {
    e.add("graph", "topk",
          [](const R& res, const plan_request& rq, search_workspace& ws, plan_retrieval& out) {
            const auto& g = plan_resource(res.graph, rq.chosen, "graph");
            const std::size_t k = plan_topk(rq);
            require_dim(g.dim(), rq.query.size(), "execute_plan: query of the graph index");
            const id_range r = plan_clip(rq.range, g.size());
            if (r.first >= r.last) return;
            out.ids.resize(k);
            out.scores.resize(k);
            const beam_search_params bp{.k = k,
                                        .L = std::max(k, rq.params.beam),
                                        .walk_through = rq.params.walk_through,
                                        .entry_prefix = rq.params.entry_prefix};
            out.scanned = beam_search(g, rq.query, bp, ws, std::span<id_t>(out.ids),
                                      std::span<float>(out.scores), r)
                              .distance_computations;
            std::erase(out.ids, invalid_id);  // the padding, at the end
            out.scores.resize(out.ids.size());
          });
    e.add("graph", "dipr",
          [](const R& res, const plan_request& rq, search_workspace& ws, plan_retrieval& out) {
            const auto& g = plan_resource(res.graph, rq.chosen, "graph");
            const dipr_params dp = plan_dipr(rq);
            require_dim(g.dim(), rq.query.size(), "execute_plan: query of the graph index");
            const id_range r = plan_clip(rq.range, g.size());
            if (r.first >= r.last) return;
            plan_dipr_into(out, [&](dipr_result& dr) { dipr_search(g, rq.query, dp, ws, dr, r); });
          });
  }
  if constexpr (requires(const R& r) { *r.coarse; }) {
    // Block answers become tokens block by block, best block first, so a budget cut keeps
    // the best blocks whole.
    auto coarse = [](bool dipr) {
      return
          [dipr](const R& res, const plan_request& rq, search_workspace& ws, plan_retrieval& out) {
            const auto& idx = plan_resource(res.coarse, rq.chosen, "coarse");
            const std::size_t kb = dipr ? 0 : plan_count(rq.chosen, "k_blocks", rq.params.k_blocks);
            require(kb > 0 || dipr, "execute_plan: plan '", rq.chosen.name(),
                    "' expected k_blocks > 0, got 0");
            const float beta = plan_beta(rq.chosen, rq.params.dipr.beta);
            require_dim(idx.dim(), rq.query.size(), "execute_plan: query of the coarse index");
            const id_range r = plan_clip(rq.range, idx.size());
            if (r.first >= r.last) return;
            block_result br;
            br.blocks.swap(out.blocks);
            br.scores.swap(out.scores);
            if (dipr) {
              idx.dipr(rq.query, beta, ws, br, r);
            } else {
              idx.topk(rq.query, kb, ws, br, r);
            }
            out.blocks.swap(br.blocks);
            out.scores.clear();  // block scores are not token scores
            out.scanned = br.stats.distance_computations;
            idx.tokens(out.blocks, out.ids, r);
          };
    };
    e.add("coarse", "topk", coarse(false));
    e.add("coarse", "dipr", coarse(true));
  }
}

}  // namespace detail

template <class Resources>
plan_executor<Resources>::plan_executor() {
  detail::register_builtin_plans(*this);
}

template <class Resources>
void plan_executor<Resources>::add(const std::string& index, const std::string& query,
                                   retrieve_fn fn) {
  detail::require(!index.empty() && !query.empty() && static_cast<bool>(fn),
                  "plan_executor::add: expected an index kind, a query kind and a function, got '",
                  index, "', '", query, "'", fn ? "" : " and no function");
  fns_[{index, query}] = std::move(fn);
}

template <class Resources>
bool plan_executor<Resources>::can_run(const std::string& index, const std::string& query) const {
  return fns_.count({index, query}) != 0;
}

template <class Resources>
std::string plan_executor<Resources>::runnable() const {
  std::string s;
  for (const auto& [k, fn] : fns_) s += (s.empty() ? "" : ", ") + k.first + "-" + k.second;
  return s;
}

template <class Resources>
void plan_executor<Resources>::retrieve(const plan& p, const Resources& res,
                                        std::span<const float> q, const plan_step_params& params,
                                        search_workspace& ws, plan_retrieval& out) const {
  const auto it = fns_.find({p.index, p.query});
  detail::require(it != fns_.end(), "execute_plan: no executor for plan '", p.name(),
                  "'; runnable: ", runnable(), " (plan_executor::add registers one)");
  detail::require(params.context > 0, "execute_plan: expected context > 0, got 0");
  const std::size_t window = checked_add(params.window.initial, params.window.recent,
                                         "execute_plan: window initial + recent");
  detail::require(window <= params.context, "execute_plan: expected a window of at most the ",
                  params.context, " tokens of the context, got ", params.window.initial, " + ",
                  params.window.recent);
  for (std::size_t i = 0; i < q.size(); ++i) {
    detail::require<non_finite_value>(std::isfinite(q[i]),
                                      "execute_plan: expected a finite query, got ", q[i],
                                      " at element ", i);
  }
  out.ids.clear();
  out.scores.clear();
  out.blocks.clear();
  out.everything = false;
  out.scanned = 0;
  out.capped = false;
  std::size_t last = params.context - params.window.recent;
  if (p.filter_prefix) last = std::min(last, *p.filter_prefix);
  out.range = {params.window.initial, last};
  it->second(res, plan_request{p, q, out.range, params}, ws, out);
  if (params.budget != 0 && out.ids.size() > params.budget) {
    out.ids.resize(params.budget);
    if (out.scores.size() > params.budget) out.scores.resize(params.budget);
  }
}

template <class Resources>
template <KvSource S>
plan_step_params plan_executor<Resources>::prepare(std::span<const float> q, const S& kv,
                                                   std::size_t kv_head,
                                                   const plan_step_params& params) const {
  detail::require<out_of_range>(params.context <= kv.tokens(), "execute_plan: context ",
                                params.context, " exceeds the ", kv.tokens(),
                                " tokens of the K/V source");
  // Checks q (length, finite), kv_head and the scale before any search.
  detail::validate_attention(q, kv_head, 0, kv, params.attention, "execute_plan");
  detail::require(params.attention.bias.empty(),
                  "execute_plan: expected no attention bias (one per token has no meaning for "
                  "a retrieved set), got ",
                  params.attention.bias.size(), " values");
  plan_step_params prm = params;
  if (params.seed_from_window) {
    // The best raw score of the window, which attend() reads anyway (NaN when it is empty).
    constexpr float neg_inf = -std::numeric_limits<float>::infinity();
    float seed = neg_inf;
    const std::size_t d = kv.head_dim(), ctx = params.context;
    auto see = [&](std::size_t t) {
      seed =
          std::max(seed, inner_product::score(q.data(), kv.key(kv_head, static_cast<id_t>(t)), d));
    };
    for (std::size_t t = 0; t < std::min(params.window.initial, ctx); ++t) see(t);
    for (std::size_t t = ctx - std::min(params.window.recent, ctx); t < ctx; ++t) see(t);
    prm.dipr.seed_score = seed == neg_inf ? std::numeric_limits<float>::quiet_NaN() : seed;
  }
  return prm;
}

template <class Resources>
template <KvSource S>
void plan_executor<Resources>::attend(const plan_retrieval& r, std::span<const float> q,
                                      const S& kv, std::size_t kv_head,
                                      const plan_step_params& params, partial_state& out) const {
  detail::require<out_of_range>(params.context <= kv.tokens() &&
                                    params.window.initial <= params.context &&
                                    params.window.recent <= params.context,
                                "plan_executor::attend: expected context <= ", kv.tokens(),
                                " and each window part <= context, got context ", params.context,
                                ", window ", params.window.initial, " + ", params.window.recent);
  if (r.everything) {
    dense_attention(q, kv_head, 0, params.context, kv, params.attention, out);
    return;
  }
  // Window first, then the retrieved ids: the order in which the Python example merged them.
  dense_attention(q, kv_head, 0, params.window.initial, kv, params.attention, out);
  partial_state part;
  dense_attention(q, kv_head, params.context - params.window.recent, params.context, kv,
                  params.attention, part);
  merge_into(out, part);
  sparse_attention(q, kv_head, std::span<const id_t>(r.ids), kv, params.attention, part);
  merge_into(out, part);
}

template <class Resources>
template <KvSource S>
void plan_executor<Resources>::execute(const plan& p, const Resources& res,
                                       std::span<const float> q, const S& kv, std::size_t kv_head,
                                       const plan_step_params& params, search_workspace& ws,
                                       plan_step_output& out) const {
  const plan_step_params prm = prepare(q, kv, kv_head, params);
  retrieve(p, res, q, prm, ws, out.retrieval);
  attend(out.retrieval, q, kv, kv_head, prm, out.state);
}

}  // namespace kvsift
