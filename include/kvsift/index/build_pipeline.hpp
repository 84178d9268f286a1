#pragma once
// Building the indexes of many KV heads (and layers) back to back, with step 1 of the next head
// overlapping steps 2-4 of the current one. With a GPU engine (kvsift::cuda::knn_engine) the
// exact kNN and its host<->device copies run on the GPU and a helper thread while the CPU
// threads project and connect the previous head, so the GPU time mostly disappears from the
// total. Each KV head gets one index, built GQA-shared: its training queries are sampled from
// every query head of its group (sample_gqa_queries), which costs one build instead of one per
// query head. Plain C++: the pipeline works with any KnnEngine, the CPU engine included.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kvsift/core/dense_matrix.hpp"
#include "kvsift/core/detail/background_task.hpp"
#include "kvsift/core/detail/clock.hpp"
#include "kvsift/core/detail/threads.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/core/vector_store.hpp"
#include "kvsift/index/gqa_sampling.hpp"
#include "kvsift/index/graph_index.hpp"
#include "kvsift/index/knn_result.hpp"
#include "kvsift/index/roargraph_builder.hpp"

namespace kvsift {

/// One KV head to index: its keys and the prefill queries of every query head that reads it.
template <MatrixStore Store>
struct kv_head_job {
  Store keys;
  std::vector<matrix_view<const float>> query_heads;  ///< the GQA group, >= 1 head
};

/// Settings of `build_heads`.
struct build_pipeline_params {
  double sample_ratio = 0.1;  ///< fraction of each query head's rows used for training, (0, 1]
  std::uint64_t seed = 7;     ///< sampling seed (the same for every head: deterministic)
};

namespace detail {
/// The checks of build_heads, before any work.
template <MatrixStore Store>
void validate_build_heads(std::span<const kv_head_job<Store>> jobs,
                          const build_pipeline_params& params, const char* who) {
  require(params.sample_ratio > 0.0 && params.sample_ratio <= 1.0, who,
          ": expected sample_ratio in (0, 1], got ", params.sample_ratio);
  for (std::size_t h = 0; h < jobs.size(); ++h) {
    require(!jobs[h].query_heads.empty(), who, ": KV head ", h,
            " has no query heads, expected at least 1");
  }
}
}  // namespace detail

/**
 * @brief Builds one RoarGraph index per KV head, in order, overlapping the kNN of head i + 1
 *        (sampling + engine call, on a helper thread) with steps 2-4 of head i.
 *
 * The result of head i equals `builder.build(jobs[i].keys, sample_gqa_queries(jobs[i]
 * .query_heads, ratio, seed))`: the pipeline changes when work runs, never what it computes.
 * At most two kNN results are alive at a time.
 *
 * @param stats    if not null, resized to jobs.size(); [i] holds head i's phase seconds
 *                 (knn_seconds measured on the helper thread; total = kNN + steps 2-4)
 * @param progress if set, called on the calling thread after each head: done = heads built,
 *                 total = jobs.size(), phase "head"
 * @throw invalid_argument a job without query heads, sample_ratio not in (0, 1] (all checked
 *        before any work); otherwise what `roargraph_builder`, `sample_gqa_queries`, the engine
 *        or the callback throw, after the helper thread has finished
 * @note Thread safety: the engine is called from the helper thread while the calling thread
 *       runs steps 2-4 with `params().threads` threads; give the CPU engine's kNN and steps 2-4
 *       the machine's cores between them. Complexity: the sum of the builds; wall time about
 *       max(kNN, steps 2-4) per head plus the first kNN.
 */
template <Metric M, KnnEngine Engine, MatrixStore Store>
std::vector<graph_index<Store, M>> build_heads(const roargraph_builder<M, Engine>& builder,
                                               std::span<const kv_head_job<Store>> jobs,
                                               const build_pipeline_params& params = {},
                                               std::vector<roargraph_build_stats>* stats = nullptr,
                                               const build_progress_callback& progress = {}) {
  detail::validate_build_heads(jobs, params, "build_heads");
  struct knn_job {
    knn_result knn;
    double seconds = 0;
  };
  auto knn_of = [&](std::size_t h) {
    const auto t0 = detail::monotonic_seconds();
    const dense_matrix<float> q =
        sample_gqa_queries(std::span<const matrix_view<const float>>(jobs[h].query_heads),
                           params.sample_ratio, params.seed);
    knn_job out{builder.training_knn(jobs[h].keys.view(), q.view()), 0.0};
    out.seconds = detail::seconds_since(t0);
    return out;
  };

  const auto t0 = detail::monotonic_seconds();
  std::vector<graph_index<Store, M>> out;
  out.reserve(jobs.size());
  if (stats != nullptr) stats->assign(jobs.size(), {});
  // The next head's kNN runs on a helper thread; a background_task waits in its destructor,
  // so an exception below still waits for the helper before `jobs` goes away.
  std::optional<detail::background_task<knn_job>> next;
  if (!jobs.empty()) next.emplace([&knn_of] { return knn_of(0); });
  for (std::size_t h = 0; h < jobs.size(); ++h) {
    knn_job cur = next->get();
    next.reset();
    if (h + 1 < jobs.size()) next.emplace([&knn_of, h] { return knn_of(h + 1); });
    roargraph_build_stats st;
    out.push_back(builder.build_from_knn(jobs[h].keys, cur.knn, &st));
    st.knn_seconds = cur.seconds;
    st.total_seconds += cur.seconds;
    if (stats != nullptr) (*stats)[h] = st;
    if (progress) progress({h + 1, jobs.size(), detail::seconds_since(t0), "head"});
  }
  return out;
}

/**
 * @brief Builds one index per KV head with several builders at once, typically one per GPU
 *        (`roargraph_builder<M, cuda::knn_engine>`, each engine on its own `device`): the jobs
 *        are cut into B contiguous shards of sizes differing by at most one (builder b takes
 *        jobs [b n / B, (b + 1) n / B)), each builder runs `build_heads` over its shard on its
 *        own thread, and the indexes come back in job order.
 *
 * Each index equals the one `build_heads` of its shard's builder makes: sharding changes where
 * and when work runs, never what it computes (equal builders give the graphs one builder
 * gives). Equal shard sizes suit a model's heads, which have equal sizes; the jobs are not
 * copied.
 *
 * @param stats    as build_heads, in job order
 * @param progress called after each head, from the builders' threads one call at a time;
 *                 done counts the heads finished by all builders, total = jobs.size()
 * @throw invalid_argument an empty builder list, and what build_heads checks (all before any
 *        work); otherwise the error of the lowest-numbered builder that failed, after every
 *        builder's thread has finished
 * @note Thread safety: the builders run concurrently, B - 1 of them on new threads and one on
 *       the calling thread. Each uses its own engine (engines that share state, such as copies
 *       of one cuda::knn_engine, are serialised by it) and `params().threads` CPU threads: give
 *       each builder its share of the cores. Complexity: the builds' sum of work; wall time
 *       about that of the most loaded builder.
 */
template <Metric M, KnnEngine Engine, MatrixStore Store>
std::vector<graph_index<Store, M>> build_heads_sharded(
    std::span<const roargraph_builder<M, Engine>> builders,
    std::span<const kv_head_job<Store>> jobs, const build_pipeline_params& params = {},
    std::vector<roargraph_build_stats>* stats = nullptr,
    const build_progress_callback& progress = {}) {
  detail::require(!builders.empty(), "build_heads_sharded: expected at least 1 builder, got 0");
  detail::validate_build_heads(jobs, params, "build_heads_sharded");
  const std::size_t shards = std::min(builders.size(), jobs.size());
  if (shards == 0) {
    if (stats != nullptr) stats->clear();
    return {};
  }
  const auto t0 = detail::monotonic_seconds();
  detail::plain_mutex progress_mutex;
  std::size_t done = 0;
  struct shard_result {
    std::vector<graph_index<Store, M>> graphs;
    std::vector<roargraph_build_stats> stats;
  };
  const auto first_of = [&](std::size_t b) { return b * jobs.size() / shards; };
  const auto run_shard = [&](std::size_t b) {
    shard_result r;
    build_progress_callback report;
    if (progress) {
      report = [&](const build_progress&) {
        const detail::scoped_lock lock(progress_mutex);
        progress({++done, jobs.size(), detail::seconds_since(t0), "head"});
      };
    }
    r.graphs = build_heads(builders[b], jobs.subspan(first_of(b), first_of(b + 1) - first_of(b)),
                           params, &r.stats, report);
    return r;
  };
  // Builders 1.. on helper threads, builder 0 here; a background_task waits in its destructor,
  // so an error of builder 0 still waits for the others before `jobs` goes away.
  std::vector<std::optional<detail::background_task<shard_result>>> helpers(shards);
  for (std::size_t b = 1; b < shards; ++b)
    helpers[b].emplace([&run_shard, b] { return run_shard(b); });
  std::vector<shard_result> results(shards);
  results[0] = run_shard(0);
  for (std::size_t b = 1; b < shards; ++b) results[b] = helpers[b]->get();
  std::vector<graph_index<Store, M>> out;
  out.reserve(jobs.size());
  if (stats != nullptr) stats->assign(jobs.size(), {});
  for (std::size_t b = 0; b < shards; ++b) {
    for (std::size_t i = 0; i < results[b].graphs.size(); ++i) {
      out.push_back(std::move(results[b].graphs[i]));
      if (stats != nullptr) (*stats)[first_of(b) + i] = results[b].stats[i];
    }
  }
  return out;
}

}  // namespace kvsift
