// The GPU graph search (step 3 of the RoarGraph build) against the CPU `beam_search` and
// `rng_prune` it mirrors.
//
// As in knn_test.cu, exact comparisons use small integer-valued vectors: every score (dot or
// squared distance) is an integer below 2^24, exact in f32 whatever the summation order, and
// exactly representable in f16 and bf16. The GPU then sees the CPU's scores bit for bit and
// must return the same pools, pruned lists and build, tie rule included.

#include <sys/mman.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#pragma nv_diagnostic push
#pragma nv_diag_suppress 554
#include <kvsift/core/dense_matrix.hpp>
#include <kvsift/core/vector_store.hpp>
#include <kvsift/cuda/graph_search.cuh>
#include <kvsift/cuda/knn.cuh>
#include <kvsift/index/build_pipeline.hpp>
#include <kvsift/index/roargraph_builder.hpp>
#include <kvsift/search/beam_search.hpp>
#pragma nv_diagnostic pop

#include "../index/step2_reference.hpp"
#include "cuda_test.cuh"
#include "test_util.cuh"

namespace {

using namespace kvsift::cuda_test;
using kvsift::id_t;
using kvsift::matrix_view;

/// A random graph: each row holds a random number (0..width) of distinct ids != its own,
/// padded with invalid_id (so some walks end at once: an entry without neighbours).
std::vector<id_t> random_graph(std::size_t n, std::size_t width) {
  std::vector<id_t> adj(n * width, kvsift::invalid_id);
  for (std::size_t i = 0; i < n; ++i) {
    const auto deg = static_cast<std::size_t>(uniform_int(0, static_cast<int>(width)));
    std::vector<id_t> row;
    while (row.size() < std::min(deg, n - 1)) {
      const auto v = static_cast<id_t>(uniform_int(0, static_cast<int>(n) - 1));
      if (v != i && std::find(row.begin(), row.end(), v) == row.end()) row.push_back(v);
    }
    std::copy(row.begin(), row.end(), adj.begin() + i * width);
  }
  return adj;
}

/// The CPU view of a padded flat adjacency, for beam_search.
template <class M, class T>
struct flat_graph {
  using metric_type = M;
  matrix_view<const T> keys;
  const std::vector<id_t>* adj;
  std::size_t width;
  id_t entry;
  std::size_t size() const { return keys.rows(); }
  std::size_t dim() const { return keys.cols(); }
  id_t entry_point() const { return entry; }
  std::span<const id_t> neighbors(id_t u) const {
    const id_t* b = adj->data() + u * width;
    return {b, static_cast<std::size_t>(std::find(b, b + width, kvsift::invalid_id) - b)};
  }
  float score(const float* q, id_t i) const { return M::score(q, keys.row(i), keys.cols()); }
};
static_assert(kvsift::Graph<flat_graph<kvsift::l2, float>>);

template <class T>
using device_t = typename kvsift::cuda::detail::device_element<T>::type;

/// Runs graph_search on the device and the CPU search + pruning on the host; counts queries
/// whose pool, scores, scored count or pruned list differ.
template <class M, class T>
int compare_with_cpu(const std::vector<float>& kf, std::size_t n, std::size_t d,
                     const std::vector<id_t>& adj, std::size_t width, id_t entry, int L, int degree,
                     const std::vector<id_t>& queries, int expand_limit = 0) {
  const auto km = kvsift::convert<T>(matrix_view<const float>(kf.data(), n, d));
  const std::vector<T> keys(km.data(), km.data() + n * d);
  const matrix_view<const T> kv(keys.data(), n, d);
  const std::size_t m = queries.size();
  const auto Lz = static_cast<std::size_t>(L);
  const auto degz = static_cast<std::size_t>(degree);

  std::vector<device_t<T>> kd(n * d);
  std::memcpy(static_cast<void*>(kd.data()), keys.data(), n * d * sizeof(T));
  device_buffer<device_t<T>> dk(kd);
  device_buffer<id_t> da(adj), dq(queries), di(m * Lz), dkept(m * std::max<std::size_t>(degz, 1));
  device_buffer<float> ds(m * Lz);
  device_buffer<std::uint32_t> dc(m), dkc(m), dsc(m);
  const std::size_t wb = kvsift::cuda::graph_search_workspace_size(n, m);
  device_buffer<char> ws(wb);
  kvsift::cuda::graph_ref<device_t<T>> g{dk.get(),
                                         static_cast<std::int64_t>(n),
                                         static_cast<std::int64_t>(d),
                                         static_cast<std::int64_t>(d),
                                         da.get(),
                                         static_cast<int>(width),
                                         entry};
  kvsift::cuda::graph_search_params p;
  p.L = L;
  p.degree = degree;
  p.expand_limit = expand_limit;
  p.metric = std::is_same_v<M, kvsift::l2> ? kvsift::cuda::graph_metric::l2
                                           : kvsift::cuda::graph_metric::inner_product;
  kvsift::cuda::graph_search_outputs out{di.get(),
                                         ds.get(),
                                         dc.get(),
                                         degree > 0 ? dkept.get() : nullptr,
                                         degree > 0 ? dkc.get() : nullptr,
                                         dsc.get()};
  kvsift::cuda::graph_search(g, dq.get(), static_cast<std::int64_t>(m), p, out, ws.get(), wb,
                             nullptr);
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  const auto ids = di.download();
  const auto scores = ds.download();
  const auto counts = dc.download();
  const auto kept = dkept.download();
  const auto kept_counts = dkc.download();
  const auto scored = dsc.download();

  const flat_graph<M, T> cg{kv, &adj, width, entry};
  const kvsift::view_store<T> store(kv);
  kvsift::search_workspace cws;
  std::vector<id_t> cid(Lz), ckept;
  std::vector<float> csc(Lz), q(d), scratch;
  std::vector<kvsift::scored_id> cands;
  int bad = 0;
  for (std::size_t i = 0; i < m; ++i) {
    const id_t x = queries[i];
    kvsift::detail::widen(kv.row(x), q.data(), d);
    const auto s = kvsift::beam_search(cg, std::span<const float>(q),
                                       {Lz, Lz, 0, static_cast<std::size_t>(expand_limit)}, cws,
                                       std::span<id_t>(cid), std::span<float>(csc));
    bool same = counts[i] == s.count && scored[i] == s.distance_computations;
    for (std::size_t j = 0; j < Lz && same; ++j) {
      same = ids[i * Lz + j] == cid[j] && scores[i * Lz + j] == csc[j];
    }
    if (same && degree > 0) {
      cands.clear();
      for (std::size_t j = 0; j < s.count; ++j) {
        if (cid[j] != x) cands.push_back({kvsift::to_key<M>(csc[j]), cid[j]});
      }
      kvsift::detail::rng_prune<kvsift::view_store<T>, M>(store, cands, degz, true, scratch, ckept);
      same = kept_counts[i] == ckept.size() &&
             std::equal(ckept.begin(), ckept.end(), kept.begin() + i * degz);
    }
    if (!same) {
      if (bad == 0) {
        std::printf("  query %zu (row %u): count %u vs %zu, scored %u vs %zu, first id %u vs %u\n",
                    i, x, counts[i], s.count, scored[i], s.distance_computations, ids[i * Lz],
                    cid[0]);
      }
      ++bad;
    }
  }
  if (bad != 0) {
    std::printf("  %s %s n=%zu d=%zu width=%zu L=%d degree=%d: %d of %zu queries differ\n",
                std::is_same_v<M, kvsift::l2> ? "l2" : "ip", type_name<device_t<T>>(), n, d, width,
                L, degree, bad, m);
  }
  return bad;
}

std::vector<id_t> iota_ids(std::size_t n) {
  std::vector<id_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<id_t>(i);
  return v;
}

}  // namespace

