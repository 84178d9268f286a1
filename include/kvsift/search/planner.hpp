#pragma once
// Rule-based query planner (AlayaDB): no single index or query wins everywhere, so the choice
// is made per request and layer from a few facts about them. Short contexts want full
// attention; a partially reused prefix needs an id_below(prefix) filter; a GPU budget that
// holds the coarse block index wants coarse top-k; otherwise DIPR, on the flat index in layer
// 0 (attention there is too diffuse for a graph to help) and on the graph index elsewhere.
//
// The planner is data, not code: index kinds (with the GPU memory each needs), query kinds and
// an ordered list of rules are registered at run time, so users add their own without editing
// the library. A rule sees the inputs and the draft plan; it may edit the draft and either
// decide (stop) or pass on to the next rule. Each rule that acts appends a sentence to the
// plan's reasons, which explain() prints.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvsift/core/detail/std_function.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/search/plan.hpp"

namespace kvsift {

/// An index kind: a name and the GPU memory (bytes) it needs for given inputs.
struct index_kind {
  std::string name;
  std::string description;
  std::function<double(const plan_inputs&)> gpu_bytes;
};

/// A query kind (top-k, DIPR, full, ...): only a name the planner can validate plans against.
struct query_kind {
  std::string name;
  std::string description;
};

template <class = void>
class basic_planner;
/// The planner (below). It is a class template only so that its bodies (the registries, the
/// default rules' std::function wrappers) are compiled where a planner is used, not in every
/// translation unit that includes this header.
using planner = basic_planner<>;

/// What a rule does after looking at the inputs.
enum class rule_outcome { pass, decide };

/// An ordered planning rule. `apply` may edit the draft plan; returning `decide` ends planning.
struct plan_rule {
  std::string name;
  std::function<rule_outcome(const plan_inputs&, const planner&, plan&)> apply;
};

/// Parameters of the default cost model and rules. Memory is counted in bytes of f16 K + V
/// per token per KV head; block summaries as 3 * head_dim f32 (minmax_representative).
struct planner_params {
  std::size_t short_context = 4096;  ///< contexts up to this use full attention
  std::size_t head_dim = 128;
  std::size_t block_size = 64;  ///< coarse index block size
  std::size_t k_blocks = 16;    ///< blocks fetched by coarse top-k
  std::size_t dipr_l0 = 64;     ///< parameters copied into DIPR plans
  double dipr_beta = 8.0;
  [[nodiscard]] double kv_bytes_per_token() const {
    return 2.0 * static_cast<double>(head_dim) * 2.0;
  }
};

/// The planner (use it as `planner`): registries plus ordered rules. Thread safety: choose()
/// is const and safe concurrently; registration mutates and needs external synchronisation.
template <class>
class basic_planner {
 public:
  /// A planner with the default kinds and the AlayaDB rules (see default_rules()).
  /// @throw invalid_argument if a parameter is 0 (head_dim, block_size, k_blocks, dipr_l0) or
  ///        dipr_beta is negative or not finite.
  explicit basic_planner(planner_params p = {}) : params_(p) {
    detail::require(p.head_dim > 0 && p.block_size > 0 && p.k_blocks > 0 && p.dipr_l0 > 0,
                    "planner: expected head_dim, block_size, k_blocks, dipr_l0 > 0, got ",
                    p.head_dim, ", ", p.block_size, ", ", p.k_blocks, ", ", p.dipr_l0);
    detail::require(std::isfinite(p.dipr_beta) && p.dipr_beta >= 0,
                    "planner: expected finite dipr_beta >= 0, got ", p.dipr_beta);
    const double kv = p.kv_bytes_per_token();
    add_index_kind({"full", "all KV of the context resident on the GPU",
                    [kv](const plan_inputs& in) { return kv * static_cast<double>(in.context); }});
    add_index_kind({"coarse", "block summaries on the GPU plus the k_blocks blocks fetched",
                    [p, kv](const plan_inputs& in) {
                      const double blocks = std::ceil(static_cast<double>(in.context) /
                                                      static_cast<double>(p.block_size));
                      return blocks * 3.0 * static_cast<double>(p.head_dim) * sizeof(float) +
                             kv * static_cast<double>(p.k_blocks * p.block_size);
                    }});
    // Flat and graph indexes live on the CPU; the GPU holds what is retrieved, which DIPR
    // sizes at run time: the estimate is the l0 exploration capacity.
    auto retrieved = [p, kv](const plan_inputs&) { return kv * static_cast<double>(p.dipr_l0); };
    add_index_kind({"flat", "exhaustive scan on the CPU", retrieved});
    add_index_kind({"graph", "RoarGraph index on the CPU", retrieved});
    add_query_kind({"full", "attend to every token"});
    add_query_kind({"topk", "the k best tokens or blocks"});
    add_query_kind({"dipr", "every token within beta of the best (dynamic inner-product range)"});
    for (auto& r : default_rules()) add_rule(std::move(r));
  }

