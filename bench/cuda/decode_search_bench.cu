// GPU decode search: one launch for every (request, query head) of a decode step, each over
// its own RoarGraph index (one per (request, KV head), GQA-shared), keys read from head-wise
// f16 pages through the page table.
//
// Setting (defaults): 32 requests x 32 query heads = 1024 queries, 8 KV heads per request =
// 256 graphs of 131072 keys x d = 128 (synthetic OOD keys: queries from another distribution
// than the keys, as attention's are). `--distinct` different key sets are generated and built
// (GPU build, GQA group of 4 query heads, 10% of prefill queries as training queries); graph g
// is a full copy of key set g % distinct in its own memory, so the launch reads 256 distinct
// graphs as a real batch would.
//
// Reports, in one run: decode_search time per launch (CUDA events, median) and recall@100
// against the exact top-100, over a sweep of pool sizes L from the cheap end, for dense and
// paged keys; DIPR at a few beta; and the baselines: the exact GPU top-100 (kvsift::cuda::knn,
// GEMM + selection, one call per graph) and the time to read every key once at the measured
// device copy bandwidth (the floor of any exact scan). Then the composed decode step at the
// fastest setting reaching recall@100 0.95, against full attention, and its stages timed alone.
//
// Usage: kvsift-cuda-decode_search_bench [--n 131072] [--d 128] [--requests 32]
//            [--kv-heads 8] [--group 4] [--distinct 2] [--page 16] [--quick 0|1] [--dipr-only 0|1]
//            [--step-expand W --step-L L --step-hops H] [--build-expand F] [--warps 0|1|4|8]
// --build-expand F: the indexes' step-3 expand fraction (default the library's).
// --warps W: the top-k searches' decode_search_params::warps_per_search (default 0, automatic).
// --quick 1 sweeps only expand_width 4 to 32 without a degree cap and skips DIPR.
// --dipr-only 1 runs only the DIPR rows of the sweep and stops before the decode step.
// --dipr-caps C1,C2,...: the DIPR rows for each max_results C (default 8192, at most 8192).
// --dipr-step 1: after the top-k step, the decode step with DIPR (l0 100, expand_width 8) at
// beta 0.5, 1.0, 1.5, each cap of --dipr-caps and each hop cap of --dipr-hops (default 0 =
// none), unseeded with the walk-through and seeded from the window without it, with
// dense_when_capped on and off: time, heads capped, tokens attended per head, output error
// against full attention.
// --step-expand W (with --step-L, default 256, and --step-hops, default 0 = no cap): the
// decode step uses this top-100 setting instead of the sweep's fastest at recall 0.95 (which
// noise can flip between settings a few microseconds apart), and the sweep is skipped: only
// this setting's search is measured before the step.
// --step-route C:P:top:L:E[:hops[:width]],... (with --route R): after the step, the decode step
// with routes (decode_step_routes: the routing sets clustered into C clusters, 0 = flat, P
// probed, the lists of the best `top` as seeds; the search with L, expand_limit E, max_hops,
// expand_width, default 0 and 8, no walk-through), alternated with the step without routes
// (walk_through = false) in the same run, and both steps' recall@100 from their carries; one
// row per comma-separated setting. --step-route-shards S,... (each >= 2): each such step also
// runs as decode_step_sharded over S shards of the graphs on device 0 (own streams and routing
// sets), alternated with the one call, and its outputs are compared with the one call's.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench_util.cuh"
#include "gqa_heads.cuh"

#pragma nv_diagnostic push
#pragma nv_diag_suppress 554
#include <kvsift/core/vector_store.hpp>
#include <kvsift/cuda/decode_search.cuh>
#include <kvsift/cuda/decode_step.cuh>
#include <kvsift/cuda/decode_step_sharded.cuh>
#include <kvsift/cuda/knn.cuh>
#include <kvsift/cuda/merge.cuh>
#include <kvsift/cuda/route_seeds.cuh>
#include <kvsift/cuda/sparse_attention.cuh>
#include <kvsift/index/gqa_sampling.hpp>
#include <kvsift/index/roargraph_builder.hpp>
#include <kvsift/testing/ood_generator.hpp>
#pragma nv_diagnostic pop

namespace {

using kvsift::id_t;
using kvsift::matrix_view;
namespace kc = kvsift::cuda;
using kvsift::cuda_bench::dev;
using kvsift::cuda_bench::make_head;
using kvsift::cuda_bench::seconds_since;

/// Key set g % distinct's routing set for each of G graphs, clustered into C clusters (0: flat),
/// stacked (kvsift::stack_route_sets) and uploaded as f16: `ref` is the device handle.
struct device_routes {
  kvsift::route_set_stack stack;
  std::vector<kvsift::half> vectors, centroids;
  dev<__half> dvectors, dcentroids;
  dev<id_t> dlists;
  dev<std::int64_t> doffset, dcluster_offset, dcluster_rows;
  kc::route_set_ref<__half> ref;

  device_routes(const std::vector<kvsift::route_set>& routes, std::size_t C, std::size_t G,
                std::size_t d)
      : stack(stacked(routes, C, G)),
        vectors(to_half(stack.vectors)),
        centroids(to_half(stack.centroids)),
        dvectors(vectors.size()),
        dcentroids(centroids.size()),
        dlists(stack.lists.size()),
        doffset(G + 1),
        dcluster_offset(std::max<std::size_t>(1, stack.cluster_offset.size())),
        dcluster_rows(std::max<std::size_t>(1, stack.cluster_rows.size())) {
    auto up = [](auto* to, const auto& from) {
      KVSIFT_CUDA_CHECK(
          cudaMemcpy(to, from.data(), from.size() * sizeof(from[0]), cudaMemcpyHostToDevice));
    };
    up(dvectors.p, vectors);
    up(dcentroids.p, centroids);
    up(dlists.p, stack.lists);
    up(doffset.p, stack.offset);
    up(dcluster_offset.p, stack.cluster_offset);
    up(dcluster_rows.p, stack.cluster_rows);
    const bool c = stack.clustered();
    ref = {dvectors.p,
           std::int64_t(d),
           int(d),
           dlists.p,
           int(stack.list_len),
           doffset.p,
           int(G),
           int(stack.max_rows),
           c ? dcentroids.p : nullptr,
           c ? dcluster_offset.p : nullptr,
           c ? dcluster_rows.p : nullptr,
           int(stack.max_clusters),
           int(stack.max_cluster_rows)};
  }