// Random graphs of widths that are and are not multiples of 32, pools from 1 to larger than
// the reachable set, both metrics, all element types; d = 24 is not a multiple of the 8-element
// vector width of f16 loads, d = 16 is.
TEST_CASE("graph_search_matches_cpu_beam_search", "[cuda][graph_search]") {
  const std::size_t n = 1500;
  for (const std::size_t d : {std::size_t{16}, std::size_t{24}}) {
    const auto kf = integer_matrix(n, d, 3);
    for (const std::size_t width : {std::size_t{32}, std::size_t{45}, std::size_t{7}}) {
      const auto adj = random_graph(n, width);
      const auto queries = iota_ids(300);
      for (const int L : {1, 16, 100, 700}) {
        CHECK((compare_with_cpu<kvsift::l2, float>(kf, n, d, adj, width, 0, L, 0, queries)) == 0);
        CHECK((compare_with_cpu<kvsift::inner_product, float>(kf, n, d, adj, width, 3, L, 0,
                                                              queries)) == 0);
      }
      CHECK((compare_with_cpu<kvsift::l2, kvsift::half>(kf, n, d, adj, width, 0, 64, 0, queries)) ==
            0);
      CHECK((compare_with_cpu<kvsift::l2, kvsift::bfloat16>(kf, n, d, adj, width, 0, 64, 0,
                                                            queries)) == 0);
    }
  }
}

// Rows wide enough that a scoring team's lanes take several 16-byte vectors each, in more than
// one round and with some lanes one vector short (f32: 34 / 66 vectors per row, f16: 17 / 33,
// against teams of 8 lanes that load two vectors per round).
TEST_CASE("graph_search_team_scoring_of_wide_rows", "[cuda][graph_search]") {
  const std::size_t n = 1000;
  for (const std::size_t d : {std::size_t{136}, std::size_t{264}}) {
    INFO("d " << d);
    const auto kf = integer_matrix(n, d, 3);
    const auto adj = random_graph(n, 32);
    const auto queries = iota_ids(200);
    CHECK((compare_with_cpu<kvsift::l2, float>(kf, n, d, adj, 32, 0, 100, 16, queries)) == 0);
    CHECK((compare_with_cpu<kvsift::inner_product, kvsift::half>(kf, n, d, adj, 32, 3, 100, 0,
                                                                 queries)) == 0);
    CHECK((compare_with_cpu<kvsift::l2, kvsift::bfloat16>(kf, n, d, adj, 32, 0, 64, 16, queries)) ==
          0);
  }
}

