// route_seeds against the library's CPU routing (kvsift::route_seeds over each graph's set): every
// query's best routing rows by inner product (ties to the lower row), their lists concatenated;
// with probe, among the rows of its best clusters only. Integer data makes every score exact in
// f32 whatever the summation order, and integer vectors have many tied scores, which exercises
// the tie rules.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#pragma nv_diagnostic push
#pragma nv_diag_suppress 554
#include <kvsift/cuda/route_seeds.cuh>
#pragma nv_diagnostic pop
#include <kvsift/index/route_set.hpp>

#include "cuda_test.cuh"
#include "test_util.cuh"

namespace {

using namespace kvsift::cuda_test;
using kvsift::id_t;
namespace kc = kvsift::cuda;

/// Routing rows of several graphs (rows[g] each) and queries over them, on the host.
struct route_case {
  int d = 0, ld = 0, list_len = 0;
  std::vector<int> rows;             // per graph
  std::vector<std::int64_t> offset;  // [G + 1]
  std::vector<float> vectors;        // [total][ld], padding 1e30 (a stray read shows)
  std::vector<id_t> lists;           // [total][list_len]
  std::vector<float> q;              // [m][d]
  std::vector<std::int32_t> graph;   // [m]
  // Clusters (empty: none): graph g's are [cluster_offset[g], cluster_offset[g + 1]); cluster k
  // holds the global rows [cluster_rows[k], cluster_rows[k + 1]).
  std::vector<std::int64_t> cluster_offset;  // [G + 1]
  std::vector<std::int64_t> cluster_rows;    // [clusters + 1]
  std::vector<float> centroids;              // [clusters][ld], padding 1e30
  int max_clusters = 0, max_cluster_rows = 0;
};

/// Cuts every graph's rows into clusters of random sizes (at most `most` per graph, at least
/// one row each) with integer centroids.
void add_clusters(route_case& c, int most) {
  c.cluster_offset = {0};
  c.cluster_rows = {0};
  c.max_clusters = 0;
  for (std::size_t g = 0; g < c.rows.size(); ++g) {
    const int n = c.rows[g];
    const int k = std::min(n, uniform_int(1, most));
    // k - 1 distinct cut points in [1, n).
    std::vector<int> cuts(std::size_t(n > 0 ? n - 1 : 0));
    for (std::size_t i = 0; i < cuts.size(); ++i) cuts[i] = int(i) + 1;
    for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
      std::swap(cuts[i], cuts[std::size_t(uniform_int(int(i), int(cuts.size()) - 1))]);
    }
    cuts.resize(std::size_t(std::max(0, k - 1)));
    std::sort(cuts.begin(), cuts.end());
    for (const int x : cuts) c.cluster_rows.push_back(c.offset[g] + x);
    c.cluster_rows.push_back(c.offset[g + 1]);
    const int made = n > 0 ? k : 0;
    c.cluster_offset.push_back(c.cluster_offset.back() + made);
    c.max_clusters = std::max(c.max_clusters, made);
  }
  for (std::size_t k = 0; k + 1 < c.cluster_rows.size(); ++k) {
    c.max_cluster_rows =
        std::max(c.max_cluster_rows, int(c.cluster_rows[k + 1] - c.cluster_rows[k]));
  }
  if (c.cluster_offset.back() == 0) c.cluster_rows = {0};
  const auto total = static_cast<std::size_t>(c.cluster_offset.back());
  const std::vector<float> v = integer_matrix(total, std::size_t(c.d), 2);
  c.centroids.assign(std::max<std::size_t>(1, total) * std::size_t(c.ld), 1e30f);
  for (std::size_t r = 0; r < total; ++r) {
    std::copy_n(v.begin() + std::ptrdiff_t(r * c.d), c.d,
                c.centroids.begin() + std::ptrdiff_t(r * c.ld));
  }
}

