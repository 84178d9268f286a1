// One graph walk per GQA group (gqa_beam_search) against one walk per query head (beam_search),
// on a real dump (bench/data/dump_qk.py layout: L<l>_k0.fbin, L<l>_q<h>.fbin): recall@100 and
// key rows read at equal pool and expand limit, and the one-thread time per group (all heads;
// the evaluation's recall bookkeeping included) (docs/algorithms.md, "One walk per GQA group").
//
// The graph: one GQA-shared RoarGraph over the layer's keys, trained on every query head's
// queries at every STRIDE-th position before the last 1000; evaluated: every 4th of the last
// 1000 positions, all query heads, against the exact top-100 by the library's exact kNN.
// Prints how many keys two heads' exact top-100 share, then, per pool L, recall@100 (mean over
// heads and positions), key rows scored per group (distinct keys; a walk per head counts each
// head's own) and expansions per group, for a walk per head and for the group's walk; then the
// group's walk at L = 100 with expand limits E.
//
//   kvsift-gqa_walk_probe DIR LAYER STRIDE L_LIST E_LIST
//   e.g. kvsift-gqa_walk_probe /data/gemma32k 11 10 100,150,200,300 30,40,50,60,80
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include <kvsift/core/metric.hpp>
#include <kvsift/core/vector_store.hpp>
#include <kvsift/index/knn.hpp>
#include <kvsift/index/roargraph_builder.hpp>
#include <kvsift/io/vector_io.hpp>
#include <kvsift/search/beam_search.hpp>
#include <kvsift/search/gqa_search.hpp>

#include "dump_files.hpp"

