#pragma once
// Shared fixture of the search and flat-index tests: one small RoarGraph over synthetic OOD keys,
// built once per test binary (an inline function's static), plus a helper returning the message
// of an expected exception.

#include <catch2/catch.hpp>

#include <string>

#include "../test_support.hpp"
#include "kvsift/index/flat_index.hpp"
#include "kvsift/index/roargraph_builder.hpp"
#include "kvsift/testing/ood_generator.hpp"

namespace kvsift_test {

using Catch::Matchers::Contains;
using kvsift::id_t;
using store_t = kvsift::view_store<float>;

struct fixture {
  kvsift::testing::ood_data data;
  store_t store;
  kvsift::graph_index<store_t> graph;
  kvsift::flat_index<store_t> flat;
  kvsift::matrix_view<const float> eval;
};

inline const fixture& fx() {
  static const fixture f = [] {
    fixture out;
    out.data = kvsift::testing::make_ood({.keys = 2000, .queries = 400, .dim = 32, .seed = 7});
    out.store = store_t(out.data.key_view());
    kvsift::roargraph_params p;
    p.nq = 50;
    p.M = 16;
    p.L = 100;
    p.threads = 2;
    p.batch = 16;
    out.graph =
        kvsift::roargraph_builder<>(p).build(out.store, out.data.query_view().row_range(0, 300));
    out.flat = kvsift::flat_index<store_t>(out.store);
    out.eval = out.data.query_view().row_range(300, 100);
    return out;
  }();
  return f;
}

}  // namespace kvsift_test
