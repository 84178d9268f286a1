#pragma once
// kvsift-bench's measurement: the exact answers (the oracle every recall is against), one
// timed table row per search setting, and the big-ann ground truth written from the oracle.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvsift/kvsift.hpp"

namespace kvsift_bench {

using clock_type = std::chrono::steady_clock;

/// One result row of the table.
struct row {
  std::string index, query, param;
  double recall = 0, scanned = 0, mean_us = 0, p50_us = 0, p99_us = 0, size = 0, exact_size = 0;
  /// All evaluation queries searched at once by `batch_threads` threads, queries per second
  /// (ann-benchmarks' batch mode); 0 where not measured (the peers' searches are not
  /// thread-safe: hnswlib's setEf, faiss's shared label buffer).
  double batch_qps = 0;
  std::size_t batch_threads = 0;
};

/// How an index was obtained: build (or load) time and the bytes of its structure beyond the
/// keys every index needs (graph: adjacency + degrees + entry points); nullopt where the
/// library gives no size (the peers). Indexes that received keys one by one after their build
/// (--insert-fraction) also record how many and the mean time per key on one thread.
struct build_record {
  double seconds = 0;
  std::optional<std::size_t> bytes;
  std::size_t inserted = 0;
  std::optional<double> insert_us;
};

/// Mean, median and 99th percentile of a set of times, in microseconds.
struct timing_summary {
  double mean_us = 0, p50_us = 0, p99_us = 0;
};

struct timing {
  std::vector<double> us;
  void add(clock_type::time_point t0) {
    us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
  }
  /// Sorts the times; all zero when there are none.
  [[nodiscard]] timing_summary summary() {
    if (us.empty()) return {};
    timing_summary s;
    s.mean_us = std::accumulate(us.begin(), us.end(), 0.0) / static_cast<double>(us.size());
    std::sort(us.begin(), us.end());
    // The median resists the scheduling spikes of a shared machine; the mean and p99 do not.
    s.p50_us = us[us.size() / 2];
    s.p99_us = us[std::min(us.size() - 1,
                           static_cast<std::size_t>(0.99 * static_cast<double>(us.size())))];
    return s;
  }
  void into(row& r) {
    // load() refuses an empty evaluation set; summary() keeps an empty timing defined anyway.
    const auto s = summary();
    r.mean_us = s.mean_us;
    r.p50_us = s.p50_us;
    r.p99_us = s.p99_us;
  }
};

/// Exact answers per evaluation query: every passing key's score, best first (ties: lower id).
template <class M, class P>
std::vector<std::vector<kvsift::scored_id>> exact_rankings(const kvsift::dense_matrix<float>& keys,
                                                           const kvsift::dense_matrix<float>& eval,
                                                           const P& pred, std::size_t threads) {
  std::vector<std::vector<kvsift::scored_id>> out(eval.rows());
  kvsift::parallel_for(eval.rows(), threads, [&](std::size_t i, std::size_t) {
    auto& r = out[i];
    for (std::size_t j = 0; j < keys.rows(); ++j) {
      const auto id = static_cast<kvsift::id_t>(j);
      if (!pred(id)) continue;
      r.push_back({kvsift::to_key<M>(M::score(eval.row(i), keys.row(j), keys.cols())), id});
    }
    std::sort(r.begin(), r.end(), kvsift::ranks_before);
  });
  return out;
}

inline std::size_t range_size(const std::vector<kvsift::scored_id>& r, float beta) {
  if (r.empty()) return 0;
  const float t = r.front().key - beta;
  return static_cast<std::size_t>(
      std::partition_point(r.begin(), r.end(),
                           [&](const kvsift::scored_id& s) { return s.key >= t; }) -
      r.begin());
}

/// Beta whose exact DIPR answer averages `target` keys over the evaluation queries.
inline float choose_beta(const std::vector<std::vector<kvsift::scored_id>>& ex,
                         std::size_t target) {
  auto mean = [&](float b) {
    double s = 0;
    for (const auto& r : ex) s += static_cast<double>(range_size(r, b));
    return s / static_cast<double>(ex.size());
  };
  float lo = 0, hi = 1;
  while (mean(hi) < static_cast<double>(target) && hi < 1e6f) hi *= 2;
  for (int it = 0; it < 40; ++it) {
    const float mid = 0.5f * (lo + hi);
    (mean(mid) < static_cast<double>(target) ? lo : hi) = mid;
  }
  return hi;
}

inline double overlap(const std::vector<kvsift::id_t>& found,
                      const std::vector<kvsift::scored_id>& truth, std::size_t count) {
  if (count == 0) return 1.0;
  std::vector<kvsift::id_t> t;
  for (std::size_t i = 0; i < count; ++i) t.push_back(truth[i].id);
  std::sort(t.begin(), t.end());
  std::size_t hits = 0;
  for (auto id : found)
    hits += (id != kvsift::invalid_id && std::binary_search(t.begin(), t.end(), id)) ? 1 : 0;
  return static_cast<double>(hits) / static_cast<double>(count);
}

/// --save-gt: the first K exact answers per query in the big-ann ground-truth layout the
/// RoarGraph reference reads (ids, then distances = -key: -inner product, or the l2 distance).
/// K = min(max(--k), shortest exact list) so every row is complete.
inline void write_gt(const std::string& path,
                     const std::vector<std::vector<kvsift::scored_id>>& exact, std::size_t want) {
  std::size_t K = want;
  for (const auto& r : exact) K = std::min(K, r.size());
  std::ofstream f(path, std::ios::binary);
  if (!f) throw kvsift::io_error("cannot write --save-gt file '" + path + "'");
  const std::uint32_t hdr[2] = {static_cast<std::uint32_t>(exact.size()),
                                static_cast<std::uint32_t>(K)};
  f.write(reinterpret_cast<const char*>(hdr), sizeof hdr);
  for (const auto& r : exact)
    for (std::size_t j = 0; j < K; ++j) f.write(reinterpret_cast<const char*>(&r[j].id), 4);
  for (const auto& r : exact)
    for (std::size_t j = 0; j < K; ++j) {
      const float dist = -r[j].key;
      f.write(reinterpret_cast<const char*>(&dist), 4);
    }
  if (!f) throw kvsift::io_error("cannot write --save-gt file '" + path + "'");
}

/// Batch throughput: every evaluation query once, spread over `threads` threads (each with its
/// own workspace and output buffers), timed as a whole; queries per second. `one(q, ws, i)`
/// searches query i. Needs a search that is safe to call concurrently (kvsift's const calls).
template <class One>
double batch_qps(const kvsift::dense_matrix<float>& eval, std::size_t threads, One&& one) {
  std::vector<kvsift::search_workspace> wss(threads);
  const auto t0 = clock_type::now();
  kvsift::parallel_for(eval.rows(), threads, [&](std::size_t i, std::size_t t) {
    one(eval.cview().row_span(i), wss[t], t);
  });
  const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  return s > 0 ? static_cast<double>(eval.rows()) / s : 0.0;
}

/// One top-k row: `search(query, ids, scores, workspace)` returns search_stats; timed per query
/// on one thread, then (when `threads` > 0) as a batch on `threads` threads (batch_qps).
template <class Search>
row measure_topk(row r, std::size_t k, const kvsift::dense_matrix<float>& eval,
                 const std::vector<std::vector<kvsift::scored_id>>& exact, double n,
                 std::size_t threads, Search&& search) {
  timing t;
  kvsift::search_workspace ws;
  std::vector<kvsift::id_t> ids(k);
  std::vector<float> scores(k);
  for (std::size_t i = 0; i < eval.rows(); ++i) {
    const auto t0 = clock_type::now();
    const auto s = search(eval.cview().row_span(i), std::span(ids), std::span(scores), ws);
    t.add(t0);
    r.recall += overlap(ids, exact[i], std::min(k, exact[i].size()));
    r.scanned += static_cast<double>(s.distance_computations) / n;
  }
  t.into(r);
  if (threads > 0) {
    std::vector<std::vector<kvsift::id_t>> bids(threads, std::vector<kvsift::id_t>(k));
    std::vector<std::vector<float>> bscores(threads, std::vector<float>(k));
    r.batch_qps = batch_qps(eval, threads, [&](auto q, auto& w, std::size_t th) {
      (void)search(q, std::span(bids[th]), std::span(bscores[th]), w);
    });
    r.batch_threads = threads;
  }
  return r;
}

/// One DIPR row: `search(query, result, workspace)` fills a dipr_result; timed per query on one
/// thread, then as a batch on `threads` threads (see measure_topk).
template <class Search>
row measure_dipr(row r, float beta, const kvsift::dense_matrix<float>& eval,
                 const std::vector<std::vector<kvsift::scored_id>>& exact, double n,
                 std::size_t threads, Search&& search) {
  timing t;
  kvsift::search_workspace ws;
  kvsift::dipr_result res;
  for (std::size_t i = 0; i < eval.rows(); ++i) {
    const auto t0 = clock_type::now();
    search(eval.cview().row_span(i), res, ws);
    t.add(t0);
    const std::size_t want = range_size(exact[i], beta);
    r.recall += overlap(res.ids, exact[i], want);
    r.scanned += static_cast<double>(res.stats.distance_computations) / n;
    r.size += static_cast<double>(res.ids.size());
    r.exact_size += static_cast<double>(want);
  }
  t.into(r);
  if (threads > 0) {
    std::vector<kvsift::dipr_result> bres(threads);
    r.batch_qps =
        batch_qps(eval, threads, [&](auto q, auto& w, std::size_t th) { search(q, bres[th], w); });
    r.batch_threads = threads;
  }
  return r;
}

}  // namespace kvsift_bench