// The pruned lists against rng_prune with fill, on a RoarGraph-built graph (the real use) and
// on a random one; pools of several batches of 32 candidates (the GPU prunes a batch at a time,
// one candidate per lane) and degrees below and above 32.
TEST_CASE("graph_search_pruning_matches_rng_prune", "[cuda][graph_search]") {
  const std::size_t n = 3000, d = 32;
  const auto kf = integer_matrix(n, d, 4);
  const auto qf = integer_matrix(400, d, 4);
  kvsift::roargraph_params rp;
  rp.nq = 40;
  rp.M = 16;
  rp.L = 64;
  rp.threads = 2;
  const kvsift::view_store<float> store(matrix_view<const float>(kf.data(), n, d));
  const auto built =
      kvsift::roargraph_builder<>(rp).build(store, matrix_view<const float>(qf.data(), 400, d));
  const std::vector<id_t> adj(built.adjacency().begin(), built.adjacency().end());
  const auto queries = iota_ids(n);
  CHECK((compare_with_cpu<kvsift::l2, float>(kf, n, d, adj, built.max_degree(), built.entry_point(),
                                             100, 16, queries)) == 0);
  CHECK((compare_with_cpu<kvsift::l2, kvsift::half>(kf, n, d, adj, built.max_degree(),
                                                    built.entry_point(), 200, 35, queries)) == 0);
  const auto rnd = random_graph(n, 50);
  CHECK((compare_with_cpu<kvsift::l2, float>(kf, n, d, rnd, 50, 0, 300, 64, iota_ids(500))) == 0);
  CHECK((compare_with_cpu<kvsift::inner_product, float>(kf, n, d, rnd, 50, 0, 50, 5,
                                                        iota_ids(500))) == 0);
}

// An expand limit (graph_search_params::expand_limit) stops the walk as the CPU's
// beam_search_params::expand_limit does: the same pools, scored counts and pruned lists, for
// limits of 1, below and at a warp's width, and L itself (the unlimited search).
TEST_CASE("graph_search_expand_limit_matches_cpu", "[cuda][graph_search]") {
  const std::size_t n = 3000, d = 16;
  const auto kf = integer_matrix(n, d, 3);
  const auto adj = random_graph(n, 40);
  const auto queries = iota_ids(400);
  for (const int limit : {1, 7, 32, 70, 100}) {
    INFO("expand_limit " << limit);
    CHECK((compare_with_cpu<kvsift::l2, float>(kf, n, d, adj, 40, 0, 100, 16, queries, limit)) ==
          0);
    CHECK((compare_with_cpu<kvsift::inner_product, kvsift::half>(kf, n, d, adj, 40, 3, 100, 0,
                                                                 queries, limit)) == 0);
  }
}

// A small case for the race and sync checkers (compute-sanitizer racecheck / synccheck).
TEST_CASE("graph_search_small_for_sanitizers", "[cuda][graph_search]") {
  const std::size_t n = 300, d = 16;
  const auto kf = integer_matrix(n, d, 3);
  const auto adj = random_graph(n, 40);
  CHECK((compare_with_cpu<kvsift::l2, float>(kf, n, d, adj, 40, 0, 64, 16, iota_ids(64))) == 0);
}

// More queries than concurrently running searches (8192): warps loop over queries and reuse
// their bitsets, which must be cleared between searches.
TEST_CASE("graph_search_more_queries_than_slots", "[cuda][graph_search]") {
  const std::size_t n = 2000, d = 16;
  const auto kf = integer_matrix(n, d, 3);
  const auto adj = random_graph(n, 20);
  std::vector<id_t> queries(9000);
  for (std::size_t i = 0; i < queries.size(); ++i) queries[i] = static_cast<id_t>((i * 7) % n);
  CHECK((compare_with_cpu<kvsift::l2, float>(kf, n, d, adj, 20, 0, 50, 8, queries)) == 0);
}

