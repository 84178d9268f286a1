// Graph quality tests that fail when the algorithm is broken. Earlier tests ran at pool 100 on
// 2000-3000 keys, where the search scans a third of the keys and passes with the query-kNN
// projection deleted or RNG pruning disabled. These run on 20000 out-of-distribution keys at
// small pools (scanning ~5-10% of the keys), next to a plain key-key kNN graph that the
// query-aware construction must clearly beat, and on the committed real sample (SmolLM2).
// Mutations each test was checked against are listed in docs/algorithms.md ("Tests").

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <vector>

#include "kvsift/core/dense_matrix.hpp"
#include "kvsift/index/graph_index.hpp"
#include "kvsift/index/knn.hpp"
#include "kvsift/index/roargraph_builder.hpp"
#include "kvsift/io/vector_io.hpp"
#include "kvsift/search/beam_search.hpp"
#include "kvsift/search/dipr_search.hpp"
#include "kvsift/testing/ood_generator.hpp"

#ifdef KVSIFT_TESTS_HNSWLIB
#include "../../bench/peers/hnswlib_peer.hpp"
#endif

#include "ood_fixture.hpp"

namespace {

using kvsift::id_t;
using store_t = kvsift::view_store<float>;

using kvsift_test::exact_topk;
struct quality {
  double recall = 0;
  double scanned = 0;  ///< mean fraction of the keys scored per query
};

template <class G>
quality measure(const G& g, kvsift::matrix_view<const float> queries,
                const std::vector<std::vector<id_t>>& truth, std::size_t k, std::size_t L,
                std::span<const id_t> extra = {}) {
  kvsift::search_workspace ws;
  std::vector<id_t> ids(k);
  std::vector<float> scores(k);
  quality q;
  for (std::size_t i = 0; i < queries.rows(); ++i) {
    const auto s = kvsift::beam_search(g, std::span<const float>(queries.row(i), queries.cols()),
                                       {k, L}, ws, std::span<id_t>(ids), std::span<float>(scores),
                                       kvsift::no_filter{}, extra);
    std::size_t hit = 0;
    for (std::size_t j = 0; j < k; ++j) {
      hit += std::count(ids.begin(), ids.end(), truth[i][j]) > 0 ? 1 : 0;
    }
    q.recall += static_cast<double>(hit) / static_cast<double>(k);
    q.scanned += static_cast<double>(s.distance_computations) / static_cast<double>(g.size());
  }
  q.recall /= static_cast<double>(queries.rows());
  q.scanned /= static_cast<double>(queries.rows());
  return q;
}

using kvsift_test::ood;
using kvsift_test::ood_build_params;

const kvsift::graph_index<store_t>& ood_graph() {
  static const auto g =
      kvsift::roargraph_builder<>(ood_build_params()).build(store_t(ood().keys), ood().train);
  return g;
}

// The baseline a query-aware graph must beat: every key linked to its 2M nearest keys (l2,
// exact), entered at the same entry point. This is what an ANN index over the keys alone gives.
kvsift::graph_index<store_t> key_knn_graph(kvsift::matrix_view<const float> keys,
                                           std::size_t degree, id_t entry) {
  const std::size_t n = keys.rows(), d = keys.cols();
  // argmin |x - y|^2 = argmax (2x, -|x|^2) . (y, 1): l2 neighbours through the IP engine.
  std::vector<float> qa(n * (d + 1)), xa(n * (d + 1));
  for (std::size_t i = 0; i < n; ++i) {
    float norm = 0;
    for (std::size_t c = 0; c < d; ++c) {
      qa[i * (d + 1) + c] = keys.row(i)[c];
      xa[i * (d + 1) + c] = 2 * keys.row(i)[c];
      norm += keys.row(i)[c] * keys.row(i)[c];
    }
    qa[i * (d + 1) + d] = 1;
    xa[i * (d + 1) + d] = -norm;
  }
  const auto knn = kvsift::cpu_knn_engine({.threads = 2})
                       .search(kvsift::matrix_view<const float>(qa.data(), n, d + 1),
                               kvsift::matrix_view<const float>(xa.data(), n, d + 1), degree + 1);
  std::vector<id_t> adj(n * degree, kvsift::invalid_id);
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t deg = 0;
    for (const id_t y : knn.row_ids(i)) {
      if (y != i && y != kvsift::invalid_id && deg < degree) adj[i * degree + deg++] = y;
    }
  }
  return {store_t(keys), degree, std::move(adj), entry};
}

}  // namespace

