// Several GPUs of one host (issue 20): the same work on one GPU and spread over D GPUs, in one
// run, from one process.
//
//  1. Build: --build-heads KV heads of --build-keys keys x d (a GQA group of 4 query heads per
//     KV head, 10% of their queries sampled for training; synthetic OOD data), each head
//     --build-repeat times (a whole model's count of heads without generating each one's data:
//     8 x 32 = Llama-3-8B's 256; a repeated head is built afresh, to the same graph), built by
//     build_heads_sharded in each configuration of --configs (GPUs x builders: 1x8 = eight
//     builders on GPU 0, 2x8 = builder s on GPU s mod 2), each builder with its share of the
//     host's cores; a configuration suffixed ":host" merges step 3's rounds on the host
//     (roargraph_params::engine_merge = false) instead of on the GPU. Every configuration runs
//     twice, alternated; every run's graphs are compared edge for edge with the first run's of
//     the same merge, and each run prints where a head's time went.
//  2. Decode step: --requests requests x 8 KV heads (32 query heads, d = 128) of --n tokens, f16
//     K/V pages, one GQA-shared index per (request, KV head) (GPU-built over --distinct key sets,
//     as kvsift-cuda-decode_search_bench). decode_step on GPU 0 over every request, against
//     decode_step_sharded with the requests split over the D GPUs (each GPU holds its requests'
//     graphs, pages and queries, and has its own stream and workspace). Timed as steps enqueued
//     back to back with every GPU synchronised at the end (wall clock per step, alternated
//     three times), plus each GPU's own CUDA-event time of one sharded step; the outputs of
//     the two are compared.
//
// Usage: kvsift-cuda-multi_device_bench [--devices 2] [--build 1] [--build-heads 16]
//            [--build-keys 131072] [--build-repeat 1] [--configs 1x4,1x8,2x8,2x16] [--threads 0]
//            [--step 1]
//            (configs: GPUsxbuilders[:host][:full][:xF][:hostproj], e.g. 1x8:host,1x8,2x16:host,
//            2x16,1x4:x0.25; host: step 3's merge on the host; full: step 3's searches expand
//            their whole pool, roargraph_params::connectivity_expand_fraction = 1, xF: that
//            fraction F; hostproj: step 2 on the host,
//            roargraph_params::engine_projection = false) [--f16 0]
//            (--f16 1: the build's keys in f16, as a model's KV cache holds them)
//            [--requests 16] [--n 131072] [--distinct 2] [--expand 16] [--L 256] [--hops 272]

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "bench_util.cuh"
#include "gqa_heads.cuh"

#pragma nv_diagnostic push
#pragma nv_diag_suppress 554
#include <kvsift/core/dense_matrix.hpp>
#include <kvsift/core/vector_store.hpp>
#include <kvsift/cuda/decode_step.cuh>
#include <kvsift/cuda/decode_step_sharded.cuh>
#include <kvsift/cuda/knn.cuh>
#include <kvsift/index/build_pipeline.hpp>
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
using gpu_builder = kvsift::roargraph_builder<kvsift::inner_product, kc::knn_engine>;

struct options {
  std::size_t devices = 2, build = 1, build_heads = 16, build_keys = 131072, build_repeat = 1;
  std::size_t threads = 0, step = 1, requests = 16, n = 131072, distinct = 2, f16 = 0;
  std::size_t expand = 16, L = 256, hops = 272;
  std::string configs = "1x4,1x8,2x8,2x16";  // GPUs x builders of the build runs
};

constexpr std::size_t d = 128, kv_heads = 8, group = 4, page = 16;