// The whole build with the CUDA engine (kNN and connectivity searches on the GPU) equals the
// CPU build on integer data, id for id; and on real-valued data (kvsift::testing OOD keys) the
// recall of the two graphs is the same within noise (knn_test.cu's graph test covers that).
TEST_CASE("connectivity_on_gpu_builds_the_cpu_graph", "[cuda][graph_search]") {
  const std::size_t n = 4000, d = 32;
  const auto kf = integer_matrix(n, d, 4);
  const auto qf = integer_matrix(500, d, 4);
  const kvsift::view_store<float> store(matrix_view<const float>(kf.data(), n, d));
  const matrix_view<const float> train(qf.data(), 500, d);
  for (const std::size_t batch : {std::size_t{1024}, std::size_t{300}}) {
    kvsift::roargraph_params p;
    p.nq = 50;
    p.M = 16;
    p.L = 100;
    p.threads = 2;
    p.batch = batch;
    // The default expand fraction (the GPU searcher honours the limit), and every entry.
    if (batch == 300) p.connectivity_expand_fraction = 1;
    kvsift::roargraph_build_stats st_cpu, st_gpu;
    const auto cpu = kvsift::roargraph_builder<>(p).build(store, train, &st_cpu);
    const auto gpu =
        kvsift::roargraph_builder<kvsift::inner_product, kvsift::cuda::knn_engine>(p).build(
            store, train, &st_gpu);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < cpu.adjacency().size(); ++i) {
      differ += cpu.adjacency()[i] != gpu.adjacency()[i];
    }
    if (differ != 0) std::printf("  batch %zu: %zu adjacency entries differ\n", batch, differ);
    CHECK(differ == 0);
    CHECK(cpu.entry_point() == gpu.entry_point());
    CHECK(st_cpu.connectivity_distance_computations == st_gpu.connectivity_distance_computations);
    // l2 builds use the same connectivity searches.
    const auto cpu_l2 = kvsift::roargraph_builder<kvsift::l2>(p).build(store, train);
    const auto gpu_l2 =
        kvsift::roargraph_builder<kvsift::l2, kvsift::cuda::knn_engine>(p).build(store, train);
    CHECK(std::ranges::equal(cpu_l2.adjacency(), gpu_l2.adjacency()));
  }
  // f16 keys (the integers are exact in f16): the GPU build instantiates its searcher over
  // half keys, which once failed to compile (a private type in the kernel's host stub).
  std::vector<kvsift::half> kh(kf.size());
  for (std::size_t i = 0; i < kf.size(); ++i) kh[i] = kvsift::half(kf[i]);
  const kvsift::view_store<kvsift::half> hstore(matrix_view<const kvsift::half>(kh.data(), n, d));
  kvsift::roargraph_params p;
  p.nq = 50;
  p.M = 16;
  p.L = 100;
  p.threads = 2;
  p.batch = 1024;
  const auto cpu_h = kvsift::roargraph_builder<>(p).build(hstore, train);
  const auto gpu_h =
      kvsift::roargraph_builder<kvsift::inner_product, kvsift::cuda::knn_engine>(p).build(hstore,
                                                                                          train);
  CHECK(std::ranges::equal(cpu_h.adjacency(), gpu_h.adjacency()));
}

// The merge on the device (`search_and_merge`) against `search` followed by the builder's merge
// written out on the host: append each result's edges both ways in generation order unless the
// row holds them, re-prune overflowing rows around their key. Integer keys, so every score is
// exact and the rows must agree id for id. A few zero keys are near everything (l2), so some
// rows receive more than 32 edges in one round (several chunks of a warp) and many rows hold an
// edge twice over (x -> y from x's search, y -> x from y's), the repeats the merge must skip.
TEST_CASE("connectivity_searcher_merge_matches_the_builders_merge", "[cuda][graph_search]") {
  const std::size_t n = 3000, d = 16, width = 24, degree = 12, L = 40;
  auto kf = integer_matrix(n, d, 3);
  for (std::size_t i = 0; i < 5 * d; ++i) kf[i] = 0;  // keys 0..4: hubs
  const matrix_view<const float> kv(kf.data(), n, d);
  const kvsift::view_store<float> store(kv);
  const auto adj0 = random_graph(n, width);
  const auto all = iota_ids(n);
  std::vector<id_t> order = all;
  for (std::size_t i = n; i > 1; --i) {
    std::swap(order[i - 1],
              order[static_cast<std::size_t>(uniform_int(0, static_cast<int>(i) - 1))]);
  }
  for (const bool fill : {true, false}) {
    INFO("fill " << fill);
    kvsift::cuda::connectivity_searcher<float> on_device(kv, width), reference(kv, width);
    on_device.set_rows(all, adj0);
    reference.set_rows(all, adj0);
    std::vector<std::vector<id_t>> rows(n);
    for (std::size_t i = 0; i < n; ++i) {
      const id_t* r = adj0.data() + i * width;
      rows[i].assign(r, std::find(r, r + width, kvsift::invalid_id));
    }
    std::size_t most_new = 0, repeats = 0, repruned = 0;
    std::vector<float> scratch;
    std::vector<id_t> padded;
    std::size_t b0 = 0;
    for (const std::size_t bn : {std::size_t{64}, std::size_t{700}, std::size_t{2236}}) {
      const std::span<const id_t> batch = std::span<const id_t>(order).subspan(b0, bn);
      b0 += bn;
      const std::size_t scored = on_device.search_and_merge(batch, 0, L, degree, fill);
      kvsift::connectivity_batch out;
      reference.search(batch, 0, L, degree, out);
      CHECK(scored == out.scored);
      // The builder's merge, as roargraph_builder::enhance_rounds writes it.
      std::vector<std::vector<id_t>> added(n);
      for (std::size_t i = 0; i < bn; ++i) {
        for (std::uint32_t j = 0; j < out.counts[i]; ++j) {
          const id_t y = out.kept[i * degree + j];
          added[batch[i]].push_back(y);
          added[y].push_back(batch[i]);
        }
      }
      std::vector<id_t> touched;
      for (std::size_t x = 0; x < n; ++x) {
        if (added[x].empty()) continue;
        touched.push_back(static_cast<id_t>(x));
        most_new = std::max(most_new, added[x].size());
        auto& row = rows[x];
        const std::size_t before = row.size();
        for (const id_t y : added[x]) {
          if (y == x) continue;
          const auto it = std::find(row.begin(), row.end(), y);
          if (it != row.end()) {
            repeats += static_cast<std::size_t>(it - row.begin()) >= before ? 1 : 0;
            continue;
          }
          row.push_back(y);
        }
        if (row.size() > width) {
          ++repruned;
          kvsift::detail::pair_scorer<kvsift::view_store<float>, kvsift::l2> ps(store);
          ps.set_pivot(static_cast<id_t>(x));
          std::vector<kvsift::scored_id> cands;
          for (const id_t c : row) cands.push_back({ps.key(c), c});
          std::vector<id_t> kept;
          kvsift::detail::rng_prune<kvsift::view_store<float>, kvsift::l2>(store, cands, width,
                                                                           fill, scratch, kept);
          row = kept;
        }
      }
      padded.assign(touched.size() * width, kvsift::invalid_id);
      for (std::size_t i = 0; i < touched.size(); ++i) {
        std::copy(rows[touched[i]].begin(), rows[touched[i]].end(), padded.begin() + i * width);
      }
      reference.set_rows(touched, padded);
    }
    std::vector<std::vector<id_t>> got;
    on_device.get_rows(got);
    REQUIRE(got.size() == n);
    std::size_t differ = 0;
    for (std::size_t x = 0; x < n; ++x) differ += got[x] != rows[x];
    std::printf(
        "  fill %d: %zu rows differ; most new edges of a row in a round %zu, %zu repeated "
        "new edges skipped, %zu re-prunes\n",
        fill ? 1 : 0, differ, most_new, repeats, repruned);
    CHECK(differ == 0);
    // The case exercises what it claims to.
    CHECK(most_new > 32);
    CHECK(repeats > 0);
    CHECK(repruned > 100);
  }
}

