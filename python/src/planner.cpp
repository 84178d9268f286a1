// The query planner of the Python module (Plan, Planner) and GQA training-query sampling.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "common.hpp"
#include "kvsift/index/gqa_sampling.hpp"
#include "kvsift/search/planner.hpp"

namespace kvsift_python {
namespace {

/// Planner parameters from Python keywords; 0 and negative values are rejected by the planner
/// itself (negative integers are caught here, before they wrap around in a size_t).
kvsift::planner_params planner_params_of(std::int64_t short_context, std::int64_t head_dim,
                                         std::int64_t block_size, std::int64_t k_blocks,
                                         std::int64_t dipr_l0, double dipr_beta) {
  auto count = [](std::int64_t v, const char* what) {
    require(v >= 0, "Planner: expected ", what, " >= 0, got ", v);
    return static_cast<std::size_t>(v);
  };
  kvsift::planner_params p;
  p.short_context = count(short_context, "short_context");
  p.head_dim = count(head_dim, "head_dim");
  p.block_size = count(block_size, "block_size");
  p.k_blocks = count(k_blocks, "k_blocks");
  p.dipr_l0 = count(dipr_l0, "dipr_l0");
  p.dipr_beta = dipr_beta;
  return p;
}

kvsift::plan_inputs plan_inputs_of(std::int64_t context, std::int64_t reused_prefix,
                                   std::int64_t layer, double gpu_budget_bytes,
                                   std::optional<double> latency_budget_us) {
  // The planner checks context > 0, prefix <= context and the budgets; only the signs of the
  // integers need checking here.
  require(context >= 0 && reused_prefix >= 0 && layer >= 0,
          "Planner.plan: expected context, reused_prefix and layer >= 0, got ", context, ", ",
          reused_prefix, ", ", layer);
  kvsift::plan_inputs in;
  in.context = static_cast<std::size_t>(context);
  in.reused_prefix = static_cast<std::size_t>(reused_prefix);
  in.layer = static_cast<std::size_t>(layer);
  in.gpu_budget_bytes = gpu_budget_bytes;
  in.latency_budget_us = latency_budget_us;
  return in;
}

}  // namespace

void bind_planner(py::module_& m) {
  py::class_<kvsift::plan>(m, "Plan",
                           "A planner decision: index kind, query kind, optional prefix filter, "
                           "parameters and the reasons.")
      .def_readonly("index", &kvsift::plan::index)
      .def_readonly("query", &kvsift::plan::query)
      .def_readonly("filter_prefix", &kvsift::plan::filter_prefix)
      .def_readonly("params", &kvsift::plan::params)
      .def_readonly("reasons", &kvsift::plan::reasons)
      .def_readonly("decided_by", &kvsift::plan::decided_by)
      .def_readonly("gpu_bytes", &kvsift::plan::gpu_bytes)
      .def_property_readonly(
          "filter",
          [](const kvsift::plan& p) -> py::object {
            if (!p.filter_prefix) return py::none();
            return py::cast(kvsift::id_below{*p.filter_prefix});
          },
          "kvsift.IdBelow(filter_prefix) or None.")
      .def_property_readonly("name", &kvsift::plan::name)
      .def("explain", &kvsift::plan::explain)
      .def("__repr__", [](const kvsift::plan& p) { return "<kvsift.Plan " + p.name() + ">"; });

  py::class_<kvsift::planner>(m, "Planner",
                              "Rule-based query planner (AlayaDB rules: short_context, "
                              "prefix_filter, coarse_if_budget, dipr_flat_layer0, dipr_graph). "
                              "Planner(...) takes the cost-model parameters; plan() is "
                              "thread-safe.")
      .def(py::init([](std::int64_t short_context, std::int64_t head_dim, std::int64_t block_size,
                       std::int64_t k_blocks, std::int64_t dipr_l0, double dipr_beta) {
             return kvsift::planner(planner_params_of(short_context, head_dim, block_size, k_blocks,
                                                      dipr_l0, dipr_beta));
           }),
           py::kw_only(), py::arg("short_context") = 4096, py::arg("head_dim") = 128,
           py::arg("block_size") = 64, py::arg("k_blocks") = 16, py::arg("dipr_l0") = 64,
           py::arg("dipr_beta") = 8.0)
      .def(
          "plan",
          [](const kvsift::planner& self, std::int64_t context, std::int64_t reused_prefix,
             std::int64_t layer, double gpu_budget_bytes, std::optional<double> latency_us) {
            return self.choose(
                plan_inputs_of(context, reused_prefix, layer, gpu_budget_bytes, latency_us));
          },
          py::arg("context"), py::kw_only(), py::arg("reused_prefix") = 0, py::arg("layer") = 0,
          py::arg("gpu_budget_bytes") = 0.0, py::arg("latency_budget_us") = py::none(),
          "Runs the rules in order until one decides -> Plan. O(rules). Raises "
          "InvalidArgument for context 0, a prefix longer than the context, a negative or "
          "non-finite budget.")
      .def(
          "gpu_bytes",
          [](const kvsift::planner& self, const std::string& index, std::int64_t context) {
            return self.gpu_bytes(index, plan_inputs_of(context, 0, 0, 0.0, std::nullopt));
          },
          py::arg("index"), py::arg("context"),
          "GPU bytes index kind `index` needs at this context; unknown names raise.")
      .def(
          "parse_name",
          [](const kvsift::planner& self, const std::string& s) { return self.parse_name(s); },
          py::arg("name"),
          "None for 'auto', (index, query) for 'index-query'; unknown names raise.")
      .def_property_readonly("short_context",
                             [](const kvsift::planner& p) { return p.params().short_context; })
      .def_property_readonly("head_dim",
                             [](const kvsift::planner& p) { return p.params().head_dim; })
      .def_property_readonly("block_size",
                             [](const kvsift::planner& p) { return p.params().block_size; })
      .def_property_readonly("k_blocks",
                             [](const kvsift::planner& p) { return p.params().k_blocks; })
      .def_property_readonly("dipr_l0", [](const kvsift::planner& p) { return p.params().dipr_l0; })
      .def_property_readonly("dipr_beta",
                             [](const kvsift::planner& p) { return p.params().dipr_beta; })
      .def_property_readonly("rules",
                             [](const kvsift::planner& self) {
                               std::vector<std::string> names;
                               for (const auto& r : self.rules()) names.push_back(r.name);
                               return names;
                             })
      .def("remove_rule", &kvsift::planner::remove_rule, py::arg("name"),
           "Removes a rule by name; unknown names raise.");

  m.def(
      "sample_gqa_queries",
      [](const py::list& heads, double ratio, std::uint64_t seed) {
        std::vector<kvsift::matrix_view<const float>> views;
        std::vector<tensor> keep;
        keep.reserve(heads.size());  // views point into keep's elements' owners, not the vector
        for (const auto& h : heads) {
          keep.push_back(tensor_of(h, "heads"));
          views.push_back(f32_matrix_of(keep.back(), "heads"));
        }
        const auto s = kvsift::sample_gqa_queries(views, ratio, seed);
        py::array_t<float> out(
            {static_cast<py::ssize_t>(s.rows()), static_cast<py::ssize_t>(s.cols())});
        for (std::size_t i = 0; i < s.rows(); ++i) {
          std::copy_n(s.row(i), s.cols(), out.mutable_data() + i * s.cols());
        }
        return out;
      },
      py::arg("heads"), py::arg("ratio"), py::arg("seed") = 7,
      "Stacks round(ratio * rows) sampled queries of each query head of a GQA group (one "
      "index per KV head is built from them).");
}

}  // namespace kvsift_python
