// A decode step's retrieval with and without walking through the ids its filter excludes, on a
// real dump (bench/data/dump_qk.py layout: L<l>_k0.fbin, L<l>_q<h>.fbin). A step attends its
// sinks and its recent window densely, so its search returns only ids in [SINKS, t + 1 - WINDOW)
// for the query at position t; `walk_through` decides whether a neighbour outside that range is
// walked through to its own neighbours (ACORN's 2-hop rule) or dropped.
//
// One GQA-shared RoarGraph over the layer's keys, trained on every query head at every
// STRIDE-th position below the evaluated ones; the last 1000 positions of every head are
// evaluated, each against the exact answer under the same filter (flat_index): top-100
// (recall@100) at each pool L, and DIPR at each beta (raw score units; set recall against the
// exact DIPR set), unseeded and seeded from the window (the best raw score over the sinks and
// the window, as a decode step's seed_from_window); each also entering the walk at the sinks
// (entry_prefix = SINKS) besides the graph's entry points. One search thread; the time is the wall
// clock of the whole loop over the evaluated queries, per query, the two modes alternated per
// setting.
//
//   kvsift-window_walk_probe DIR LAYER STRIDE SINKS WINDOW L_LIST BETA_LIST
//   e.g. kvsift-window_walk_probe /data/gemma32k 11 10 4 512 100,128,160,200,256 32,64
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <kvsift/core/metric.hpp>
#include <kvsift/core/parallel_for.hpp>
#include <kvsift/core/vector_store.hpp>
#include <kvsift/index/flat_index.hpp>
#include <kvsift/index/roargraph_builder.hpp>
#include <kvsift/io/vector_io.hpp>
#include <kvsift/search/beam_search.hpp>
#include <kvsift/search/dipr_search.hpp>

#include "dump_files.hpp"

namespace {

using namespace kvsift;

struct query_ref {
  const float* q;
  id_range filter;
  float window_best;  ///< the best raw score over the sinks and the window (attended anyway)
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s DIR LAYER STRIDE SINKS WINDOW L_LIST BETA_LIST\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1], layer = argv[2];
  const std::size_t stride = std::stoul(argv[3]), sinks = std::stoul(argv[4]),
                    window = std::stoul(argv[5]);
  const auto pools = kvsift_tools::parse_list(argv[6]);
  std::vector<float> betas;
  for (const std::size_t b : kvsift_tools::parse_list(argv[7])) betas.push_back(float(b));
  constexpr std::size_t neval = 1000, k = 100;
  const auto K = read_fbin(file_path(dir + "/L" + layer + "_k0.fbin"));
  const auto heads = kvsift_tools::read_query_heads(dir, layer);
  const std::size_t n = K.rows(), d = K.cols();
  if (heads.empty() || n <= neval + window + sinks || stride == 0) {
    std::fprintf(stderr, "expected query heads, more than %zu keys and STRIDE >= 1\n",
                 neval + window + sinks);
    return 2;
  }
  const std::size_t ntrain = n - neval;
  const std::vector<float> train = kvsift_tools::strided_queries(heads, ntrain, stride);
  const matrix_view<const float> tv(train.data(), train.size() / d, d);
  const auto t0 = std::chrono::steady_clock::now();
  const view_store<float> store(K.view());
  const auto g = roargraph_builder<inner_product>(roargraph_params{}).build(store, tv);
  std::printf(
      "layer %s: %zu keys x %zu, %zu query heads, %zu training queries (stride %zu), "
      "built in %.1f s; filter [%zu, t + 1 - %zu)\n",
      layer.c_str(), n, d, heads.size(), tv.rows(), stride, seconds_since(t0), sinks, window);

