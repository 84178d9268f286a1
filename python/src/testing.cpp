// The synthetic workload of the C++ tests and benchmarks (kvsift::testing::make_ood) from Python,
// so a Python benchmark draws exactly the keys and queries the C++ one does.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "bindings.hpp"
#include "common.hpp"
#include "kvsift/testing/ood_generator.hpp"

namespace kvsift_python {

void bind_testing(py::module_& m) {
  m.def(
      "make_ood",
      [](std::int64_t keys, std::int64_t queries, std::int64_t dim, std::int64_t topics,
         double key_offset, double query_offset, double topic_scale, double noise,
         double norm_spread, std::uint64_t seed) {
        kvsift::testing::ood_params p;
        p.keys = non_negative(keys, "make_ood", "keys");
        p.queries = non_negative(queries, "make_ood", "queries");
        p.dim = non_negative(dim, "make_ood", "dim");
        p.topics = non_negative(topics, "make_ood", "topics");
        // Checked in double: a value past float's range must not reach the conversion (UB).
        const auto as_float = [](double v, const char* what) {
          kvsift::detail::require<kvsift::non_finite_value>(
              std::isfinite(v) && std::fabs(v) <= std::numeric_limits<float>::max(),
              "make_ood: expected finite ", what, " (within float range), got ", v);
          return static_cast<float>(v);
        };
        p.key_offset = as_float(key_offset, "key_offset");
        p.query_offset = as_float(query_offset, "query_offset");
        p.topic_scale = as_float(topic_scale, "topic_scale");
        p.noise = as_float(noise, "noise");
        p.norm_spread = as_float(norm_spread, "norm_spread");
        p.seed = seed;
        kvsift::testing::ood_data d;
        {
          py::gil_scoped_release release;
          d = kvsift::testing::make_ood(p);
        }
        return py::make_tuple(to_numpy(d.keys).reshape({keys, dim}),
                              to_numpy(d.queries).reshape({queries, dim}));
      },
      py::arg("keys"), py::arg("queries"), py::arg("dim"), py::kw_only(), py::arg("topics") = 256,
      py::arg("key_offset") = 4.0, py::arg("query_offset") = 4.0, py::arg("topic_scale") = 2.0,
      py::arg("noise") = 0.6, py::arg("norm_spread") = 0.2, py::arg("seed") = 42,
      "The synthetic out-of-distribution workload of kvsift's C++ tests and benchmarks "
      "(kvsift::testing::make_ood): (keys (keys, dim), queries (queries, dim)), float32. Keys "
      "and queries come from different distributions (orthogonal means, keys of varying norm) "
      "and each query prefers the keys of its topic, as attention's do. The same arrays as the "
      "C++ generator for the same arguments, on every platform. O((keys + queries) * dim).");
}

}  // namespace kvsift_python
