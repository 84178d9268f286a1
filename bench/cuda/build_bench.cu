// RoarGraph build of one KV head with the CUDA engine: 131072 keys x dim 128, a GQA
// group of 4 query heads, 10% of each head's queries sampled for training. Step 1 (kNN) and the
// searches + pruning of step 3 (connectivity) run on the GPU, projection and the merging of
// step 3 on all host cores. Reports the phase breakdown (kNN, projection, connectivity, and
// within connectivity the searches, merging and repair) and compares, in the same run:
//   - the defaults (the paper's L = 500, rounds up to 8192 keys) against the same build with
//     step 3's searches on the CPU (`engine_connectivity = false`, the baseline), against
//     rounds up to 1024 keys (GPU and CPU searches; the latter is the build before step 3 moved
//     to the GPU), and against step 3 from the GPU's exact key kNN (`connectivity_knn` = 300),
//     by build time and recall@100;
//   - GQA-shared (one index from the queries of all 4 heads) against one index per query head
//     (4 builds), by build time and by recall@100 of each head's held-out queries against the
//     exact CPU kNN, at several search pool sizes L;
//   - the same shared build's step 1 with the CPU kNN engine (baseline for step 1);
//   - build_heads (next head's GPU kNN overlapping this head's CPU steps) against the same
//     heads built one after the other, on --pipeline-heads KV heads of --pipeline-keys keys;
//   - with --shards S, build_heads_sharded over S builders (builder s on device s modulo the
//     device count, each with 1/S of the CPU threads) against build_heads, same heads;
//   - with --expand-fractions F1,F2,..: GPU builds whose step-3 searches expand only that
//     fraction of their pool (roargraph_params::connectivity_expand_fraction) against the
//     defaults, for each seed of --seeds (the rounds' order; graphs built alike differ by seed),
//     by build time and recall@100; --quick 1 runs only these and the defaults.
// Query heads differ in distribution (topic strength and query mean per head), keys are shared.
//
// Usage: kvsift-cuda-build_bench [--n 131072] [--d 128] [--heads 4] [--ratio 0.1]
//            [--eval 200] [--threads 0] [--per-head 1] [--pipeline-heads 4]
//            [--pipeline-keys 32768] [--shards 0] [--expand-fractions ""] [--seeds 2024]
//            [--quick 0]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.cuh"
#include "gqa_heads.cuh"

#pragma nv_diagnostic push
#pragma nv_diag_suppress 554
#include <kvsift/core/vector_store.hpp>
#include <kvsift/cuda/knn.cuh>
#include <kvsift/index/build_pipeline.hpp>
#include <kvsift/index/roargraph_builder.hpp>
#include <kvsift/search/beam_search.hpp>
#include <kvsift/testing/ood_generator.hpp>
#pragma nv_diagnostic pop