 private:
  static kvsift::route_set_stack stacked(const std::vector<kvsift::route_set>& routes,
                                         std::size_t C, std::size_t G) {
    // Clustering changes the sets, so a flat routing (C = 0) takes the built ones as they are.
    std::vector<kvsift::route_set> clustered;
    if (C != 0) {
      clustered = routes;
      for (auto& rs : clustered) kvsift::cluster_routes(rs, C);
    }
    const std::vector<kvsift::route_set>& sets = C != 0 ? clustered : routes;
    std::vector<const kvsift::route_set*> of_graph(G);
    for (std::size_t g = 0; g < G; ++g) of_graph[g] = &sets[g % sets.size()];
    return kvsift::stack_route_sets(of_graph);
  }
  static std::vector<kvsift::half> to_half(const std::vector<float>& f) {
    std::vector<kvsift::half> h(std::max<std::size_t>(f.size(), 1));
    for (std::size_t i = 0; i < f.size(); ++i) h[i] = kvsift::half(f[i]);
    return h;
  }
};

/// The routed step as decode_step_sharded over `S` shards of the graphs on this device (each
/// with its own stream, workspace and routing sets, stacked for its graphs), timed alternated
/// with `single`, the one routed call over every graph, which writes (o, lse); the shards'
/// outputs are compared with those. Graph g of a shard is graph g0 + g of the whole set, whose
/// rows are n apart; its key set (and routing set) is (g0 + g) % distinct, so g0 must be a
/// multiple of distinct.
template <class Single>
void sharded_routed_step(std::size_t S, const std::vector<kvsift::route_set>& routes, std::size_t C,
                         const kc::route_params& route_p, const kc::decode_step_params& p,
                         const kc::graph_set_ref& set, const kc::paged_kv_ref<__half>& kv,
                         const float* q, std::size_t d, std::size_t group, cudaStream_t stream,
                         Single&& single, const float* single_o, const float* single_lse) {
  const std::size_t G = std::size_t(set.num_graphs), n = std::size_t(set.max_keys);
  if (G % S != 0 || (G / S) % routes.size() != 0) {
    std::printf(
        "  (--step-route-shards %zu: the %zu graphs do not cut into shards of a multiple "
        "of %zu graphs)\n",
        S, G, routes.size());
    return;
  }
  const std::size_t Gs = G / S, Hs = Gs * group, Q = G * group;
  std::vector<std::int64_t> offsets(Gs + 1);
  for (std::size_t g = 0; g <= Gs; ++g) offsets[g] = std::int64_t(g * n);
  dev<std::int64_t> doff(Gs + 1);
  KVSIFT_CUDA_CHECK(cudaMemcpy(doff.p, offsets.data(), (Gs + 1) * 8, cudaMemcpyHostToDevice));
  std::vector<std::unique_ptr<device_routes>> dr;
  std::vector<cudaStream_t> streams(S);
  std::vector<cudaEvent_t> joins(S);
  cudaEvent_t fork = nullptr;
  KVSIFT_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  std::vector<kc::decode_step_shard<__half>> args;
  dev<float> o(Q * d), lse(Q);
  std::size_t ws_each = 0;
  for (std::size_t i = 0; i < S; ++i) {
    KVSIFT_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
    KVSIFT_CUDA_CHECK(cudaEventCreateWithFlags(&joins[i], cudaEventDisableTiming));
    dr.push_back(std::make_unique<device_routes>(routes, C, Gs, d));
    kc::decode_step_shard<__half> a;
    const std::size_t g0 = i * Gs;
    a.set = {set.adjacency + g0 * n * std::size_t(set.width),
             doff.p,
             set.entries + g0 * std::size_t(set.max_entries),
             int(Gs),
             set.width,
             set.max_entries,
             set.max_keys};
    a.kv = kv;
    a.kv.page_table = kv.page_table + g0 * std::size_t(kv.max_pages_per_head);
    a.kv.num_kv_heads = int(Gs);
    a.q = q + g0 * group * d;
    a.num_qo_heads = int(Hs);
    a.out_o = o.p + g0 * group * d;
    a.out_lse = lse.p + g0 * group;
    a.stream = streams[i];
    a.routes = kc::decode_step_routes<__half>{dr.back()->ref, route_p};
    a.workspace_bytes = kc::decode_step_workspace_size(a.set, int(Hs), int(d), p, *a.routes);
    ws_each = std::max(ws_each, (a.workspace_bytes + 255) / 256 * 256);
    args.push_back(a);
  }
  dev<char> ws(S * ws_each);
  for (std::size_t i = 0; i < S; ++i) args[i].workspace = ws.p + i * ws_each;
  // The shards' streams fork from and join `s`, so that the events on `s` time the whole call.
  auto sharded = [&](cudaStream_t s) {
    KVSIFT_CUDA_CHECK(cudaEventRecord(fork, s));
    for (cudaStream_t st : streams) KVSIFT_CUDA_CHECK(cudaStreamWaitEvent(st, fork));
    kc::decode_step_sharded<__half>(args, int(d), p);
    for (std::size_t i = 0; i < S; ++i) {
      KVSIFT_CUDA_CHECK(cudaEventRecord(joins[i], streams[i]));
      KVSIFT_CUDA_CHECK(cudaStreamWaitEvent(s, joins[i]));
    }
  };
  float one_ms[2], shard_ms[2];
  for (int round = 0; round < 2; ++round) {
    one_ms[round] = kvsift::cuda_bench::median_ms(single, stream, 2, 10);
    shard_ms[round] = kvsift::cuda_bench::median_ms(sharded, stream, 2, 10);
  }
  single(stream);
  sharded(stream);
  KVSIFT_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> a(Q * d), b(Q * d), la(Q), lb(Q);
  KVSIFT_CUDA_CHECK(cudaMemcpy(a.data(), single_o, Q * d * 4, cudaMemcpyDeviceToHost));
  KVSIFT_CUDA_CHECK(cudaMemcpy(b.data(), o.p, Q * d * 4, cudaMemcpyDeviceToHost));
  KVSIFT_CUDA_CHECK(cudaMemcpy(la.data(), single_lse, Q * 4, cudaMemcpyDeviceToHost));
  KVSIFT_CUDA_CHECK(cudaMemcpy(lb.data(), lse.p, Q * 4, cudaMemcpyDeviceToHost));
  double diff = 0;
  for (std::size_t i = 0; i < Q * d; ++i) diff = std::max(diff, double(std::fabs(a[i] - b[i])));
  for (std::size_t i = 0; i < Q; ++i) diff = std::max(diff, double(std::fabs(la[i] - lb[i])));
  std::printf(
      "  decode_step_sharded with routes, %zu shards of %zu graphs on device 0 (own streams and "
      "routing sets): %.3f / %.3f ms against %.3f / %.3f ms for the one call, alternated: "
      "%.2fx / %.2fx; largest |o or lse difference| from the one call %.2e\n",
      S, Gs, shard_ms[0], shard_ms[1], one_ms[0], one_ms[1], one_ms[0] / shard_ms[0],
      one_ms[1] / shard_ms[1], diff);
  for (std::size_t i = 0; i < S; ++i) {
    KVSIFT_CUDA_CHECK(cudaEventDestroy(joins[i]));
    KVSIFT_CUDA_CHECK(cudaStreamDestroy(streams[i]));
  }
  KVSIFT_CUDA_CHECK(cudaEventDestroy(fork));
}

struct options {
  std::size_t n = 131072, d = 128, requests = 32, kv_heads = 8, group = 4, distinct = 2, page = 16;
  std::size_t quick = 0;      // 1: only the wide top-k walks, no DIPR (iterating on the kernel)
  std::size_t dipr_only = 0;  // 1: only the DIPR rows of the sweep, no decode step
  std::string dipr_caps = "8192";  // DIPR max_results swept (bounds the flat queries' walks)
  std::size_t dipr_step = 0;       // 1: DIPR decode steps after the top-k one
  std::string dipr_hops = "0";     // DIPR max_hops of those steps (0 = no cap)
  std::size_t step_expand = 0, step_L = 256, step_hops = 0;  // the step's setting, when given
  double build_expand = kvsift::roargraph_params{}.connectivity_expand_fraction;
  std::size_t warps = 0;  // top-k warps per search (decode_search_params::warps_per_search)
  // Routed seeds (route_seeds.cuh): routing rows per graph (0: none), routes taken per query,
  // and the searches run from them as L:expand_limit:max_hops[:expand_width] (the width by
  // default --step-expand's, else 8). Clusters of the routing rows (kvsift::cluster_routes; 0:
  // flat, every row scored) and clusters probed per query.
  std::size_t route = 0;
  std::string route_top = "4,8";
  std::string route_clusters = "0";
  std::string route_probe = "4";
  std::string route_settings = "128:96:0,160:80:0,160:120:0,200:100:0,200:150:0";
  std::string step_route;  // C:P:top:L:E[:hops[:width]],...; empty: no routed step
  // Shard counts (each >= 2): each routed step also runs as decode_step_sharded over that many
  // shards of the graphs on device 0, each with its own stream and routing sets, against the
  // one call.
  std::string step_route_shards;
};

}  // namespace