/// Queries come in runs of `group` over one graph (a GQA group), the last run possibly short.
route_case make_case(const std::vector<int>& rows, int d, int ld, int list_len, int m, int group) {
  route_case c;
  c.d = d;
  c.ld = ld;
  c.list_len = list_len;
  c.rows = rows;
  c.offset.push_back(0);
  for (const int r : rows) c.offset.push_back(c.offset.back() + r);
  const auto total = static_cast<std::size_t>(c.offset.back());
  const std::vector<float> v = integer_matrix(total, std::size_t(d), 2);
  c.vectors.assign(total * std::size_t(ld), 1e30f);
  for (std::size_t r = 0; r < total; ++r) {
    std::copy_n(v.begin() + std::ptrdiff_t(r * d), d, c.vectors.begin() + std::ptrdiff_t(r * ld));
  }
  for (std::size_t r = 0; r < total; ++r) {
    for (int j = 0; j < list_len; ++j) {
      c.lists.push_back(uniform_int(0, 7) == 0 ? kvsift::invalid_id
                                               : id_t(uniform_int(0, 1 << 20)));
    }
  }
  c.q = integer_matrix(std::size_t(m), std::size_t(d), 2);
  for (int i = 0; i < m; i += group) {
    const int g = uniform_int(0, int(rows.size()) - 1);
    for (int j = i; j < std::min(m, i + group); ++j) c.graph.push_back(g);
  }
  return c;
}

/// Graph g's routing set as the CPU library holds it (with its clusters, when the case has them).
kvsift::route_set set_of(const route_case& c, std::size_t g) {
  kvsift::route_set rs;
  rs.dim = std::size_t(c.d);
  rs.list_len = std::size_t(c.list_len);
  const auto r0 = std::size_t(c.offset[g]), n = std::size_t(c.rows[g]);
  for (std::size_t r = r0; r < r0 + n; ++r) {
    rs.vectors.insert(rs.vectors.end(), c.vectors.begin() + std::ptrdiff_t(r * c.ld),
                      c.vectors.begin() + std::ptrdiff_t(r * c.ld + c.d));
  }
  rs.lists.assign(c.lists.begin() + std::ptrdiff_t(r0 * c.list_len),
                  c.lists.begin() + std::ptrdiff_t((r0 + n) * c.list_len));
  if (!c.cluster_offset.empty()) {
    for (auto k = std::size_t(c.cluster_offset[g]); k < std::size_t(c.cluster_offset[g + 1]); ++k) {
      rs.centroids.insert(rs.centroids.end(), c.centroids.begin() + std::ptrdiff_t(k * c.ld),
                          c.centroids.begin() + std::ptrdiff_t(k * c.ld + c.d));
      rs.cluster_rows.push_back(std::size_t(c.cluster_rows[k]) - r0);
    }
    rs.cluster_rows.push_back(n);
  }
  return rs;
}

/// The CPU model: kvsift::route_seeds per query; seeds [m][top * list_len].
std::vector<id_t> cpu_route(const route_case& c, int top, int probe = 0) {
  const std::size_t m = c.graph.size(), sld = std::size_t(top) * c.list_len;
  std::vector<kvsift::route_set> sets;
  for (std::size_t g = 0; g < c.rows.size(); ++g) sets.push_back(set_of(c, g));
  std::vector<id_t> out(m * sld, kvsift::invalid_id);
  for (std::size_t i = 0; i < m; ++i) {
    const kvsift::route_set& rs = sets[std::size_t(c.graph[i])];
    if (rs.rows() == 0 || (probe > 0 && rs.clusters() == 0)) continue;
    kvsift::route_seeds(rs, std::span<const float>(c.q.data() + i * c.d, std::size_t(c.d)),
                        std::size_t(top), std::span<id_t>(out.data() + i * sld, sld),
                        std::size_t(probe));
  }
  return out;
}

struct gpu_case {
  device_buffer<float> q;
  device_buffer<std::int32_t> graph;
  device_buffer<id_t> lists;
  device_buffer<std::int64_t> offset;
  explicit gpu_case(const route_case& c)
      : q(c.q), graph(c.graph), lists(c.lists), offset(c.offset) {}
};

/// f as T (at least one element: a device buffer is never empty).
template <class T>
std::vector<T> converted(const std::vector<float>& f) {
  std::vector<T> v(std::max<std::size_t>(f.size(), 1));
  for (std::size_t i = 0; i < f.size(); ++i) v[i] = from_float<T>(f[i]);
  return v;
}

