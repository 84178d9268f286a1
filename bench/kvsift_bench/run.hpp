#pragma once
// kvsift-bench's main measurement: the flat baseline, the RoarGraph build (or load) and its
// top-k / DIPR sweeps, the insert run, the peers and the attention quality, for one metric and
// filter.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>  // isatty

#include "insert_run.hpp"
#include "kvsift/kvsift.hpp"
#include "kvsift_bench/datasets.hpp"
#include "kvsift_bench/measure.hpp"
#include "kvsift_bench/options.hpp"
#include "kvsift_bench/peers.hpp"
#include "kvsift_bench/quality.hpp"

namespace kvsift_bench {

/// A progress bar on stderr for long builds, only when stderr is a terminal (logs and the CTest
/// regexes, which read stdout, stay clean).
inline kvsift::build_progress_callback progress_bar() {
  if (!isatty(fileno(stderr))) return {};
  return [](const kvsift::build_progress& p) {
    constexpr std::size_t width = 30;
    const std::size_t filled = p.total ? width * p.done / p.total : width;
    std::fprintf(stderr, "\r[%s%s] %zu/%zu %-12.*s %6.1f s", std::string(filled, '#').c_str(),
                 std::string(width - filled, ' ').c_str(), p.done, p.total,
                 static_cast<int>(p.phase.size()), p.phase.data(), p.elapsed_seconds);
    if (p.done == p.total) std::fputc('\n', stderr);
    std::fflush(stderr);
  };
}

template <class M, class P>
std::vector<row> run(const options& o, const workload& w, const P& pred, std::ostream& info,
                     std::vector<quality_row>& quality,
                     std::map<std::string, build_record>& builds) {
  using store_t = kvsift::view_store<float>;
  const store_t store(w.keys.cview());
  const double n = static_cast<double>(w.keys.rows());
  const auto& E = w.eval;
  std::vector<row> rows;

  // Batch QPS runs on the threads the build and the oracle use.
  const std::size_t threads = o.build.threads ? o.build.threads : kvsift::default_thread_count();
  std::vector<std::vector<kvsift::scored_id>> exact;
  if (w.given_exact) {
    exact = *w.given_exact;
    info << "ground truth: " << w.given_exact_source << ", " << exact.front().size()
         << " ids per query (not recomputed)\n";
  } else {
    std::fprintf(stderr, "computing exact answers for %zu queries...\n", E.rows());
    exact = exact_rankings<M>(w.keys, E, pred, o.build.threads);
  }
  if (!o.save_gt.empty()) write_gt(o.save_gt, exact, *std::max_element(o.k.begin(), o.k.end()));
  const bool topk = o.query != "dipr", dipr = o.query != "topk";
  const float beta = dipr ? (o.beta ? *o.beta : choose_beta(exact, o.dipr_target)) : 0.0f;

  const kvsift::flat_index<store_t, M> flat(store);
  builds["flat"].bytes = 0;  // a view of the keys: nothing built, nothing stored beyond them
  for (std::size_t k : topk ? o.k : std::vector<std::size_t>{}) {
    rows.push_back(measure_topk({"flat", "top-" + std::to_string(k), "-"}, k, E, exact, n, threads,
                                [&](auto q, auto ids, auto scores, auto& ws) {
                                  return flat.topk(q, k, ws, ids, scores, pred);
                                }));
  }
  if (dipr) {
    rows.push_back(measure_dipr({"flat", "dipr", "beta=" + std::to_string(beta)}, beta, E, exact, n,
                                threads, [&](auto q, kvsift::dipr_result& res, auto& ws) {
                                  flat.dipr(q, {.beta = beta}, ws, res, pred);
                                }));
  }
  // An explicit pool below a k gives no row for that k (parse() refused pools below every k):
  // say which, rather than drop them silently.
  if (o.L_given && topk) {
    for (std::size_t k : o.k) {
      std::string skipped;
      for (std::size_t L : o.L)
        if (L < k) skipped += (skipped.empty() ? "" : ",") + std::to_string(L);
      if (!skipped.empty()) info << "L sweep: top-" << k << " skips L=" << skipped << " (L < k)\n";
    }
  }

  std::optional<kvsift::graph_index<store_t, M>> graph;
  if (o.uses("roargraph")) {
    auto& g = graph.emplace();
    if (!o.load_index.empty()) {
      const auto t0 = clock_type::now();
      g = kvsift::load_graph<M>(o.load_index, store);
      builds["roargraph"].seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
      info << "index: loaded from " << o.load_index << "\n";
    } else {
      std::fprintf(stderr, "building RoarGraph over %zu keys from %zu training queries...\n",
                   w.keys.rows(), w.train.rows());
      kvsift::roargraph_build_stats bs;
      const kvsift::roargraph_builder<M> builder(o.build);
      if (o.save_train_knn.empty() && o.load_train_knn.empty()) {
        g = builder.build(store, w.train.cview(), &bs, progress_bar());
      } else {
        // Step 1 apart, so that the kNN lists can be written for (or read from) another
        // builder: the RoarGraph reference then builds from exactly the same input.
        const auto t0 = clock_type::now();
        kvsift::knn_result knn;
        if (!o.load_train_knn.empty()) {
          auto ids = kvsift::read_ibin(o.load_train_knn);
          knn.rows = ids.rows;
          knn.k = ids.cols;
          knn.ids = std::move(ids.data);
          info << "train kNN: loaded from " << o.load_train_knn << " (" << knn.rows << " x "
               << knn.k << ")\n";
        } else {
          knn = builder.training_knn(w.keys.cview(), w.train.cview());
        }
        const double knn_s = std::chrono::duration<double>(clock_type::now() - t0).count();
        if (!o.save_train_knn.empty()) {
          kvsift::write_ibin(o.save_train_knn, {knn.ids, knn.rows, knn.k});
        }
        g = builder.build_from_knn(store, knn, &bs, progress_bar());
        bs.knn_seconds = knn_s;
        bs.total_seconds += knn_s;
      }
      info << "build: " << bs.total_seconds << " s (kNN " << bs.knn_seconds << " s, projection "
           << bs.projection_seconds << " s, connectivity " << bs.connectivity_seconds << " s), nq "
           << o.build.nq << ", M " << o.build.M << ", L " << o.build.L << ", expand fraction "
           << o.build.connectivity_expand_fraction << ", threads "
           << (o.build.threads ? o.build.threads : kvsift::default_thread_count()) << "\n";
      builds["roargraph"].seconds = bs.total_seconds;
      if (!o.save_index.empty()) kvsift::save_graph(g, o.save_index);
    }
    builds["roargraph"].bytes = g.memory().total();
    // --entry-window: the static window's keys seed every search (the first and last W ids).
    std::vector<kvsift::id_t> window_entries;
    const std::size_t nk = w.keys.rows();
    for (std::size_t i = 0; i < std::min(o.entry_window, nk); ++i) {
      window_entries.push_back(static_cast<kvsift::id_t>(i));
      if (nk - 1 - i >= o.entry_window)
        window_entries.push_back(static_cast<kvsift::id_t>(nk - 1 - i));
    }
    if (!window_entries.empty()) {
      info << "entry window: the first and last " << o.entry_window << " keys seed every search ("
           << window_entries.size() << " entries)\n";
    }
    const auto deg = g.degrees();
    info << "degree: min " << deg.min << ", mean " << deg.mean << ", max " << deg.max << "\n";
    for (std::size_t k : topk ? o.k : std::vector<std::size_t>{}) {
      for (std::size_t L : o.L) {
        if (L < k) continue;
        // --expand-limits: each fraction of L a row (1 = every pool entry, the plain label).
        std::vector<std::size_t> limits;
        for (double f : o.expand_limits) {
          const auto e = f >= 1 ? L : std::max<std::size_t>(1, std::llround(f * double(L)));
          if (std::find(limits.begin(), limits.end(), e) == limits.end()) limits.push_back(e);
        }
        for (std::size_t e : limits) {
          const std::string label =
              "L=" + std::to_string(L) + (e == L ? "" : ",E=" + std::to_string(e));
          rows.push_back(measure_topk(
              {"roargraph", "top-" + std::to_string(k), label}, k, E, exact, n, threads,
              [&](auto q, auto ids, auto scores, auto& ws) {
                return kvsift::beam_search(
                    g, q,
                    {.k = k, .L = L, .degree_cap = o.degree_cap, .expand_limit = e == L ? 0 : e},
                    ws, ids, scores, pred, std::span<const kvsift::id_t>(window_entries));
              }));
        }
      }
    }
    if (o.insert_fraction > 0) {
      // Rows positional when --train-fraction split --queries: row i is position i's query.
      const bool positional = !o.demo && o.train.empty();
      std::fprintf(stderr, "building on the first %.0f%% of the keys, inserting the rest...\n",
                   100 * (1 - o.insert_fraction));
      kvsift::graph_insert_params ip{.query_knn_lists = o.insert_query_lists};
      ip.query_candidates = o.insert_query_candidates.value_or(ip.query_candidates);
      ip.holder_capacity = o.insert_holders.value_or(ip.holder_capacity);
      if (o.insert_rule == "graph") {
        ip.query_neighbors = 0;
        ip.update_query_knn = false;
      }
      const auto ins =
          kvsift_bench::build_then_insert<M>(w.keys.cview(), w.train.cview(), o.insert_fraction,
                                             positional, o.build, ip, o.insert_query_stride);
      info << "insert: built on " << ins.base_keys << " keys / " << ins.base_train
           << " training queries in " << ins.build_seconds << " s, inserted " << ins.inserted
           << " keys one by one: mean " << ins.insert.mean_us << " us/key, p50 "
           << ins.insert.p50_us << ", p99 " << ins.insert.p99_us << " (one thread); degree mean "
           << ins.graph.degrees().mean << "; query lists updated per insert: "
           << (o.insert_query_lists == 0 ? std::string("all it beats")
                                         : std::to_string(o.insert_query_lists))
           << "; training queries scored per insert: "
           << (o.insert_rule == "graph" ? std::string("none (--insert-rule graph)")
               : ip.query_candidates == 0
                   ? std::string("all")
                   : "<= " + std::to_string(ip.query_candidates) + " (key -> query lists, " +
                         (ip.holder_capacity == 0
                              ? std::string("every holder")
                              : "<= " + std::to_string(ip.holder_capacity) + " per key") +
                         ")")
           << "; decode queries added: " << ins.queries_added;
      if (ins.queries_added > 0) {
        info << " (every " << o.insert_query_stride << " positions, mean " << ins.query_mean_us
             << " us per query, lists by a search of pool 200)";
      }
      info << "\n";
      // Build of the prefix plus every insert; the insertable graph keeps the training queries
      // and their kNN lists for its insert rule, counted with the graph.
      const auto mem = ins.graph.memory();
      builds["roargraph+insert"] = {
          ins.build_seconds + ins.insert.mean_us * static_cast<double>(ins.inserted) * 1e-6 +
              ins.query_mean_us * static_cast<double>(ins.queries_added) * 1e-6,
          mem.graph + mem.queries + mem.query_knn + mem.query_index, ins.inserted,
          ins.insert.mean_us};
      for (std::size_t k : topk ? o.k : std::vector<std::size_t>{}) {
        for (std::size_t L : o.L) {
          if (L < k) continue;
          rows.push_back(measure_topk(
              {"roargraph+insert", "top-" + std::to_string(k), "L=" + std::to_string(L)}, k, E,
              exact, n, threads, [&](auto q, auto ids, auto scores, auto& ws) {
                return kvsift::beam_search(ins.graph, q, {k, L}, ws, ids, scores, pred);
              }));
        }
      }
    }
    for (std::size_t l0 : dipr ? o.l0 : std::vector<std::size_t>{}) {
      rows.push_back(measure_dipr(
          {"roargraph", "dipr", "l0=" + std::to_string(l0)}, beta, E, exact, n, threads,
          [&](auto q, kvsift::dipr_result& res, auto& ws) {
            kvsift::dipr_search(g, q, {.beta = beta, .l0 = l0, .degree_cap = o.degree_cap}, ws, res,
                                pred, std::span<const kvsift::id_t>(window_entries));
          }));
    }
  }
  if constexpr (std::is_same_v<M, kvsift::inner_product> && std::is_same_v<P, kvsift::no_filter>) {
    run_peers(o, w, exact, n, rows, info, builds);
    if (!o.values.empty()) {
      std::fprintf(stderr, "attention quality over %zu causal queries...\n", E.rows());
      quality = run_quality(o, w, flat, graph ? &*graph : nullptr);
    }
  }
  const double m = static_cast<double>(E.rows());
  for (auto& r : rows) {
    r.recall /= m;
    r.scanned /= m;
    r.size /= m;
    r.exact_size /= m;
  }
  if (dipr)
    info << "dipr: beta " << beta << (o.beta ? " (given)" : " (chosen for the target size)")
         << "\n";
  return rows;
}

}  // namespace kvsift_bench