int main(int argc, char** argv) {
  options o;
  kvsift::cuda_bench::parse_options(
      argc, argv,
      {kvsift::cuda_bench::size_option("--n", o.n),
       kvsift::cuda_bench::size_option("--d", o.d),
       kvsift::cuda_bench::size_option("--requests", o.requests),
       kvsift::cuda_bench::size_option("--kv-heads", o.kv_heads),
       kvsift::cuda_bench::size_option("--group", o.group),
       kvsift::cuda_bench::size_option("--distinct", o.distinct),
       kvsift::cuda_bench::size_option("--page", o.page),
       kvsift::cuda_bench::size_option("--quick", o.quick),
       kvsift::cuda_bench::size_option("--dipr-only", o.dipr_only),
       kvsift::cuda_bench::string_option("--dipr-caps", o.dipr_caps),
       kvsift::cuda_bench::size_option("--dipr-step", o.dipr_step),
       kvsift::cuda_bench::string_option("--dipr-hops", o.dipr_hops),
       kvsift::cuda_bench::size_option("--step-expand", o.step_expand),
       kvsift::cuda_bench::size_option("--step-L", o.step_L),
       kvsift::cuda_bench::size_option("--step-hops", o.step_hops),
       kvsift::cuda_bench::double_option("--build-expand", o.build_expand),
       kvsift::cuda_bench::size_option("--warps", o.warps),
       kvsift::cuda_bench::size_option("--route", o.route),
       kvsift::cuda_bench::string_option("--route-top", o.route_top),
       kvsift::cuda_bench::string_option("--route-clusters", o.route_clusters),
       kvsift::cuda_bench::string_option("--route-probe", o.route_probe),
       kvsift::cuda_bench::string_option("--route-settings", o.route_settings),
       kvsift::cuda_bench::string_option("--step-route", o.step_route),
       kvsift::cuda_bench::string_option("--step-route-shards", o.step_route_shards)});
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  kvsift::cuda_bench::bench_setup setup;
  if (!kvsift::cuda_bench::start_bench(setup)) return 0;
  cudaStream_t stream = setup.stream;
  const std::size_t n = o.n, d = o.d;
  const std::size_t G = o.requests * o.kv_heads;                  // graphs
  const std::size_t Q = o.requests * o.kv_heads * o.group;        // queries
  const std::size_t per_set = (G + o.distinct - 1) / o.distinct;  // eval queries per member

  // 1. Key sets and their GQA-shared indexes (GPU build).
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<kvsift::half>> keys16(o.distinct);
  std::vector<std::vector<float>> eval(o.distinct);  // [member][per_set][d] per key set
  std::vector<std::vector<id_t>> adj(o.distinct);
  std::vector<std::vector<id_t>> entries(o.distinct);
  std::vector<kvsift::route_set> routes(o.distinct);
  const std::size_t route_list = 100;
  std::size_t width = 0;
  double build_s = 0;
  for (std::size_t s = 0; s < o.distinct; ++s) {
    auto set = kvsift::cuda_bench::build_gqa_key_set(n, per_set, d, o.group, 100 + s,
                                                     o.build_expand, o.route, route_list);
    routes[s] = std::move(set.routes);
    build_s += set.build_seconds;
    width = set.width;
    keys16[s] = std::move(set.keys16);
    eval[s] = std::move(set.eval);
    adj[s] = std::move(set.adjacency);
    entries[s] = std::move(set.entries);
  }
  std::printf(
      "data + %zu GPU builds: %.1f s (builds %.1f s, step-3 expand fraction %.2f); %zu graphs x "
      "%zu keys x d=%zu, width %zu\n",
      o.distinct, seconds_since(t0), build_s, o.build_expand, G, n, d, width);

  // 2. Device copies: graph g is key set g % distinct, in its own memory.
  const std::size_t max_entries = kvsift::max_entry_points;
  dev<__half> dkeys(G * n * d);
  dev<id_t> dadj(G * n * width), dent(G * max_entries);
  std::vector<std::int64_t> offsets(G + 1);
  std::vector<id_t> ent_all(G * max_entries, kvsift::invalid_id);
  for (std::size_t g = 0; g <= G; ++g) offsets[g] = static_cast<std::int64_t>(g * n);
  for (std::size_t g = 0; g < G; ++g) {
    const std::size_t s = g % o.distinct;
    if (g < o.distinct) {
      KVSIFT_CUDA_CHECK(
          cudaMemcpy(dkeys.p + g * n * d, keys16[s].data(), n * d * 2, cudaMemcpyHostToDevice));
      KVSIFT_CUDA_CHECK(
          cudaMemcpy(dadj.p + g * n * width, adj[s].data(), n * width * 4, cudaMemcpyHostToDevice));
    } else {
      KVSIFT_CUDA_CHECK(cudaMemcpy(dkeys.p + g * n * d, dkeys.p + s * n * d, n * d * 2,
                                   cudaMemcpyDeviceToDevice));
      KVSIFT_CUDA_CHECK(cudaMemcpy(dadj.p + g * n * width, dadj.p + s * n * width, n * width * 4,
                                   cudaMemcpyDeviceToDevice));
    }
    std::copy(entries[s].begin(), entries[s].end(), ent_all.begin() + g * max_entries);
  }
  dev<std::int64_t> doff(G + 1);
  KVSIFT_CUDA_CHECK(cudaMemcpy(doff.p, offsets.data(), (G + 1) * 8, cudaMemcpyHostToDevice));
  KVSIFT_CUDA_CHECK(cudaMemcpy(dent.p, ent_all.data(), ent_all.size() * 4, cudaMemcpyHostToDevice));

  // Paged copy of the same keys: pages of each graph in a shuffled order over one pool.
  const std::size_t pages_per = (n + o.page - 1) / o.page;
  const std::size_t pages = G * pages_per;
  std::vector<std::int32_t> table(pages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937_64(7));
  dev<__half> dpool(pages * o.page * d);
  {
    std::vector<std::int64_t> src(pages), dst(pages);
    for (std::size_t i = 0; i < pages; ++i) {
      // (Page i is page i % pages_per of graph i / pages_per: its last page may be partial.)
      KVSIFT_CUDA_CHECK(
          cudaMemcpyAsync(dpool.p + std::size_t(table[i]) * o.page * d,
                          dkeys.p + ((i / pages_per) * n + (i % pages_per) * o.page) * d,
                          std::min(o.page, n - (i % pages_per) * o.page) * d * 2,
                          cudaMemcpyDeviceToDevice, stream));
    }
    KVSIFT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  dev<std::int32_t> dtable(pages);
  KVSIFT_CUDA_CHECK(cudaMemcpy(dtable.p, table.data(), pages * 4, cudaMemcpyHostToDevice));
  kc::paged_kv_ref<__half> kv{dpool.p,  dpool.p, std::int64_t(pages), int(o.page), int(d),
                              dtable.p, int(G),  int(pages_per)};

  // 3. Queries: request r, query head j searches graph r * kv_heads + j / group with eval query
  // (g / distinct) of group member j % group of its key set.
  std::vector<float> qh(Q * d);
  std::vector<std::int32_t> qg(Q);
  for (std::size_t r = 0; r < o.requests; ++r) {
    for (std::size_t j = 0; j < o.kv_heads * o.group; ++j) {
      const std::size_t i = r * o.kv_heads * o.group + j;
      const std::size_t g = r * o.kv_heads + j / o.group;
      const std::size_t s = g % o.distinct, member = j % o.group, e = g / o.distinct;
      qg[i] = static_cast<std::int32_t>(g);
      std::copy_n(eval[s].begin() + (member * per_set + e) * d, d, qh.begin() + i * d);
    }
  }
  dev<float> dq(Q * d);
  dev<std::int32_t> dqg(Q);
  KVSIFT_CUDA_CHECK(cudaMemcpy(dq.p, qh.data(), Q * d * 4, cudaMemcpyHostToDevice));
  KVSIFT_CUDA_CHECK(cudaMemcpy(dqg.p, qg.data(), Q * 4, cudaMemcpyHostToDevice));

  // 4. Exact top-100 per query (GPU kNN over its graph's keys, f16 queries), the oracle and the
  // exact-scan baseline: one knn call per graph with that graph's query heads.
  const int K = 100;
  std::vector<id_t> exact(Q * K);
  dev<kvsift::half> dq16(Q * d);
  {
    std::vector<kvsift::half> q16(Q * d);
    for (std::size_t i = 0; i < Q * d; ++i) q16[i] = kvsift::half(qh[i]);
    KVSIFT_CUDA_CHECK(cudaMemcpy(dq16.p, q16.data(), Q * d * 2, cudaMemcpyHostToDevice));
  }
  const auto* keys_h = reinterpret_cast<const kvsift::half*>(dkeys.p);
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return 1;
  const std::size_t knn_ws = kc::knn_workspace_size(std::int64_t(o.group), std::int64_t(n), K);
  dev<char> dknn_ws(knn_ws);
  dev<float> dks(Q * K);
  dev<id_t> dki(Q * K);
  auto exact_scan = [&](cudaStream_t s) {
    for (std::size_t g = 0; g < G; ++g) {
      // The query heads of graph g are rows [g * group, (g + 1) * group) (row order r, j).
      kc::knn(matrix_view<const kvsift::half>(dq16.p + g * o.group * d, o.group, d),
              matrix_view<const kvsift::half>(keys_h + g * n * d, n, d), K, dks.p + g * o.group * K,
              dki.p + g * o.group * K, dknn_ws.p, knn_ws, handle, s);
    }
  };
  exact_scan(stream);
  KVSIFT_CUDA_CHECK(cudaStreamSynchronize(stream));
  KVSIFT_CUDA_CHECK(cudaMemcpy(exact.data(), dki.p, Q * K * 4, cudaMemcpyDeviceToHost));
  const float exact_ms = kvsift::cuda_bench::median_ms(exact_scan, stream, 1, 5);
  const double key_bytes = double(G) * double(n) * double(d) * 2.0;
  // copy_gbps counts bytes read plus written; a kernel that only reads moves its bytes at that
  // rate (torch SDPA reads K+V at 103% of it on the H200), so that is the floor of a scan.
  const double floor_ms = key_bytes / (setup.copy_gbps * 1e9) * 1e3;
  std::printf(
      "baselines: exact GPU top-%d (kvsift::cuda::knn per graph) %.3f ms; reading all %.2f GB "
      "of keys once at the copy bandwidth %.3f ms\n",
      K, exact_ms, key_bytes / 1e9, floor_ms);

  // Share of the exact top-K of every query among the first counts[i] ids of row i of `ids`
  // (all `ld` of them without counts).
  auto recall_of = [&](const std::vector<id_t>& ids, std::size_t ld,
                       const std::vector<std::uint32_t>* counts) {
    std::size_t hit = 0;
    for (std::size_t i = 0; i < Q; ++i) {
      const std::size_t c = counts != nullptr ? std::min<std::size_t>((*counts)[i], ld) : ld;
      std::vector<id_t> got(ids.begin() + i * ld, ids.begin() + i * ld + c);
      std::sort(got.begin(), got.end());
      for (int j = 0; j < K; ++j)
        hit += std::binary_search(got.begin(), got.end(), exact[i * K + j]);
    }
    return double(hit) / double(Q * K);
  };

  // 5. decode_search sweep.
  kc::graph_set_ref set{dadj.p,     doff.p,           dent.p,         int(G),
                        int(width), int(max_entries), std::int64_t(n)};
  kc::decode_queries qs{dq.p, std::int64_t(d), dqg.p};
  const int cap_max = 8192;
  dev<id_t> oids(Q * cap_max);
  dev<float> oscores(Q * cap_max);
  dev<std::uint32_t> ocounts(Q), oscored(Q), ostatus(1);
  KVSIFT_CUDA_CHECK(cudaMemset(ostatus.p, 0, 4));
  kc::decode_search_outputs out{oids.p, oscores.p, ocounts.p, nullptr, oscored.p, ostatus.p};
  // The last search's ids ([Q][ld]), result counts and keys scored, after the stream drains.
  struct results {
    std::vector<id_t> ids;
    std::vector<std::uint32_t> counts, scored;
  };
  auto download = [&](std::size_t ld) {
    KVSIFT_CUDA_CHECK(cudaStreamSynchronize(stream));
    results r{std::vector<id_t>(Q * ld), std::vector<std::uint32_t>(Q),
              std::vector<std::uint32_t>(Q)};
    KVSIFT_CUDA_CHECK(cudaMemcpy(r.ids.data(), oids.p, r.ids.size() * 4, cudaMemcpyDeviceToHost));
    KVSIFT_CUDA_CHECK(cudaMemcpy(r.counts.data(), ocounts.p, Q * 4, cudaMemcpyDeviceToHost));
    KVSIFT_CUDA_CHECK(cudaMemcpy(r.scored.data(), oscored.p, Q * 4, cudaMemcpyDeviceToHost));
    return r;
  };
  std::printf("\n%-28s %6s %10s %12s %10s %10s %10s\n", "search", "L", "recall@100", "scored/query",
              "paged ms", "dense ms", "x exact");
  // The fastest top-k setting (paged keys) that reaches recall@100 0.95: the decode step uses it.
  kc::decode_search_params chosen;
  float chosen_ms = 1e30f;
  auto run = [&](kc::decode_search_params p, const char* label, int L) {
    if (p.mode == kc::decode_search_mode::topk) p.warps_per_search = int(o.warps);
    const std::size_t wb = kc::decode_search_workspace_size(set, std::int64_t(Q), p);
    dev<char> ws(wb);
    const int cap = kc::decode_search_capacity(p);
    auto paged = [&](cudaStream_t s) {
      kc::decode_search(set, kv, qs, std::int64_t(Q), p, out, ws.p, wb, s);
    };
    auto dense = [&](cudaStream_t s) {
      kc::decode_search(set, kc::dense_keys_ref<__half>{dkeys.p, std::int64_t(d), int(d)}, qs,
                        std::int64_t(Q), p, out, ws.p, wb, s);
    };
    const float dense_ms = kvsift::cuda_bench::median_ms(dense, stream, 2, 10);
    const float paged_ms = kvsift::cuda_bench::median_ms(paged, stream, 2, 10);
    const auto [ids, counts, scored] = download(std::size_t(cap));
    const double recall = recall_of(ids, std::size_t(cap), &counts);
    double sc = 0, found = 0;
    for (std::size_t i = 0; i < Q; ++i) {
      sc += scored[i];
      found += counts[i];
    }
    std::vector<std::uint32_t> sorted_scored(scored.begin(), scored.end());
    std::sort(sorted_scored.begin(), sorted_scored.end());
    std::printf(
        "%-28s %6d %10.4f %12.0f %10.3f %10.3f %10.1f   (%.0f results/query; scored p50 "
        "%u p90 %u p99 %u max %u)\n",
        label, L, recall, sc / double(Q), paged_ms, dense_ms, exact_ms / paged_ms,
        found / double(Q), sorted_scored[Q / 2], sorted_scored[Q * 9 / 10],
        sorted_scored[Q * 99 / 100], sorted_scored[Q - 1]);
    if (p.mode == kc::decode_search_mode::dipr) {
      std::size_t at_cap = 0;
      for (std::size_t i = 0; i < Q; ++i) at_cap += counts[i] >= std::uint32_t(cap);
      std::printf("%-28s %6s %zu of %zu searches returned max_results = %d ids\n", "", "", at_cap,
                  Q, cap);
    }
    if (p.mode == kc::decode_search_mode::topk && recall >= 0.95 && paged_ms < chosen_ms) {
      chosen = p;
      chosen_ms = paged_ms;
    }
  };
  // The step's setting when given (--step-expand): measured alone, no sweep.
  const bool given = o.step_expand != 0;
  if (given) {
    kc::decode_search_params p;
    p.k = K;
    p.L = int(o.step_L);
    p.expand_width = int(o.step_expand);
    p.max_hops = int(o.step_hops);
    p.warps_per_search = int(o.warps);
    char label[64];
    std::snprintf(label, sizeof label, "top-100 expand %d hops %d", p.expand_width, p.max_hops);
    run(p, label, p.L);
    chosen = p;  // whatever its recall (printed above)
  } else {       // the sweep: every setting below
    // (expand_width, degree_cap): the CPU walk, wider expansions, then wide expansions over the
    // sparser subgraph a degree cap reads (the rows' first neighbours).
    const std::pair<int, int> walks[] = {{1, 0},  {2, 0},  {4, 0},  {8, 0}, {16, 0},
                                         {32, 0}, {8, 40}, {8, 32}, {8, 24}};
    for (const auto& [expand, degree_cap] : walks) {
      if (o.dipr_only != 0) break;
      if (o.quick != 0 && (expand < 4 || degree_cap != 0)) continue;
      for (const int L : {100, 128, 160, 200, 224, 256, 320, 400}) {
        kc::decode_search_params p;
        p.k = K;
        p.L = L;
        p.expand_width = expand;
        p.degree_cap = degree_cap;
        char label[64];
        std::snprintf(label, sizeof label, "top-100 expand %d cap %d", expand, degree_cap);
        run(p, label, L);
      }
    }
    // Wider pools with a cap on the nodes expanded (decode_search_params::max_hops), in steps of
    // expand_width nodes: the launch waits for its slowest search, which the cap cuts.
    const int capped[][4] = {{8, 256, 30, 37},  {8, 320, 30, 37},  {16, 256, 15, 18},
                             {16, 320, 15, 18}, {16, 400, 15, 18}, {24, 256, 11, 14},
                             {24, 320, 11, 14}, {32, 256, 9, 12},  {32, 320, 9, 12},
                             {32, 400, 9, 12},  {12, 256, 20, 23}};
    for (const auto& [w, L, s0, s1] : capped) {
      if (o.dipr_only != 0) break;
      for (int steps = s0; steps <= s1; ++steps) {
        kc::decode_search_params p;
        p.k = K;
        p.L = L;
        p.expand_width = w;
        p.max_hops = steps * w;
        char label[64];
        std::snprintf(label, sizeof label, "top-100 expand %d hops %d", w, steps * w);
        run(p, label, L);
      }
    }
    for (const std::string& item : kvsift::cuda_bench::split_list(o.dipr_caps)) {
      const int dipr_cap = std::stoi(item);
      for (const int expand : {1, 4, 8}) {
        if (o.quick != 0) break;
        for (const float beta : {0.5f, 1.0f, 1.5f}) {
          kc::decode_search_params p;
          p.mode = kc::decode_search_mode::dipr;
          p.beta = beta;
          p.l0 = 100;
          p.max_results = std::min(dipr_cap, cap_max);
          p.expand_width = expand;
          char label[64];
          std::snprintf(label, sizeof label, "DIPR beta %.1f cap %d expand %d", beta, p.max_results,
                        expand);
          run(p, label, 100);
        }
      }
    }
  }
  // Routed seeds: route_seeds (every query against its graph's routing rows, a GQA group per
  // block, or with clusters its probed clusters' rows) then the search from those seeds with an
  // expand limit, timed together; the routing alone is timed too. Graph g's routing rows are key
  // set g % distinct's.
  if (o.route != 0 && o.dipr_only == 0) {
    for (const std::string& clusters_item : kvsift::cuda_bench::split_list(o.route_clusters)) {
      const std::size_t C = std::stoul(clusters_item);
      const device_routes dr(routes, C, G, d);
      const kvsift::route_set_stack& st = dr.stack;
      const std::size_t R = st.max_rows;
      const int max_clusters = int(st.max_clusters), max_cluster_rows = int(st.max_cluster_rows);
      const kc::route_set_ref<__half>& ref = dr.ref;
      std::printf(
          "\nrouted seeds: %zu routing rows per graph (unit-norm training queries, f16), lists of "
          "their exact top-%zu; %s\n",
          R, route_list, C == 0 ? "every row scored" : "clustered");
      if (C != 0) {
        std::printf("clusters: %d at most per graph (%zu asked), of at most %d rows; probe %s\n",
                    max_clusters, C, max_cluster_rows, o.route_probe.c_str());
      }
      const std::vector<std::string> probes =
          C == 0 ? std::vector<std::string>{"0"} : kvsift::cuda_bench::split_list(o.route_probe);
      for (const std::string& probe_item : probes) {
        for (const std::string& top_item : kvsift::cuda_bench::split_list(o.route_top)) {
          kc::route_params rp;
          rp.top = std::stoi(top_item);
          rp.group = int(o.group);
          rp.probe = std::stoi(probe_item);
          const int sld = kc::route_seeds_ld(int(route_list), rp);
          dev<id_t> dseeds(Q * std::size_t(sld));
          auto route = [&](cudaStream_t s) {
            kc::route_seeds(ref, qs, std::int64_t(Q), rp, dseeds.p, ostatus.p, s);
          };
          const float route_ms = kvsift::cuda_bench::median_ms(route, stream, 2, 10);
          // Seed recall: the share of the exact top-100 among the seeds.
          route(stream);
          KVSIFT_CUDA_CHECK(cudaStreamSynchronize(stream));
          std::vector<id_t> seeds(Q * std::size_t(sld));
          KVSIFT_CUDA_CHECK(
              cudaMemcpy(seeds.data(), dseeds.p, seeds.size() * 4, cudaMemcpyDeviceToHost));
          std::printf("route top %d probe %d: %.3f ms, exact top-100 among the seeds %.4f\n",
                      rp.top, rp.probe, route_ms, recall_of(seeds, std::size_t(sld), nullptr));
          kc::decode_queries rqs = qs;
          rqs.seeds = dseeds.p;
          rqs.seeds_ld = sld;
          for (const std::string& item : kvsift::cuda_bench::split_list(o.route_settings)) {
            int L = 0, E = 0, hops = 0, w = o.step_expand != 0 ? int(o.step_expand) : 8;
            if (std::sscanf(item.c_str(), "%d:%d:%d:%d", &L, &E, &hops, &w) < 3) {
              std::fprintf(stderr, "--route-settings: expected L:E:hops[:width], got %s\n",
                           item.c_str());
              return 2;
            }
            kc::decode_search_params p;
            p.k = K;
            p.L = L;
            p.expand_limit = E;
            p.max_hops = hops;
            p.expand_width = w;
            p.warps_per_search = int(o.warps);
            const std::size_t wb = kc::decode_search_workspace_size(set, std::int64_t(Q), p);
            dev<char> ws(wb);
            auto search = [&](cudaStream_t s) {
              kc::decode_search(set, kv, rqs, std::int64_t(Q), p, out, ws.p, wb, s);
            };
            auto both = [&](cudaStream_t s) {
              route(s);
              search(s);
            };
            const float search_ms = kvsift::cuda_bench::median_ms(search, stream, 2, 10);
            const float both_ms = kvsift::cuda_bench::median_ms(both, stream, 2, 10);
            const auto [ids, counts, scored] = download(std::size_t(K));
            const double recall = recall_of(ids, std::size_t(K), &counts);
            double sc = 0;
            for (const std::uint32_t x : scored) sc += x;
            std::printf(
                "routed top %d probe %d expand %d L %d E %d hops %d: recall@100 %.4f, "
                "scored/query %.0f, route + search %.3f ms (search %.3f, route %.3f)\n",
                rp.top, rp.probe, p.expand_width, L, E, hops, recall, sc / double(Q), both_ms,
                search_ms, route_ms);
          }
        }
      }
    }
  }
  if (o.dipr_only != 0) {
    cublasDestroy(handle);
    return 0;
  }
  // 6. The composed decode step (window 512 + 4 sinks + top-100 at the chosen setting)
  // against full attention over every token with kvsift's own sparse_attention (all tokens
  // listed), same queries, same paged K/V, and the output's distance to full attention. V
  // aliases K, whose common mean dominates every token's value, so that distance is a
  // consistency check, not attention quality: attention over these keys is flat, and the
  // retrieved tokens hold a small share of its mass (docs/decode_search.md).
  {
    kc::decode_step_params sp;
    sp.search = chosen;
    const std::size_t wb = kc::decode_step_workspace_size(set, int(Q), int(d), sp);
    dev<char> ws(wb);
    dev<float> o1(Q * d), l1(Q), o2(Q * d), l2(Q);
    auto step = [&](cudaStream_t s) {
      kc::decode_step(set, kv, dq.p, int(Q), int(d), o1.p, l1.p, ws.p, wb, s, sp, ostatus.p);
    };
    std::vector<std::int64_t> indptr(Q + 1);
    for (std::size_t i = 0; i <= Q; ++i) indptr[i] = std::int64_t(i * n);
    std::vector<std::int32_t> all(n);
    std::iota(all.begin(), all.end(), 0);
    dev<std::int64_t> dind(Q + 1);
    dev<std::int32_t> dall(Q * n);
    KVSIFT_CUDA_CHECK(cudaMemcpy(dind.p, indptr.data(), (Q + 1) * 8, cudaMemcpyHostToDevice));
    for (std::size_t i = 0; i < Q; ++i) {
      KVSIFT_CUDA_CHECK(cudaMemcpy(dall.p + i * n, all.data(), n * 4, cudaMemcpyHostToDevice));
    }
    const std::size_t awb = kc::sparse_attention_workspace_size(int(Q), int(d));
    dev<char> aws(awb);
    auto full = [&](cudaStream_t s) {
      kc::sparse_attention(dq.p, int(Q), int(d), kv, dind.p, dall.p, o2.p, l2.p, aws.p, awb, s);
    };
    const float step_ms = kvsift::cuda_bench::median_ms(step, stream, 2, 10);
    const float full_ms = kvsift::cuda_bench::median_ms(full, stream, 2, 10);
    // Relative L2 error of the step's output o1 against full attention's o2.
    std::vector<float> a(Q * d), b(Q * d);
    KVSIFT_CUDA_CHECK(cudaMemcpy(b.data(), o2.p, Q * d * 4, cudaMemcpyDeviceToHost));
    auto step_error = [&] {
      KVSIFT_CUDA_CHECK(cudaMemcpy(a.data(), o1.p, Q * d * 4, cudaMemcpyDeviceToHost));
      double num = 0, den = 0;
      for (std::size_t i = 0; i < Q * d; ++i) {
        num += (a[i] - b[i]) * double(a[i] - b[i]);
        den += double(b[i]) * b[i];
      }
      return std::sqrt(num / den);
    };
    const double step_err = step_error();
    const double full_bytes = 2.0 * double(G) * double(n) * double(d) * 2.0;
    std::printf(
        "\ndecode step (%zu requests x %zu query heads, %zu tokens each): kvsift window 512 + "
        "4 sinks + top-100 (L %d, expand_width %d, degree_cap %d, max_hops %d: the fastest at "
        "recall@100 >= 0.95 above, or as given) %.3f "
        "ms; full attention (sparse_attention "
        "over all tokens) %.3f ms = %.1f%% of copy bandwidth; speedup %.2fx; relative output "
        "error %.2e (V = K: a consistency check, not quality)\n",
        o.requests, o.kv_heads * o.group, n, chosen.L, chosen.expand_width, chosen.degree_cap,
        chosen.max_hops, step_ms, full_ms,
        100.0 * full_bytes / (full_ms * 1e-3) / (setup.copy_gbps * 1e9), full_ms / step_ms,
        step_err);
    // The same step without walking through window tokens met by the walk (walk_through =
    // false: each step of the walk is one batch): time and output error.
    kc::decode_step_params sp2 = sp;
    sp2.search.walk_through = false;
    auto step2 = [&](cudaStream_t s) {
      kc::decode_step(set, kv, dq.p, int(Q), int(d), o1.p, l1.p, ws.p, wb, s, sp2, ostatus.p);
    };
    const float step2_ms = kvsift::cuda_bench::median_ms(step2, stream, 2, 10);
    std::printf(
        "decode step, walk_through = false: %.3f ms (%.2fx the step above); speedup over full "
        "attention %.2fx; relative output error %.2e (V = K)\n",
        step2_ms, step_ms / step2_ms, full_ms / step2_ms, step_error());

    // The step with routes, for each --step-route setting: one routing launch, the search from
    // the routed seeds with an expand limit, the attention. Timed alternated with the step
    // without routes (sp2) in this run; the retrieved ids of both (for recall) from one more
    // step with a carry of invalid ids, which seeds nothing (the same search). Recall as the
    // filtered search's below: of the exact top-100 ids outside the window.
    // The step's filter: the tokens between the sinks and the window, [lo, hi), in every query.
    const std::uint32_t lo = std::uint32_t(sp.sink);
    const std::uint32_t hi = std::uint32_t(std::max<std::size_t>(n - std::size_t(sp.window), lo));
    auto middle_recall_of = [&](const std::vector<id_t>& ids, std::size_t ld) {
      std::size_t hit = 0, want = 0;
      for (std::size_t i = 0; i < Q; ++i) {
        std::vector<id_t> mine(ids.begin() + i * ld, ids.begin() + (i + 1) * ld);
        std::sort(mine.begin(), mine.end());
        for (int j = 0; j < K; ++j) {
          const id_t e = exact[i * K + j];
          if (e < lo || e >= hi) continue;
          ++want;
          hit += std::binary_search(mine.begin(), mine.end(), e) ? 1 : 0;
        }
      }
      return want == 0 ? 1.0 : double(hit) / double(want);
    };
    const std::vector<std::string> step_routes = o.step_route.empty() || o.route == 0
                                                     ? std::vector<std::string>{}
                                                     : kvsift::cuda_bench::split_list(o.step_route);
    const std::vector<std::string> route_shards =
        o.step_route_shards.empty() ? std::vector<std::string>{}
                                    : kvsift::cuda_bench::split_list(o.step_route_shards);
    for (const std::string& item : step_routes) {
      std::size_t C = 0;
      int P = 0, top = 4, L = 128, E = 24, hops = 0, w = 8;
      if (std::sscanf(item.c_str(), "%zu:%d:%d:%d:%d:%d:%d", &C, &P, &top, &L, &E, &hops, &w) < 5) {
        std::fprintf(stderr, "--step-route: expected C:P:top:L:E[:hops[:width]], got %s\n",
                     item.c_str());
        return 2;
      }
      const device_routes dr(routes, C, G, d);
      kc::decode_step_routes<__half> rt{dr.ref, {}};
      rt.params.top = top;
      rt.params.group = int(o.group);
      rt.params.probe = P;
      kc::decode_step_params rp = sp2;
      rp.search.L = L;
      rp.search.expand_limit = E;
      rp.search.max_hops = hops;
      rp.search.expand_width = w;
      const std::size_t rwb = kc::decode_step_workspace_size(set, int(Q), int(d), rp, rt);
      dev<char> rws(rwb);
      const std::size_t cap = std::size_t(kc::decode_search_capacity(rp.search));
      dev<id_t> carry(Q * cap);
      auto routed = [&](cudaStream_t s) {
        kc::decode_step(set, rt, kv, dq.p, int(Q), int(d), o1.p, l1.p, rws.p, rwb, s, rp,
                        ostatus.p);
      };
      float plain_ms[2], routed_ms[2];
      for (int round = 0; round < 2; ++round) {
        plain_ms[round] = kvsift::cuda_bench::median_ms(step2, stream, 2, 10);
        routed_ms[round] = kvsift::cuda_bench::median_ms(routed, stream, 2, 10);
      }
      auto retrieved = [&] {
        KVSIFT_CUDA_CHECK(cudaStreamSynchronize(stream));
        std::vector<id_t> ids(Q * cap);
        KVSIFT_CUDA_CHECK(cudaMemcpy(ids.data(), carry.p, ids.size() * 4, cudaMemcpyDeviceToHost));
        return ids;
      };
      KVSIFT_CUDA_CHECK(cudaMemsetAsync(carry.p, 0xFF, Q * cap * sizeof(id_t), stream));
      kc::decode_step(set, kv, dq.p, int(Q), int(d), o1.p, l1.p, ws.p, wb, stream, sp2, ostatus.p,
                      carry.p);
      const double plain_recall = middle_recall_of(retrieved(), cap);
      KVSIFT_CUDA_CHECK(cudaMemsetAsync(carry.p, 0xFF, Q * cap * sizeof(id_t), stream));
      kc::decode_step(set, rt, kv, dq.p, int(Q), int(d), o1.p, l1.p, rws.p, rwb, stream, rp,
                      ostatus.p, carry.p);
      const double routed_recall = middle_recall_of(retrieved(), cap);
      std::uint32_t bad = 0;
      KVSIFT_CUDA_CHECK(cudaMemcpy(&bad, ostatus.p, 4, cudaMemcpyDeviceToHost));
      std::printf(
          "decode step with routes (%zu routing rows per graph, %d clusters probe %d, top %d; L %d "
          "expand_limit %d max_hops %d expand_width %d): %.3f / %.3f ms against %.3f / %.3f ms "
          "for the step without routes (walk_through = false), alternated: %.2fx / %.2fx; "
          "speedup over full attention %.2fx; recall@100 of the exact top-100 outside the "
          "window %.4f against %.4f without routes; relative output error %.2e (V = K); status "
          "%u\n",
          std::size_t(dr.stack.max_rows), int(dr.stack.max_clusters), P, top, L, E, hops, w,
          routed_ms[0], routed_ms[1], plain_ms[0], plain_ms[1], plain_ms[0] / routed_ms[0],
          plain_ms[1] / routed_ms[1], full_ms / std::min(routed_ms[0], routed_ms[1]), routed_recall,
          plain_recall, step_error(), bad);
      for (const std::string& shards : route_shards) {
        sharded_routed_step(std::max<std::size_t>(2, std::stoul(shards)), routes, C, rt.params, rp,
                            set, kv, dq.p, d, o.group, stream, routed, o1.p, l1.p);
      }
    }

    // The step's filter [lo, hi) in every query, for its searches run alone below.
    std::vector<std::uint32_t> fl(Q, lo), fh(Q, hi);
    dev<std::uint32_t> dfl(Q), dfh(Q);
    KVSIFT_CUDA_CHECK(cudaMemcpy(dfl.p, fl.data(), Q * 4, cudaMemcpyHostToDevice));
    KVSIFT_CUDA_CHECK(cudaMemcpy(dfh.p, fh.data(), Q * 4, cudaMemcpyHostToDevice));
    kc::decode_queries fq{dq.p, std::int64_t(d), dqg.p};
    fq.filter_first = dfl.p;
    fq.filter_last = dfh.p;

    // DIPR steps (the step's sink and window, a DIPR search): a capped search (more keys
    // within beta than max_results, or a walk longer than max_hops: flat attention) attends
    // every token with dense_when_capped, its truncated answer without. Each (cap, hops,
    // beta) runs as before (unseeded, walking through window tokens) and seeded from the
    // window without the walk-through (decode_step_params::seed_from_window, walk_through =
    // false). Heads capped and tokens retrieved come from one untimed step of the same
    // parameters, through its `capped` and `carry` outputs.
    std::vector<std::pair<int, int>> dipr_caps;  // (max_results, max_hops)
    for (const std::string& c : kvsift::cuda_bench::split_list(o.dipr_caps)) {
      for (const std::string& h : kvsift::cuda_bench::split_list(o.dipr_hops)) {
        dipr_caps.emplace_back(std::min(std::stoi(c), cap_max), std::stoi(h));
      }
    }
    dev<std::uint32_t> dcap(Q);
    for (const auto& [max_results, max_hops] : dipr_caps) {
      if (o.dipr_step == 0) break;
      for (const float beta : {0.5f, 1.0f, 1.5f}) {
        for (const bool seeded : {false, true}) {
          kc::decode_step_params dp = sp;
          dp.search = {};
          dp.search.mode = kc::decode_search_mode::dipr;
          dp.search.beta = beta;
          dp.search.l0 = 100;
          dp.search.max_results = max_results;
          dp.search.max_hops = max_hops;
          dp.search.expand_width = 8;
          dp.search.walk_through = !seeded;
          dp.seed_from_window = seeded;
          const int capacity = kc::decode_search_capacity(dp.search);
          const double window_tokens = double(lo) + double(n - hi);
          double heads_capped = 0, attended_dense = 0, attended_plain = 0;
          {
            const std::size_t dwb = kc::decode_step_workspace_size(set, int(Q), int(d), dp);
            dev<char> dws(dwb);
            dev<id_t> carry(Q * std::size_t(capacity));
            KVSIFT_CUDA_CHECK(cudaMemset(carry.p, 0xff, Q * std::size_t(capacity) * 4));
            kc::decode_step(set, kv, dq.p, int(Q), int(d), o1.p, l1.p, dws.p, dwb, stream, dp,
                            ostatus.p, carry.p, dcap.p);
            KVSIFT_CUDA_CHECK(cudaStreamSynchronize(stream));
            std::vector<id_t> ids(Q * std::size_t(capacity));
            std::vector<std::uint32_t> capped(Q);
            KVSIFT_CUDA_CHECK(
                cudaMemcpy(ids.data(), carry.p, ids.size() * 4, cudaMemcpyDeviceToHost));
            KVSIFT_CUDA_CHECK(cudaMemcpy(capped.data(), dcap.p, Q * 4, cudaMemcpyDeviceToHost));
            for (std::size_t i = 0; i < Q; ++i) {
              double got = window_tokens;
              for (int j = 0; j < capacity; ++j)
                got += ids[i * std::size_t(capacity) + std::size_t(j)] != kvsift::invalid_id;
              heads_capped += capped[i];
              attended_plain += got;
              attended_dense += capped[i] != 0u ? double(n) : got;
            }
          }
          for (const bool dense : {true, false}) {
            dp.dense_when_capped = dense;
            const std::size_t dwb = kc::decode_step_workspace_size(set, int(Q), int(d), dp);
            dev<char> dws(dwb);
            auto dstep = [&](cudaStream_t s) {
              kc::decode_step(set, kv, dq.p, int(Q), int(d), o1.p, l1.p, dws.p, dwb, s, dp,
                              ostatus.p);
            };
            const float ms = kvsift::cuda_bench::median_ms(dstep, stream, 2, 10);
            std::printf(
                "decode step, window + DIPR beta %.1f cap %d hops %d expand 8%s, "
                "dense_when_capped %d: %.3f ms (speedup over full attention %.2fx); %.0f of %zu "
                "heads capped; %.0f tokens attended per head (%.2f%% of %zu); relative output "
                "error %.2e (V = K)\n",
                beta, max_results, max_hops, seeded ? ", seeded, no walk-through" : "", int(dense),
                ms, full_ms / ms, heads_capped, Q,
                (dense ? attended_dense : attended_plain) / double(Q),
                100.0 * (dense ? attended_dense : attended_plain) / double(Q) / double(n), n,
                step_error());
          }
        }
      }
    }

    // The step's stages, each timed alone over the step's own inputs: the search with the
    // window excluded by an id range, the CSR compaction, attention over the retrieved and
    // over the window tokens, the merge. Their sum next to the step shows what composing them
    // costs (the step also builds its per-head lists: one small kernel, not timed alone).
    // The search runs over the step's filter (fq, above).
    const int cap = kc::decode_search_capacity(chosen);
    dev<id_t> sids(Q * cap);
    dev<std::uint32_t> scounts(Q);
    kc::decode_search_outputs so{};
    so.ids = sids.p;
    so.counts = scounts.p;
    so.status = ostatus.p;
    const std::size_t swb = kc::decode_search_workspace_size(set, std::int64_t(Q), chosen);
    dev<char> sws(swb);
    dev<std::int64_t> rind(Q + 1), wind(Q + 1);
    dev<std::int32_t> rids(Q * cap);
    std::vector<std::int64_t> hwind(Q + 1, 0);
    std::vector<std::int32_t> hwids;
    for (std::size_t i = 0; i < Q; ++i) {
      for (std::uint32_t t = 0; t < lo; ++t) hwids.push_back(std::int32_t(t));
      for (std::size_t t = hi; t < n; ++t) hwids.push_back(std::int32_t(t));
      hwind[i + 1] = std::int64_t(hwids.size());
    }
    dev<std::int32_t> wids(hwids.size());
    KVSIFT_CUDA_CHECK(cudaMemcpy(wind.p, hwind.data(), (Q + 1) * 8, cudaMemcpyHostToDevice));
    KVSIFT_CUDA_CHECK(cudaMemcpy(wids.p, hwids.data(), hwids.size() * 4, cudaMemcpyHostToDevice));
    dev<float> o_r(Q * d), l_r(Q), o_w(Q * d), l_w(Q), o_m(Q * d), l_m(Q);
    kc::decode_search_params sw = chosen;
    auto search = [&](cudaStream_t s) {
      kc::decode_search(set, kv, fq, std::int64_t(Q), sw, so, sws.p, swb, s);
    };
    // Recall of the filtered search: the exact top-100 ids outside the window that it found.
    auto middle_recall = [&] {
      search(stream);
      KVSIFT_CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<id_t> got(Q * cap);  // (rows padded with invalid_id past their counts)
      KVSIFT_CUDA_CHECK(cudaMemcpy(got.data(), sids.p, Q * cap * 4, cudaMemcpyDeviceToHost));
      return middle_recall_of(got, std::size_t(cap));
    };
    sw.walk_through = false;
    const double recall_nw = middle_recall();
    const float t_search_nw = kvsift::cuda_bench::median_ms(search, stream, 2, 10);
    sw.walk_through = true;
    const double recall_w = middle_recall();
    auto csr = [&](cudaStream_t s) {
      kc::decode_results_to_csr(sids.p, scounts.p, std::int64_t(Q), cap, rind.p, rids.p, s);
    };
    auto attn_r = [&](cudaStream_t s) {
      kc::sparse_attention(dq.p, int(Q), int(d), kv, rind.p, rids.p, o_r.p, l_r.p, aws.p, awb, s);
    };
    auto attn_w = [&](cudaStream_t s) {
      kc::sparse_attention(dq.p, int(Q), int(d), kv, wind.p, wids.p, o_w.p, l_w.p, aws.p, awb, s);
    };
    auto merge = [&](cudaStream_t s) {
      kc::merge_state(o_r.p, l_r.p, o_w.p, l_w.p, o_m.p, l_m.p, 1, int(Q), int(d), s);
    };
    csr(stream);  // over middle_recall's results (walk_through = true), for the attention
    KVSIFT_CUDA_CHECK(cudaStreamSynchronize(stream));
    const float t_search = kvsift::cuda_bench::median_ms(search, stream, 2, 10);
    const float t_csr = kvsift::cuda_bench::median_ms(csr, stream, 2, 10);
    const float t_r = kvsift::cuda_bench::median_ms(attn_r, stream, 2, 10);
    const float t_w = kvsift::cuda_bench::median_ms(attn_w, stream, 2, 10);
    const float t_m = kvsift::cuda_bench::median_ms(merge, stream, 2, 10);
    // The step attends once over each head's window + retrieved tokens (one list, no merge):
    // the same lists built here from the search's results, timed alone.
    std::vector<std::int64_t> hr(Q + 1), hu(Q + 1, 0);
    KVSIFT_CUDA_CHECK(cudaMemcpy(hr.data(), rind.p, (Q + 1) * 8, cudaMemcpyDeviceToHost));
    std::vector<std::int32_t> hrids(static_cast<std::size_t>(hr[Q]));
    std::vector<std::int32_t> huids;
    if (!hrids.empty()) {
      KVSIFT_CUDA_CHECK(cudaMemcpy(hrids.data(), rids.p, hrids.size() * 4, cudaMemcpyDeviceToHost));
    }
    for (std::size_t i = 0; i < Q; ++i) {
      huids.insert(huids.end(), hwids.begin() + hwind[i], hwids.begin() + hwind[i + 1]);
      huids.insert(huids.end(), hrids.begin() + hr[i], hrids.begin() + hr[i + 1]);
      hu[i + 1] = std::int64_t(huids.size());
    }
    dev<std::int64_t> uind(Q + 1);
    dev<std::int32_t> uids(huids.size());
    KVSIFT_CUDA_CHECK(cudaMemcpy(uind.p, hu.data(), (Q + 1) * 8, cudaMemcpyHostToDevice));
    KVSIFT_CUDA_CHECK(cudaMemcpy(uids.p, huids.data(), huids.size() * 4, cudaMemcpyHostToDevice));
    auto attn_u = [&](cudaStream_t s) {
      kc::sparse_attention(dq.p, int(Q), int(d), kv, uind.p, uids.p, o_m.p, l_m.p, aws.p, awb, s);
    };
    const float t_u = kvsift::cuda_bench::median_ms(attn_u, stream, 2, 10);
    std::printf(
        "decode step stages, each alone (ms): search (window excluded) %.3f, CSR %.3f, attention "
        "over window + retrieved in one pass (the step's) %.3f; sum %.3f vs step %.3f; two "
        "passes instead: over retrieved %.3f, over window %.3f, merge %.3f\n",
        t_search, t_csr, t_u, t_search + t_csr + t_u, step_ms, t_r, t_w, t_m);
    std::printf(
        "filtered search, recall@100 of the exact top-100 outside the window: walk_through "
        "true %.4f (%.3f ms), false %.4f (%.3f ms)\n",
        recall_w, t_search, recall_nw, t_search_nw);
  }
  std::uint32_t status = 0;
  KVSIFT_CUDA_CHECK(cudaMemcpy(&status, ostatus.p, 4, cudaMemcpyDeviceToHost));
  std::printf("status word: %u (0 = no device-side error; 4 = a DIPR search hit its cap)\n",
              status);
  cublasDestroy(handle);
  return 0;
}