TEST_CASE("RoarGraph beats a key-key kNN graph on OOD queries at small pools",
          "[index][roargraph][quality]") {
  const auto& o = ood();
  const auto& rg = ood_graph();
  const auto knn_graph = key_knn_graph(o.keys, rg.max_degree(), rg.entry_point());
  for (const std::size_t L : {10, 20, 40}) {
    const quality a = measure(rg, o.eval, o.truth, 10, L);
    const quality b = measure(knn_graph, o.eval, o.truth, 10, L);
    std::printf("OOD 20000 L=%zu: roargraph recall@10 %.3f scanned %.3f; key-kNN %.3f / %.3f\n", L,
                a.recall, a.scanned, b.recall, b.scanned);
    INFO("L = " << L << ": roargraph " << a.recall << " at " << a.scanned << " scanned, key-kNN "
                << b.recall << " at " << b.scanned);
    CHECK(a.recall >= b.recall + 0.2);
    CHECK(a.scanned <= 0.15);
  }
  CHECK(measure(rg, o.eval, o.truth, 10, 20).recall >= 0.72);
  CHECK(measure(rg, o.eval, o.truth, 10, 40).recall >= 0.84);
}

TEST_CASE("RoarGraph beats a key-driven graph: the query projection matters",
          "[index][roargraph][quality]") {
  // Same builder, same keys, but "training queries" drawn from the keys themselves: the
  // projection then links keys that keys consider close, which is all a key-only index knows.
  // Deleting the query-kNN projection from the builder turns the real graph into this one.
  const auto& o = ood();
  const auto& rg = ood_graph();
  const auto key_driven = kvsift::roargraph_builder<>(ood_build_params())
                              .build(store_t(o.keys), o.keys.row_range(0, 2000));
  for (const std::size_t L : {10, 20}) {
    const quality a = measure(rg, o.eval, o.truth, 10, L);
    const quality b = measure(key_driven, o.eval, o.truth, 10, L);
    std::printf(
        "OOD 20000 L=%zu: query-driven recall@10 %.3f scanned %.3f; key-driven %.3f / %.3f\n", L,
        a.recall, a.scanned, b.recall, b.scanned);
    INFO("L = " << L << ": query-driven " << a.recall << ", key-driven " << b.recall);
    CHECK(a.recall >= b.recall + 0.1);
  }
}

#ifdef KVSIFT_SOURCE_DIR
namespace {

// The committed real sample: SmolLM2-135M layer 15, KV head 0 and the 3 query heads of its GQA
// group; positions [0, 2918) train, [2918, 3072) evaluate (bench/data/sample/manifest.json).
struct sample_fixture {
  kvsift::dense_matrix<float> keys, train, eval;
  std::vector<std::vector<id_t>> truth;
};

const sample_fixture& sample() {
  static const sample_fixture f = [] {
    const std::filesystem::path dir =
        std::filesystem::path(KVSIFT_SOURCE_DIR) / "bench/data/sample";
    sample_fixture s;
    s.keys = kvsift::read_vectors(dir / "L15_k0.fbin");
    const std::size_t d = s.keys.cols(), split = 2918;
    std::vector<float> train, eval;
    for (int h = 0; h < 3; ++h) {
      const auto q = kvsift::read_vectors(dir / ("L15_q" + std::to_string(h) + ".fbin"));
      REQUIRE(q.rows() == 3072);
      for (std::size_t i = 0; i < q.rows(); ++i) {
        auto& to = i < split ? train : eval;
        to.insert(to.end(), q.view().row(i), q.view().row(i) + d);
      }
    }
    s.train =
        kvsift::convert<float>(kvsift::matrix_view<const float>(train.data(), train.size() / d, d));
    s.eval =
        kvsift::convert<float>(kvsift::matrix_view<const float>(eval.data(), eval.size() / d, d));
    s.truth = exact_topk(s.keys.view(), s.eval.view(), 10);
    return s;
  }();
  return f;
}

const kvsift::graph_index<store_t>& sample_graph() {
  static const auto g = [] {
    kvsift::roargraph_params p;  // the defaults a user gets
    p.threads = 2;
    return kvsift::roargraph_builder<>(p).build(store_t(sample().keys.view()),
                                                sample().train.view());
  }();
  return g;
}

}  // namespace

