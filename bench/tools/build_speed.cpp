// RoarGraph CPU build speed and quality on the synthetic OOD workload of `kvsift-bench --demo`
// (ood_params defaults: spread 0.2, 256 topics, seed 42; training = n / 10 queries, the next
// `eval` queries held out), from one training kNN for every configuration of the run:
// per-phase build seconds, vectors scored, an FNV-1a hash of the adjacency (same graph or not)
// and recall@10 / recall@100 at search pools 10..300 against the exact inner-product top-k.
//   kvsift-build_speed N THREADS EVAL CONFIGS [REPEAT]
// N = `sample` takes bench/data/sample instead (keys of layer 15 KV head 0; training = the first
// 95% of positions of query heads 0-2, evaluation = the last 5%, as kvsift-bench --sample; EVAL
// ignored), read from the directory in $KVSIFT_SAMPLE_DIR or bench/data/sample.
// N = `files:KEYS:TRAIN:EVAL` reads the three matrices (.fbin or .npy; EVAL ignored).
// CONFIGS: comma-separated `cap:L:batch[:clusters[:expand[:seed]]]` (roargraph_params::
// connectivity_degree_cap, L, batch, step3_locality_clusters, connectivity_expand_fraction,
// seed; the last three default to the library's; another seed shows how much recall moves
// between graphs built alike).
// Each configuration is built REPEAT times (alternating with the others); the recall is that of
// its last build. How it was run is written in the results file that quotes it.
#include <sys/resource.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <kvsift/index/knn.hpp>
#include <kvsift/index/roargraph_builder.hpp>
#include <kvsift/io/vector_io.hpp>
#include <kvsift/search/beam_search.hpp>
#include <kvsift/testing/ood_generator.hpp>
#include <string>
#include <vector>

#include "recall.hpp"

using namespace kvsift;
using kvsift_tools::recall_at;

