// Consumer of an installed kvsift (see CMakeLists.txt next to this file): builds a small
// RoarGraph index through find_package(kvsift) and checks one search against the flat oracle.

#include <cstdio>
#include <vector>

#include <kvsift/kvsift.hpp>
#include <kvsift/testing/ood_generator.hpp>

int main() {
  kvsift::testing::ood_params p;
  p.keys = 2000;
  p.queries = 210;
  p.dim = 32;
  const auto data = kvsift::testing::make_ood(p);
  kvsift::view_store<float> keys(data.key_view());
  const auto index = kvsift::roargraph_builder<>({.nq = 30, .M = 16, .L = 100})
                         .build(keys, data.query_view().row_range(0, 200));

  kvsift::search_workspace ws;
  std::vector<kvsift::id_t> ids(10), exact(10);
  std::vector<float> scores(10), exact_scores(10);
  const auto query = data.query_view().row_span(205);
  kvsift::beam_search(index, query, {.k = 10, .L = 64}, ws, std::span(ids), std::span(scores));
  kvsift::flat_index<kvsift::view_store<float>>(keys).topk(query, 10, ws, std::span(exact),
                                                           std::span(exact_scores));
  std::size_t hits = 0;
  for (auto id : ids) {
    for (auto e : exact) hits += id == e ? 1 : 0;
  }
  std::printf("installed kvsift: %zu keys indexed, top-10 recall %zu/10\n", index.size(), hits);
  return hits >= 7 ? 0 : 1;
}
