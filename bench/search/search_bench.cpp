// Search latency on a synthetic out-of-distribution workload: RoarGraph top-k and DIPR next
// to the exact flat scan (the baseline, measured in the same run). Recall is reported as a
// counter so a speed-up is never read without its accuracy. The index is built once.
// The *_window cases filter as a decode step does (4 sinks and a recent window of 512 tokens
// left out), with and without walking through the excluded ids (walk_through 1 / 0); their
// recall is against the exact top-100 under the same filter.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

#include "kvsift/kvsift.hpp"
#include "kvsift/testing/ood_generator.hpp"

namespace {

using store_t = kvsift::view_store<float>;

struct fixture {
  static constexpr std::size_t n = 32768, train = 3277, eval = 100;
  kvsift::testing::ood_data data;
  kvsift::graph_index<store_t> graph;
  kvsift::flat_index<store_t> flat;
  kvsift::knn_result truth;
  /// A decode step's retrieval range: the sinks and the recent window are attended anyway.
  static constexpr kvsift::id_range window_filter{4, n - 512};
  kvsift::knn_result window_truth;

  fixture() {
    kvsift::testing::ood_params p;
    p.keys = n;
    p.queries = train + eval;
    p.dim = 128;
    data = kvsift::testing::make_ood(p);
    store_t keys(data.key_view());
    graph = kvsift::roargraph_builder<>().build(keys, data.query_view().row_range(0, train));
    flat = kvsift::flat_index<store_t>(keys);
    truth = kvsift::exact_topk(flat, eval_queries(), 100);
    window_truth = kvsift::exact_topk(flat, eval_queries(), 100, 0, window_filter);
  }
  kvsift::matrix_view<const float> eval_queries() const {
    return data.query_view().row_range(train, eval);
  }
  static const fixture& get() {
    static const fixture f;
    return f;
  }
};

double recall_at(const kvsift::knn_result& truth, std::size_t q,
                 const std::vector<kvsift::id_t>& ids) {
  const auto t = truth.row_ids(q);
  std::size_t hits = 0;
  for (auto id : ids) hits += std::find(t.begin(), t.end(), id) != t.end() ? 1 : 0;
  return static_cast<double>(hits) / static_cast<double>(t.size());
}

void bm_flat_top100(benchmark::State& state) {
  const auto& f = fixture::get();
  kvsift::search_workspace ws;
  std::vector<kvsift::id_t> ids(100);
  std::vector<float> scores(100);
  std::size_t q = 0;
  for (auto _ : state) {
    f.flat.topk(f.eval_queries().row_span(q), 100, ws, std::span(ids), std::span(scores));
    q = (q + 1) % fixture::eval;
  }
  state.counters["scanned"] = 1.0;
}

/// Top-100 by beam search over the eval queries in turn; recall against `truth` (the exact
/// top-100 under the same filter) and the share of keys scored as counters.
template <class P = kvsift::no_filter>
void time_top100(benchmark::State& state, const kvsift::beam_search_params& p,
                 const kvsift::knn_result& truth, const P& pred = {}) {
  const auto& f = fixture::get();
  kvsift::search_workspace ws;
  std::vector<kvsift::id_t> ids(100);
  std::vector<float> scores(100);
  std::size_t q = 0;
  double recall = 0, scanned = 0, runs = 0;
  for (auto _ : state) {
    const auto s = kvsift::beam_search(f.graph, f.eval_queries().row_span(q), p, ws, std::span(ids),
                                       std::span(scores), pred);
    state.PauseTiming();
    recall += recall_at(truth, q, ids);
    scanned += static_cast<double>(s.distance_computations) / fixture::n;
    runs += 1;
    state.ResumeTiming();
    q = (q + 1) % fixture::eval;
  }
  state.counters["recall"] = recall / runs;
  state.counters["scanned"] = scanned / runs;
}

/// DIPR over the eval queries in turn; answer size and share of keys scored as counters.
template <class P = kvsift::no_filter>
void time_dipr(benchmark::State& state, const kvsift::dipr_params& p, const P& pred = {}) {
  const auto& f = fixture::get();
  kvsift::search_workspace ws;
  kvsift::dipr_result r;
  std::size_t q = 0;
  double size = 0, scanned = 0, runs = 0;
  for (auto _ : state) {
    kvsift::dipr_search(f.graph, f.eval_queries().row_span(q), p, ws, r, pred);
    size += static_cast<double>(r.ids.size());
    scanned += static_cast<double>(r.stats.distance_computations) / fixture::n;
    runs += 1;
    q = (q + 1) % fixture::eval;
  }
  state.counters["size"] = size / runs;
  state.counters["scanned"] = scanned / runs;
}

void bm_graph_top100(benchmark::State& state) {
  time_top100(state, {.k = 100, .L = static_cast<std::size_t>(state.range(0))},
              fixture::get().truth);
}

void bm_graph_dipr(benchmark::State& state) {
  time_dipr(state, {.beta = 1.5f, .l0 = static_cast<std::size_t>(state.range(0))});
}

void bm_graph_top100_window(benchmark::State& state) {
  time_top100(state,
              {.k = 100,
               .L = static_cast<std::size_t>(state.range(0)),
               .walk_through = state.range(1) != 0},
              fixture::get().window_truth, fixture::window_filter);
}

void bm_graph_dipr_window(benchmark::State& state) {
  time_dipr(state,
            {.beta = 1.5f,
             .l0 = static_cast<std::size_t>(state.range(0)),
             .walk_through = state.range(1) != 0},
            fixture::window_filter);
}

}  // namespace

BENCHMARK(bm_flat_top100)->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_graph_top100)->Arg(200)->Arg(500)->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_graph_dipr)->Arg(100)->Arg(400)->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_graph_top100_window)
    ->ArgsProduct({{100, 200}, {1, 0}})
    ->ArgNames({"L", "walk_through"})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_graph_dipr_window)
    ->ArgsProduct({{100, 400}, {1, 0}})
    ->ArgNames({"l0", "walk_through"})
    ->Unit(benchmark::kMicrosecond);
