// Concurrency contract of the plan executor: the shared default executor (a function-local
// static, never mutated) runs plans concurrently from several threads on shared const indexes,
// each thread with its own workspace and output, and every result equals the single-threaded
// one bit for bit. Tagged [concurrency]: CI also runs it under ThreadSanitizer.
//
// Catch2 v2 assertions are not thread-safe: workers only count mismatches, checked after join.
#include <catch2/catch.hpp>

#include <cstddef>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvsift/decode/plan_executor.hpp"
#include "kvsift/index/roargraph_builder.hpp"
#include "kvsift/testing/ood_generator.hpp"

namespace {

using store_t = kvsift::view_store<float>;
constexpr std::size_t n_keys = 1000, dim = 16, n_train = 120, n_eval = 16, threads = 4;

struct fixture {
  kvsift::testing::ood_data data;
  std::vector<float> values;
  kvsift::graph_index<store_t> graph;
  kvsift::flat_index<store_t> flat;
  kvsift::block_index<> coarse;
};

const fixture& fx() {
  static const fixture f = [] {
    fixture out;
    out.data = kvsift::testing::make_ood(
        {.keys = n_keys, .queries = n_train + n_eval, .dim = dim, .seed = 5});
    out.values.resize(n_keys * dim);
    for (std::size_t i = 0; i < out.values.size(); ++i)
      out.values[i] = static_cast<float>(static_cast<int>(i % 5) - 2);
    kvsift::roargraph_params p;
    p.nq = 20;
    p.M = 8;
    p.L = 32;
    p.threads = 2;
    const store_t store(out.data.key_view());
    out.graph =
        kvsift::roargraph_builder<>(p).build(store, out.data.query_view().row_range(0, n_train));
    out.flat = kvsift::flat_index<store_t>(store);
    out.coarse = kvsift::block_index<>(out.data.key_view(), 16);
    return out;
  }();
  return f;
}

}  // namespace

TEST_CASE("plans run concurrently on shared indexes equal the serial results",
          "[concurrency][plan_executor]") {
  const auto& f = fx();
  const kvsift::kv_view<float> kv(f.data.key_view(),
                                  kvsift::matrix_view<const float>(f.values.data(), n_keys, dim));
  const kvsift::default_plan_resources res{.flat = &f.flat, .graph = &f.graph, .coarse = &f.coarse};
  const std::vector<std::pair<std::string, std::string>> kinds{
      {"full", "full"},  {"flat", "topk"},   {"flat", "dipr"},  {"graph", "topk"},
      {"graph", "dipr"}, {"coarse", "topk"}, {"coarse", "dipr"}};
  auto run_all = [&](std::vector<kvsift::plan_step_output>& out) {
    kvsift::search_workspace ws;
    out.resize(kinds.size() * n_eval);
    for (std::size_t m = 0; m < kinds.size(); ++m) {
      kvsift::plan p;
      p.index = kinds[m].first;
      p.query = kinds[m].second;
      p.params["k_blocks"] = 4;
      for (std::size_t i = 0; i < n_eval; ++i) {
        kvsift::execute_plan(p, res, f.data.query_view().row_span(n_train + i), kv, 0,
                             {.context = 900 + 5 * i,
                              .window = {8, 32},
                              .budget = 30,
                              .dipr = {.beta = 2.0f},
                              .seed_from_window = true},
                             ws, out[m * n_eval + i]);
      }
    }
  };
  std::vector<kvsift::plan_step_output> serial;
  run_all(serial);
  std::vector<std::vector<kvsift::plan_step_output>> got(threads);
  std::vector<std::size_t> mismatches(threads, 0);
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      run_all(got[t]);
      for (std::size_t i = 0; i < serial.size(); ++i) {
        const auto& a = got[t][i];
        const auto& b = serial[i];
        if (a.retrieval.ids != b.retrieval.ids || a.state.o != b.state.o ||
            a.state.lse != b.state.lse)
          ++mismatches[t];
      }
    });
  }
  for (auto& th : pool) th.join();
  for (std::size_t t = 0; t < threads; ++t) CHECK(mismatches[t] == 0);
  std::size_t retrieved = 0;
  for (const auto& s : serial) retrieved += s.retrieval.ids.size();
  CHECK(retrieved > 500);  // the plans retrieved something to compare
}
