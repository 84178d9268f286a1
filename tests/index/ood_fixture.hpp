#pragma once
// The synthetic OOD workload of the index quality tests (RoarGraph quality, incremental insert):
// 20000 keys x 32; 2000 training queries (10% of the keys), 200 held-out evaluation queries with
// their exact top-10. One instance per test binary (an inline function's static), built on first
// use.

#include <vector>

#include "exact_topk.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/index/roargraph_builder.hpp"
#include "kvsift/testing/ood_generator.hpp"

namespace kvsift_test {

struct ood_fixture {
  kvsift::testing::ood_data data;
  kvsift::matrix_view<const float> keys, train, eval;
  std::vector<std::vector<kvsift::id_t>> truth;  // exact top-10 of eval
};

inline const ood_fixture& ood() {
  static const ood_fixture f = [] {
    ood_fixture o;
    o.data = kvsift::testing::make_ood(
        {.keys = 20000, .queries = 2200, .dim = 32, .norm_spread = 0.2f, .seed = 11});
    o.keys = o.data.key_view();
    o.train = o.data.query_view().row_range(0, 2000);
    o.eval = o.data.query_view().row_range(2000, 200);
    o.truth = exact_topk(o.keys, o.eval, 10);
    return o;
  }();
  return f;
}

/// The RoarGraph build parameters of the tests on this fixture (smaller than the defaults, for
/// CI's two cores).
inline kvsift::roargraph_params ood_build_params() {
  kvsift::roargraph_params p;
  p.nq = 50;
  p.M = 16;
  p.L = 100;
  p.threads = 2;
  return p;
}

}  // namespace kvsift_test