  [[nodiscard]] const planner_params& params() const noexcept { return params_; }

  /// Registers (or replaces) an index kind. @throw invalid_argument for an empty name or no
  /// memory function.
  void add_index_kind(index_kind k) {
    detail::require(!k.name.empty() && static_cast<bool>(k.gpu_bytes),
                    "planner::add_index_kind: expected a name and a gpu_bytes function");
    indexes_[k.name] = std::move(k);
  }
  /// Registers (or replaces) a query kind. @throw invalid_argument for an empty name.
  void add_query_kind(query_kind q) {
    detail::require(!q.name.empty(), "planner::add_query_kind: expected a non-empty name");
    queries_[q.name] = std::move(q);
  }
  /// Inserts a rule before the rule named `before` (appends when `before` is empty).
  /// @throw invalid_argument for an empty name or no function, a duplicate name, or an unknown
  ///        `before`.
  void add_rule(plan_rule r, const std::string& before = {}) {
    detail::require(!r.name.empty() && static_cast<bool>(r.apply),
                    "planner::add_rule: expected a name and a function");
    detail::require(find_rule(r.name) == rules_.end(), "planner::add_rule: a rule named '", r.name,
                    "' exists already");
    auto pos = rules_.end();
    if (!before.empty()) {
      pos = find_rule(before);
      detail::require(pos != rules_.end(), "planner::add_rule: unknown rule '", before,
                      "'; rules: ", rule_names());
    }
    rules_.insert(pos, std::move(r));
  }
  /// Removes a rule. @throw invalid_argument for an unknown name.
  void remove_rule(const std::string& name) {
    auto it = find_rule(name);
    detail::require(it != rules_.end(), "planner::remove_rule: unknown rule '", name,
                    "'; rules: ", rule_names());
    rules_.erase(it);
  }
  [[nodiscard]] const std::vector<plan_rule>& rules() const noexcept { return rules_; }

  /// @throw invalid_argument naming the registered kinds if `name` is unknown.
  [[nodiscard]] const index_kind& index(const std::string& name) const {
    auto it = indexes_.find(name);
    detail::require(it != indexes_.end(), "planner: unknown index kind '", name,
                    "'; registered: ", names(indexes_));
    return it->second;
  }
  /// @throw invalid_argument naming the registered kinds if `name` is unknown.
  [[nodiscard]] const query_kind& query(const std::string& name) const {
    auto it = queries_.find(name);
    detail::require(it != queries_.end(), "planner: unknown query kind '", name,
                    "'; registered: ", names(queries_));
    return it->second;
  }

  /// GPU memory (bytes) index kind `name` needs for `in`. @throw as index().
  [[nodiscard]] double gpu_bytes(const std::string& name, const plan_inputs& in) const {
    return index(name).gpu_bytes(in);
  }

  /// Runs the rules in order until one decides. Complexity O(rules).
  /// @throw invalid_argument if gpu_budget_bytes is negative or not finite, reused_prefix >
  ///        context, context == 0, a latency budget is negative or not finite, no rule
  ///        decides, or the plan names an unregistered index or query kind.
  [[nodiscard]] plan choose(const plan_inputs& in) const {
    detail::require(in.context > 0, "planner: expected context > 0, got 0");
    detail::require(std::isfinite(in.gpu_budget_bytes) && in.gpu_budget_bytes >= 0,
                    "planner: expected a GPU budget >= 0 bytes, got ", in.gpu_budget_bytes);
    detail::require(in.reused_prefix <= in.context, "planner: reused prefix of ", in.reused_prefix,
                    " tokens is longer than the context of ", in.context);
    detail::require(!in.latency_budget_us ||
                        (std::isfinite(*in.latency_budget_us) && *in.latency_budget_us >= 0),
                    "planner: expected a latency budget >= 0 us, got ",
                    in.latency_budget_us.value_or(0));
    plan p;
    for (const auto& r : rules_) {
      if (r.apply(in, *this, p) == rule_outcome::decide) {
        p.decided_by = r.name;
        (void)index(p.index);  // validates the names the rule produced
        (void)query(p.query);
        p.gpu_bytes = gpu_bytes(p.index, in);
        return p;
      }
    }
    detail::fail("planner: no rule decided for context ", in.context, ", layer ", in.layer,
                 "; rules: ", rule_names());
  }