namespace {

using kvsift::cuda_bench::make_head;
using kvsift::cuda_bench::seconds_since;

using kvsift::id_t;
using kvsift::matrix_view;
using store_t = kvsift::view_store<float>;
using gpu_builder = kvsift::roargraph_builder<kvsift::inner_product, kvsift::cuda::knn_engine>;
using cpu_builder = kvsift::roargraph_builder<kvsift::inner_product, kvsift::cpu_knn_engine>;

struct options {
  std::size_t n = 131072, d = 128, heads = 4, eval = 200, threads = 0, per_head = 1;
  std::size_t pipeline_heads = 4, pipeline_keys = 32768, shards = 0, quick = 0;
  double ratio = 0.1;
  std::string expand_fractions, seeds = "2024";
};

options parse(int argc, char** argv) {
  options o;
  kvsift::cuda_bench::parse_options(
      argc, argv,
      {kvsift::cuda_bench::size_option("--n", o.n), kvsift::cuda_bench::size_option("--d", o.d),
       kvsift::cuda_bench::size_option("--heads", o.heads),
       kvsift::cuda_bench::size_option("--eval", o.eval),
       kvsift::cuda_bench::size_option("--threads", o.threads),
       kvsift::cuda_bench::size_option("--per-head", o.per_head),
       kvsift::cuda_bench::size_option("--pipeline-heads", o.pipeline_heads),
       kvsift::cuda_bench::size_option("--pipeline-keys", o.pipeline_keys),
       kvsift::cuda_bench::size_option("--shards", o.shards),
       kvsift::cuda_bench::size_option("--quick", o.quick),
       kvsift::cuda_bench::string_option("--expand-fractions", o.expand_fractions),
       kvsift::cuda_bench::string_option("--seeds", o.seeds),
       kvsift::cuda_bench::double_option("--ratio", o.ratio)});
  return o;
}

void print_stats(const char* what, const kvsift::roargraph_build_stats& s, std::size_t n = 0) {
  std::printf("%-44s total %7.3f s = kNN %6.3f + projection %6.3f + connectivity %7.3f (+ rest)\n",
              what, s.total_seconds, s.knn_seconds, s.projection_seconds, s.connectivity_seconds);
  if (n == 0) return;
  std::printf(
      "  connectivity: searches (or key kNN) + pruning %.3f s, merging %.3f s, repair %.3f s; "
      "per key %.0f vectors scored by the search, %.0f pairs by the pruning (CPU only)\n",
      s.connectivity_search_seconds, s.connectivity_merge_seconds, s.repair_seconds,
      static_cast<double>(s.connectivity_distance_computations) / static_cast<double>(n),
      static_cast<double>(s.connectivity_prune_distance_computations) / static_cast<double>(n));
}

template <class G>
double recall_at(const G& g, matrix_view<const float> eval, const kvsift::knn_result& exact,
                 std::size_t k, std::size_t L) {
  std::size_t hit = 0;
  kvsift::search_workspace ws;
  std::vector<id_t> ids(k);
  std::vector<float> scores(k);
  for (std::size_t i = 0; i < eval.rows(); ++i) {
    const auto r = kvsift::beam_search(g, std::span<const float>(eval.row(i), eval.cols()), {k, L},
                                       ws, std::span<id_t>(ids), std::span<float>(scores));
    const auto want = exact.row_ids(i);
    for (std::size_t j = 0; j < r.count; ++j) {
      hit += std::find(want.begin(), want.end(), ids[j]) != want.end();
    }
  }
  return static_cast<double>(hit) / static_cast<double>(eval.rows() * k);
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines survive a timeout when piped
  kvsift::cuda_bench::bench_setup setup;
  if (!kvsift::cuda_bench::start_bench(setup)) return 0;
  const std::size_t threads = o.threads == 0 ? std::thread::hardware_concurrency() : o.threads;
  const std::size_t m = o.n;  // prefill queries per head: one per key position
  auto t0 = std::chrono::steady_clock::now();
  std::vector<kvsift::testing::ood_data> heads;
  for (std::size_t h = 0; h < o.heads; ++h) heads.push_back(make_head(o.n, m + o.eval, o.d, h, 11));
  for (std::size_t h = 1; h < o.heads; ++h) {
    if (heads[h].keys != heads[0].keys) {
      std::printf("error: query heads do not share keys\n");
      return 1;
    }
  }
  std::printf(
      "data: %zu keys x d=%zu, GQA group of %zu query heads x %zu prefill queries "
      "(+%zu held out each), %.1f s to generate; %zu CPU threads\n",
      o.n, o.d, o.heads, m, o.eval, seconds_since(t0), threads);
  const store_t store(heads[0].key_view());
  std::vector<matrix_view<const float>> prefill;
  for (const auto& h : heads) prefill.push_back(h.query_view().row_range(0, m));

  kvsift::roargraph_params p;  // defaults: nq = 100, M = 35, L = 500, batch 8192
  p.threads = threads;
  const gpu_builder gb(p);
  const cpu_builder cb(p);

  // Exact oracle for the held-out queries of each head.
  const kvsift::cpu_knn_engine exact_engine({.threads = threads});
  const std::size_t k = 100;
  std::vector<kvsift::knn_result> exact;
  for (const auto& h : heads) {
    exact.push_back(exact_engine.search(h.query_view().row_range(m, o.eval), store.view(), k));
  }

  // GQA-shared, GPU kNN.
  const auto shared_q =
      kvsift::sample_gqa_queries(std::span<const matrix_view<const float>>(prefill), o.ratio, 7);
  // Warm the builder's engine (CUDA context, cuBLAS handle, device buffers at full size).
  (void)gb.training_knn(store.view(), shared_q.view());
  const std::size_t Ls[] = {100, 200, 400};
  char what[128];
  // One GQA-shared build with `q`: breakdown and recall@k at the three search pools.
  auto shared_build = [&](const char* label, const kvsift::roargraph_params& q,
                          double(&recall)[3]) {
    kvsift::roargraph_build_stats st;
    const gpu_builder b(q);
    (void)b.training_knn(store.view(), shared_q.view());  // warm this builder's engine
    const auto g = b.build(store, shared_q.view(), &st);
    std::snprintf(what, sizeof what, "%s (%zu train queries):", label, shared_q.rows());
    print_stats(what, st, o.n);
    for (std::size_t i = 0; i < 3; ++i) {
      recall[i] = 0;
      for (std::size_t h = 0; h < o.heads; ++h) {
        recall[i] += recall_at(g, heads[h].query_view().row_range(m, o.eval), exact[h], k, Ls[i]) /
                     static_cast<double>(o.heads);
      }
    }
    std::printf(
        "  GQA-shared recall@%zu of held-out queries of all heads, L=%zu/%zu/%zu: "
        "%.4f %.4f %.4f\n",
        k, Ls[0], Ls[1], Ls[2], recall[0], recall[1], recall[2]);
    return st;
  };
  // The defaults (the paper's L = 500, rounds of at most 8192 keys, step 3 on the GPU) against
  // other settings in the same run: step 3's searches on the CPU (the baseline), smaller rounds,
  // and step 3 from the GPU's exact key kNN.
  double shared_recall[3] = {}, other_recall[3] = {};
  const auto s_shared = shared_build("GQA-shared, defaults (L=500, batch 8192)", p, shared_recall);
  auto report_vs_defaults = [&](const kvsift::roargraph_build_stats& st) {
    std::printf(
        "  vs defaults: defaults build x%.2f faster, connectivity x%.2f; recall@%zu of this "
        "minus defaults %+.4f %+.4f %+.4f at L=%zu/%zu/%zu\n",
        st.total_seconds / s_shared.total_seconds,
        st.connectivity_seconds / s_shared.connectivity_seconds, k,
        other_recall[0] - shared_recall[0], other_recall[1] - shared_recall[1],
        other_recall[2] - shared_recall[2], Ls[0], Ls[1], Ls[2]);
  };
  // Step 3's expand fraction against the defaults, seed by seed (the defaults' recall moves
  // by about 0.01 between seeds, so one seed cannot tell a small change from that spread).
  const auto seeds = o.expand_fractions.empty() ? std::vector<std::string>{}
                                                : kvsift::cuda_bench::split_list(o.seeds);
  for (const auto& seed_s : seeds) {
    auto base = p;
    base.seed = std::stoull(seed_s);
    double base_recall[3] = {};
    kvsift::roargraph_build_stats s_base = s_shared;
    if (base.seed == p.seed) {
      std::copy(std::begin(shared_recall), std::end(shared_recall), std::begin(base_recall));
    } else {
      std::snprintf(what, sizeof what, "defaults, seed %llu",
                    static_cast<unsigned long long>(base.seed));
      s_base = shared_build(what, base, base_recall);
    }
    for (const auto& f : kvsift::cuda_bench::split_list(o.expand_fractions)) {
      auto q = base;
      q.connectivity_expand_fraction = std::stod(f);
      char label[96];
      std::snprintf(label, sizeof label, "expand fraction %.2f, seed %llu",
                    q.connectivity_expand_fraction, static_cast<unsigned long long>(q.seed));
      double r[3] = {};
      const auto st = shared_build(label, q, r);
      std::printf(
          "  vs defaults (fraction %.2f), same seed: build x%.2f, step-3 searches x%.2f of the "
          "time; recall@%zu minus defaults' %+.4f %+.4f %+.4f at L=%zu/%zu/%zu\n",
          p.connectivity_expand_fraction, st.total_seconds / s_base.total_seconds,
          st.connectivity_search_seconds / s_base.connectivity_search_seconds, k,
          r[0] - base_recall[0], r[1] - base_recall[1], r[2] - base_recall[2], Ls[0], Ls[1], Ls[2]);
    }
  }
  if (o.quick != 0) return 0;

  auto on_cpu = p;
  on_cpu.engine_connectivity = false;
  report_vs_defaults(shared_build("baseline: step 3 searches on the CPU", on_cpu, other_recall));
  auto small_rounds = p;
  small_rounds.batch = 1024;
  report_vs_defaults(shared_build("rounds up to 1024 keys", small_rounds, other_recall));
  small_rounds.engine_connectivity = false;
  report_vs_defaults(
      shared_build("rounds up to 1024 keys, CPU searches (before)", small_rounds, other_recall));
  auto key_knn = p;
  key_knn.connectivity_knn = 300;
  report_vs_defaults(shared_build("exact key kNN connectivity, k=300", key_knn, other_recall));

  kvsift::roargraph_build_stats s_cpu;
  (void)cb.training_knn(store.view(), shared_q.view().row_range(0, 64));
  t0 = std::chrono::steady_clock::now();
  const auto knn_cpu = cb.training_knn(store.view(), shared_q.view());
  s_cpu.knn_seconds = seconds_since(t0);
  std::printf("%-44s kNN %6.3f s (GPU kNN x%.1f faster)\n",
              "GQA-shared, CPU kNN (step 1 only):", s_cpu.knn_seconds,
              s_cpu.knn_seconds / s_shared.knn_seconds);

  // One index per query head.
  std::vector<decltype(gb.build(store, shared_q.view()))> per_head;
  double per_head_total = 0;
  for (std::size_t h = 0; h < o.heads && o.per_head != 0; ++h) {
    const auto q = kvsift::sample_gqa_queries(
        std::span<const matrix_view<const float>>(&prefill[h], 1), o.ratio, 7);
    kvsift::roargraph_build_stats st;
    per_head.push_back(gb.build(store, q.view(), &st));
    per_head_total += st.total_seconds;
    std::snprintf(what, sizeof what, "per query head %zu, GPU kNN (%zu train queries):", h,
                  q.rows());
    print_stats(what, st);
  }
  if (o.per_head != 0) {
    std::printf(
        "one index per query head: %.3f s for %zu indexes; GQA-shared: %.3f s for 1 -> "
        "sharing builds x%.2f faster\n",
        per_head_total, o.heads, s_shared.total_seconds, per_head_total / s_shared.total_seconds);
  }
  std::printf("recall@%zu of held-out queries (mean over heads) vs exact kNN:\n", k);
  for (std::size_t i = 0; i < 3 && o.per_head != 0; ++i) {
    double rp = 0;
    for (std::size_t h = 0; h < o.heads; ++h) {
      rp += recall_at(per_head[h], heads[h].query_view().row_range(m, o.eval), exact[h], k, Ls[i]);
    }
    std::printf("  L=%3zu  GQA-shared %.4f  per-head %.4f\n", Ls[i], shared_recall[i],
                rp / static_cast<double>(o.heads));
  }
  // Pipeline: several KV heads (smaller), one after the other vs overlapped.
  if (o.pipeline_heads > 0) {
    std::vector<kvsift::testing::ood_data> kv;
    std::vector<kvsift::kv_head_job<store_t>> jobs;
    for (std::size_t h = 0; h < o.pipeline_heads; ++h) {
      kv.push_back(make_head(o.pipeline_keys, o.heads * o.pipeline_keys, o.d, h, 100 + h));
    }
    for (const auto& x : kv) {
      kvsift::kv_head_job<store_t> j{store_t(x.key_view()), {}};
      for (std::size_t g = 0; g < o.heads; ++g) {
        j.query_heads.push_back(x.query_view().row_range(g * o.pipeline_keys, o.pipeline_keys));
      }
      jobs.push_back(std::move(j));
    }
    t0 = std::chrono::steady_clock::now();
    double knn_sum = 0;
    for (const auto& j : jobs) {
      kvsift::roargraph_build_stats st;
      const auto q = kvsift::sample_gqa_queries(
          std::span<const matrix_view<const float>>(j.query_heads), o.ratio, 7);
      (void)gb.build(j.keys, q.view(), &st);
      knn_sum += st.knn_seconds;
    }
    const double sequential = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    std::size_t last_done = 0;
    const auto graphs = kvsift::build_heads(
        gb, std::span<const kvsift::kv_head_job<store_t>>(jobs), {.sample_ratio = o.ratio}, nullptr,
        [&](const kvsift::build_progress& pr) { last_done = pr.done; });
    const double pipelined = seconds_since(t0);
    std::printf(
        "%zu KV heads x %zu keys: one after the other %.3f s (of which kNN %.3f s), "
        "build_heads %.3f s (x%.2f), %zu heads reported\n",
        o.pipeline_heads, o.pipeline_keys, sequential, knn_sum, pipelined, sequential / pipelined,
        last_done);
    if (o.shards > 0) {
      int devices = 0;
      KVSIFT_CUDA_CHECK(cudaGetDeviceCount(&devices));
      auto sp = p;
      sp.threads = std::max<std::size_t>(1, threads / o.shards);
      std::vector<gpu_builder> builders;
      for (std::size_t s = 0; s < o.shards; ++s) {
        builders.emplace_back(
            sp, kvsift::cuda::knn_engine({.device = static_cast<int>(s % std::size_t(devices))}));
      }
      t0 = std::chrono::steady_clock::now();
      const auto sharded = kvsift::build_heads_sharded(
          std::span<const gpu_builder>(builders),
          std::span<const kvsift::kv_head_job<store_t>>(jobs), {.sample_ratio = o.ratio});
      const double sharded_s = seconds_since(t0);
      std::size_t differ = 0;
      for (std::size_t h = 0; h < graphs.size(); ++h) {
        differ += !std::ranges::equal(graphs[h].adjacency(), sharded[h].adjacency());
      }
      std::printf(
          "build_heads_sharded over %zu builders (%d device(s), %zu CPU threads each): %.3f s "
          "(x%.2f against build_heads), %zu of %zu graphs differ from build_heads'\n",
          o.shards, std::min(devices, static_cast<int>(o.shards)), sp.threads, sharded_s,
          pipelined / sharded_s, differ, graphs.size());
    }
  }
  (void)knn_cpu;
  return 0;
}