TEST_CASE("RoarGraph on the real sample: recall@10 >= 0.97 scanning <= 15% of the keys",
          "[index][roargraph][quality][real]") {
  // The project's recall bar is 0.9; the build's second entry point (the attention sink, the best
  // key of most training queries) is what lifts pool 10 from 0.91 to 0.99, so it is guarded.
  const auto& s = sample();
  const auto& g = sample_graph();
  REQUIRE(g.entry_points().size() == 2);
  CHECK(g.entry_points()[1] == 0);  // key 0, the sink
  const quality q = measure(g, s.eval.view(), s.truth, 10, 10);
  std::printf("sample L=10: recall@10 %.3f scanned %.3f\n", q.recall, q.scanned);
  CHECK(q.recall >= 0.97);
  CHECK(q.scanned <= 0.15);
}

TEST_CASE("extra entries at the static window reach the attention sink",
          "[index][roargraph][quality][real]") {
  // Key 0 (the attention sink) is the true top-1 of most evaluation queries but lies far
  // (Euclidean) from every other key, so few edges lead to it. From the centroid entry alone
  // the walk misses it; an engine keeps the first and last tokens anyway, and seeding the walk
  // there must find it at the smallest pool.
  const auto& s = sample();
  const auto& g = sample_graph();
  const std::size_t n = s.keys.rows();
  const kvsift::graph_index<store_t> centroid_only(
      g.store(), g.max_degree(), std::vector<id_t>(g.adjacency().begin(), g.adjacency().end()),
      g.entry_point());
  const std::vector<id_t> window = {0,
                                    1,
                                    2,
                                    3,
                                    static_cast<id_t>(n - 4),
                                    static_cast<id_t>(n - 3),
                                    static_cast<id_t>(n - 2),
                                    static_cast<id_t>(n - 1)};
  const quality plain = measure(centroid_only, s.eval.view(), s.truth, 10, 10);
  const quality seeded = measure(centroid_only, s.eval.view(), s.truth, 10, 10, window);
  std::printf(
      "sample L=10, centroid entry only: recall@10 %.3f without, %.3f with window "
      "entries (scanned %.3f)\n",
      plain.recall, seeded.recall, seeded.scanned);
  CHECK(seeded.recall >= 0.98);
  CHECK(seeded.recall >= plain.recall + 0.03);
  CHECK(seeded.scanned <= 0.15);
}