/// Launches route_seeds for the m queries of `qs` with list_len ids a list and waits; the seeds
/// and the status word.
template <class T>
std::pair<std::vector<id_t>, std::uint32_t> launch_route(const kc::route_set_ref<T>& rs,
                                                         const kc::decode_queries& qs,
                                                         std::size_t m, int top, int group,
                                                         int probe) {
  kc::route_params p;
  p.top = top;
  p.group = group;
  p.probe = probe;
  device_buffer<id_t> seeds(m * std::size_t(kc::route_seeds_ld(rs.list_len, p)));
  device_buffer<std::uint32_t> status(std::vector<std::uint32_t>{0u});
  kc::route_seeds(rs, qs, std::int64_t(m), p, seeds.get(), status.get(), nullptr);
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  return {seeds.download(), status.download()[0]};
}

/// route_seeds on the GPU with vectors stored as T; the seeds and the status word.
template <class T>
std::pair<std::vector<id_t>, std::uint32_t> gpu_route(const route_case& c, int top, int group,
                                                      int max_rows = 0, int probe = 0) {
  gpu_case dc(c);
  device_buffer<T> dv(converted<T>(c.vectors));
  const bool clustered = !c.cluster_offset.empty();
  device_buffer<T> dcent(converted<T>(clustered ? c.centroids : std::vector<float>{}));
  device_buffer<std::int64_t> dcoff(clustered ? c.cluster_offset : std::vector<std::int64_t>(1));
  device_buffer<std::int64_t> dcrows(clustered ? c.cluster_rows : std::vector<std::int64_t>(1));
  const int most = *std::max_element(c.rows.begin(), c.rows.end());
  const kc::route_set_ref<T> rs{dv.get(),
                                std::int64_t(c.ld),
                                c.d,
                                dc.lists.get(),
                                c.list_len,
                                dc.offset.get(),
                                int(c.rows.size()),
                                max_rows > 0 ? max_rows : std::max(1, most),
                                clustered ? dcent.get() : nullptr,
                                clustered ? dcoff.get() : nullptr,
                                clustered ? dcrows.get() : nullptr,
                                c.max_clusters,
                                c.max_cluster_rows};
  const kc::decode_queries qs{dc.q.get(), std::int64_t(c.d), dc.graph.get()};
  return launch_route(rs, qs, c.graph.size(), top, group, probe);
}

}  // namespace

TEST_CASE("route_seeds_matches_cpu", "[cuda][route_seeds]") {
  // Graphs with fewer rows than `top` (missing routes are invalid_id), one row, several
  // hundred; vectors in f32 / f16 / bf16 (16-byte loads), an odd dimension with a padded
  // stride (scalar loads); one query per block and GQA groups with a short last block.
  struct shape {
    std::vector<int> rows;
    int d, ld, list_len, m, group, top;
  };
  const shape shapes[] = {
      {{300, 1, 3, 700}, 32, 32, 7, 203, 4, 4}, {{300, 1, 3, 700}, 32, 40, 100, 64, 1, 8},
      {{50, 900}, 24, 24, 1, 77, 8, 16},        {{64, 17, 200}, 13, 16, 33, 90, 3, 5},
      {{1024}, 128, 128, 100, 33, 4, 2},
  };
  for (const shape& sh : shapes) {
    const route_case c = make_case(sh.rows, sh.d, sh.ld, sh.list_len, sh.m, sh.group);
    const std::vector<id_t> want = cpu_route(c, sh.top);
    INFO("d " << sh.d << ", ld " << sh.ld << ", list " << sh.list_len << ", group " << sh.group
              << ", top " << sh.top);
    const auto [f32, s32] = gpu_route<float>(c, sh.top, sh.group);
    CHECK(f32 == want);
    CHECK(s32 == 0u);
    const auto [f16, s16] = gpu_route<__half>(c, sh.top, sh.group);
    CHECK(f16 == want);
    const auto [b16, sb] = gpu_route<__nv_bfloat16>(c, sh.top, sh.group);
    CHECK(b16 == want);
  }
}

