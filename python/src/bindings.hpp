#pragma once
// One function per concern, each adding its classes and functions to the module; called in
// this order by PYBIND11_MODULE (kvsift_module.cpp): result and filter types first, so the
// signatures of the functions bound later name them.
#include <pybind11/pybind11.h>

namespace kvsift_python {

/// Filters (IdBelow, IdRange), result types (SearchResult, DiprResult, BlockResult) and
/// search_heads.
void bind_search(pybind11::module_& m);
/// FlatIndex, RoarGraphIndex (and BuildStats), InsertableGraphIndex, BlockIndex.
void bind_indexes(pybind11::module_& m);
/// sparse/dense attention (one head and all heads), merge, merge_states, merge_n.
void bind_attention(pybind11::module_& m);
/// Plan, Planner and sample_gqa_queries.
void bind_planner(pybind11::module_& m);
/// BufferElasticity (the GPU page budget across requests and its per-pair limits).
void bind_memory(pybind11::module_& m);
/// make_ood (the synthetic workload of the C++ tests and benchmarks).
void bind_testing(pybind11::module_& m);
/// RouteSet and make_route_set (seeds for cold decode searches).
void bind_routing(pybind11::module_& m);

}  // namespace kvsift_python
