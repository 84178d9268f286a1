// Keys scanned for recall@100 on a real dump (bench/data/dump_qk.py layout: L<l>_k0.fbin,
// L<l>_q<h>.fbin), cold and warm-started, for one layer, as the decode path runs its searches:
// one GQA-shared RoarGraph over the layer's keys, trained on all query heads' queries at every
// `stride`-th prefill position (stride 1: every prefill query; 10: the 10% the evaluation
// defaults to); the last 1000 positions are decoded in order, each query head searching with
//   cold: beam_search at pool L = E (expand_limit 0);
//   warm: seeds = that head's previous results (extra_entries), expand_limit E, pool
//         max(100, E) (docs/algorithms.md, "Warm start for decode queries").
// Prints, per head and setting, recall@100 against the exact top-100 and vectors scored per
// query (share of the keys). One build thread per core, one search thread.
//
//   kvsift-warm_start_scan DIR LAYER HEADS STRIDE DEGREE_CAP COLD_E_LIST WARM_E_LIST
//   e.g. kvsift-warm_start_scan /data/gemma32k 11 0123 1 32 100,128,160 80,90,100,112
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include <kvsift/core/metric.hpp>
#include <kvsift/core/vector_store.hpp>
#include <kvsift/index/knn.hpp>
#include <kvsift/index/roargraph_builder.hpp>
#include <kvsift/io/vector_io.hpp>
#include <kvsift/search/beam_search.hpp>

#include "dump_files.hpp"

int main(int argc, char** argv) {
  using namespace kvsift;
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s DIR LAYER HEADS STRIDE DEGREE_CAP COLD_E_LIST WARM_E_LIST\n",
                 argv[0]);
    return 2;
  }
  const std::string dir = argv[1], layer = argv[2], heads = argv[3];
  const std::size_t stride = std::stoul(argv[4]), cap = std::stoul(argv[5]);
  const auto cold_e = kvsift_tools::parse_list(argv[6]), warm_e = kvsift_tools::parse_list(argv[7]);
  constexpr std::size_t neval = 1000, k = 100;
  const auto K = read_fbin(file_path(dir + "/L" + layer + "_k0.fbin"));
  // Every query head of the file trains the shared graph (GQA); HEADS are the ones evaluated.
  const auto all = kvsift_tools::read_query_heads(dir, layer);
  std::vector<const dense_matrix<float>*> Q;
  for (const char h : heads) {
    const int i = h - '0';
    if (i < 0 || i >= static_cast<int>(all.size())) {
      std::fprintf(stderr, "no query head %c in %s (%zu heads)\n", h, dir.c_str(), all.size());
      return 2;
    }
    Q.push_back(&all[static_cast<std::size_t>(i)]);
  }
  const std::size_t n = K.rows(), d = K.cols();
  if (n <= neval || stride == 0) {
    std::fprintf(stderr, "expected more than %zu keys and STRIDE >= 1\n", neval);
    return 2;
  }
  const std::size_t ntrain = n - neval;
  const std::vector<float> train = kvsift_tools::strided_queries(all, ntrain, stride);
  const matrix_view<const float> tv(train.data(), train.size() / d, d);
  const auto t0 = std::chrono::steady_clock::now();
  const auto g =
      roargraph_builder<inner_product>(roargraph_params{}).build(view_store<float>(K.view()), tv);
  std::printf("layer %s, %zu keys, %zu training queries (stride %zu), built in %.1f s, cap %zu\n",
              layer.c_str(), n, tv.rows(), stride,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), cap);
  search_workspace ws;
  std::vector<id_t> ids(k);
  std::vector<float> scores(k);
  for (std::size_t h = 0; h < Q.size(); ++h) {
    // The exact top-k of the evaluated positions, by the library's exact kNN.
    const matrix_view<const float> eval = Q[h]->view().row_range(ntrain, neval);
    const knn_result truth = cpu_knn_engine{}.search(eval, K.view(), k);
    std::vector<std::vector<id_t>> exact(neval);
    for (std::size_t e = 0; e < neval; ++e) {
      const auto row = truth.row_ids(e);
      exact[e].assign(row.begin(), row.end());
      std::sort(exact[e].begin(), exact[e].end());
    }
    for (const bool warm : {false, true}) {
      for (const std::size_t E : warm ? warm_e : cold_e) {
        const std::size_t L = warm ? std::max<std::size_t>(k, E) : E;
        double hit = 0, scored = 0;
        std::vector<id_t> prev;
        for (std::size_t e = 0; e < neval; ++e) {
          const float* q = eval.row(e);
          const beam_search_params p{k, L, cap, warm ? E : 0};
          const auto st = beam_search(g, std::span<const float>(q, d), p, ws, std::span<id_t>(ids),
                                      std::span<float>(scores), no_filter{},
                                      warm ? std::span<const id_t>(prev) : std::span<const id_t>());
          prev.assign(ids.begin(), ids.begin() + st.count);
          for (const id_t x : prev) {
            hit += std::binary_search(exact[e].begin(), exact[e].end(), x) ? 1 : 0;
          }
          scored += static_cast<double>(st.distance_computations);
        }
        std::printf("head %c %-4s E %4zu L %4zu recall@100 %.4f scored %7.0f (%.2f%%)\n", heads[h],
                    warm ? "warm" : "cold", E, L, hit / double(neval * k), scored / double(neval),
                    100.0 * scored / double(neval) / double(n));
      }
    }
  }
  return 0;
}