TEST_CASE("route_seeds_ties_and_non_finite_queries", "[cuda][route_seeds]") {
  // Every routing row alike: the first `top` rows win, in row order. A query holding NaN or
  // Inf gets no seeds; its group's other queries are routed as usual.
  route_case c = make_case({40}, 16, 16, 3, 8, 4);
  for (std::size_t r = 0; r < 40; ++r)
    std::fill_n(c.vectors.begin() + std::ptrdiff_t(r * 16), 16, 1.0f);
  c.q[1 * 16 + 5] = std::numeric_limits<float>::quiet_NaN();
  c.q[6 * 16 + 0] = std::numeric_limits<float>::infinity();
  const std::vector<id_t> want = cpu_route(c, 3);
  const auto [got, status] = gpu_route<float>(c, 3, 4);
  CHECK(got == want);
  CHECK(status == 0u);
  for (int j = 0; j < 9; ++j) CHECK(got[1 * 9 + j] == kvsift::invalid_id);
  const auto [row0, st0] = gpu_route<float>(c, 3, 1);
  for (int t = 0; t < 3; ++t) {
    for (int j = 0; j < 3; ++j)
      CHECK(row0[std::size_t(t) * 3 + j] == c.lists[std::size_t(t) * 3 + j]);
  }
}

TEST_CASE("route_seeds_device_errors", "[cuda][route_seeds]") {
  // A block's queries over two graphs, a graph id out of range, a graph with more rows than
  // max_rows: the status bit, and those blocks' rows all invalid_id; other blocks are routed.
  route_case c = make_case({30, 30}, 16, 16, 4, 12, 4);
  c.graph = {0, 0, 0, 0, 1, 0, 1, 1, 1, 1, 1, 1};  // block 1 mixes graphs
  {
    const auto [got, status] = gpu_route<float>(c, 2, 4);
    CHECK(status == kc::decode_status_bad_graph);
    const std::vector<id_t> want = cpu_route(c, 2);
    for (std::size_t i = 0; i < 12; ++i) {
      for (std::size_t j = 0; j < 8; ++j) {
        const id_t w = i >= 4 && i < 8 ? kvsift::invalid_id : want[i * 8 + j];
        CHECK(got[i * 8 + j] == w);
      }
    }
  }
  c.graph = {0, 0, 0, 0, 1, 1, 1, 1, 7, 7, 7, 7};
  {
    const auto [got, status] = gpu_route<float>(c, 2, 4);
    CHECK(status == kc::decode_status_bad_graph);
    for (std::size_t j = 64; j < 96; ++j) CHECK(got[j] == kvsift::invalid_id);
  }
  c.graph = {0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0};
  {
    const auto [got, status] = gpu_route<float>(c, 2, 4, 29);
    CHECK(status == kc::decode_status_bad_graph);
    CHECK(std::all_of(got.begin(), got.end(), [](id_t x) { return x == kvsift::invalid_id; }));
  }
}

TEST_CASE("route_seeds_probed_clusters_match_cpu", "[cuda][route_seeds]") {
  // Random cluster cuts (one-row clusters, a graph of one cluster, graphs with fewer clusters than
  // probe); probe 1, 2, 5 and at least every cluster (which must equal the flat routing); GQA
  // groups whose queries probe different clusters (the rows of every probed cluster are scored
  // for the whole group, each query ranks its own); f32 / f16 / bf16 and an odd dimension.
  struct shape {
    std::vector<int> rows;
    int d, ld, list_len, m, group, top, most_clusters;
  };
  const shape shapes[] = {
      {{300, 1, 3, 700}, 32, 32, 7, 203, 4, 4, 40}, {{50, 900}, 24, 24, 1, 77, 8, 16, 64},
      {{64, 17, 200}, 13, 16, 33, 90, 3, 5, 9},     {{120, 500}, 16, 16, 5, 64, 4, 3, 16},
      {{2048}, 128, 128, 100, 33, 4, 4, 64},
  };
  for (const shape& sh : shapes) {
    route_case c = make_case(sh.rows, sh.d, sh.ld, sh.list_len, sh.m, sh.group);
    add_clusters(c, sh.most_clusters);
    // The last probe covers every cluster where max_route_probe allows it.
    const int all = std::min(c.max_clusters, kc::max_route_probe);
    for (const int probe : {1, 2, 5, all}) {
      const std::vector<id_t> want = cpu_route(c, sh.top, probe);
      INFO("d " << sh.d << ", group " << sh.group << ", top " << sh.top << ", probe " << probe
                << ", max clusters " << c.max_clusters);
      const auto [f32, s32] = gpu_route<float>(c, sh.top, sh.group, 0, probe);
      CHECK(f32 == want);
      CHECK(s32 == 0u);
      const auto [f16, s16] = gpu_route<__half>(c, sh.top, sh.group, 0, probe);
      CHECK(f16 == want);
      const auto [b16, sb] = gpu_route<__nv_bfloat16>(c, sh.top, sh.group, 0, probe);
      CHECK(b16 == want);
      if (probe == c.max_clusters) CHECK(want == cpu_route(c, sh.top));
      // Smaller score buffers (max_cluster_rows given) and max_rows-sized ones route alike.
      route_case loose = c;
      loose.max_cluster_rows = 0;
      CHECK(gpu_route<float>(loose, sh.top, sh.group, 0, probe).first == want);
    }
    // Probing must matter: with one cluster probed some query's routes differ from the flat
    // scan's (a kernel that ignored probe would pass the comparisons above only by luck).
    if (c.max_clusters > 4) CHECK(cpu_route(c, sh.top, 1) != cpu_route(c, sh.top));
  }
}

