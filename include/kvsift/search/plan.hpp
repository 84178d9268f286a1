#pragma once
// What the query planner (<kvsift/search/planner.hpp>) decides on and from: the facts about one
// (request, layer) and the chosen plan. On their own so that what runs a plan
// (<kvsift/decode/plan_executor.hpp>) does not compile the planner's registries and rules.

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kvsift/core/error.hpp"

namespace kvsift {

/// What the planner knows about one (request, layer).
struct plan_inputs {
  std::size_t context = 0;        ///< tokens in the context
  std::size_t reused_prefix = 0;  ///< tokens reused from a cached prefix (<= context)
  std::size_t layer = 0;
  double gpu_budget_bytes = 0;  ///< GPU memory available to this (request, layer) (>= 0)
  std::optional<double> latency_budget_us;  ///< optional; no default rule uses it
};

/// A chosen plan: which index, which query, an optional prefix filter and named parameters.
struct plan {
  std::string index;                         ///< a registered index kind
  std::string query;                         ///< a registered query kind
  std::optional<std::size_t> filter_prefix;  ///< id_below(*filter_prefix) when set
  std::map<std::string, double> params;      ///< e.g. "k_blocks", "block_size"
  std::vector<std::string> reasons;          ///< one sentence per rule that acted
  std::string decided_by;                    ///< the rule that stopped planning
  double gpu_bytes = 0;                      ///< memory the chosen index kind needs

  /// Short name "index-query[+filter]", e.g. "graph-dipr+id_below(4096)".
  [[nodiscard]] std::string name() const {
    std::string s = index + "-" + query;
    if (filter_prefix) s += "+id_below(" + std::to_string(*filter_prefix) + ")";
    return s;
  }
  /// One paragraph: the plan, its parameters, and why each rule acted.
  [[nodiscard]] std::string explain() const {
    std::string s =
        detail::concat(name(), " (decided by rule '", decided_by, "'; GPU bytes ", gpu_bytes, ")");
    for (const auto& [k, v] : params) s += detail::concat(" ", k, "=", v);
    for (const auto& r : reasons) s += "\n  - " + r;
    return s;
  }
};

}  // namespace kvsift