  // The evaluated queries: every head at the last neval positions, position t attending
  // [0, t], its window the last `window` of those tokens.
  std::vector<query_ref> qs;
  for (const auto& h : heads) {
    for (std::size_t t = ntrain; t < n; ++t) {
      const float* q = h.view().row(t);
      float best = -std::numeric_limits<float>::infinity();
      for (std::size_t j = 0; j <= t; ++j) {
        if (j < sinks || j >= t + 1 - window) {
          best = std::max(best, inner_product::score(q, K.view().row(j), d));
        }
      }
      qs.push_back({q, id_range{sinks, t + 1 - window}, best});
    }
  }
  const flat_index<view_store<float>> flat(store);
  std::vector<std::vector<id_t>> exact(qs.size());
  // Exact DIPR sets per beta, unseeded [2b] and seeded from the window [2b + 1] (as a decode
  // step with seed_from_window: the range is measured from the best of the whole context).
  std::vector<std::vector<std::vector<id_t>>> exact_dipr(2 * betas.size(),
                                                         std::vector<std::vector<id_t>>(qs.size()));
  parallel_for(qs.size(), default_thread_count(), [&](std::size_t i, std::size_t) {
    thread_local search_workspace ws;
    std::vector<id_t> ids(k);
    std::vector<float> sc(k);
    const std::span<const float> q(qs[i].q, d);
    flat.topk(q, k, ws, std::span(ids), std::span(sc), qs[i].filter);
    exact[i].assign(ids.begin(), ids.end());
    std::sort(exact[i].begin(), exact[i].end());
    dipr_result r;
    for (std::size_t b = 0; b < 2 * betas.size(); ++b) {
      const float seed = b % 2 == 1 ? qs[i].window_best : std::numeric_limits<float>::quiet_NaN();
      flat.dipr(q, {.beta = betas[b / 2], .seed_score = seed}, ws, r, qs[i].filter);
      exact_dipr[b][i] = r.ids;
      std::sort(exact_dipr[b][i].begin(), exact_dipr[b][i].end());
    }
  });

  search_workspace ws;
  std::vector<id_t> ids(k);
  std::vector<float> scores(k);
  const double m = double(qs.size());
  // Each setting with and without entering at the sinks (entry_prefix = SINKS), the two
  // walk-through modes alternated.
  for (const std::size_t L : pools) {
    for (const std::size_t prefix : {std::size_t{0}, sinks}) {
      for (const bool through : {true, false}) {
        const beam_search_params p{
            .k = k, .L = std::max(k, L), .walk_through = through, .entry_prefix = prefix};
        double hit = 0, scored = 0;
        const auto ts = std::chrono::steady_clock::now();
        for (std::size_t i = 0; i < qs.size(); ++i) {
          const auto st = beam_search(g, std::span<const float>(qs[i].q, d), p, ws, std::span(ids),
                                      std::span(scores), qs[i].filter);
          for (std::size_t j = 0; j < st.count; ++j) {
            hit += std::binary_search(exact[i].begin(), exact[i].end(), ids[j]) ? 1 : 0;
          }
          scored += double(st.distance_computations);
        }
        const double us = 1e6 * seconds_since(ts) / m;
        std::printf(
            "top-100 L %4zu sinks entered %d walk_through %d: recall@100 %.4f scored "
            "%7.0f (%.2f%%) %8.1f us\n",
            L, prefix > 0 ? 1 : 0, through ? 1 : 0, hit / (m * double(k)), scored / m,
            100.0 * scored / m / double(n), us);
      }
    }
  }
  for (std::size_t b = 0; b < 2 * betas.size(); ++b) {
    const bool seeded = b % 2 == 1;
    for (const std::size_t prefix : {std::size_t{0}, sinks}) {
      for (const bool through : {true, false}) {
        dipr_result r;
        double hit = 0, want = 0, got = 0, scored = 0;
        const auto ts = std::chrono::steady_clock::now();
        for (std::size_t i = 0; i < qs.size(); ++i) {
          const dipr_params p{
              .beta = betas[b / 2],
              .seed_score = seeded ? qs[i].window_best : std::numeric_limits<float>::quiet_NaN(),
              .walk_through = through,
              .entry_prefix = prefix};
          dipr_search(g, std::span<const float>(qs[i].q, d), p, ws, r, qs[i].filter);
          for (const id_t x : r.ids) {
            hit += std::binary_search(exact_dipr[b][i].begin(), exact_dipr[b][i].end(), x) ? 1 : 0;
          }
          want += double(exact_dipr[b][i].size());
          got += double(r.ids.size());
          scored += double(r.stats.distance_computations);
        }
        const double us = 1e6 * seconds_since(ts) / m;
        std::printf(
            "DIPR beta %5.1f %-8s sinks entered %d walk_through %d: set recall %.4f "
            "(exact set %.1f, answer %.1f) scored %7.0f (%.2f%%) %8.1f us\n",
            double(betas[b / 2]), seeded ? "seeded" : "unseeded", prefix > 0 ? 1 : 0,
            through ? 1 : 0, hit / want, want / m, got / m, scored / m,
            100.0 * scored / m / double(n), us);
      }
    }
  }
  return 0;
}
