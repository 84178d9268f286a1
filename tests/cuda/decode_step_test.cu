// The composed decode step (search -> attention over each head's window + retrieved tokens)
// against the same step composed from the public calls, bit for bit, and against full
// attention in double precision: with a pool that holds every middle token, retrieval finds
// them all, and window + retrieval is exactly all tokens, so the output must equal full
// attention. A head whose context is all window (retrieval empty) and GQA sharing are in the
// same batch.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

#include <kvsift/cuda/decode_step.cuh>

#include "cuda_test.cuh"
#include "test_util.cuh"

namespace {

using namespace kvsift::cuda_test;
using kvsift::id_t;
namespace kc = kvsift::cuda;

struct step_result {
  std::vector<float> o, lse, want_o, want_lse;
  // The same step composed from the public calls: decode_search with the step's filter, then
  // sparse_attention over host-built lists (window, then the retrieved ids), same split count.
  std::vector<float> composed_o, composed_lse;
  std::uint32_t status = 0;
  std::vector<id_t> carry;  // the carry after the step (with one)
  // Per query head, its exact top-k of the retrieval range [sink', n - window) (host, double).
  std::vector<std::vector<id_t>> exact_middle;
  // Per query head (without a carry): whether the composed search was capped (DIPR), and how
  // many ids it retrieved.
  std::vector<std::uint32_t> capped, retrieved;
  // With `capped_out`: the step's own per-head capped flags (the buffer starts at 7).
  std::vector<std::uint32_t> step_capped;
};

/// The routing of a routed step (decode_step with routes) in run_step: graph g's routing rows are
/// its query heads' vectors scaled to unit norm (so each head's best row is its own), row r's
/// list the exact top-k of head g * group + r's retrieval range (`empty_lists`: all invalid_id).
struct route_spec {
  int top = 1;
  int group = 1;  ///< route_params::group
  bool empty_lists = false;
};

/// Graphs of the given sizes over random f32 keys; each graph a ring (i -> i + 1) plus random
/// edges, so every token is reachable; entry inside the retrieval range.
/// `carry` (optional): the step's carry in (seeds), then out; `carry_exact` makes the carry
/// in the exact top-k of each head's retrieval range instead.
/// `spare` > 0: each graph gets that many rows beyond its keys (room to grow; linked among
/// themselves, their tokens holding large keys and values) and `graph_set_ref::sizes` says how
/// many are keys; the step must neither retrieve nor attend to the spare ones. `nan_head` >= 0
/// puts a NaN into that query head's vector. `capped_out`: the step also writes its capped flags
/// to an array of the caller's (else, with dense_when_capped, to its workspace).
/// `spare_attended`: the spare rows' tokens are ordinary random tokens that the step must attend
/// (`decode_step_params::unindexed` = spare), and full attention covers them too.
/// `routing`: the step runs with routes (route_spec).
step_result run_step(const std::vector<int>& sizes, int group, int d,
                     const kc::decode_step_params& p, const std::vector<id_t>* carry = nullptr,
                     bool carry_exact = false, int spare = 0, int nan_head = -1,
                     bool capped_out = false, bool spare_attended = false,
                     const route_spec* routing = nullptr) {
  const int G = static_cast<int>(sizes.size());
  const int H = G * group;
  const int width = 12, page = 16;
  const int max_n = *std::max_element(sizes.begin(), sizes.end()) + spare;
  const int max_pages = (max_n + page - 1) / page;
  std::vector<std::int64_t> off{0};
  for (const int n : sizes) off.push_back(off.back() + n + spare);
  std::vector<id_t> adj(static_cast<std::size_t>(off.back()) * width, kvsift::invalid_id);
  std::vector<id_t> ent(static_cast<std::size_t>(G), kvsift::invalid_id);
  std::vector<float> keys, vals;
  std::vector<std::int32_t> table(static_cast<std::size_t>(G) * max_pages, -1);
  int pages = 0;
  for (int g = 0; g < G; ++g) {
    const int n = sizes[g];
    for (int i = 0; i < n; ++i) fill_ring_row(adj.data() + (off[g] + i) * width, i, n, width);
    for (int i = n; i < n + spare; ++i) {
      adj[(off[g] + i) * width] = static_cast<id_t>(i - 1);
      adj[(off[g] + i) * width + 1] = static_cast<id_t>(i + 1 < n + spare ? i + 1 : 0);
    }
    ent[g] = static_cast<id_t>(std::min(n - 1, p.sink + 1));
    for (int t = 0; t < (n + spare + page - 1) / page; ++t) table[g * max_pages + t] = pages++;
  }
  keys.resize(static_cast<std::size_t>(pages) * page * d, 1e30f);
  vals.resize(keys.size(), 1e30f);
  std::vector<std::vector<float>> hk(G), hv(G);
  for (int g = 0; g < G; ++g) {
    for (int t = 0; t < sizes[g] + spare; ++t) {
      const std::size_t at =
          (static_cast<std::size_t>(table[g * max_pages + t / page]) * page + t % page) * d;
      for (int j = 0; j < d; ++j) {
        const bool key = t < sizes[g] || spare_attended;
        keys[at + j] = key ? uniform(-1.0f, 1.0f) : 3.0f;
        vals[at + j] = key ? uniform(-1.0f, 1.0f) : 100.0f;
        if (!key) continue;
        hk[g].push_back(keys[at + j]);
        hv[g].push_back(vals[at + j]);
      }
    }
  }
  std::vector<float> q(static_cast<std::size_t>(H) * d);
  for (auto& x : q) x = uniform(-2.0f, 2.0f);
  if (nan_head >= 0) q[static_cast<std::size_t>(nan_head) * d + 1] = std::nanf("");
  const int cap = kc::decode_search_capacity(p.search);
  std::vector<std::vector<id_t>> exact_middle(static_cast<std::size_t>(H));
  for (int h = 0; h < H; ++h) {
    const int g = h / group, n = sizes[g];
    const int lo = std::min(n, p.sink), hi = std::max(lo, n - p.window);
    std::vector<std::pair<double, id_t>> sc;
    for (int t = lo; t < hi; ++t) {
      double acc = 0;
      for (int j = 0; j < d; ++j) acc += double(q[h * d + j]) * hk[g][t * d + j];
      sc.push_back({-acc, static_cast<id_t>(t)});
    }
    std::sort(sc.begin(), sc.end());
    for (int j = 0; j < std::min<int>(p.search.k, static_cast<int>(sc.size())); ++j)
      exact_middle[h].push_back(sc[j].second);
  }
  std::vector<id_t> carry_in;
  if (carry != nullptr) carry_in = *carry;
  if (carry_exact) {
    carry_in.assign(static_cast<std::size_t>(H) * cap, kvsift::invalid_id);
    for (int h = 0; h < H; ++h)
      std::copy(exact_middle[h].begin(), exact_middle[h].end(), carry_in.begin() + h * cap);
  }
  device_buffer<id_t> dcarry(carry_in);

  device_buffer<id_t> dadj(adj), dent(ent);
  device_buffer<std::int64_t> doff(off);
  device_buffer<float> dk(keys), dv(vals), dq(q), o(static_cast<std::size_t>(H) * d), lse(H);
  device_buffer<std::int32_t> dt(table);
  device_buffer<std::uint32_t> status(std::vector<std::uint32_t>{0});
  std::vector<std::uint32_t> held(sizes.begin(), sizes.end());
  device_buffer<std::uint32_t> dsizes(held);
  kc::graph_set_ref set{dadj.get(), doff.get(), dent.get(), G, width, 1, max_n};
  if (spare > 0) set.sizes = dsizes.get();
  kc::paged_kv_ref<float> kv{dk.get(), dv.get(), pages, page, d, dt.get(), G, max_pages};
  device_buffer<std::uint32_t> dstep_capped(std::vector<std::uint32_t>(H, 7u));
  // Routing rows: graph g's are its heads' unit-norm queries, each listing that head's exact
  // top-k (padded to k).
  const int list_len = p.search.k;
  std::vector<float> rvec(q);
  std::vector<id_t> rlists(static_cast<std::size_t>(H) * list_len, kvsift::invalid_id);
  std::vector<std::int64_t> roff;
  for (int g = 0; g <= G; ++g) roff.push_back(std::int64_t{g} * group);
  for (int h = 0; h < H; ++h) {
    double norm = 0;
    for (int j = 0; j < d; ++j) norm += double(q[h * d + j]) * q[h * d + j];
    for (int j = 0; j < d; ++j)
      rvec[h * d + j] = static_cast<float>(q[h * d + j] / std::sqrt(norm));
    if (routing != nullptr && !routing->empty_lists) {
      std::copy(exact_middle[h].begin(), exact_middle[h].end(), rlists.begin() + h * list_len);
    }
  }
  device_buffer<float> drvec(rvec);
  device_buffer<id_t> drlists(rlists);
  device_buffer<std::int64_t> droff(roff);
  kc::decode_step_routes<float> routes;
  routes.set = {drvec.get(), d, d, drlists.get(), list_len, droff.get(), G, group};
  if (routing != nullptr) {
    routes.params.top = routing->top;
    routes.params.group = routing->group;
  }
  id_t* dcarry_or_null = carry_in.empty() ? nullptr : dcarry.get();
  std::uint32_t* capped_or_null = capped_out ? dstep_capped.get() : nullptr;
  if (routing == nullptr) {
    const std::size_t wb = kc::decode_step_workspace_size(set, H, d, p);
    device_buffer<char> ws(wb);
    kc::decode_step(set, kv, dq.get(), H, d, o.get(), lse.get(), ws.get(), wb, nullptr, p,
                    status.get(), dcarry_or_null, capped_or_null);
    KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  } else {
    const std::size_t wb = kc::decode_step_workspace_size(set, H, d, p, routes);
    CHECK(wb > kc::decode_step_workspace_size(set, H, d, p));  // room for the routed seeds
    device_buffer<char> ws(wb);
    kc::decode_step(set, routes, kv, dq.get(), H, d, o.get(), lse.get(), ws.get(), wb, nullptr, p,
                    status.get(), dcarry_or_null, capped_or_null);
    KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  }

  step_result r;
  if (carry_in.empty() && !spare_attended &&
      routing == nullptr) {  // (with a carry the step's seeds are its input,
                             // unindexed tokens are not composed: not here)
    std::vector<std::int32_t> graph_of(static_cast<std::size_t>(H));
    std::vector<std::uint32_t> lo(static_cast<std::size_t>(H)), hi(static_cast<std::size_t>(H));
    for (int h = 0; h < H; ++h) {
      const int n = sizes[h / group];
      graph_of[h] = h / group;
      lo[h] = static_cast<std::uint32_t>(std::min(n, p.sink));
      hi[h] = static_cast<std::uint32_t>(std::max<int>(static_cast<int>(lo[h]), n - p.window));
    }
    device_buffer<std::int32_t> dgraph(graph_of);
    device_buffer<std::uint32_t> dlo(lo), dhi(hi), dcounts(static_cast<std::size_t>(H));
    device_buffer<std::uint32_t> dcapped(static_cast<std::size_t>(H));
    device_buffer<id_t> dids(static_cast<std::size_t>(H) * cap);
    kc::decode_queries qs{dq.get(), d, dgraph.get()};
    qs.filter_first = dlo.get();
    qs.filter_last = dhi.get();
    // seed_from_window: each head's best raw score over its window, summed as the device sums
    // it (fmaf in element order), NaN for an empty window.
    std::vector<float> seeds(static_cast<std::size_t>(H), std::nanf(""));
    for (int h = 0; h < H; ++h) {
      const int g = h / group, n = sizes[g];
      float best = -INFINITY;
      for (int t = 0; t < n; ++t) {
        if (t >= static_cast<int>(lo[h]) && t < static_cast<int>(hi[h])) continue;
        float acc = 0.0f;
        for (int j = 0; j < d; ++j) acc = std::fma(q[h * d + j], hk[g][t * d + j], acc);
        best = std::max(best, acc);
      }
      if (best != -INFINITY) seeds[h] = best;
    }
    device_buffer<float> dseeds(seeds);
    if (p.seed_from_window && p.search.mode == kc::decode_search_mode::dipr)
      qs.seed_score = dseeds.get();
    kc::decode_search_outputs so{};
    so.ids = dids.get();
    so.counts = dcounts.get();
    so.capped = dcapped.get();
    const std::size_t swb = kc::decode_search_workspace_size(set, H, p.search);
    device_buffer<char> sws(swb);
    kc::decode_search(set, kv, qs, H, p.search, so, sws.get(), swb, nullptr);
    const std::vector<id_t> ids = dids.download();
    const std::vector<std::uint32_t> counts = dcounts.download();
    r.capped = dcapped.download();
    r.retrieved = counts;
    std::vector<std::int64_t> indptr{0};
    std::vector<std::int32_t> tokens;
    for (int h = 0; h < H; ++h) {
      const int n = sizes[h / group];
      for (std::uint32_t t = 0; t < lo[h]; ++t) tokens.push_back(static_cast<std::int32_t>(t));
      for (int t = static_cast<int>(hi[h]); t < n; ++t) tokens.push_back(t);
      for (std::uint32_t j = 0; j < std::min<std::uint32_t>(counts[h], cap); ++j)
        tokens.push_back(static_cast<std::int32_t>(ids[static_cast<std::size_t>(h) * cap + j]));
      indptr.push_back(static_cast<std::int64_t>(tokens.size()));
    }
    device_buffer<std::int64_t> dindptr(indptr);
    device_buffer<std::int32_t> dtokens(tokens.empty() ? std::vector<std::int32_t>{0} : tokens);
    kc::sparse_attention_params ap;
    ap.scale = p.scale;
    const std::size_t awb = kc::sparse_attention_workspace_size(H, d, ap);
    device_buffer<char> aws(std::max<std::size_t>(awb, 1));
    device_buffer<float> co(static_cast<std::size_t>(H) * d), clse(H);
    kc::sparse_attention(dq.get(), H, d, kv, dindptr.get(), dtokens.get(), co.get(), clse.get(),
                         aws.get(), awb, nullptr, ap);
    KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
    r.composed_o = co.download();
    r.composed_lse = clse.download();
  }
  if (!carry_in.empty()) r.carry = dcarry.download();
  if (capped_out) r.step_capped = dstep_capped.download();
  r.exact_middle = exact_middle;
  r.o = o.download();
  r.lse = lse.download();
  r.status = status.download()[0];
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int h = 0; h < H; ++h) {
    const int g = h / group;
    const int attended = sizes[g] + (spare_attended ? spare : 0);
    const auto [o_h, lse_h] =
        full_attention_one(&q[h * d], hk[g].data(), hv[g].data(), attended, d, scale);
    r.want_lse.push_back(static_cast<float>(lse_h));
    for (const double x : o_h) r.want_o.push_back(static_cast<float>(x));
  }
  return r;
}

