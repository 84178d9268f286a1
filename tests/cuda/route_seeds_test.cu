// route_seeds against a CPU model: every query's best routing rows by inner product (ties to
// the lower row), their lists concatenated. Integer data makes every score exact in f32 whatever
// the summation order, and integer vectors have many tied scores, which exercises the tie rule.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#pragma nv_diagnostic push
#pragma nv_diag_suppress 554
#include <kvsift/cuda/route_seeds.cuh>
#pragma nv_diagnostic pop

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
};

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

/// The CPU model: seeds [m][top * list_len].
std::vector<id_t> cpu_route(const route_case& c, int top) {
  const std::size_t m = c.graph.size(), sld = std::size_t(top) * c.list_len;
  std::vector<id_t> out(m * sld, kvsift::invalid_id);
  for (std::size_t i = 0; i < m; ++i) {
    const float* q = c.q.data() + i * c.d;
    if (!std::all_of(q, q + c.d, [](float x) { return std::isfinite(x); })) continue;
    const int g = c.graph[i];
    const std::int64_t r0 = c.offset[std::size_t(g)];
    std::vector<std::pair<float, int>> s;
    for (int r = 0; r < c.rows[std::size_t(g)]; ++r) {
      float acc = 0;
      for (int j = 0; j < c.d; ++j) acc += q[j] * c.vectors[std::size_t(r0 + r) * c.ld + j];
      s.emplace_back(acc, r);
    }
    std::sort(s.begin(), s.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    for (int t = 0; t < top && t < int(s.size()); ++t) {
      const id_t* list = c.lists.data() + std::size_t(r0 + s[std::size_t(t)].second) * c.list_len;
      std::copy_n(list, c.list_len,
                  out.begin() + std::ptrdiff_t(i * sld + std::size_t(t) * c.list_len));
    }
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

/// route_seeds on the GPU with vectors stored as T; the seeds and the status word.
template <class T>
std::pair<std::vector<id_t>, std::uint32_t> gpu_route(const route_case& c, int top, int group,
                                                      int max_rows = 0) {
  gpu_case dc(c);
  std::vector<T> v(c.vectors.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = from_float<T>(c.vectors[i]);
  device_buffer<T> dv(v);
  const int most = *std::max_element(c.rows.begin(), c.rows.end());
  const kc::route_set_ref<T> rs{dv.get(),
                                std::int64_t(c.ld),
                                c.d,
                                dc.lists.get(),
                                c.list_len,
                                dc.offset.get(),
                                int(c.rows.size()),
                                max_rows > 0 ? max_rows : std::max(1, most)};
  const kc::decode_queries qs{dc.q.get(), std::int64_t(c.d), dc.graph.get()};
  kc::route_params p;
  p.top = top;
  p.group = group;
  const std::size_t m = c.graph.size();
  device_buffer<id_t> seeds(m * std::size_t(kc::route_seeds_ld(c.list_len, p)));
  device_buffer<std::uint32_t> status(std::vector<std::uint32_t>{0u});
  kc::route_seeds(rs, qs, std::int64_t(m), p, seeds.get(), status.get(), nullptr);
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  return {seeds.download(), status.download()[0]};
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
}