namespace {

// User + system CPU seconds of the process: on a shared machine wall-clock time measures the
// other tenants' load as much as the build, CPU time much less.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct config {
  std::size_t cap = 0, L = 500, batch = 8192;
  std::size_t clusters = roargraph_params{}.step3_locality_clusters;
  double expand = roargraph_params{}.connectivity_expand_fraction;
  unsigned long long seed = roargraph_params{}.seed;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s N THREADS EVAL cap:L:batch[:clusters][,...] [REPEAT]\n",
                 argv[0]);
    return 2;
  }
  const std::string what = argv[1];
  const bool sample = what == "sample", files = what.rfind("files:", 0) == 0;
  std::size_t n = std::strtoull(argv[1], nullptr, 10);
  const std::size_t threads = std::strtoull(argv[2], nullptr, 10);
  std::size_t eval = std::strtoull(argv[3], nullptr, 10);
  const int repeat = argc > 5 ? std::atoi(argv[5]) : 1;
  std::vector<config> configs;
  for (std::string s = argv[4]; !s.empty();) {
    const auto e = std::min(s.find(','), s.size());
    config c;
    std::sscanf(s.substr(0, e).c_str(), "%zu:%zu:%zu:%zu:%lf:%llu", &c.cap, &c.L, &c.batch,
                &c.clusters, &c.expand, &c.seed);
    configs.push_back(c);
    s.erase(0, std::min(e + 1, s.size()));
  }

  testing::ood_data data;
  std::size_t train = 0;
  if (files) {
    std::vector<std::string> path;
    for (std::size_t b = 6; b <= what.size();) {
      const auto e = std::min(what.find(':', b), what.size());
      path.push_back(what.substr(b, e - b));
      b = e + 1;
    }
    if (path.size() != 3) {
      std::fprintf(stderr, "expected files:KEYS:TRAIN:EVAL, got %s\n", what.c_str());
      return 2;
    }
    const auto k = read_vectors(path[0]), tr = read_vectors(path[1]), ev = read_vectors(path[2]);
    data.dim = k.cols();
    n = k.rows();
    train = tr.rows();
    eval = ev.rows();
    data.keys.assign(k.view().row(0), k.view().row(0) + n * data.dim);
    data.queries.assign(tr.view().row(0), tr.view().row(0) + train * data.dim);
    data.queries.insert(data.queries.end(), ev.view().row(0), ev.view().row(0) + eval * data.dim);
  } else if (sample) {
    const char* env = std::getenv("KVSIFT_SAMPLE_DIR");
    const std::string dir = env != nullptr ? env : "bench/data/sample";
    const auto k = read_fbin(dir + "/L15_k0.fbin");
    data.dim = k.cols();
    n = k.rows();
    data.keys.assign(k.view().row(0), k.view().row(0) + n * data.dim);
    std::vector<float> tr, ev;
    for (int h = 0; h < 3; ++h) {
      const auto q = read_fbin(dir + "/L15_q" + std::to_string(h) + ".fbin");
      const std::size_t t = q.rows() * 95 / 100;
      tr.insert(tr.end(), q.view().row(0), q.view().row(0) + t * data.dim);
      ev.insert(ev.end(), q.view().row(t), q.view().row(0) + q.rows() * data.dim);
    }
    train = tr.size() / data.dim;
    eval = ev.size() / data.dim;
    data.queries = std::move(tr);
    data.queries.insert(data.queries.end(), ev.begin(), ev.end());
  } else {
    testing::ood_params p;
    p.keys = n;
    p.dim = 128;
    train = std::max<std::size_t>(1, n / 10);
    p.queries = train + eval;
    data = testing::make_ood(p);
  }
  const auto keys = data.key_view();
  const auto train_q = data.query_view().row_range(0, train);
  const auto eval_q = data.query_view().row_range(train, eval);
  const cpu_knn_engine engine({.threads = threads});
  const knn_result exact = engine.search(eval_q, keys, 100);

  roargraph_params base;
  base.threads = threads;
  const auto t0 = std::chrono::steady_clock::now();
  const knn_result knn = roargraph_builder<>(base).training_knn(keys, train_q);
  std::printf("%s n=%zu d=%zu train=%zu eval=%zu threads=%zu knn %.2fs\n",
              files    ? "files"
              : sample ? "sample"
                       : "ood",
              n, data.dim, train, eval, threads,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  std::vector<graph_index<view_store<float>>> graphs;
  for (int r = 0; r < repeat; ++r) {
    for (std::size_t ci = 0; ci < configs.size(); ++ci) {
      const config& c = configs[ci];
      roargraph_params q = base;
      q.connectivity_degree_cap = c.cap;
      q.L = c.L;
      q.batch = c.batch;
      q.step3_locality_clusters = c.clusters;
      q.connectivity_expand_fraction = c.expand;
      q.seed = c.seed;
      roargraph_build_stats st;
      const double c0 = cpu_seconds();
      auto g = roargraph_builder<>(q).build_from_knn(view_store<float>(keys), knn, &st);
      const double cpu = cpu_seconds() - c0;
      std::uint64_t h = 1469598103934665603ull;
      for (const id_t v : g.adjacency()) h = (h ^ v) * 1099511628211ull;
      std::printf(
          "cap=%zu L=%zu batch=%zu clusters=%zu expand=%.3f seed=%llu run %d: cpu %.2fs total "
          "%.2fs proj "
          "%.2fs conn "
          "%.2fs (search "
          "%.2fs merge "
          "%.2fs repair %.2fs) dist/key %.0f prune/key %.0f graph %016llx\n",
          c.cap, c.L, c.batch, c.clusters, c.expand, c.seed, r, cpu, st.total_seconds,
          st.projection_seconds, st.connectivity_seconds, st.connectivity_search_seconds,
          st.connectivity_merge_seconds, st.repair_seconds,
          double(st.connectivity_distance_computations) / double(n),
          double(st.connectivity_prune_distance_computations) / double(n),
          static_cast<unsigned long long>(h));
      std::fflush(stdout);
      if (r + 1 == repeat) graphs.push_back(std::move(g));
    }
  }
  for (std::size_t ci = 0; ci < configs.size(); ++ci) {
    std::printf("cap=%zu L=%zu batch=%zu clusters=%zu expand=%.3f seed=%llu recall@10",
                configs[ci].cap, configs[ci].L, configs[ci].batch, configs[ci].clusters,
                configs[ci].expand, configs[ci].seed);
    for (const std::size_t L : {10, 20, 50, 100, 200, 300}) {
      std::printf(" %zu:%.4f", L, recall_at(graphs[ci], eval_q, exact, 10, L));
    }
    std::printf(" | recall@100");
    for (const std::size_t L : {100, 150, 200, 300}) {
      std::printf(" %zu:%.4f", L, recall_at(graphs[ci], eval_q, exact, 100, L));
    }
    std::printf("\n");
    std::fflush(stdout);
  }
}
