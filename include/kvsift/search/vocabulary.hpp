#pragma once
// The search vocabulary: the per-thread workspace and its statistics, predicates, per-call
// parameters and results, the argument checks every search shares, and the `Graph` concept.
// Leaf of the search layer: index/ includes it to speak the searches' language without pulling
// in a search algorithm (see docs/architecture.md).

#include "kvsift/search/detail/query_checks.hpp"
#include "kvsift/search/graph.hpp"
#include "kvsift/search/predicate.hpp"
#include "kvsift/search/search_params.hpp"
#include "kvsift/search/search_workspace.hpp"
