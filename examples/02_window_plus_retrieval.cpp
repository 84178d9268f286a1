// Retrieval-based sparse attention for one decode step of one head, end to end: a static
// window (first 128 + last 512 tokens, as on the GPU) attended densely, the middle of the
// context searched with a RoarGraph index and attended sparsely (as on the CPU), and the two
// partial states merged exactly. Compared with full attention and with the exact top-k.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kvsift/kvsift.hpp"
#include "kvsift/testing/ood_generator.hpp"

int main() {
  using namespace kvsift;
  constexpr std::size_t n = 8192, d = 64, sink = 128, recent = 512, k = 100;
  testing::ood_params p;
  p.keys = n;
  p.queries = 1000;
  p.dim = d;
  const auto data = testing::make_ood(p);
  std::vector<float> values(n * d);  // V: any values will do to check the merge
  std::mt19937 gen(3);
  std::normal_distribution<float> normal;
  for (auto& v : values) v = normal(gen);

  const matrix_view<const float> K = data.key_view(), V(values.data(), n, d);
  const kv_view<float> kv(K, V);
  const auto q = data.query_view().row_span(999);  // a query the index was not built from
  // Synthetic logits are small (|q.k| ~ 3): at 1/sqrt(d) attention would be nearly uniform,
  // which no sparse method can recover. Scale 4 gives the peaked softmax of trained heads.
  const attention_params ap{.scale = 4.0f};

  // Prefill: the index over all keys, built from the prompt's queries.
  view_store<float> store(K);
  const auto index = roargraph_builder<>({.nq = 50, .M = 24, .L = 200})
                         .build(store, data.query_view().row_range(0, 900));

  // Decode: the window, densely (merged from its two ranges).
  auto window = dense_attention(q, 0, 0, sink, kv, ap);
  merge_into(window, dense_attention(q, 0, n - recent, n, kv, ap));

  // Decode: the top-k of the middle of the context [sink, n - recent), by filtered graph search,
  // and the exact top-k of the same range for comparison.
  const id_range middle{sink, n - recent};
  search_workspace ws;
  std::vector<id_t> ids(k), exact(k);
  std::vector<float> scores(k), exact_scores(k);
  const auto s =
      beam_search(index, q, {.k = k, .L = 200}, ws, std::span(ids), std::span(scores), middle);
  ids.resize(s.count);
  flat_index<view_store<float>>(store).topk(q, k, ws, std::span(exact), std::span(exact_scores),
                                            middle);

  const auto full = dense_attention(q, 0, 0, n, kv, ap);
  auto report = [&](const char* name, const partial_state& st) {
    // Share of the full softmax mass on the attended tokens, and the output's error.
    const auto quality = compare_states(full, st);
    std::printf("%-22s mass %.4f, relative L2 error %.4f\n", name, quality.recovery,
                quality.rel_l2_error);
    return quality.recovery;
  };
  std::printf("attended %zu of %zu tokens (%.1f%%); the graph scored %zu keys\n",
              sink + recent + ids.size(), n, 100.0 * (sink + recent + ids.size()) / n,
              s.distance_computations);
  report("window only", window);
  const double graph =
      report("window + graph top-k", merge(window, sparse_attention(q, 0, ids, kv, ap)));
  const double best =
      report("window + exact top-k", merge(window, sparse_attention(q, 0, exact, kv, ap)));
  return graph > 0.9 * best && best <= 1.0 + 1e-5 ? 0 : 1;
}