int mismatches(const step_result& r) {
  int bad = 0;
  for (std::size_t i = 0; i < r.o.size(); ++i) bad += !(std::fabs(r.o[i] - r.want_o[i]) <= 2e-5);
  for (std::size_t i = 0; i < r.lse.size(); ++i)
    bad += !(std::fabs(r.lse[i] - r.want_lse[i]) <= 2e-5);
  if (bad != 0) std::printf("    %d mismatches (o[0] %g vs %g)\n", bad, r.o[0], r.want_o[0]);
  return bad;
}

/// Elements of query head h's output (o and lse) farther than 2e-5 from full attention.
int head_mismatches(const step_result& r, std::size_t h, int d) {
  int bad = !(std::fabs(r.lse[h] - r.want_lse[h]) <= 2e-5);
  for (std::size_t i = h * d; i < (h + 1) * d; ++i)
    bad += !(std::fabs(r.o[i] - r.want_o[i]) <= 2e-5);
  return bad;
}

/// Query heads whose carry after the step (its retrieved ids, padding skipped) is not, as a set,
/// their exact top-k of the retrieval range.
int heads_off_exact(const step_result& r, int heads, int cap) {
  int off = 0;
  for (int h = 0; h < heads; ++h) {
    std::vector<id_t> got;
    for (int j = 0; j < cap; ++j) {
      if (r.carry[h * cap + j] != kvsift::invalid_id) got.push_back(r.carry[h * cap + j]);
    }
    std::vector<id_t> want = r.exact_middle[h];
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    off += got == want ? 0 : 1;
  }
  return off;
}