/// route_seeds on the GPU over a kvsift::stack_route_sets layout (vectors as T), the handle
/// filled from the stack's fields alone; the seeds and the status word.
template <class T>
std::pair<std::vector<id_t>, std::uint32_t> gpu_route_stack(const kvsift::route_set_stack& st,
                                                            const route_case& c, int top, int group,
                                                            int probe) {
  device_buffer<T> dv(converted<T>(st.vectors)), dcent(converted<T>(st.centroids));
  device_buffer<id_t> dl(st.lists);
  device_buffer<std::int64_t> doff(st.offset);
  device_buffer<std::int64_t> dcoff(st.clustered() ? st.cluster_offset
                                                   : std::vector<std::int64_t>(1));
  device_buffer<std::int64_t> dcrows(st.clustered() ? st.cluster_rows
                                                    : std::vector<std::int64_t>(1));
  device_buffer<float> dq(c.q);
  device_buffer<std::int32_t> dg(c.graph);
  const kc::route_set_ref<T> rs{dv.get(),
                                std::int64_t(st.dim),
                                int(st.dim),
                                dl.get(),
                                int(st.list_len),
                                doff.get(),
                                int(st.graphs()),
                                int(st.max_rows),
                                st.clustered() ? dcent.get() : nullptr,
                                st.clustered() ? dcoff.get() : nullptr,
                                st.clustered() ? dcrows.get() : nullptr,
                                int(st.max_clusters),
                                int(st.max_cluster_rows)};
  const kc::decode_queries qs{dq.get(), std::int64_t(st.dim), dg.get()};
  return launch_route(rs, qs, c.graph.size(), top, group, probe);
}