// The projection on the device (`connectivity_searcher::project`) against step 2 written out
// on the host (`project_on_host` of tests/index/step2_reference.hpp) and against the
// builder's own step 2 (a CPU build without step 3 keeps the projection's rows). Integer keys
// and queries (exact scores); few keys and many training queries, so pivots head hundreds of
// lists (candidate sets of several warps' chunks) and some keys are kept by many pivots (rows
// that overflow after the reverse edges and are pruned again).
TEST_CASE("connectivity_searcher_projection_matches_the_builders_step_2", "[cuda][graph_search]") {
  const std::size_t n = 600, d = 16, m = 3000, nq = 60, M = 12, width = 2 * M;
  const auto kf = integer_matrix(n, d, 3);
  const auto qf = integer_matrix(m, d, 4);
  const matrix_view<const float> kv(kf.data(), n, d), train(qf.data(), m, d);
  const kvsift::view_store<float> store(kv);
  const kvsift::cpu_knn_engine engine;
  const auto knn = engine.search(train, kv, nq);  // the builder's step 1 (inner product)
  kvsift_test::step2_stats seen;
  const auto expected = kvsift_test::project_on_host(kv, knn.ids, knn.k, M, &seen);

  kvsift::cuda::connectivity_searcher<float> s(kv, width);
  s.project(knn.ids, knn.k, M);
  std::vector<std::vector<id_t>> got;
  s.get_rows(got);
  REQUIRE(got.size() == n);
  std::size_t differ = 0, edges = 0;
  for (std::size_t x = 0; x < n; ++x) {
    differ += got[x] != expected[x];
    edges += expected[x].size();
  }
  std::printf(
      "  projection: %zu of %zu rows differ; %zu edges, longest candidate set %zu, %zu "
      "rows pruned again\n",
      differ, n, edges, seen.longest, seen.repruned);
  CHECK(differ == 0);
  // The case exercises what it claims to.
  CHECK(seen.longest > 64);
  CHECK(seen.repruned > 20);

  // The builder's step 2 is what project_on_host says it is: a CPU build without step 3 keeps
  // the projection's rows (padded to 2M).
  kvsift::roargraph_params p;
  p.nq = nq;
  p.M = M;
  p.threads = 2;
  p.connectivity = false;
  const auto cpu = kvsift::roargraph_builder<>(p).build(store, train);
  std::size_t differ_builder = 0;
  for (std::size_t x = 0; x < n; ++x) {
    const auto row = cpu.neighbors(static_cast<id_t>(x));
    differ_builder += !std::ranges::equal(row, expected[x]);
  }
  CHECK(differ_builder == 0);

  // f16 keys, and a width equal to the degree; rows set before are replaced.
  std::vector<kvsift::half> kh(kf.size());
  for (std::size_t i = 0; i < kf.size(); ++i) kh[i] = kvsift::half(kf[i]);
  kvsift::cuda::connectivity_searcher<kvsift::half> sh(
      matrix_view<const kvsift::half>(kh.data(), n, d), M);
  const auto all = iota_ids(n);
  sh.set_rows(all, random_graph(n, M));
  sh.project(knn.ids, knn.k, M);
  sh.get_rows(got);
  differ = 0;
  for (std::size_t x = 0; x < n; ++x) differ += got[x] != expected[x];
  CHECK(differ == 0);

  // Lists of one id (k = 1) have no candidates: every row is empty.
  std::vector<id_t> firsts(m);
  for (std::size_t q = 0; q < m; ++q) firsts[q] = knn.row_ids(q)[0];
  s.project(firsts, 1, M);
  s.get_rows(got);
  CHECK(std::ranges::all_of(got, [](const auto& r) { return r.empty(); }));
  // Padded lists: the padding contributes nothing (lists cut to 5 ids).
  std::vector<id_t> cut(knn.ids);
  for (std::size_t q = 0; q < m; ++q) {
    std::fill(cut.begin() + q * nq + 5, cut.begin() + (q + 1) * nq, kvsift::invalid_id);
  }
  s.project(cut, nq, M);
  s.get_rows(got);
  const auto expected5 = kvsift_test::project_on_host(kv, cut, nq, M);
  differ = 0;
  for (std::size_t x = 0; x < n; ++x) differ += got[x] != expected5[x];
  CHECK(differ == 0);
  // No lists at all: the rows set above are replaced by empty ones.
  REQUIRE(std::ranges::any_of(got, [](const auto& r) { return !r.empty(); }));
  s.project(std::span<const id_t>(), nq, M);
  s.get_rows(got);
  CHECK(std::ranges::all_of(got, [](const auto& r) { return r.empty(); }));
}