/// One graph of 40 tokens (a ring, entry 5) over keys of 0.5 (V = K), d 64, in pages of 16 in
/// order: enough for the argument checks that must refuse a call before its first launch.
struct ring_fixture {
  static constexpr int n = 40, d = 64, width = 4, page = 16, pages = (n + page - 1) / page;
  device_buffer<id_t> adj{ring_adjacency()}, ent{std::vector<id_t>{5}};
  device_buffer<std::int64_t> off{std::vector<std::int64_t>{0, n}};
  device_buffer<float> keys{std::vector<float>(static_cast<std::size_t>(pages) * page * d, 0.5f)};
  device_buffer<std::int32_t> table{pages_in_order()};
  kc::graph_set_ref set{adj.get(), off.get(), ent.get(), 1, width, 1, n};
  kc::paged_kv_ref<float> kv{keys.get(), keys.get(), pages, page, d, table.get(), 1, pages};

  static std::vector<id_t> ring_adjacency() {
    std::vector<id_t> a(static_cast<std::size_t>(n) * width, kvsift::invalid_id);
    for (int i = 0; i < n; ++i) fill_ring_row(a.data() + i * width, i, n, width);
    return a;
  }
  static std::vector<std::int32_t> pages_in_order() {
    std::vector<std::int32_t> t(pages);
    for (int i = 0; i < pages; ++i) t[i] = i;
    return t;
  }
};

