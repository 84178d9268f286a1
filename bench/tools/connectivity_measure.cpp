// Local measurement: build time breakdown + recall@100 for several connectivity settings on
// the same kNN result (same run).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <kvsift/index/gqa_sampling.hpp>
#include <kvsift/index/roargraph_builder.hpp>
#include <kvsift/io/vector_io.hpp>
#include <kvsift/search/beam_search.hpp>
#include <kvsift/testing/ood_generator.hpp>
#include <string>
#include <vector>

#include "recall.hpp"
using namespace kvsift;
using kvsift_tools::recall_at;
int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ood";
  std::size_t n = argc > 2 ? std::strtoull(argv[2], 0, 10) : 32768;
  const char* cfgs = argc > 3 ? argv[3] : "500:1024:0";
  std::vector<float> keys;
  std::vector<std::vector<float>> qheads;
  std::size_t d = 128, m = 0, eval = 100;
  if (mode == "ood") {
    const float scale[] = {2.0f, 1.5f, 2.5f, 3.0f}, offset[] = {4.0f, 3.0f, 5.0f, 4.5f};
    for (int h = 0; h < 4; ++h) {
      auto x = testing::make_ood({.keys = n,
                                  .queries = n + eval,
                                  .dim = d,
                                  .topics = 1024,
                                  .query_offset = offset[h],
                                  .topic_scale = scale[h],
                                  .seed = 11});
      if (h == 0) keys = x.keys;
      qheads.push_back(x.queries);
    }
    m = n;
  } else {
    auto k = read_fbin("/work/main/bench/data/dump/L15_k0.fbin");
    d = k.cols();
    n = k.rows();
    keys.assign(k.view().row(0), k.view().row(0) + n * d);
    for (int h = 0; h < 3; ++h) {
      auto q = read_fbin("/work/main/bench/data/dump/L15_q" + std::to_string(h) + ".fbin");
      qheads.emplace_back(q.view().row(0), q.view().row(0) + q.rows() * d);
      m = q.rows() - eval;
    }
  }
  matrix_view<const float> kv(keys.data(), n, d);
  std::vector<matrix_view<const float>> prefill;
  for (auto& q : qheads) prefill.emplace_back(q.data(), m, d);
  const auto shared =
      sample_gqa_queries(std::span<const matrix_view<const float>>(prefill),
                         std::getenv("RATIO") ? std::atof(std::getenv("RATIO")) : 0.1, 7);
  cpu_knn_engine eng({.threads = 2});
  std::vector<knn_result> exact;
  for (auto& q : qheads)
    exact.push_back(eng.search(matrix_view<const float>(q.data() + m * d, eval, d), kv, 100));
  roargraph_params p;
  p.threads = 2;
  const roargraph_builder<> b0(p);
  auto t0 = std::chrono::steady_clock::now();
  const auto knn = b0.training_knn(kv, shared.view());
  std::printf("%s n=%zu d=%zu train=%zu knn %.2fs\n", mode.c_str(), n, d, shared.rows(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::string s = cfgs;
  std::size_t pos = 0;
  while (pos < s.size()) {
    auto e = s.find(',', pos);
    if (e == std::string::npos) e = s.size();
    const std::string c = s.substr(pos, e - pos);
    pos = e + 1;
    roargraph_params q = p;
    unsigned long L, B, F = 0;
    std::sscanf(c.c_str(), "%lu:%lu:%lu", &L, &B, &F);
    q.L = L;
    q.batch = B;
    q.connectivity_knn = F;
    roargraph_build_stats st;
    const auto g = roargraph_builder<>(q).build_from_knn(view_store<float>(kv), knn, &st);
    std::printf(
        "L=%4lu batch=%5lu cknn=%lu: proj %.2fs conn %.2fs (search %.2fs merge %.2fs repair %.2fs) "
        "dist/search %.0f prune %.0f | recall",
        L, B, F, st.projection_seconds, st.connectivity_seconds, st.connectivity_search_seconds,
        st.connectivity_merge_seconds, st.repair_seconds,
        double(st.connectivity_distance_computations) / double(n),
        double(st.connectivity_prune_distance_computations) / double(n));
    std::uint64_t h = 1469598103934665603ull;  // FNV-1a of the adjacency: same graph or not
    for (const id_t v : g.adjacency()) h = (h ^ v) * 1099511628211ull;
    std::printf(" graph %016llx |", static_cast<unsigned long long>(h));
    for (std::size_t sl : {100, 200, 400}) {
      double r = 0;
      for (std::size_t h = 0; h < qheads.size(); ++h)
        r += recall_at(g, matrix_view<const float>(qheads[h].data() + m * d, eval, d), exact[h],
                       100, sl);
      std::printf(" %zu:%.4f", sl, r / qheads.size());
    }
    std::printf("\n");
    std::fflush(stdout);
  }
}