TEST_CASE("connectivity_searcher_projection_rejects_bad_input", "[cuda][graph_search]") {
  const std::size_t n = 50, d = 8;
  const auto kf = integer_matrix(n, d, 3);
  kvsift::cuda::connectivity_searcher<float> s(matrix_view<const float>(kf.data(), n, d), 8);
  s.set_rows(std::vector<id_t>{3},
             std::vector<id_t>{1, 2, kvsift::invalid_id, kvsift::invalid_id, kvsift::invalid_id,
                               kvsift::invalid_id, kvsift::invalid_id, kvsift::invalid_id});
  std::vector<id_t> ids{3, 1, 2, 4, 5, 6};  // two lists of 3
  CHECK(contains(message_of([&] { s.project(ids, 0, 4); }), "expected k >= 1 ids per list, got 0"));
  CHECK(contains(message_of([&] { s.project(ids, 4, 4); }), "expected m x 4 ids, got 6"));
  CHECK(contains(message_of([&] { s.project(ids, 3, 0); }), "expected 1 <= degree <= 8"));
  CHECK(contains(message_of([&] { s.project(ids, 3, 9); }), "got 9"));
  ids[4] = 50;
  CHECK_THROWS_AS(s.project(ids, 3, 4), kvsift::out_of_range);
  ids[4] = kvsift::invalid_id;
  CHECK(contains(message_of([&] { s.project(ids, 3, 4); }),
                 "list 1 has id 6 after invalid_id at position 2"));
  {
    // m x (k - 1) past INT_MAX: refused before the ids are read or anything is sized. The
    // 8.6 GB of lists are reserved address space that is never touched.
    const std::size_t k = (std::size_t{1} << 20) + 1, m = 2049, bytes = k * m * sizeof(id_t);
    void* v = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    REQUIRE(v != MAP_FAILED);
    const std::span<const id_t> many(static_cast<const id_t*>(v), k * m);
    CHECK(contains(message_of([&] { s.project(many, k, 4); }),
                   "expected m x (k - 1) and n x degree <= 2147483647, got 2049 x 1048576"));
    munmap(v, bytes);
  }
  // Nothing was changed by the refused calls.
  std::vector<std::vector<id_t>> got;
  s.get_rows(got);
  CHECK(got[3] == (std::vector<id_t>{1, 2}));
  // A valid call: lists 3 -> {1, 2} and 4 -> {5}.
  ids[4] = 5;
  ids[5] = kvsift::invalid_id;
  s.project(ids, 3, 4);
  s.get_rows(got);
  // 1 and 2 are kept or filled (degree 4), nearer first.
  const kvsift::view_store<float> store(matrix_view<const float>(kf.data(), n, d));
  kvsift::detail::pair_scorer<kvsift::view_store<float>, kvsift::l2> ps(store);
  ps.set_pivot(3);
  CHECK(got[3] == (ps.key(1) >= ps.key(2) ? std::vector<id_t>{1, 2} : std::vector<id_t>{2, 1}));
  CHECK(got[4] == (std::vector<id_t>{5}));
  CHECK(got[1] == (std::vector<id_t>{3}));
  CHECK(got[5] == (std::vector<id_t>{4}));
  CHECK(got[0].empty());
}