/// Top-10 of a pool of 20, 4 sinks and a window of 32: a search that misses some of the exact
/// top-10 unless its seeds hold them (the carry and routing tests).
kc::decode_step_params small_topk_step() {
  kc::decode_step_params p;
  p.sink = 4;
  p.window = 32;
  p.search.k = 10;
  p.search.L = 20;
  return p;
}

/// Top-k step parameters whose pool (1000) holds every middle token of the test graphs (at most
/// 1000 tokens each), so window + retrieval is every token: 4 sinks and `window` recent tokens.
kc::decode_step_params whole_middle(int window) {
  kc::decode_step_params p;
  p.sink = 4;
  p.window = window;
  p.search.k = 1000;
  p.search.L = 1000;
  return p;
}

}  // namespace

TEST_CASE("decode_step_full_retrieval_equals_full_attention", "[cuda][decode_step]") {
  kc::decode_step_params p = whole_middle(32);
  // 30 tokens: all window, retrieval empty. Others: window + a middle retrieval must find whole.
  const step_result r = run_step({300, 30, 1000}, 4, 64, p);
  CHECK(mismatches(r) == 0);
  CHECK(r.status == 0u);
  p.search.expand_width = 4;  // the wider walk finds everything too at this pool
  CHECK(mismatches(run_step({500, 800}, 2, 128, p)) == 0);
}

TEST_CASE("decode_step_searches_and_attends_only_the_keys_a_grown_graph_holds",
          "[cuda][decode_step]") {
  // Graphs with room to grow (graph_set_ref::sizes < rows): the spare rows are reachable and
  // their tokens would dominate attention, so reading past the sizes shows in the output.
  kc::decode_step_params p = whole_middle(32);
  const step_result r = run_step({300, 30, 1000}, 4, 64, p, nullptr, false, 40);
  CHECK(mismatches(r) == 0);
  CHECK(r.status == 0u);
  // Seeds in the spare rows are ids beyond the graph: skipped and flagged, the output exact.
  const int cap = kc::decode_search_capacity(p.search);
  std::vector<id_t> seeds(static_cast<std::size_t>(3 * 4) * cap, kvsift::invalid_id);
  const id_t first_spare[] = {300, 30, 1000};
  for (int h = 0; h < 12; ++h) seeds[static_cast<std::size_t>(h) * cap] = first_spare[h / 4] + 5;
  const step_result s = run_step({300, 30, 1000}, 4, 64, p, &seeds, false, 40);
  CHECK(mismatches(s) == 0);
  CHECK((s.status & kc::decode_status_bad_id) != 0u);
}

