#pragma once
// Synthetic GQA groups shared by the CUDA benchmarks: several query heads over one key set, and
// the decode benchmarks' key sets with their GPU-built indexes.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <thread>
#include <vector>

#pragma nv_diagnostic push
#pragma nv_diag_suppress 554
#include <kvsift/core/element.hpp>
#include <kvsift/core/vector_store.hpp>
#include <kvsift/cuda/knn.cuh>
#include <kvsift/index/gqa_sampling.hpp>
#include <kvsift/index/roargraph_builder.hpp>
#include <kvsift/index/route_set.hpp>
#include <kvsift/testing/ood_generator.hpp>
#pragma nv_diagnostic pop

namespace kvsift::cuda_bench {

/// Query head h of a GQA group over one key set: same seed and key parameters (so the same
/// keys and topics), different topic strength and query mean per head.
inline kvsift::testing::ood_data make_head(std::size_t n, std::size_t m, std::size_t d,
                                           std::size_t h, std::uint64_t seed) {
  const float scale[] = {2.0f, 1.5f, 2.5f, 3.0f};
  const float offset[] = {4.0f, 3.0f, 5.0f, 4.5f};
  return kvsift::testing::make_ood({.keys = n,
                                    .queries = m,
                                    .dim = d,
                                    .topics = 1024,
                                    .query_offset = offset[h % 4],
                                    .topic_scale = scale[h % 4],
                                    .seed = seed});
}

/// One key set of the decode benchmarks and its GQA-shared index, GPU-built.
struct gqa_key_set {
  std::vector<kvsift::half> keys16;  ///< [n][d], as the cache holds them
  std::vector<float> eval;           ///< [group][extra][d]: each head's held-out queries
  std::vector<kvsift::id_t> adjacency, entries;
  std::size_t width = 0;     ///< the index's row width (max degree)
  double build_seconds = 0;  ///< the build alone (sampling + kNN + steps 2-4)
  /// Routing set (kvsift::make_route_set), when asked for: `route_rows` training queries evenly
  /// spaced over the build's sample, unit-norm, and their exact top-`route_list` keys.
  kvsift::route_set routes;
};

/// Key set `seed`: make_head(n, n + extra, d, h, seed) for the group's heads h; keys rounded to
/// f16 (the index and the oracle see the values the cache holds); the index built from 10% of
/// each head's n prefill queries (sample_gqa_queries, seed 7) with every host thread and step 3's
/// expand fraction `expand` (roargraph_params::connectivity_expand_fraction).
inline gqa_key_set build_gqa_key_set(
    std::size_t n, std::size_t extra, std::size_t d, std::size_t group, std::uint64_t seed,
    double expand = kvsift::roargraph_params{}.connectivity_expand_fraction,
    std::size_t route_rows = 0, std::size_t route_list = 100) {
  std::vector<kvsift::testing::ood_data> heads;
  for (std::size_t h = 0; h < group; ++h) heads.push_back(make_head(n, n + extra, d, h, seed));
  gqa_key_set out;
  out.keys16.resize(n * d);
  std::vector<float> kf(n * d);
  for (std::size_t i = 0; i < n * d; ++i) {
    out.keys16[i] = kvsift::half(heads[0].keys[i]);
    kf[i] = static_cast<float>(out.keys16[i]);
  }
  std::vector<kvsift::matrix_view<const float>> prefill;
  for (const auto& h : heads) prefill.push_back(h.query_view().row_range(0, n));
  for (const auto& h : heads)
    out.eval.insert(out.eval.end(), h.queries.begin() + n * d, h.queries.end());
  kvsift::roargraph_params p;
  p.threads = std::thread::hardware_concurrency();
  p.connectivity_expand_fraction = expand;
  const kvsift::roargraph_builder<kvsift::inner_product, kvsift::cuda::knn_engine> builder(p);
  const auto t0 = std::chrono::steady_clock::now();
  const auto train = kvsift::sample_gqa_queries(
      std::span<const kvsift::matrix_view<const float>>(prefill), 0.1, 7);
  const kvsift::view_store<float> store(kvsift::matrix_view<const float>(kf.data(), n, d));
  const auto index = builder.build(store, train.view());
  out.build_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.width = index.max_degree();
  out.adjacency.assign(index.adjacency().begin(), index.adjacency().end());
  out.entries.assign(index.entry_points().begin(), index.entry_points().end());
  if (route_rows > 0) {
    out.routes =
        kvsift::make_route_set(train.view(), kvsift::matrix_view<const float>(kf.data(), n, d),
                               route_rows, route_list, kvsift::cuda::knn_engine{});
  }
  return out;
}

}  // namespace kvsift::cuda_bench
