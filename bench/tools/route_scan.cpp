// Keys scored for recall@100 on a real dump (bench/data/dump_qk.py layout: L<l>_k0.fbin,
// L<l>_q<h>.fbin), cold and from routed seeds (kvsift/index/route_set.hpp), for one layer:
// one GQA-shared RoarGraph over the layer's keys, trained on all query heads' queries at every
// `stride`-th prefill position (10: the evaluation's 10%); every 4th of the last 1000 positions
// of every head is searched on its own (no previous step), with
//   cold:   beam_search at pool L (and with an expand limit E alone, no seeds);
//   routed: a routing set of R rows of the training queries with their exact top-100, seeds =
//           the lists of the query's best `top` routes, pool L, expand_limit E.
// Prints recall@100 against the exact top-100 and vectors scored per query (the R routing
// vectors are a dense pass on top, printed apart). One build thread per core, one search thread.
//
// With CLUSTERS_LIST and PROBE_LIST, each routing set of R rows is also clustered
// (cluster_routes) into C clusters for every C <= R of the list, and routed with each probe P:
// only the rows of the query's best P clusters compete. Those lines end with the routing
// vectors read per query (C centroids + the probed clusters' rows, averaged; a flat set reads R).
//
//   kvsift-route_scan DIR LAYER STRIDE ROWS_LIST TOP_LIST [CLUSTERS_LIST PROBE_LIST]
//   e.g. kvsift-route_scan /data/gemma32k 11 10 256,1024,2048 4,8
//        kvsift-route_scan /data/gemma32k 11 10 2048,8192 4 64,128 2,4,8
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <kvsift/core/metric.hpp>
#include <kvsift/core/vector_store.hpp>
#include <kvsift/index/knn.hpp>
#include <kvsift/index/roargraph_builder.hpp>
#include <kvsift/index/route_set.hpp>
#include <kvsift/io/vector_io.hpp>
#include <kvsift/search/beam_search.hpp>

#include "dump_files.hpp"