void sync_devices(int count) {
  for (int dv = 0; dv < count; ++dv) {
    KVSIFT_CUDA_CHECK(cudaSetDevice(dv));
    KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  KVSIFT_CUDA_CHECK(cudaSetDevice(0));
}

// --- 1. build ------------------------------------------------------------------------------------

// E: the keys' element type in the build (float, or kvsift::half with --f16 1: a model's cache).
template <class E>
void build_part(const options& o, int devices) {
  using store_t = kvsift::view_store<E>;
  const std::size_t threads = o.threads == 0 ? std::thread::hardware_concurrency() : o.threads;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<kvsift::testing::ood_data> data;
  std::vector<kvsift::dense_matrix<E>> keys;  // the keys as E (a copy when E is not float)
  std::vector<kvsift::kv_head_job<store_t>> jobs;
  for (std::size_t h = 0; h < o.build_heads; ++h) {
    data.push_back(make_head(o.build_keys, group * o.build_keys, d, h, 100 + h));
    keys.push_back(kvsift::convert<E>(data.back().key_view()));
  }
  for (std::size_t i = 0; i < data.size() * std::max<std::size_t>(o.build_repeat, 1); ++i) {
    const std::size_t h = i % data.size();
    const auto& x = data[h];
    kvsift::kv_head_job<store_t> j{store_t(keys[h].cview()), {}};
    for (std::size_t g = 0; g < group; ++g) {
      j.query_heads.push_back(x.query_view().row_range(g * o.build_keys, o.build_keys));
    }
    jobs.push_back(std::move(j));
  }
  std::printf(
      "build: %zu KV heads (%zu distinct) x %zu %s keys x d=%zu, GQA group %zu, 10%% training "
      "queries; data %.1f s; %zu host threads\n",
      jobs.size(), o.build_heads, o.build_keys, std::is_same_v<E, float> ? "f32" : "f16", d, group,
      seconds_since(t0), threads);
  using graphs_t = std::vector<kvsift::graph_index<store_t, kvsift::inner_product>>;
  // The first run's graphs per configuration kind (merge on the GPU or host, expand fraction,
  // projection on the GPU or host), and the very first run's, which the other kinds are
  // compared with.
  std::map<std::tuple<bool, double, bool>, graphs_t> first;
  const graphs_t* reference = nullptr;
  // One build over `on_devices` GPUs with `builders` builders; prints its time and, per head
  // (means over heads, each phase timed inside its builder), where it went.
  auto run = [&](std::size_t on_devices, std::size_t builders, bool host_merge, double expand,
                 bool host_projection) {
    kvsift::roargraph_params p;
    p.threads = std::max<std::size_t>(1, threads / builders);
    p.engine_merge = !host_merge;
    if (expand > 0) p.connectivity_expand_fraction = expand;
    p.engine_projection = !host_projection;
    std::vector<gpu_builder> b;
    for (std::size_t s = 0; s < builders; ++s) {
      b.emplace_back(p, kc::knn_engine({.device = static_cast<int>(s % on_devices)}));
    }
    std::vector<kvsift::roargraph_build_stats> st;
    const auto t = std::chrono::steady_clock::now();
    graphs_t g = kvsift::build_heads_sharded(std::span<const gpu_builder>(b),
                                             std::span<const kvsift::kv_head_job<store_t>>(jobs),
                                             {.sample_ratio = 0.1}, &st);
    const double s = seconds_since(t);
    // Issue 15's memory report: the graphs' bytes per head (the keys are the cache's own and
    // not counted), and a whole model of 32 layers x 8 KV heads (Llama-3-8B) at this size.
    std::size_t bytes = 0, compact_bytes = 0, edges = 0;
    for (const auto& x : g) {
      const auto one = x.memory();
      bytes += one.total();
      compact_bytes += one.compact();
      edges += one.edges;
    }
    {
      constexpr double mib = 1024.0 * 1024.0, model_heads = 32.0 * 8.0;
      const double heads = static_cast<double>(g.size());
      const double per_head = static_cast<double>(bytes) / heads;
      const double compact = static_cast<double>(compact_bytes) / heads;
      std::printf(
          "  graph memory per head: %.2f MiB (width %zu, padded) = %.1f bytes per key; edges "
          "without padding %.2f MiB (mean degree %.1f); whole model (32 x 8 KV heads): %.2f GiB "
          "padded, %.2f GiB compact; the head's keys %.2f MiB\n",
          per_head / mib, g.empty() ? std::size_t{0} : g.front().max_degree(),
          per_head / static_cast<double>(o.build_keys), compact / mib,
          static_cast<double>(edges) / (heads * static_cast<double>(o.build_keys)),
          per_head * model_heads / (mib * 1024.0), compact * model_heads / (mib * 1024.0),
          static_cast<double>(o.build_keys * d * sizeof(E)) / mib);
    }
    // Graphs are compared with the first run of the same kind. The merges and projections on
    // the GPU and on the host give the same graph up to f32 summation order (equal on integer
    // data, tests/cuda/graph_search_test.cu); on these real-valued keys the share of adjacency
    // entries that differ from the first kind's graphs is printed.
    std::size_t differ = 0;
    graphs_t& same = first[{host_merge, p.connectivity_expand_fraction, host_projection}];
    if (same.empty()) {
      if (reference != nullptr) {
        std::size_t entries = 0, moved = 0;
        for (std::size_t h = 0; h < g.size(); ++h) {
          const auto a = g[h].adjacency(), b = (*reference)[h].adjacency();
          entries += a.size();
          for (std::size_t i = 0; i < a.size(); ++i) moved += a[i] != b[i];
        }
        std::printf(
            "  (adjacency entries that differ from the first configuration's: %zu of %zu, "
            "%.4f%%)\n",
            moved, entries, 100.0 * static_cast<double>(moved) / static_cast<double>(entries));
      }
      same = std::move(g);
      if (reference == nullptr) reference = &same;
    } else {
      for (std::size_t h = 0; h < g.size(); ++h)
        differ += !std::ranges::equal(g[h].adjacency(), same[h].adjacency());
    }
    kvsift::roargraph_build_stats m;
    for (const auto& x : st) {
      m.total_seconds += x.total_seconds;
      m.knn_seconds += x.knn_seconds;
      m.projection_seconds += x.projection_seconds;
      m.connectivity_search_seconds += x.connectivity_search_seconds;
      m.connectivity_merge_seconds += x.connectivity_merge_seconds;
      m.repair_seconds += x.repair_seconds;
    }
    const double h = static_cast<double>(jobs.size()), ms = 1e3 / h;
    std::printf(
        "  %zu GPU(s), %2zu builders (%2zu threads each), projection and merge on the %s and "
        "%s, expand fraction %.2f: "
        "%7.3f s, %6.1f ms per head; %zu graphs differ from the first run's with this merge\n"
        "      per head inside its builder (ms): kNN %.0f (helper thread), projection %.0f, step-3 "
        "searches %.0f, merging %.0f, repair %.0f; total %.0f -> %.1f heads in flight\n",
        on_devices, builders, p.threads, host_projection ? "host" : "GPU",
        host_merge ? "host" : "GPU", p.connectivity_expand_fraction, s, 1e3 * s / h, differ,
        m.knn_seconds * ms, m.projection_seconds * ms, m.connectivity_search_seconds * ms,
        m.connectivity_merge_seconds * ms, m.repair_seconds * ms, m.total_seconds * ms,
        m.total_seconds / s);
    return s;
  };
  // Every configuration twice, alternated, so that drift in the host's or the GPUs' state shows.
  struct config {
    std::size_t gpus, builders;
    bool host_merge;
    double expand;  // step 3's expand fraction; <= 0: the default
    bool host_projection;
  };
  // ":full:" is fraction 1, ":x<F>:" fraction F, neither the default (-1).
  auto expand_of = [](const std::string& tail) {
    if (tail.find(":full:") != std::string::npos) return 1.0;
    const auto at = tail.find(":x");
    return at == std::string::npos ? -1.0 : std::stod(tail.substr(at + 2));
  };
  std::vector<config> configs;
  for (const auto& c : kvsift::cuda_bench::split_list(o.configs)) {
    const auto x = c.find('x'), colon = c.find(':');
    const std::string tail = colon == std::string::npos ? "" : c.substr(colon) + ":";
    configs.push_back({std::stoul(c.substr(0, x)), std::stoul(c.substr(x + 1, colon - x - 1)),
                       tail.find(":host:") != std::string::npos, expand_of(tail),
                       tail.find(":hostproj:") != std::string::npos});
  }
  std::vector<double> best(configs.size(), 1e30);
  for (int rep = 0; rep < 2; ++rep) {
    for (std::size_t i = 0; i < configs.size(); ++i) {
      const config& c = configs[i];
      best[i] = std::min(best[i], run(std::min<std::size_t>(c.gpus, devices), c.builders,
                                      c.host_merge, c.expand, c.host_projection));
    }
  }
  for (const bool host : {false, true}) {
    double best_one = 1e30, best_many = 1e30;
    for (std::size_t i = 0; i < configs.size(); ++i) {
      if (configs[i].host_merge != host || configs[i].expand > 0 || configs[i].host_projection) {
        continue;
      }
      double& b = configs[i].gpus == 1 ? best_one : best_many;
      b = std::min(b, best[i]);
    }
    if (best_one == 1e30 || best_many == 1e30) continue;
    std::printf(
        "build, merge on the %s: best on %d GPUs %.3f s against best on 1 GPU %.3f s (each the "
        "best of its configurations, best of 2 runs): x%.2f\n",
        host ? "host" : "GPU", devices, best_many, best_one, best_one / best_many);
  }
}

// --- 2. decode step ------------------------------------------------------------------------------

/// Graphs [g0, g1) of the step's batch on one device: keys as f16 pages (one contiguous run of
/// pages per graph), adjacency, entries, the queries of those graphs' heads, outputs, workspace,
/// a stream.
struct step_shard {
  int device = 0;
  std::size_t graphs = 0, heads = 0;
  std::unique_ptr<dev<__half>> pool;
  std::unique_ptr<dev<id_t>> adj, ent;
  std::unique_ptr<dev<std::int64_t>> off;
  std::unique_ptr<dev<std::int32_t>> table;
  std::unique_ptr<dev<float>> q, o, lse;
  std::unique_ptr<dev<std::uint32_t>> status;
  std::unique_ptr<dev<char>> ws;
  std::size_t ws_bytes = 0;
  cudaStream_t stream = nullptr;
  kc::graph_set_ref set{};
  kc::paged_kv_ref<__half> kv{};

  step_shard(int device_, std::size_t g0, std::size_t g1, std::size_t n, std::size_t width,
             const std::vector<std::vector<kvsift::half>>& keys,
             const std::vector<std::vector<id_t>>& adjacency,
             const std::vector<std::vector<id_t>>& entries, const std::vector<float>& qh,
             const kc::decode_step_params& sp)
      : device(device_), graphs(g1 - g0), heads((g1 - g0) * group) {
    const kc::detail::device_guard on(device);
    const std::size_t distinct = keys.size(), pages_per = (n + page - 1) / page;
    const std::size_t me = kvsift::max_entry_points;
    pool = std::make_unique<dev<__half>>(graphs * pages_per * page * d);
    adj = std::make_unique<dev<id_t>>(graphs * n * width);
    ent = std::make_unique<dev<id_t>>(graphs * me);
    off = std::make_unique<dev<std::int64_t>>(graphs + 1);
    table = std::make_unique<dev<std::int32_t>>(graphs * pages_per);
    std::vector<std::int64_t> offsets(graphs + 1);
    std::vector<std::int32_t> t(graphs * pages_per);
    std::vector<id_t> e(graphs * me, kvsift::invalid_id);
    for (std::size_t i = 0; i < graphs; ++i) {
      const std::size_t s = (g0 + i) % distinct;
      offsets[i] = static_cast<std::int64_t>(i * n);
      for (std::size_t pg = 0; pg < pages_per; ++pg)
        t[i * pages_per + pg] = int(i * pages_per + pg);
      std::copy(entries[s].begin(), entries[s].end(), e.begin() + i * me);
      KVSIFT_CUDA_CHECK(cudaMemcpy(pool->p + i * pages_per * page * d, keys[s].data(), n * d * 2,
                                   cudaMemcpyHostToDevice));
      KVSIFT_CUDA_CHECK(cudaMemcpy(adj->p + i * n * width, adjacency[s].data(), n * width * 4,
                                   cudaMemcpyHostToDevice));
    }
    offsets[graphs] = static_cast<std::int64_t>(graphs * n);
    KVSIFT_CUDA_CHECK(
        cudaMemcpy(off->p, offsets.data(), offsets.size() * 8, cudaMemcpyHostToDevice));
    KVSIFT_CUDA_CHECK(cudaMemcpy(table->p, t.data(), t.size() * 4, cudaMemcpyHostToDevice));
    KVSIFT_CUDA_CHECK(cudaMemcpy(ent->p, e.data(), e.size() * 4, cudaMemcpyHostToDevice));
    q = std::make_unique<dev<float>>(heads * d);
    KVSIFT_CUDA_CHECK(
        cudaMemcpy(q->p, qh.data() + g0 * group * d, heads * d * 4, cudaMemcpyHostToDevice));
    o = std::make_unique<dev<float>>(heads * d);
    lse = std::make_unique<dev<float>>(heads);
    status = std::make_unique<dev<std::uint32_t>>(1);
    KVSIFT_CUDA_CHECK(cudaMemset(status->p, 0, 4));
    set = {adj->p, off->p, ent->p, int(graphs), int(width), int(me), std::int64_t(n)};
    // V aliases K: the step's time does not depend on the values.
    kv = {pool->p,     pool->p,       std::int64_t(graphs * pages_per), int(page), int(d), table->p,
          int(graphs), int(pages_per)};
    ws_bytes = kc::decode_step_workspace_size(set, int(heads), int(d), sp);
    ws = std::make_unique<dev<char>>(ws_bytes);
    KVSIFT_CUDA_CHECK(cudaStreamCreate(&stream));
  }
  ~step_shard() {
    const kc::detail::quiet_device_guard on(device);
    cudaStreamDestroy(stream);
  }
  step_shard(const step_shard&) = delete;
  step_shard& operator=(const step_shard&) = delete;

  [[nodiscard]] kc::decode_step_shard<__half> args() const {
    return {device, set,   kv,       q->p,   int(heads), o->p,
            lse->p, ws->p, ws_bytes, stream, status->p,  nullptr};
  }
};

void step_part(const options& o, int devices) {
  const std::size_t n = o.n, G = o.requests * kv_heads, Q = G * group;
  const std::size_t per_set = (G + o.distinct - 1) / o.distinct;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<kvsift::half>> keys16(o.distinct);
  std::vector<std::vector<float>> eval(o.distinct);
  std::vector<std::vector<id_t>> adjacency(o.distinct), entries(o.distinct);
  std::size_t width = 0;
  for (std::size_t s = 0; s < o.distinct; ++s) {
    auto set = kvsift::cuda_bench::build_gqa_key_set(n, per_set, d, group, 100 + s);
    width = set.width;
    keys16[s] = std::move(set.keys16);
    eval[s] = std::move(set.eval);
    adjacency[s] = std::move(set.adjacency);
    entries[s] = std::move(set.entries);
  }
  // Query head j of request r searches graph r * kv_heads + j / group (decode_step's order).
  std::vector<float> qh(Q * d);
  for (std::size_t g = 0; g < G; ++g) {
    for (std::size_t m = 0; m < group; ++m) {
      const std::size_t s = g % o.distinct, e = g / o.distinct;
      std::copy_n(eval[s].begin() + (m * per_set + e) * d, d, qh.begin() + (g * group + m) * d);
    }
  }
  kc::decode_step_params sp;
  sp.search.k = 100;
  sp.search.L = int(o.L);
  sp.search.expand_width = int(o.expand);
  sp.search.max_hops = int(o.hops);
  sp.search.walk_through = false;
  std::printf(
      "\ndecode step: %zu requests x %zu KV heads x %zu query heads of %zu tokens, "
      "window 512 + 4 sinks + top-100 (expand %zu, L %zu, hops %zu); data + %zu GPU "
      "builds %.1f s\n",
      o.requests, kv_heads, group, n, o.expand, o.L, o.hops, o.distinct, seconds_since(t0));
  const step_shard one(0, 0, G, n, width, keys16, adjacency, entries, qh, sp);
  std::vector<std::unique_ptr<step_shard>> parts;
  for (int dv = 0; dv < devices; ++dv) {
    // Requests split evenly; a request's KV heads stay together.
    const std::size_t r0 = o.requests * dv / devices, r1 = o.requests * (dv + 1) / devices;
    parts.push_back(std::make_unique<step_shard>(dv, r0 * kv_heads, r1 * kv_heads, n, width, keys16,
                                                 adjacency, entries, qh, sp));
  }
  std::vector<kc::decode_step_shard<__half>> args;
  for (const auto& x : parts) args.push_back(x->args());
  const kc::decode_step_shard<__half> whole = one.args();
  auto single = [&] {
    kc::decode_step(whole.set, whole.kv, whole.q, whole.num_qo_heads, int(d), whole.out_o,
                    whole.out_lse, whole.workspace, whole.workspace_bytes, whole.stream, sp,
                    whole.status);
  };
  auto sharded = [&] { kc::decode_step_sharded<__half>(args, int(d), sp); };
  auto per_step_ms = [&](auto&& f, int steps) {
    for (int i = 0; i < 3; ++i) f();
    sync_devices(devices);
    const auto t = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) f();
    sync_devices(devices);
    return 1e3 * seconds_since(t) / steps;
  };
  std::printf("  back to back, 50 steps each, wall clock per step (all GPUs synchronised):\n");
  double best_one = 1e30, best_many = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const double a = per_step_ms(single, 50), b = per_step_ms(sharded, 50);
    best_one = std::min(best_one, a);
    best_many = std::min(best_many, b);
    std::printf("    1 GPU %.3f ms, %d GPUs (decode_step_sharded) %.3f ms: x%.2f\n", a, devices, b,
                a / b);
  }
  std::printf("  best: 1 GPU %.3f ms, %d GPUs %.3f ms: x%.2f\n", best_one, devices, best_many,
              best_one / best_many);
  // Each GPU's own time of one sharded step (CUDA events on its stream, median of 20).
  std::vector<cudaEvent_t> a(parts.size()), b(parts.size());
  std::vector<std::vector<float>> ms(parts.size());
  for (std::size_t i = 0; i < parts.size(); ++i) {
    KVSIFT_CUDA_CHECK(cudaSetDevice(parts[i]->device));
    KVSIFT_CUDA_CHECK(cudaEventCreate(&a[i]));
    KVSIFT_CUDA_CHECK(cudaEventCreate(&b[i]));
  }
  for (int rep = 0; rep < 20; ++rep) {
    for (std::size_t i = 0; i < parts.size(); ++i) {
      KVSIFT_CUDA_CHECK(cudaSetDevice(parts[i]->device));
      KVSIFT_CUDA_CHECK(cudaEventRecord(a[i], parts[i]->stream));
    }
    sharded();
    for (std::size_t i = 0; i < parts.size(); ++i) {
      KVSIFT_CUDA_CHECK(cudaSetDevice(parts[i]->device));
      KVSIFT_CUDA_CHECK(cudaEventRecord(b[i], parts[i]->stream));
    }
    for (std::size_t i = 0; i < parts.size(); ++i) {
      float t = 0;
      KVSIFT_CUDA_CHECK(cudaEventSynchronize(b[i]));
      KVSIFT_CUDA_CHECK(cudaEventElapsedTime(&t, a[i], b[i]));
      ms[i].push_back(t);
    }
  }
  KVSIFT_CUDA_CHECK(cudaSetDevice(0));
  const float whole_ms =
      kvsift::cuda_bench::median_ms([&](cudaStream_t) { single(); }, one.stream, 3, 20);
  std::printf("  CUDA events, median of 20: 1 GPU, all %zu graphs %.3f ms;", G, whole_ms);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    std::nth_element(ms[i].begin(), ms[i].begin() + 10, ms[i].end());
    std::printf(" GPU %d (%zu graphs) %.3f ms;", parts[i]->device, parts[i]->graphs, ms[i][10]);
  }
  std::printf("\n");
  // The outputs: the sharded step's rows against the single GPU's, in request order.
  std::vector<float> want(Q * d), got(Q * d);
  KVSIFT_CUDA_CHECK(cudaMemcpy(want.data(), one.o->p, Q * d * 4, cudaMemcpyDeviceToHost));
  std::size_t at = 0;
  for (const auto& x : parts) {
    KVSIFT_CUDA_CHECK(
        cudaMemcpy(got.data() + at, x->o->p, x->heads * d * 4, cudaMemcpyDeviceToHost));
    at += x->heads * d;
  }
  double worst = 0;
  std::size_t equal = 0;
  for (std::size_t i = 0; i < Q * d; ++i) {
    worst = std::max(worst, double(std::fabs(want[i] - got[i])));
    equal += want[i] == got[i];
  }
  std::uint32_t st = 0, st1 = 0;
  for (const auto& x : parts) {
    KVSIFT_CUDA_CHECK(cudaMemcpy(&st1, x->status->p, 4, cudaMemcpyDeviceToHost));
    st |= st1;
  }
  std::printf("  outputs: %zu of %zu equal, largest difference %.3g; status words %u\n", equal,
              Q * d, worst, st);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    KVSIFT_CUDA_CHECK(cudaSetDevice(parts[i]->device));
    KVSIFT_CUDA_CHECK(cudaEventDestroy(a[i]));
    KVSIFT_CUDA_CHECK(cudaEventDestroy(b[i]));
  }
  KVSIFT_CUDA_CHECK(cudaSetDevice(0));
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  namespace cb = kvsift::cuda_bench;
  cb::parse_options(
      argc, argv,
      {cb::size_option("--devices", o.devices), cb::size_option("--build", o.build),
       cb::size_option("--build-heads", o.build_heads),
       cb::size_option("--build-repeat", o.build_repeat),
       cb::size_option("--build-keys", o.build_keys), cb::size_option("--threads", o.threads),
       cb::size_option("--step", o.step), cb::size_option("--requests", o.requests),
       cb::size_option("--n", o.n), cb::size_option("--distinct", o.distinct),
       cb::size_option("--expand", o.expand), cb::size_option("--L", o.L),
       cb::size_option("--hops", o.hops), cb::string_option("--configs", o.configs),
       cb::size_option("--f16", o.f16)});
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  cb::bench_setup setup;
  if (!cb::start_bench(setup)) return 0;
  int count = 0;
  KVSIFT_CUDA_CHECK(cudaGetDeviceCount(&count));
  const int devices = std::min(count, static_cast<int>(std::max<std::size_t>(o.devices, 1)));
  std::printf("%d GPU(s) visible, using %d\n", count, devices);
  if (devices < 2) std::printf("(one GPU: the 'D GPUs' rows below run on that one GPU)\n");
  if (o.build != 0) {
    if (o.f16 != 0) {
      build_part<kvsift::half>(o, devices);
    } else {
      build_part<float>(o, devices);
    }
  }
  if (o.step != 0) step_part(o, devices);
  return 0;
}