namespace {

double micros_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kvsift;
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s DIR LAYER STRIDE L_LIST E_LIST\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1], layer = argv[2];
  const std::size_t stride = std::stoul(argv[3]);
  const auto pools = kvsift_tools::parse_list(argv[4]), limits = kvsift_tools::parse_list(argv[5]);
  constexpr std::size_t held_out = 1000, every = 4, k = 100;
  const auto K = read_fbin(file_path(dir + "/L" + layer + "_k0.fbin"));
  const auto Q = kvsift_tools::read_query_heads(dir, layer);
  const std::size_t n = K.rows(), d = K.cols(), H = Q.size();
  if (n <= held_out || stride == 0 || H == 0) {
    std::fprintf(stderr, "expected more than %zu keys, query heads and STRIDE >= 1\n", held_out);
    return 2;
  }
  const std::size_t ntrain = n - held_out;
  const std::vector<float> train = kvsift_tools::strided_queries(Q, ntrain, stride);
  const auto g = roargraph_builder<inner_product>(roargraph_params{})
                     .build(view_store<float>(K.view()),
                            matrix_view<const float>(train.data(), train.size() / d, d));
  std::vector<std::size_t> pos;
  for (std::size_t p = ntrain; p < n; p += every) pos.push_back(p);
  // exact[h][e]: the sorted exact top-k of head h at position pos[e].
  std::vector<std::vector<std::vector<id_t>>> exact(H);
  for (std::size_t h = 0; h < H; ++h) {
    std::vector<float> ev;
    for (const std::size_t p : pos) ev.insert(ev.end(), Q[h].view().row(p), Q[h].view().row(p) + d);
    const knn_result truth =
        cpu_knn_engine{}.search(matrix_view<const float>(ev.data(), pos.size(), d), K.view(), k);
    for (std::size_t e = 0; e < pos.size(); ++e) {
      const auto row = truth.row_ids(e);
      exact[h].emplace_back(row.begin(), row.end());
      std::sort(exact[h].back().begin(), exact[h].back().end());
    }
  }
  std::printf(
      "layer %s: %zu keys x %zu, %zu query heads, %zu training queries (stride %zu), "
      "%zu positions evaluated\n",
      layer.c_str(), n, d, H, train.size() / d, stride, pos.size());
  double shared_keys = 0;  // keys two heads' exact top-k have in common, mean over pairs
  std::size_t pairs = 0;
  for (std::size_t e = 0; e < pos.size(); ++e) {
    for (std::size_t a = 0; a < H; ++a) {
      for (std::size_t b = a + 1; b < H; ++b, ++pairs) {
        std::vector<id_t> both;
        std::set_intersection(exact[a][e].begin(), exact[a][e].end(), exact[b][e].begin(),
                              exact[b][e].end(), std::back_inserter(both));
        shared_keys += double(both.size());
      }
    }
  }
  std::printf("two heads' exact top-%zu share %.1f keys on average\n", k,
              pairs > 0 ? shared_keys / double(pairs) : 0.0);
  auto hits = [&](std::span<const id_t> got, std::size_t h, std::size_t e) {
    std::size_t c = 0;
    for (const id_t x : got) c += std::binary_search(exact[h][e].begin(), exact[h][e].end(), x);
    return c;
  };
  const double per = double(pos.size()), all = double(pos.size() * H * k);
  search_workspace ws;
  std::vector<id_t> ids(k);
  std::vector<float> scores(k);
  std::vector<id_t> group_ids(H * k);
  std::vector<float> group_scores(H * k);
  std::vector<std::size_t> counts(H);
  std::vector<float> group(H * d);
  auto shared = [&](std::size_t L, std::size_t E, double& hit, double& rows, double& exp) {
    for (std::size_t e = 0; e < pos.size(); ++e) {
      for (std::size_t h = 0; h < H; ++h) {
        std::copy_n(Q[h].view().row(pos[e]), d, group.begin() + std::ptrdiff_t(h * d));
      }
      const auto st = gqa_beam_search(g, matrix_view<const float>(group.data(), H, d),
                                      beam_search_params{k, L, 0, E == L ? 0 : E}, ws,
                                      std::span<id_t>(group_ids), std::span<float>(group_scores),
                                      std::span<std::size_t>(counts));
      rows += double(st.distance_computations);
      exp += double(st.hops);
      for (std::size_t h = 0; h < H; ++h) {
        hit += double(hits(std::span<const id_t>(group_ids).subspan(h * k, counts[h]), h, e));
      }
    }
  };
  for (const std::size_t L : pools) {
    double hit_a = 0, rows_a = 0, exp_a = 0, hit_b = 0, rows_b = 0, exp_b = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t e = 0; e < pos.size(); ++e) {
      for (std::size_t h = 0; h < H; ++h) {
        const auto st = beam_search(g, std::span<const float>(Q[h].view().row(pos[e]), d), {k, L},
                                    ws, std::span<id_t>(ids), std::span<float>(scores));
        hit_a += double(hits(std::span<const id_t>(ids).first(st.count), h, e));
        rows_a += double(st.distance_computations);
        exp_a += double(st.hops);
      }
    }
    const double us_a = micros_since(t0) / per;
    const auto t1 = std::chrono::steady_clock::now();
    shared(L, L, hit_b, rows_b, exp_b);
    const double us_b = micros_since(t1) / per;
    std::printf(
        "L %4zu | a walk per head: recall@100 %.4f, rows per group %6.0f (%.2f%% of the "
        "keys per query), expansions %5.0f, %.0f us | one walk per group: recall@100 %.4f, rows "
        "%6.0f (%.2f%%), expansions %5.0f, %.0f us\n",
        L, hit_a / all, rows_a / per, 100.0 * rows_a / per / double(H * n), exp_a / per, us_a,
        hit_b / all, rows_b / per, 100.0 * rows_b / per / double(H * n), exp_b / per, us_b);
  }
  for (const std::size_t E : limits) {
    double hit = 0, rows = 0, exp = 0;
    const auto t0 = std::chrono::steady_clock::now();
    shared(std::max(k, E), E, hit, rows, exp);
    const double us = micros_since(t0) / per;
    std::printf(
        "one walk per group, L %zu, expand limit %3zu: recall@100 %.4f, rows %6.0f "
        "(%.2f%% of the keys per query), expansions %5.0f, %.0f us\n",
        std::max(k, E), E, hit / all, rows / per, 100.0 * rows / per / double(H * n), exp / per,
        us);
  }
  return 0;
}
