// The query planner of the Python module (Plan, Planner), the plan executor (execute_plan) and
// GQA training-query sampling.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>

#include "bindings.hpp"
#include "common.hpp"
#include "indexes.hpp"
#include "kv_tensor.hpp"
#include "kvsift/decode/plan_executor.hpp"
#include "kvsift/index/gqa_sampling.hpp"
#include "kvsift/search/planner.hpp"

namespace kvsift_python {
namespace {

/// Planner parameters from Python keywords; 0 and negative values are rejected by the planner
/// itself (negative integers are caught here, before they wrap around in a size_t).
kvsift::planner_params planner_params_of(std::int64_t short_context, std::int64_t head_dim,
                                         std::int64_t block_size, std::int64_t k_blocks,
                                         std::int64_t dipr_l0, double dipr_beta) {
  auto count = [](std::int64_t v, const char* what) { return non_negative(v, "Planner", what); };
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

/// One executed step (execute_plan's result).
struct plan_step_result {
  py::array_t<float> o;
  float lse = 0;
  py::array_t<std::int64_t> ids;
  bool everything = false;
  std::size_t scanned = 0;
  bool capped = false;
  double search_seconds = 0, attention_seconds = 0;
};

/// The float32 alternative of an index variant, or a clear error: the executor's resources are
/// indexes over float32 keys (the e2e example's, and the bench's).
template <class Index, class Variant>
const Index* f32_index(const Variant& v, const char* what) {
  const auto* idx = std::get_if<Index>(&v);
  require(idx != nullptr, "execute_plan: expected ", what, " over float32 keys");
  return idx;
}

kvsift::default_plan_resources resources_of(const py::object& flat, const py::object& graph,
                                            const py::object& coarse) {
  kvsift::default_plan_resources r;
  if (!flat.is_none())
    r.flat = f32_index<flat_t<float>>(flat.cast<const py_flat&>().index(), "flat");
  if (!graph.is_none()) {
    r.graph = f32_index<graph_t<float>>(graph.cast<const py_graph&>().index(), "graph");
  }
  if (!coarse.is_none()) r.coarse = &coarse.cast<const py_block&>().index();
  return r;
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

  py::class_<plan_step_result>(m, "PlanStep",
                               "One executed plan step: output state, retrieved ids, counters.")
      .def_readonly("o", &plan_step_result::o)
      .def_readonly("lse", &plan_step_result::lse)
      .def_readonly("ids", &plan_step_result::ids)
      .def_readonly("everything", &plan_step_result::everything)
      .def_readonly("scanned", &plan_step_result::scanned)
      .def_readonly("capped", &plan_step_result::capped)
      .def_readonly("search_seconds", &plan_step_result::search_seconds)
      .def_readonly("attention_seconds", &plan_step_result::attention_seconds);

  m.def(
      "execute_plan",
      [](const kvsift::plan& p, const py::handle& q, const py::handle& keys,
         const py::handle& values, std::size_t context, std::size_t kv_head,
         std::pair<std::size_t, std::size_t> window, const py::object& flat,
         const py::object& graph, const py::object& coarse, std::size_t budget, std::size_t topk,
         std::size_t beam, std::size_t k_blocks, float beta, std::size_t l0,
         std::size_t max_candidates, bool seed_from_window, float scale) {
        const auto qv = vector_of(q, "q");
        const std::span<const float> qs = qv.s;
        const auto res = resources_of(flat, graph, coarse);
        kvsift::plan_step_params prm{
            .context = context,
            .window = {window.first, window.second},
            .budget = budget,
            .topk = topk,
            .beam = beam,
            .k_blocks = k_blocks,
            .dipr = {.beta = beta, .l0 = l0, .max_candidates = max_candidates},
            .seed_from_window = seed_from_window,
            .attention = {.scale = scale}};
        plan_step_result r;
        kvsift::plan_step_output out;
        visit_kv(keys, values, [&](const auto& kv) {
          py::gil_scoped_release release;
          thread_local kvsift::search_workspace ws;
          const auto& ex = kvsift::default_plan_executor<kvsift::default_plan_resources>();
          using clock = std::chrono::steady_clock;
          const auto t0 = clock::now();
          const auto ready = ex.prepare(qs, kv, kv_head, prm);
          ex.retrieve(p, res, qs, ready, ws, out.retrieval);
          const auto t1 = clock::now();
          ex.attend(out.retrieval, qs, kv, kv_head, ready, out.state);
          r.search_seconds = std::chrono::duration<double>(t1 - t0).count();
          r.attention_seconds = std::chrono::duration<double>(clock::now() - t1).count();
        });
        r.o = to_numpy(out.state.o);
        r.lse = out.state.lse;
        r.ids = ids_to_numpy(out.retrieval.ids);
        r.everything = out.retrieval.everything;
        r.scanned = out.retrieval.scanned;
        r.capped = out.retrieval.capped;
        return r;
      },
      py::arg("plan"), py::arg("q"), py::arg("keys"), py::arg("values"), py::kw_only(),
      py::arg("context"), py::arg("kv_head") = 0,
      py::arg("window") = std::pair<std::size_t, std::size_t>{0, 0}, py::arg("flat") = py::none(),
      py::arg("graph") = py::none(), py::arg("coarse") = py::none(), py::arg("budget") = 0,
      py::arg("topk") = 0, py::arg("beam") = 100, py::arg("k_blocks") = 16, py::arg("beta") = 1.0f,
      py::arg("l0") = 64, py::arg("max_candidates") = 0, py::arg("seed_from_window") = false,
      py::arg("scale") = 0.0f,
      "Runs a Plan for one query head (kvsift::plan_executor): the plan's search over the given "
      "index (FlatIndex / RoarGraphIndex over float32 keys, BlockIndex) restricted to "
      "[window[0], context - window[1]) and the plan's prefix, cut to `budget` (0 = all), then "
      "dense attention over the window plus sparse attention over the retrieved ids, merged "
      "-> PlanStep (a full plan attends [0, context)). The plan's beta, l0 and k_blocks win "
      "over the keywords. keys/values as dense_attention. Raises for a plan no executor runs, "
      "an index the plan needs but was not given, wrong shapes, NaN/Inf in q.");
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