// Heads sharded over GPU builders (issue 20): one CUDA engine per device, each building its
// shard on its own thread, give the CPU pipeline's graphs (integer data: exact). With one GPU
// the two engines share device 0, which still runs the shards concurrently.
TEST_CASE("build_heads_sharded_over_devices_builds_the_cpu_graphs", "[cuda][graph_search]") {
  int devices = 0;
  KVSIFT_CUDA_CHECK(cudaGetDeviceCount(&devices));
  const int second = devices >= 2 ? 1 : 0;
  std::printf("  build_heads_sharded on devices {0, %d}\n", second);
  const std::size_t n = 1500, d = 32, heads = 4;
  std::vector<std::vector<float>> keys, queries;
  for (std::size_t h = 0; h < heads; ++h) {
    keys.push_back(integer_matrix(n - 100 * h, d, 4));
    queries.push_back(integer_matrix(400, d, 4));
  }
  std::vector<kvsift::kv_head_job<kvsift::view_store<float>>> jobs;
  for (std::size_t h = 0; h < heads; ++h) {
    jobs.push_back(
        {kvsift::view_store<float>(matrix_view<const float>(keys[h].data(), keys[h].size() / d, d)),
         {matrix_view<const float>(queries[h].data(), 400, d)}});
  }
  const std::span<const kvsift::kv_head_job<kvsift::view_store<float>>> js(jobs);
  kvsift::roargraph_params p;
  p.nq = 40;
  p.M = 12;
  p.L = 60;
  p.threads = 2;
  const kvsift::build_pipeline_params bp{.sample_ratio = 0.5, .seed = 11};
  const auto cpu = kvsift::build_heads(kvsift::roargraph_builder<>(p), js, bp);
  using gpu_builder = kvsift::roargraph_builder<kvsift::inner_product, kvsift::cuda::knn_engine>;
  std::vector<kvsift::roargraph_build_stats> stats;
  auto gpu = [&] {
    const std::vector<gpu_builder> builders{
        gpu_builder(p, kvsift::cuda::knn_engine({.device = 0})),
        gpu_builder(p, kvsift::cuda::knn_engine({.device = second}))};
    return kvsift::build_heads_sharded(std::span<const gpu_builder>(builders), js, bp, &stats);
  }();  // the builders (and the engines' device state) are gone here
  REQUIRE(gpu.size() == heads);
  for (std::size_t h = 0; h < heads; ++h) {
    INFO("head " << h);
    CHECK(std::ranges::equal(cpu[h].adjacency(), gpu[h].adjacency()));
    CHECK(cpu[h].entry_point() == gpu[h].entry_point());
    CHECK(stats[h].knn_seconds > 0);
  }
  // The engines' device switches are scoped, their destructors' too (engine state on device 1
  // freed on this thread once left the caller on device 1).
  int current = -1;
  KVSIFT_CUDA_CHECK(cudaGetDevice(&current));
  CHECK(current == 0);
}

TEST_CASE("graph_search_rejects_bad_input", "[cuda][graph_search]") {
  const std::size_t n = 64, d = 8, m = 4;
  device_buffer<float> dk(n * d), ds(m * 16);
  device_buffer<id_t> da(std::vector<id_t>(n * 8, kvsift::invalid_id));
  device_buffer<id_t> dq(std::vector<id_t>{0, 1, 2, 3}), di(m * 16);
  const std::size_t wb = kvsift::cuda::graph_search_workspace_size(n, m);
  device_buffer<char> ws(wb);
  const kvsift::cuda::graph_ref<float> g{
      dk.get(), std::int64_t(n), std::int64_t(d), std::int64_t(d), da.get(), 8, 0};
  auto run = [&](kvsift::cuda::graph_ref<float> gg, kvsift::cuda::graph_search_params p,
                 kvsift::cuda::graph_search_outputs o, const id_t* q, void* w, std::size_t b) {
    kvsift::cuda::graph_search(gg, q, std::int64_t(m), p, o, w, b, nullptr);
  };
  const kvsift::cuda::graph_search_outputs out{di.get(), ds.get()};
  kvsift::cuda::graph_search_params p;
  p.L = 16;
  run(g, p, out, dq.get(), ws.get(), wb);  // valid
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  auto bad = [&](auto&& f, const char* part) {
    const std::string msg = message_of(f);
    if (!contains(msg, part)) std::printf("  got \"%s\", expected \"%s\"\n", msg.c_str(), part);
    CHECK(contains(msg, part));
  };
  auto with = [&](auto change) {
    auto gg = g;
    auto pp = p;
    auto oo = out;
    const id_t* q = dq.get();
    void* w = ws.get();
    std::size_t b = wb;
    change(gg, pp, oo, q, w, b);
    return [=] { run(gg, pp, oo, q, w, b); };
  };
  bad(with([](auto&, auto& pp, auto&, auto&, auto&, auto&) { pp.L = 0; }), "1 <= L <= 1024");
  bad(with([](auto&, auto& pp, auto&, auto&, auto&, auto&) { pp.L = 1025; }), "got 1025");
  bad(with([](auto&, auto& pp, auto&, auto&, auto&, auto&) { pp.degree = 65; }), "degree <= 64");
  bad(with([](auto&, auto& pp, auto&, auto&, auto&, auto&) { pp.expand_limit = -1; }),
      "expected 0 <= expand_limit <= L = 16 (0 = L), got -1");
  bad(with([](auto&, auto& pp, auto&, auto&, auto&, auto&) { pp.expand_limit = 17; }),
      "expected 0 <= expand_limit <= L = 16 (0 = L), got 17");
  bad(with([](auto& gg, auto&, auto&, auto&, auto&, auto&) { gg.width = 0; }), "width");
  bad(with([](auto& gg, auto&, auto&, auto&, auto&, auto&) { gg.width = 257; }), "width");
  bad(with([](auto& gg, auto&, auto&, auto&, auto&, auto&) { gg.entry = 64; }),
      "expected an entry id < 64, got 64");
  bad(with([](auto& gg, auto&, auto&, auto&, auto&, auto&) { gg.n = 0; }), "non-empty");
  bad(with([](auto& gg, auto&, auto&, auto&, auto&, auto&) { gg.ld = 4; }), "row stride");
  bad(with([](auto&, auto&, auto&, auto&, auto&, auto& b) { b -= 4; }), "too small");
  bad(with([](auto&, auto&, auto& oo, auto&, auto&, auto&) { oo.kept = oo.ids; }),
      "pruning outputs need degree > 0");
  std::vector<id_t> host_q{0, 1, 2, 3};
  const id_t* hq = host_q.data();
  bad(with([&](auto&, auto&, auto&, auto& q, auto&, auto&) { q = hq; }), "host pointer");
  bad(with([](auto&, auto&, auto&, auto& q, auto&, auto&) { q = nullptr; }), "is null");
  CHECK_THROWS_AS(kvsift::cuda::graph_search_workspace_size(0, 4), kvsift::invalid_argument);
  CHECK_THROWS_AS(kvsift::cuda::graph_search_workspace_size(4, 0), kvsift::invalid_argument);
  const bool two = with_foreign_stream([&](cudaStream_t other) {
    bad(
        [&] {
          kvsift::cuda::graph_search(g, dq.get(), std::int64_t(m), p, out, ws.get(), wb, other);
        },
        "the stream belongs to device 1");
  });
  if (two) {  // device memory of device 0 used while device 1 is current
    KVSIFT_CUDA_CHECK(cudaSetDevice(1));
    bad([&] { run(g, p, out, dq.get(), ws.get(), wb); }, "lives on device 0");
    KVSIFT_CUDA_CHECK(cudaSetDevice(0));
  }
}