#ifdef KVSIFT_TESTS_HNSWLIB
TEST_CASE("RoarGraph beats hnswlib on the real sample at equal keys scanned",
          "[index][roargraph][quality][real][peers]") {
  // hnswlib (M 16, ef_construction 200, built on one thread so the graph is reproducible)
  // over the same keys; for each ef, RoarGraph at the pool that scans no more keys must
  // recall clearly more. Smaller ef scan fewer keys (3-8%) than RoarGraph's smallest pool
  // (L = k = 10, 8%) at recalls of 0.69-0.88, so they have no equal-scanned counterpart.
  const auto& s = sample();
  kvsift_bench::hnsw_peer hnsw(s.keys.view(), 16, 200, 1);
  std::vector<id_t> ids(10);
  std::vector<float> scores(10);
  for (const std::size_t ef : {120, 240, 480}) {
    quality h;
    for (std::size_t i = 0; i < s.eval.rows(); ++i) {
      const auto st = hnsw.search(std::span<const float>(s.eval.view().row(i), s.eval.cols()), ef,
                                  std::span<id_t>(ids), std::span<float>(scores));
      std::size_t hit = 0;
      for (std::size_t j = 0; j < 10; ++j) {
        hit += std::count(ids.begin(), ids.end(), s.truth[i][j]) > 0 ? 1 : 0;
      }
      h.recall += hit / 10.0;
      h.scanned += static_cast<double>(st.distance_computations) / s.keys.rows();
    }
    h.recall /= s.eval.rows();
    h.scanned /= s.eval.rows();
    // The largest RoarGraph pool whose scanned fraction does not exceed hnswlib's.
    quality best;
    for (const std::size_t L : {10, 15, 20, 30, 40, 60, 80, 100}) {
      const quality r = measure(sample_graph(), s.eval.view(), s.truth, 10, L);
      if (r.scanned <= h.scanned) best = r;
    }
    std::printf("sample ef=%zu: hnswlib recall@10 %.3f scanned %.3f; RoarGraph %.3f at %.3f\n", ef,
                h.recall, h.scanned, best.recall, best.scanned);
    INFO("ef " << ef << ": hnswlib " << h.recall << " at " << h.scanned << ", RoarGraph "
               << best.recall << " at " << best.scanned);
    REQUIRE(best.scanned > 0);  // some RoarGraph pool scans no more than hnswlib
    CHECK(best.recall >= h.recall + 0.05);
  }
}
#endif  // KVSIFT_TESTS_HNSWLIB

#endif  // KVSIFT_SOURCE_DIR

TEST_CASE("DIPR's exploration beam finds the range answer at a small capacity",
          "[search][dipr][quality]") {
  // Without the beam (range-only expansion) DIPR stops once nothing near is within beta of the
  // best so far: at a narrow range (a few keys) it finds 0.30 of the exact answer instead of
  // 0.80 (measured with the beam reduced to the entry point). Wide ranges hide the beam: at
  // beta = 1 (46 keys in range) both find 0.77, so the test uses a narrow one.
  const auto& o = ood();
  const auto& rg = ood_graph();
  kvsift::search_workspace ws;
  kvsift::dipr_result r;
  double found = 0, want = 0, scanned = 0;
  for (std::size_t i = 0; i < o.eval.rows(); ++i) {
    const std::span<const float> q(o.eval.row(i), o.eval.cols());
    // Exact DIPR answer: every key within beta of the best.
    std::vector<float> s(o.keys.rows());
    float best = -std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < o.keys.rows(); ++j) {
      s[j] = kvsift::inner_product::score(q.data(), o.keys.row(j), o.keys.cols());
      best = std::max(best, s[j]);
    }
    const float beta = 0.25f;
    kvsift::dipr_search(rg, q, {.beta = beta, .l0 = 20}, ws, r);
    for (std::size_t j = 0; j < o.keys.rows(); ++j) {
      if (s[j] >= best - beta) {
        want += 1;
        found += std::count(r.ids.begin(), r.ids.end(), static_cast<id_t>(j)) > 0 ? 1 : 0;
      }
    }
    scanned += static_cast<double>(r.stats.distance_computations) / o.keys.rows();
  }
  const double recall = found / want;
  std::printf("DIPR l0=20 beta=0.25: recall %.3f of %.1f keys per query, scanned %.3f\n", recall,
              want / o.eval.rows(), scanned / o.eval.rows());
  CHECK(recall >= 0.7);
  CHECK(scanned / o.eval.rows() <= 0.15);
}