// `unindexed`: tokens past the graphs' rows (generated since the build) are attended with the
// window; with every middle token retrieved the step is full attention over all of them. The
// graphs' spare rows are linked among themselves but outside their sizes, so the search cannot
// reach them: only the window can attend them. Top-k, and DIPR seeded from a window that
// includes them; a window of none but the unindexed tokens; GQA groups of 1 and 4.
TEST_CASE("decode_step_attends_unindexed_tokens_with_the_window", "[cuda][decode_step]") {
  kc::decode_step_params p = whole_middle(16);
  p.unindexed = 24;
  const step_result r = run_step({300, 30, 700}, 4, 64, p, nullptr, false, 24, -1, false, true);
  CHECK(mismatches(r) == 0);
  CHECK(r.status == 0u);
  p.window = 0;
  p.sink = 1;
  CHECK(mismatches(run_step({200, 500}, 1, 64, p, nullptr, false, 24, -1, false, true)) == 0);
  p.window = 16;
  p.search.mode = kc::decode_search_mode::dipr;
  p.search.beta = 1e30f;
  p.search.l0 = 1000;
  p.seed_from_window = true;
  CHECK(mismatches(run_step({300, 30, 700}, 4, 64, p, nullptr, false, 24, -1, false, true)) == 0);
  // Without the parameter the same data is not full attention (the test can tell).
  p.unindexed = 0;
  CHECK(mismatches(run_step({300, 700}, 2, 64, p, nullptr, false, 24, -1, false, true)) > 0);
}

TEST_CASE("decode_step_dipr_with_infinite_beta_equals_full_attention", "[cuda][decode_step]") {
  // DIPR with a range wider than any score gap keeps every scored token: with l0 >= the middle
  // the walk scores them all.
  kc::decode_step_params p;
  p.sink = 2;
  p.window = 16;
  p.search.mode = kc::decode_search_mode::dipr;
  p.search.beta = 1e30f;
  p.search.l0 = 1000;
  p.search.max_results = 4096;
  CHECK(mismatches(run_step({700, 10}, 2, 64, p)) == 0);
}

TEST_CASE("decode_step_capped_dipr_heads_attend_every_token", "[cuda][decode_step]") {
  // A DIPR search that hits max_results returns an arbitrary part of its range; with
  // dense_when_capped that head attends every token, so its output is full
  // attention, while an uncapped head's output is the same as the one-pass composition over
  // its window and retrieved ids, bit for bit (the full-attention pass leaves it an empty
  // state). Without the switch a capped head attends the truncated answer: not full attention.
  kc::decode_step_params p;
  p.sink = 2;
  p.window = 16;
  p.search.mode = kc::decode_search_mode::dipr;
  p.search.l0 = 16;
  p.search.max_results = 32;
  // Middles of 7 (never capped), ~280, ~1480 and ~3980 tokens (where a capped head's dense
  // pass has several splits of decode_step_dense_chunk).
  const std::vector<int> sizes{25, 300, 1500, 4000, 9000};
  int capped = 0, partial = 0;
  // (beta, max_hops): capped by max_results (32), and at the end by a hop cap of 3 under a
  // max_results the ranges do not reach.
  for (const auto& [beta, hops] : {std::pair{1e30f, 0}, std::pair{4.0f, 0}, std::pair{8.0f, 0},
                                   std::pair{12.0f, 0}, std::pair{4.0f, 3}}) {
    p.search.beta = beta;
    p.search.max_hops = hops;
    p.search.max_results = hops != 0 ? 4096 : 32;
    for (const bool dense : {true, false}) {
      p.dense_when_capped = dense;
      rng().seed(41);
      const step_result r = run_step(sizes, 2, 64, p);
      CHECK((r.status & ~kc::decode_status_capped) == 0u);
      const int d = 64;
      int bad = 0;
      for (std::size_t h = 0; h < r.capped.size(); ++h) {
        const auto head_o = [&](const std::vector<float>& v) {
          return std::vector<float>(v.begin() + h * d, v.begin() + (h + 1) * d);
        };
        if (r.capped[h] != 0u) {
          if (!dense) continue;  // checked in aggregate below
          ++capped;
          bad += head_mismatches(r, h, d);
        } else {
          partial += dense && r.retrieved[h] > 0u && r.retrieved[h] < 300u ? 1 : 0;
          bad += head_o(r.o) != head_o(r.composed_o) ? 1 : 0;
          bad += r.lse[h] != r.composed_lse[h] ? 1 : 0;
        }
      }
      CHECK(bad == 0);
      // The step's own capped flags are the search's, and giving the step an array for them
      // (which the dense pass then reads instead of its workspace's) changes no output bit.
      rng().seed(41);
      const step_result rc = run_step(sizes, 2, 64, p, nullptr, false, 0, -1, true);
      CHECK(rc.step_capped == r.capped);
      CHECK(rc.o == r.o);
      CHECK(rc.lse == r.lse);
      if (!dense) {  // the capped heads attend their truncated answers: not full attention
        int capped_wrong = 0;
        for (std::size_t h = 0; h < r.capped.size(); ++h) {
          if (r.capped[h] != 0u) capped_wrong += std::fabs(r.lse[h] - r.want_lse[h]) > 1e-3 ? 1 : 0;
        }
        CHECK(capped_wrong > 0);
      }
    }
  }
  CHECK(capped > 0);  // both kinds of head are in the batches: the check bites on each
  CHECK(partial > 0);
}