  /// Parses "auto" (nullopt) or "index-query" (e.g. "graph-dipr") against the registries.
  /// @throw invalid_argument naming the valid names for anything else.
  [[nodiscard]] std::optional<std::pair<std::string, std::string>> parse_name(
      const std::string& s) const {
    if (s == "auto") return std::nullopt;
    const auto dash = s.find('-');
    detail::require(dash != std::string::npos, "planner: expected 'auto' or 'index-query' with ",
                    "index in {", names(indexes_), "} and query in {", names(queries_), "}, got '",
                    s, "'");
    auto idx = s.substr(0, dash), q = s.substr(dash + 1);
    (void)index(idx);
    (void)query(q);
    return std::make_pair(idx, q);
  }

  /// The AlayaDB rules, in order: short_context, prefix_filter, coarse_if_budget,
  /// dipr_flat_layer0, dipr_graph.
  [[nodiscard]] std::vector<plan_rule> default_rules() const {
    const planner_params p = params_;
    std::vector<plan_rule> r;
    r.push_back({"short_context", [p](const plan_inputs& in, const planner&, plan& out) {
                   if (in.context > p.short_context) return rule_outcome::pass;
                   out.index = "full";
                   out.query = "full";
                   out.filter_prefix.reset();  // full attention needs no filter
                   out.reasons.push_back(detail::concat("context ", in.context,
                                                        " <= ", p.short_context,
                                                        " tokens: full attention is cheapest"));
                   return rule_outcome::decide;
                 }});
    r.push_back({"prefix_filter", [](const plan_inputs& in, const planner&, plan& out) {
                   if (in.reused_prefix > 0 && in.reused_prefix < in.context) {
                     out.filter_prefix = in.reused_prefix;
                     out.reasons.push_back(detail::concat(
                         "prefix of ", in.reused_prefix, " of ", in.context,
                         " tokens reused: search its index with id_below(", in.reused_prefix, ")"));
                   }
                   return rule_outcome::pass;
                 }});
    r.push_back({"coarse_if_budget", [p](const plan_inputs& in, const planner& pl, plan& out) {
                   const double need = pl.gpu_bytes("coarse", in);
                   if (need > in.gpu_budget_bytes) {
                     out.reasons.push_back(detail::concat(
                         "coarse index needs ", need, " B > budget ", in.gpu_budget_bytes, " B"));
                     return rule_outcome::pass;
                   }
                   out.index = "coarse";
                   out.query = "topk";
                   out.params["block_size"] = static_cast<double>(p.block_size);
                   out.params["k_blocks"] = static_cast<double>(p.k_blocks);
                   out.reasons.push_back(detail::concat("coarse index needs ", need,
                                                        " B <= budget ", in.gpu_budget_bytes,
                                                        " B: block top-k"));
                   return rule_outcome::decide;
                 }});
    auto dipr = [p](const char* index, const char* why) {
      return [p, index, why](const plan_inputs&, const planner&, plan& out) {
        out.index = index;
        out.query = "dipr";
        out.params["beta"] = p.dipr_beta;
        out.params["l0"] = static_cast<double>(p.dipr_l0);
        out.reasons.emplace_back(why);
        return rule_outcome::decide;
      };
    };
    r.push_back({"dipr_flat_layer0",
                 [f = dipr("flat", "layer 0: attention is diffuse, DIPR on the flat index")](
                     const plan_inputs& in, const planner& pl, plan& out) {
                   return in.layer == 0 ? f(in, pl, out) : rule_outcome::pass;
                 }});
    r.push_back({"dipr_graph", dipr("graph", "DIPR on the graph index")});
    return r;
  }

 private:
  template <class Map>
  static std::string names(const Map& m) {
    std::string s;
    for (const auto& [k, v] : m) s += (s.empty() ? "" : ", ") + k;
    return s;
  }
  [[nodiscard]] std::string rule_names() const {
    std::string s;
    for (const auto& r : rules_) s += (s.empty() ? "" : ", ") + r.name;
    return s;
  }
  std::vector<plan_rule>::iterator find_rule(const std::string& name) {
    return std::find_if(rules_.begin(), rules_.end(),
                        [&](const plan_rule& r) { return r.name == name; });
  }

  planner_params params_;
  std::map<std::string, index_kind> indexes_;
  std::map<std::string, query_kind> queries_;
  std::vector<plan_rule> rules_;
};

}  // namespace kvsift