TEST_CASE("route_seeds_from_stack_route_sets_matches_cpu", "[cuda][route_seeds]") {
  // The library's host-side stacking is the layout the kernel reads: per-graph CPU sets (some
  // with shorter lists, one with no rows, one named twice) stacked by kvsift::stack_route_sets
  // and routed on the GPU equal kvsift::route_seeds over each set, the shorter lists padded.
  route_case c = make_case({300, 41, 700, 64}, 32, 32, 9, 160, 4);
  add_clusters(c, 24);
  // Every other group of four queries over graph 0 goes to graph 5 (graph 0's set named again),
  // over graph 1 to graph 4 (a set of no rows: no routes).
  for (std::size_t i = 0; i < c.graph.size(); i += 4) {
    for (std::size_t j = i; j < std::min(c.graph.size(), i + 4) && (i / 4) % 2 == 1; ++j) {
      if (c.graph[j] <= 1) c.graph[j] = c.graph[j] == 0 ? 5 : 4;
    }
  }
  const kvsift::route_set none{32, 9, {}, {}, {}, {}};
  for (const bool clustered : {false, true}) {
    std::vector<kvsift::route_set> own;
    for (std::size_t g = 0; g < c.rows.size(); ++g) {
      own.push_back(set_of(c, g));
      if (!clustered) {
        own.back().centroids.clear();
        own.back().cluster_rows.clear();
      }
    }
    // Graph 2's lists cut to 4 ids: the stack pads them to 9.
    kvsift::route_set& cut = own[2];
    std::vector<id_t> shorter;
    for (std::size_t r = 0; r < cut.rows(); ++r) {
      shorter.insert(shorter.end(), cut.lists.begin() + std::ptrdiff_t(r * 9),
                     cut.lists.begin() + std::ptrdiff_t(r * 9 + 4));
    }
    cut.lists = shorter;
    cut.list_len = 4;
    const std::vector<const kvsift::route_set*> sets{&own[0], &own[1], &own[2],
                                                     &own[3], &none,   &own[0]};
    const kvsift::route_set_stack st = kvsift::stack_route_sets(sets);
    REQUIRE(st.list_len == 9);
    for (const int probe : clustered ? std::vector<int>{1, 2} : std::vector<int>{0}) {
      const int top = 5, sld = top * 9;
      std::vector<id_t> want(c.graph.size() * std::size_t(sld), kvsift::invalid_id);
      for (std::size_t i = 0; i < c.graph.size(); ++i) {
        const kvsift::route_set& rs = *sets[std::size_t(c.graph[i])];
        if (rs.rows() == 0) continue;
        std::vector<id_t> one(top * rs.list_len);
        kvsift::route_seeds(rs, std::span<const float>(c.q.data() + i * 32, 32), top, one,
                            std::size_t(probe));
        for (int t = 0; t < top; ++t) {
          std::copy_n(one.begin() + std::ptrdiff_t(t * rs.list_len), rs.list_len,
                      want.begin() + std::ptrdiff_t(i * sld + std::size_t(t) * 9));
        }
      }
      INFO((clustered ? "clustered" : "flat") << ", probe " << probe);
      const auto [f32, s32] = gpu_route_stack<float>(st, c, top, 4, probe);
      CHECK(s32 == 0u);
      CHECK(f32 == want);
      const auto [f16, s16] = gpu_route_stack<__half>(st, c, top, 4, probe);
      CHECK(s16 == 0u);
      CHECK(f16 == want);
    }
  }
}

TEST_CASE("route_seeds_probed_device_errors", "[cuda][route_seeds]") {
  // Graph 0: one cluster of 30 rows; graph 1: clusters [30, 45) and [45, 60). Probe 2, so every
  // query of graph 1 probes both. Broken bounds (graph 1's end moved, a middle bound below its
  // first row or past its end) and a graph with more clusters than max_clusters: the status bit
  // and graph 1's rows all invalid_id, graph 0's routed as before.
  route_case c = make_case({30, 30}, 16, 16, 4, 8, 4);
  c.graph = {0, 0, 0, 0, 1, 1, 1, 1};
  c.cluster_offset = {0, 1, 3};
  c.cluster_rows = {0, 30, 45, 60};
  c.max_clusters = 2;
  c.max_cluster_rows = 30;
  c.centroids = integer_matrix(3, 16, 2);
  const std::vector<id_t> want = cpu_route(c, 2, 2);
  {
    const auto [got, status] = gpu_route<float>(c, 2, 4, 0, 2);
    CHECK(got == want);
    CHECK(status == 0u);
  }
  auto expect_graph1_failed = [&](const route_case& bad) {
    const auto [got, status] = gpu_route<float>(bad, 2, 4, 0, 2);
    CHECK(status == kc::decode_status_bad_graph);
    for (std::size_t i = 0; i < 8; ++i) {
      for (std::size_t j = 0; j < 8; ++j) {
        CHECK(got[i * 8 + j] == (i >= 4 ? kvsift::invalid_id : want[i * 8 + j]));
      }
    }
  };
  for (const std::int64_t end : {59, 61}) {
    route_case bad = c;
    bad.cluster_rows[3] = end;
    INFO("graph 1's last bound " << end);
    expect_graph1_failed(bad);
  }
  for (const std::int64_t middle : {29, 61}) {
    route_case bad = c;
    bad.cluster_rows[2] = middle;
    INFO("graph 1's middle bound " << middle);
    expect_graph1_failed(bad);
  }
  route_case many = c;
  many.max_clusters = 1;
  expect_graph1_failed(many);
  // max_cluster_rows 15: graph 0's one cluster of 30 rows fails, graph 1's clusters of 15 pass.
  route_case long_cluster = c;
  long_cluster.max_cluster_rows = 15;
  const auto [got, status] = gpu_route<float>(long_cluster, 2, 4, 0, 2);
  CHECK(status == kc::decode_status_bad_graph);
  for (std::size_t i = 0; i < 8; ++i) {
    for (std::size_t j = 0; j < 8; ++j) {
      CHECK(got[i * 8 + j] == (i < 4 ? kvsift::invalid_id : want[i * 8 + j]));
    }
  }
}