TEST_CASE("decode_step_dipr_seeded_from_the_window_equals_its_composition", "[cuda][decode_step]") {
  // seed_from_window: each DIPR search starts from the best raw score of its head's window, so
  // it keeps only the middle tokens within beta of the best token of the whole context. The
  // step must equal decode_search seeded with each window's best (computed on the host, summed
  // as the device sums it) + sparse_attention over the window and those ids, bit for bit; and
  // where a window holds the context's best key, the seed must narrow that head's retrieval.
  kc::decode_step_params p;
  p.sink = 2;
  p.window = 200;
  p.search.mode = kc::decode_search_mode::dipr;
  p.search.beta = 3.0f;
  p.search.l0 = 32;
  p.search.max_results = 4096;
  const std::vector<int> sizes{600, 900, 1500, 250, 700, 400, 1100};
  // Windows mostly at the end, then mostly sinks (so that both ranges hold some head's best).
  for (const auto& [sink, window] : {std::pair{2, 200}, std::pair{200, 20}}) {
    p.sink = sink;
    p.window = window;
    p.seed_from_window = false;
    p.search.expand_width = 1;
    rng().seed(57);
    const step_result plain = run_step(sizes, 2, 64, p);
    p.seed_from_window = true;
    for (const int expand : {1, 4}) {
      p.search.expand_width = expand;
      rng().seed(57);
      const step_result r = run_step(sizes, 2, 64, p);
      CHECK(r.status == 0u);
      CHECK(r.o == r.composed_o);
      CHECK(r.lse == r.composed_lse);
      int narrower = 0;
      for (std::size_t h = 0; h < r.retrieved.size(); ++h)
        narrower += r.retrieved[h] < plain.retrieved[h] ? 1 : 0;
      CHECK(narrower > 0);
    }
  }
}

TEST_CASE("decode_step_seeded_checks_its_arguments_before_any_launch", "[cuda][decode_step]") {
  // The window's scores launch before the search: a host query pointer must be refused with
  // the search's message, not read by a kernel.
  const ring_fixture f;
  const int d = ring_fixture::d;
  const kc::graph_set_ref& set = f.set;
  const kc::paged_kv_ref<float>& kv = f.kv;
  device_buffer<float> o(d), lse(1);
  kc::decode_step_params p;
  p.sink = 1;
  p.window = 8;
  p.search.mode = kc::decode_search_mode::dipr;
  p.seed_from_window = true;
  const std::size_t wb = kc::decode_step_workspace_size(set, 1, d, p);
  device_buffer<char> ws(wb);
  const std::vector<float> host_q(d, 1.0f);
  CHECK(contains(message_of([&] {
                   kc::decode_step(set, kv, host_q.data(), 1, d, o.get(), lse.get(), ws.get(), wb,
                                   nullptr, p);
                 }),
                 "queries"));
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());  // nothing was launched that could fault
}

TEST_CASE("decode_step_carry_warm_starts_the_search", "[cuda][decode_step]") {
  // The carry is read as the search's seeds and overwritten with its results. An empty carry
  // (all invalid_id) is the cold step, bit for bit; a carry holding each head's exact top-k
  // with expand_limit 1 returns exactly those (the cold search at that limit does not).
  kc::decode_step_params p = small_topk_step();
  const std::vector<int> sizes{1500, 40, 2500};
  const int group = 2, H = 6, cap = 10;
  rng().seed(21);
  const step_result cold = run_step(sizes, group, 64, p);
  rng().seed(21);
  const std::vector<id_t> empty(std::size_t(H) * cap, kvsift::invalid_id);
  const step_result warm0 = run_step(sizes, group, 64, p, &empty);
  CHECK(warm0.o == cold.o);
  CHECK(warm0.lse == cold.lse);
  for (int h = 0; h < H; ++h) {  // the carry now holds the step's retrieval: in range, distinct
    const int n = sizes[h / group];
    std::vector<id_t> row;
    for (int j = 0; j < cap; ++j) {
      const id_t id = warm0.carry[h * cap + j];
      if (id == kvsift::invalid_id) continue;
      CHECK((id >= 4 && static_cast<int>(id) < n - 32));
      row.push_back(id);
    }
    std::sort(row.begin(), row.end());
    CHECK(std::adjacent_find(row.begin(), row.end()) == row.end());
    CHECK(row.size() == std::min<std::size_t>(cap, std::size_t(std::max(0, n - 36))));
  }
  p.search.expand_limit = 1;
  int cold_missed = 0;
  for (const bool seeded : {false, true}) {
    rng().seed(22);
    const step_result r = run_step(sizes, group, 64, p, seeded ? nullptr : &empty, seeded);
    CHECK(r.status == 0u);
    const int off = heads_off_exact(r, H, cap);
    if (seeded) {
      CHECK(off == 0);
    } else {
      cold_missed += off;
    }
  }
  CHECK(cold_missed > 0);  // without the seeds the limited search misses: the check bites
}