TEST_CASE("connectivity_searcher_rejects_bad_input", "[cuda][graph_search]") {
  const std::size_t n = 50, d = 8;
  auto kf = integer_matrix(n, d, 3);
  const matrix_view<const float> kv(kf.data(), n, d);
  using searcher = kvsift::cuda::connectivity_searcher<float>;
  CHECK_THROWS_AS(searcher(matrix_view<const float>(kf.data(), 0, d), 8), kvsift::invalid_argument);
  CHECK(contains(message_of([&] { searcher(kv, 0); }), "1 <= width <= 256, got 0"));
  kf[9] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_AS(searcher(kv, 8), kvsift::non_finite_value);
  kf[9] = 1;
  searcher s(kv, 4);
  std::vector<id_t> rows{3, 7}, padded(8, kvsift::invalid_id);
  padded[0] = 1;
  s.set_rows(rows, padded);  // valid
  CHECK(contains(message_of([&] { s.set_rows(rows, std::span<const id_t>(padded).first(7)); }),
                 "need 8 ids, got 7"));
  rows[1] = 50;
  CHECK_THROWS_AS(s.set_rows(rows, padded), kvsift::out_of_range);
  rows[1] = 7;
  padded[5] = 50;
  CHECK(contains(message_of([&] { s.set_rows(rows, padded); }), "neighbour ids < 50"));
  kvsift::connectivity_batch out;
  CHECK(contains(message_of([&] { s.search(rows, 0, 0, 4, out); }), "1 <= L <= 1024, got 0"));
  CHECK(contains(message_of([&] { s.search(rows, 0, 8, 0, out); }), "1 <= degree <= 64"));
  CHECK_THROWS_AS(s.search(rows, 50, 8, 4, out), kvsift::out_of_range);
  rows[0] = 99;
  CHECK_THROWS_AS(s.search(rows, 0, 8, 4, out), kvsift::out_of_range);
  CHECK(contains(message_of([&] { s.search_and_merge(rows, 0, 0, 4, true); }),
                 "1 <= L <= 1024, got 0"));
  CHECK_THROWS_AS(s.search_and_merge(rows, 0, 8, 4, true), kvsift::out_of_range);  // row 99
  {
    // 2 * rows * degree past INT_MAX: refused before the ids are read or anything is sized.
    const std::vector<id_t> many(std::size_t{INT_MAX} / 128 + 1, 0);
    CHECK(contains(message_of([&] { s.search_and_merge(many, 0, 8, 64, true); }),
                   "2 * rows * degree must be <= 2147483647, got 16777216 rows of degree 64"));
  }
  // A valid search over the one stored edge: row 3 searches from entry 3, reaching 1.
  rows = {3};
  s.search(rows, 3, 8, 4, out);
  CHECK((out.counts.size() == 1 && out.counts[0] == 1 && out.kept[0] == 1));
  CHECK(out.scored == 2);
  // The same through the merge: 3 -> 1 is there already, 1 -> 3 is new.
  CHECK(s.search_and_merge(rows, 3, 8, 4, true) == 2);
  CHECK(s.search_and_merge(std::span<const id_t>(), 3, 8, 4, true) == 0);
  std::vector<std::vector<id_t>> got;
  s.get_rows(got);
  REQUIRE(got.size() == n);
  CHECK(got[1] == std::vector<id_t>{3});
  CHECK(got[3] == std::vector<id_t>{1});
  CHECK(got[7].empty());
}