TEST_CASE("route_seeds_rejects_bad_input", "[cuda][route_seeds]") {
  const route_case c = make_case({30, 30}, 16, 16, 4, 8, 4);
  gpu_case dc(c);
  device_buffer<float> dv(c.vectors);
  device_buffer<id_t> seeds(8 * 64);
  const kc::route_set_ref<float> good{dv.get(), 16, 16, dc.lists.get(), 4, dc.offset.get(), 2, 30};
  const kc::decode_queries qs{dc.q.get(), 16, dc.graph.get()};
  kc::route_params p;
  p.top = 2;
  p.group = 4;
  auto run = [&](kc::route_set_ref<float> rs, kc::decode_queries q, std::int64_t m,
                 kc::route_params rp,
                 id_t* out) { kc::route_seeds(rs, q, m, rp, out, nullptr, nullptr); };
  CHECK_NOTHROW(run(good, qs, 8, p, seeds.get()));
  CHECK_NOTHROW(run(good, qs, 0, p, seeds.get()));  // nothing to route
  auto bad_p = [&](int top, int group) {
    kc::route_params q = p;
    q.top = top;
    q.group = group;
    return q;
  };
  CHECK_THROWS_WITH(run(good, qs, 8, bad_p(0, 4), seeds.get()),
                    Catch::Contains("expected 1 <= top <= 16, got 0"));
  CHECK_THROWS_WITH(run(good, qs, 8, bad_p(17, 4), seeds.get()), Catch::Contains("got 17"));
  CHECK_THROWS_WITH(run(good, qs, 8, bad_p(2, 0), seeds.get()),
                    Catch::Contains("expected 1 <= group <= 8, got 0"));
  CHECK_THROWS_WITH(run(good, qs, 8, bad_p(2, 9), seeds.get()), Catch::Contains("got 9"));
  CHECK_THROWS_WITH(run(good, qs, -1, p, seeds.get()), Catch::Contains("got -1"));
  CHECK_THROWS_WITH(run(good, qs, (std::int64_t{1} << 30) + 1, p, seeds.get()),
                    Catch::Contains("2^30"));
  auto with = [&](auto change) {
    kc::route_set_ref<float> rs = good;
    change(rs);
    return rs;
  };
  CHECK_THROWS_WITH(run(with([](auto& r) { r.list_len = 0; }), qs, 8, p, seeds.get()),
                    Catch::Contains("expected list_len >= 1, got 0"));
  CHECK_THROWS_WITH(run(with([](auto& r) { r.list_len = 40000; }), qs, 8, p, seeds.get()),
                    Catch::Contains("80000 seeds per query"));
  CHECK_THROWS_WITH(run(with([](auto& r) { r.max_rows = 9000; }), qs, 8, p, seeds.get()),
                    Catch::Contains("group 4 x max_rows 9000"));
  CHECK_THROWS_WITH(run(with([](auto& r) { r.max_rows = 0; }), qs, 8, p, seeds.get()),
                    Catch::Contains("expected max_rows >= 1, got 0"));
  CHECK_THROWS_WITH(run(with([](auto& r) { r.num_graphs = 0; }), qs, 8, p, seeds.get()),
                    Catch::Contains("at least one graph, got 0"));
  CHECK_THROWS_WITH(run(with([](auto& r) { r.dim = 0; }), qs, 8, p, seeds.get()),
                    Catch::Contains("positive dimension, got 0"));
  CHECK_THROWS_AS(run(with([](auto& r) { r.ld = 15; }), qs, 8, p, seeds.get()),
                  kvsift::dimension_mismatch);
  kc::decode_queries short_ld = qs;
  short_ld.ld = 8;
  CHECK_THROWS_AS(run(good, short_ld, 8, p, seeds.get()), kvsift::dimension_mismatch);
  CHECK_THROWS_WITH(run(good, qs, 8, p, nullptr), Catch::Contains("seeds is null"));
  CHECK_THROWS_WITH(run(with([](auto& r) { r.vectors = nullptr; }), qs, 8, p, seeds.get()),
                    Catch::Contains("routing vectors is null"));
  std::vector<id_t> host(8 * 64);
  CHECK_THROWS_WITH(run(good, qs, 8, p, host.data()),
                    Catch::Contains("seeds must be device memory"));
  kc::decode_queries no_graph = qs;
  no_graph.graph = nullptr;
  CHECK_THROWS_WITH(run(good, no_graph, 8, p, seeds.get()),
                    Catch::Contains("query graphs is null"));
  with_foreign_stream([&](cudaStream_t s) {
    CHECK_THROWS_WITH(kc::route_seeds(good, qs, 8, p, seeds.get(), nullptr, s),
                      Catch::Contains("the stream belongs to device"));
  });
  // Probing: range, a set without clusters, null cluster arrays.
  kc::route_params pr = p;
  pr.probe = 17;
  CHECK_THROWS_WITH(run(good, qs, 8, pr, seeds.get()),
                    Catch::Contains("expected 0 <= probe <= 16, got 17"));
  pr.probe = -1;
  CHECK_THROWS_WITH(run(good, qs, 8, pr, seeds.get()), Catch::Contains("got -1"));
  pr.probe = 2;
  CHECK_THROWS_WITH(run(good, qs, 8, pr, seeds.get()),
                    Catch::Contains("needs 1 <= max_clusters <= max_rows = 30, got 0"));
  device_buffer<float> dcent(std::vector<float>(16 * 4, 1.0f));
  device_buffer<std::int64_t> dcoff(std::vector<std::int64_t>{0, 2, 4});
  device_buffer<std::int64_t> dcrows(std::vector<std::int64_t>{0, 10, 30, 40, 60});
  auto clustered = [&](auto change) {
    kc::route_set_ref<float> rs = good;
    rs.centroids = dcent.get();
    rs.cluster_offset = dcoff.get();
    rs.cluster_rows = dcrows.get();
    rs.max_clusters = 2;
    change(rs);
    return rs;
  };
  CHECK_NOTHROW(run(clustered([](auto&) {}), qs, 8, pr, seeds.get()));
  CHECK_THROWS_WITH(run(clustered([](auto& r) { r.max_clusters = 31; }), qs, 8, pr, seeds.get()),
                    Catch::Contains("got 31"));
  CHECK_THROWS_WITH(
      run(clustered([](auto& r) { r.max_cluster_rows = -1; }), qs, 8, pr, seeds.get()),
      Catch::Contains("expected 0 <= max_cluster_rows <= max_rows = 30, got -1"));
  CHECK_THROWS_WITH(
      run(clustered([](auto& r) { r.max_cluster_rows = 31; }), qs, 8, pr, seeds.get()),
      Catch::Contains("got 31"));
  // With probe the limit is on the probed rows, not max_rows: 9000 rows in clusters of at most
  // 100 pass the host checks (and these small graphs are routed).
  CHECK_NOTHROW(run(clustered([](auto& r) {
                      r.max_rows = 9000;
                      r.max_cluster_rows = 100;
                    }),
                    qs, 8, pr, seeds.get()));
  CHECK_THROWS_WITH(run(clustered([](auto& r) {
                          r.max_rows = 9000;
                          r.max_cluster_rows = 1100;
                        }),
                        qs, 8, pr, seeds.get()),
                    Catch::Contains("group 4 x 8800 scores"));
  CHECK_THROWS_WITH(run(clustered([](auto& r) { r.centroids = nullptr; }), qs, 8, pr, seeds.get()),
                    Catch::Contains("centroids is null"));
  CHECK_THROWS_WITH(
      run(clustered([](auto& r) { r.cluster_rows = nullptr; }), qs, 8, pr, seeds.get()),
      Catch::Contains("cluster rows is null"));
  CHECK_THROWS_WITH(
      run(clustered([](auto& r) { r.cluster_offset = nullptr; }), qs, 8, pr, seeds.get()),
      Catch::Contains("cluster offsets is null"));
}