int main(int argc, char** argv) {
  using namespace kvsift;
  if (argc != 6 && argc != 8) {
    std::fprintf(stderr,
                 "usage: %s DIR LAYER STRIDE ROWS_LIST TOP_LIST [CLUSTERS_LIST PROBE_LIST]\n",
                 argv[0]);
    return 2;
  }
  const std::string dir = argv[1], layer = argv[2];
  const std::size_t stride = std::stoul(argv[3]);
  const auto rows_list = kvsift_tools::parse_list(argv[4]);
  const auto top_list = kvsift_tools::parse_list(argv[5]);
  const auto clusters_list =
      argc == 8 ? kvsift_tools::parse_list(argv[6]) : std::vector<std::size_t>{};
  const auto probe_list =
      argc == 8 ? kvsift_tools::parse_list(argv[7]) : std::vector<std::size_t>{};
  constexpr std::size_t neval = 1000, k = 100;
  const auto K = read_fbin(file_path(dir + "/L" + layer + "_k0.fbin"));
  const auto all = kvsift_tools::read_query_heads(dir, layer);
  const std::size_t n = K.rows(), d = K.cols();
  if (n <= neval || stride == 0) {
    std::fprintf(stderr, "expected more than %zu keys and STRIDE >= 1\n", neval);
    return 2;
  }
  const std::size_t ntrain = n - neval;
  const std::vector<float> train = kvsift_tools::strided_queries(all, ntrain, stride);
  const matrix_view<const float> tv(train.data(), train.size() / d, d);
  roargraph_params rp;
  rp.threads = std::max(1u, std::thread::hardware_concurrency());
  const auto t0 = std::chrono::steady_clock::now();
  const auto g = roargraph_builder<inner_product>(rp).build(view_store<float>(K.view()), tv);
  std::printf("layer %s, %zu keys x %zu, %zu training queries (stride %zu), built in %.1f s\n",
              layer.c_str(), n, d, tv.rows(), stride,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::vector<float> ev;  // every 4th of the last 1000 positions, head by head
  for (const auto& h : all) {
    for (std::size_t e = 0; e < neval; e += 4) {
      const float* r = h.view().row(ntrain + e);
      ev.insert(ev.end(), r, r + d);
    }
  }
  const std::size_t ne = ev.size() / d;
  const matrix_view<const float> E(ev.data(), ne, d);
  const knn_result truth = cpu_knn_engine{}.search(E, K.view(), k);
  std::vector<std::vector<id_t>> exact(ne);
  for (std::size_t e = 0; e < ne; ++e) {
    const auto r = truth.row_ids(e);
    exact[e].assign(r.begin(), r.end());
    std::sort(exact[e].begin(), exact[e].end());
  }
  search_workspace ws;
  std::vector<id_t> ids(k);
  std::vector<float> sc(k);
  auto run = [&](const char* name, std::size_t L, std::size_t limit, const route_set* rs,
                 std::size_t top, std::size_t probe = 0) {
    double hit = 0, scored = 0, read = 0;
    std::vector<id_t> seeds(rs != nullptr ? top * rs->list_len : 0);
    for (std::size_t e = 0; e < ne; ++e) {
      const std::span<const float> q(E.row(e), d);
      if (rs != nullptr) {
        // Probed clusters can hold fewer than `top` rows: the padding (invalid_id) is skipped
        // by beam_search.
        // The routing vectors read: every row, or the centroids and the probed clusters' rows.
        const std::size_t r = route_seeds(*rs, q, top, seeds, probe);
        if (probe > 0) read += static_cast<double>(r);
      }
      const auto st = beam_search(g, q, beam_search_params{k, L, 0, limit}, ws, ids, sc,
                                  no_filter{}, std::span<const id_t>(seeds));
      for (std::size_t i = 0; i < st.count; ++i) {
        hit += std::binary_search(exact[e].begin(), exact[e].end(), ids[i]) ? 1 : 0;
      }
      scored += static_cast<double>(st.distance_computations);
    }
    std::printf("%-14s L %4zu E %4zu recall@100 %.4f scored %7.0f (%.2f%%)", name, L, limit,
                hit / double(ne * k), scored / double(ne), 100.0 * scored / double(ne) / double(n));
    if (probe > 0) std::printf(" read %6.0f", read / double(ne));
    std::printf("\n");
    std::fflush(stdout);
  };
  const std::pair<std::size_t, std::size_t> settings[] = {{100, 60},  {100, 80},  {128, 96},
                                                          {160, 120}, {200, 150}, {256, 192}};
  for (const std::size_t L : {100, 128, 160, 200, 256}) run("cold", L, 0, nullptr, 0);
  // The expand limit alone, no seeds: what the routes add to it.
  for (const auto& [L, limit] : settings) run("limit only", L, limit, nullptr, 0);
  for (const std::size_t R : rows_list) {
    const route_set rs = make_route_set(tv, K.view(), std::min(R, tv.rows()), k, cpu_knn_engine{});
    for (const std::size_t top : top_list) {
      char name[32];
      std::snprintf(name, sizeof name, "R %zu top %zu", rs.rows(), top);
      for (const auto& [L, limit] : settings) run(name, L, limit, &rs, top);
    }
    for (const std::size_t C : clusters_list) {
      if (C > rs.rows() || C == 0) continue;
      route_set cr = rs;
      const auto c0 = std::chrono::steady_clock::now();
      cluster_routes(cr, C);
      std::size_t smallest = cr.rows(), largest = 0;
      for (std::size_t c = 0; c < cr.clusters(); ++c) {
        smallest = std::min(smallest, cr.cluster_rows[c + 1] - cr.cluster_rows[c]);
        largest = std::max(largest, cr.cluster_rows[c + 1] - cr.cluster_rows[c]);
      }
      std::printf("R %zu into %zu clusters (%zu asked), rows per cluster %zu-%zu, in %.1f s\n",
                  cr.rows(), cr.clusters(), C, smallest, largest,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count());
      for (const std::size_t P : probe_list) {
        if (P == 0) continue;
        for (const std::size_t top : top_list) {
          char name[64];
          std::snprintf(name, sizeof name, "R %zu C %zu P %zu top %zu", cr.rows(), cr.clusters(), P,
                        top);
          for (const auto& [L, limit] : settings) run(name, L, limit, &cr, top, P);
        }
      }
    }
  }
  return 0;
}