TEST_CASE("decode_step_routes_seed_the_search", "[cuda][decode_step]") {
  // decode_step with routes: every head's best routing row is its own (unit-norm query), whose
  // list is its exact top-k; with expand_limit 1 the step then retrieves exactly those (the
  // cold step at that limit does not: decode_step_carry_warm_starts_the_search). The routed
  // lists follow the carry (here empty, so that it returns the retrieved ids). Routing group 1
  // and 2 (the GQA group), top 1 and 3. Routes whose lists are all invalid_id add no seed: the
  // cold step, bit for bit.
  kc::decode_step_params p = small_topk_step();
  p.search.expand_limit = 1;
  const std::vector<int> sizes{1500, 40, 2500};
  const int group = 2, H = 6, cap = 10;
  const std::vector<id_t> empty(std::size_t(H) * cap, kvsift::invalid_id);
  for (const auto& [top, rgroup] : {std::pair{1, 1}, std::pair{1, 2}, std::pair{3, 2}}) {
    INFO("top " << top << ", routing group " << rgroup);
    const route_spec spec{top, rgroup, false};
    rng().seed(22);
    const step_result r = run_step(sizes, group, 64, p, &empty, false, 0, -1, false, false, &spec);
    CHECK(r.status == 0u);
    CHECK(heads_off_exact(r, H, cap) == 0);
  }
  rng().seed(22);
  const step_result cold = run_step(sizes, group, 64, p, &empty);
  const route_spec none{1, 2, true};
  rng().seed(22);
  const step_result r = run_step(sizes, group, 64, p, &empty, false, 0, -1, false, false, &none);
  CHECK(r.status == 0u);
  CHECK(r.o == cold.o);
  CHECK(r.lse == cold.lse);
  CHECK(r.carry == cold.carry);
}

TEST_CASE("decode_step_with_routes_rejects_bad_routes_before_any_launch", "[cuda][decode_step]") {
  // The routes are checked with the step's other arguments, before the first launch: a set over
  // another number of graphs, routing vectors of another dimension, a routing group that does
  // not divide the GQA group, top out of range, a too-small workspace, host routing vectors.
  const ring_fixture f;
  const int d = ring_fixture::d;
  const kc::graph_set_ref& set = f.set;
  const kc::paged_kv_ref<float>& kv = f.kv;
  device_buffer<float> dq(std::vector<float>(static_cast<std::size_t>(4) * d, 1.0f));
  device_buffer<float> o(static_cast<std::size_t>(4) * d), lse(4);
  device_buffer<float> rvec(std::vector<float>(static_cast<std::size_t>(3) * d, 0.1f));
  device_buffer<id_t> rlists(std::vector<id_t>(static_cast<std::size_t>(3) * 10, 7));
  device_buffer<std::int64_t> roff(std::vector<std::int64_t>{0, 3});
  kc::decode_step_routes<float> good;
  good.set = {rvec.get(), d, d, rlists.get(), 10, roff.get(), 1, 3};
  good.params.group = 2;
  kc::decode_step_params p;
  p.sink = 1;
  p.window = 8;
  const std::size_t wb = kc::decode_step_workspace_size(set, 4, d, p, good);
  device_buffer<char> ws(wb);
  auto step = [&](const kc::decode_step_routes<float>& r, std::size_t bytes) {
    return message_of([&] {
      kc::decode_step(set, r, kv, dq.get(), 4, d, o.get(), lse.get(), ws.get(), bytes, nullptr, p);
    });
  };
  CHECK(step(good, wb) == "(no exception)");
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  kc::decode_step_routes<float> bad = good;
  bad.set.num_graphs = 2;
  CHECK(contains(step(bad, wb), "expected a routing set per graph (1), got 2"));
  bad = good;
  bad.set.dim = 32;
  bad.set.ld = 32;
  CHECK(contains(step(bad, wb), "routing vectors of head_dim = 64 elements, got 32"));
  bad = good;
  bad.params.group = 3;
  CHECK(contains(step(bad, wb), "routing group dividing the GQA group (4), got 3"));
  bad = good;
  bad.params.top = kc::max_route_top + 1;
  CHECK(contains(step(bad, wb), "1 <= top <= 16, got 17"));
  CHECK(contains(step(good, wb - 4), "too small"));
  const std::vector<float> host_vectors(static_cast<std::size_t>(3) * d, 0.1f);
  bad = good;
  bad.set.vectors = host_vectors.data();
  CHECK(contains(step(bad, wb), "routing vectors"));
  // Workspace sizes: the routed seeds make it larger, and bad routing parameters are refused.
  CHECK(wb > kc::decode_step_workspace_size(set, 4, d, p));
  bad = good;
  bad.params.top = 0;
  CHECK(contains(message_of([&] { kc::decode_step_workspace_size(set, 4, d, p, bad); }),
                 "1 <= top <= 16, got 0"));
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());  // nothing was launched that could fault
}

TEST_CASE("decode_step_equals_its_composition_from_public_calls", "[cuda][decode_step]") {
  // A retrieval that finds a few of the middle tokens, so that the output depends on which:
  // the step reads its window as ranges and its retrieved tokens from the search's rows, in
  // place; decode_search + sparse_attention over lists built on the host (window first) must
  // give the same bits. Heads with all-window contexts, no sinks and several splits are in
  // the batch.
  kc::decode_step_params p;
  p.sink = 3;
  p.window = 20;
  p.search.k = 7;
  p.search.L = 16;
  for (const int d : {64, 128}) {
    rng().seed(31);
    const step_result r = run_step({900, 12, 23, 400, 2000}, 2, d, p);
    CHECK(r.status == 0u);
    CHECK(r.o == r.composed_o);
    CHECK(r.lse == r.composed_lse);
    CHECK(mismatches(r) > 0);  // a partial retrieval: not full attention, so the lists matter
    // Top-k is never capped: the step's flags are all written, all 0.
    rng().seed(31);
    const step_result rc = run_step({900, 12, 23, 400, 2000}, 2, d, p, nullptr, false, 0, -1, true);
    CHECK(rc.step_capped == std::vector<std::uint32_t>(rc.o.size() / std::size_t(d), 0u));
    CHECK(rc.o == r.o);
  }
  p.sink = 0;  // window only at the end
  p.search.expand_width = 4;
  rng().seed(32);
  const step_result r = run_step({700, 5, 1200}, 4, 64, p);
  CHECK(r.o == r.composed_o);
  CHECK(r.lse == r.composed_lse);
}

TEST_CASE("decode_step_with_many_heads_takes_few_splits", "[cuda][decode_step]") {
  // 136 query heads: on a device of 66-264 multiprocessors the attention's automatic split
  // count is 2-8 (the tests above, with few heads, take many more). Whole retrieval equals full
  // attention, and the step equals its composition from public calls bit for bit.
  constexpr int pattern[] = {300, 30, 1000, 517};
  std::vector<int> sizes;
  for (int g = 0; g < 34; ++g) sizes.push_back(pattern[g % 4]);
  rng().seed(41);
  const step_result r = run_step(sizes, 4, 128, whole_middle(32));
  CHECK(mismatches(r) == 0);
  CHECK(r.status == 0u);
  CHECK(r.o == r.composed_o);
  CHECK(r.lse == r.composed_lse);
}

TEST_CASE("decode_step_nan_query_shows_in_its_head_only", "[cuda][decode_step]") {
  // A NaN query head returns no retrieval and its output is NaN (o and lse), as sparse_attention
  // gives it; the other heads are exact. DIPR with dense_when_capped merges two passes: the
  // merge must propagate the NaN, not empty the row.
  kc::decode_step_params topk;
  topk.sink = 4;
  topk.window = 32;
  topk.search.k = 1000;
  topk.search.L = 1000;
  kc::decode_step_params dipr = topk;
  dipr.search.mode = kc::decode_search_mode::dipr;
  dipr.search.beta = 1e30f;  // every head caps at 32 and attends all its tokens
  dipr.search.l0 = 16;
  dipr.search.max_results = 32;
  dipr.dense_when_capped = true;
  for (const kc::decode_step_params& p : {topk, dipr}) {
    rng().seed(51);
    const int d = 64, nan_head = 5;
    const step_result r = run_step({300, 1000}, 4, d, p, nullptr, false, 0, nan_head);
    int bad = 0, nan = 0;
    for (std::size_t h = 0; h < r.lse.size(); ++h) {
      if (static_cast<int>(h) != nan_head) {
        bad += head_mismatches(r, h, d);
        continue;
      }
      nan += std::isnan(r.lse[h]) ? 1 : 0;
      for (int j = 0; j < d; ++j) nan += std::isnan(r.o[h * d + j]) ? 1 : 0;
    }
    CHECK(bad == 0);
    CHECK(nan == d + 1);
  }
}

TEST_CASE("decode_step_rejects_bad_input", "[cuda][decode_step]") {
  kc::decode_step_params p;
  p.sink = -1;
  kc::graph_set_ref set;
  set.num_graphs = 2;
  set.width = 8;
  set.max_keys = 10;
  CHECK(contains(message_of([&] { kc::decode_step_workspace_size(set, 4, 64, p); }), "sink >= 0"));
  p.sink = 4;
  p.unindexed = -1;
  CHECK(contains(message_of([&] { kc::decode_step_workspace_size(set, 4, 64, p); }),
                 "expected 0 <= unindexed <= 2^30, got -1"));
  p.unindexed = (1 << 30) + 1;
  CHECK(contains(message_of([&] { kc::decode_step_workspace_size(set, 4, 64, p); }),
                 "expected 0 <= unindexed <= 2^30, got 1073741825"));
  p.unindexed = 0;
  CHECK(contains(message_of([&] { kc::decode_step_workspace_size(set, 3, 64, p); }),
                 "multiple of num_graphs = 2"));
  p.search.L = 5;
  CHECK(contains(message_of([&] { kc::decode_step_workspace_size(set, 4, 64, p); }), "<= L"));
  kc::decode_step_params seeded;
  seeded.search.mode = kc::decode_search_mode::dipr;
  seeded.search.metric = kc::graph_metric::l2;
  seeded.seed_from_window = true;
  CHECK(contains(message_of([&] { kc::decode_step_workspace_size(set, 4, 64, seeded); }),
                 "seed_from_window needs the inner-product metric"));
  seeded.seed_from_window = false;  // unseeded l2 DIPR stays allowed
  CHECK(message_of([&] { kc::decode_step_workspace_size(set, 4, 64, seeded); }) ==
        "(no exception)");
}
