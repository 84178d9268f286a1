#pragma once
// kvsift-bench --index hnsw,ivf: the peers (hnswlib, faiss IVF-Flat) measured against the same
// exact answers, when kvsift-bench was built with them (KVSIFT_BENCH_HNSWLIB / _FAISS).

#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "insert_run.hpp"
#include "kvsift/kvsift.hpp"
#include "kvsift_bench/datasets.hpp"
#include "kvsift_bench/measure.hpp"
#include "kvsift_bench/options.hpp"
#ifdef KVSIFT_BENCH_HNSWLIB
#include "peers/hnswlib_peer.hpp"
#endif
#ifdef KVSIFT_BENCH_FAISS
#include "peers/faiss_peer.hpp"
#endif

namespace kvsift_bench {

/// Adds keys [base, n) one by one through `insert(i)`, timing each: the peers' side of
/// --insert-fraction, as build_then_insert does for kvsift's insertable graph.
template <class Insert>
timing_summary insert_each(std::size_t base, std::size_t n, Insert insert) {
  timing t;
  t.us.reserve(n - base);
  for (std::size_t i = base; i < n; ++i) {
    const auto t0 = clock_type::now();
    insert(i);
    t.add(t0);
  }
  return t.summary();
}

/// The info line and build record of a peer's insert run.
inline void report_insert(const char* name, const std::string& index, std::size_t base,
                          std::size_t inserted, double build_seconds, const timing_summary& s,
                          std::ostream& info, std::map<std::string, build_record>& builds) {
  info << name << ": built on " << base << " keys in " << build_seconds << " s, inserted "
       << inserted << " keys one by one: mean " << s.mean_us << " us/key, p50 " << s.p50_us
       << ", p99 " << s.p99_us << " (one thread, the peer's own insert)\n";
  builds[index] = {build_seconds + s.mean_us * static_cast<double>(inserted) * 1e-6, std::nullopt,
                   inserted, s.mean_us};
}

/// hnswlib / faiss top-k rows, swept over ef / nprobe (only for --metric ip, no filter). With
/// --insert-fraction F, each peer also builds on the keys kvsift's inserted index starts from
/// (the first 1 - F; IVF trains its centroids on them), receives the rest one by one through
/// its own insert (hnswlib addPoint, faiss add), and sweeps again as hnsw+insert / ivf+insert.
inline void run_peers(const options& o, const workload& w,
                      const std::vector<std::vector<kvsift::scored_id>>& exact, double n,
                      std::vector<row>& rows, std::ostream& info,
                      std::map<std::string, build_record>& builds) {
  const auto& E = w.eval;
  // Unused when kvsift-bench has neither peer.
  [[maybe_unused]] const auto keys = w.keys.cview();
  [[maybe_unused]] const std::size_t nk = keys.rows();
  [[maybe_unused]] const bool inserts = o.insert_fraction > 0;
  [[maybe_unused]] const std::size_t base = inserts ? insert_base_keys(nk, o.insert_fraction) : nk;
  [[maybe_unused]] const auto seconds_since = [](clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
  };
#ifdef KVSIFT_BENCH_HNSWLIB
  const auto sweep_hnsw = [&](const std::string& index, kvsift_bench::hnsw_peer& h) {
    for (std::size_t k : o.k) {
      for (std::size_t ef : o.ef) {
        if (ef < k) continue;
        rows.push_back(measure_topk(
            {index, "top-" + std::to_string(k), "ef=" + std::to_string(ef)}, k, E, exact, n,
            /*threads=*/0,
            [&](auto q, auto ids, auto scores, auto&) { return h.search(q, ef, ids, scores); }));
      }
    }
  };
  if (o.uses("hnsw")) {
    std::fprintf(stderr, "building hnswlib HNSW over %zu keys...\n", nk);
    const auto t0 = clock_type::now();
    kvsift_bench::hnsw_peer h(keys, o.hnsw_M, o.hnsw_ef_construction, o.build.threads);
    builds["hnsw"].seconds = seconds_since(t0);
    info << "hnswlib: build " << builds["hnsw"].seconds << " s, M " << o.hnsw_M
         << ", ef_construction " << o.hnsw_ef_construction << ", inner-product space\n";
    sweep_hnsw("hnsw", h);
    if (inserts) {
      std::fprintf(stderr, "hnswlib: building on %zu keys, inserting the rest...\n", base);
      const auto t1 = clock_type::now();
      kvsift_bench::hnsw_peer hi(keys, o.hnsw_M, o.hnsw_ef_construction, o.build.threads, base);
      const double build_s = seconds_since(t1);
      const auto s = insert_each(base, nk, [&](std::size_t i) { hi.insert(keys.row(i), i); });
      report_insert("hnswlib+insert", "hnsw+insert", base, nk - base, build_s, s, info, builds);
      sweep_hnsw("hnsw+insert", hi);
    }
  }
#endif
#ifdef KVSIFT_BENCH_FAISS
  const auto sweep_ivf = [&](const std::string& index, kvsift_bench::ivf_flat_peer& f) {
    for (std::size_t k : o.k) {
      for (std::size_t np : o.nprobe) {
        if (np > f.nlist()) continue;
        rows.push_back(measure_topk(
            {index, "top-" + std::to_string(k), "nprobe=" + std::to_string(np)}, k, E, exact, n,
            /*threads=*/0,
            [&](auto q, auto ids, auto scores, auto&) { return f.search(q, np, ids, scores); }));
      }
    }
  };
  const auto lists = [&](std::size_t keys_built) {
    return o.nlist ? o.nlist : kvsift_bench::ivf_flat_peer::default_nlist(keys_built);
  };
  if (o.uses("ivf")) {
    std::fprintf(stderr, "training faiss IVF-Flat (%zu lists) over %zu keys...\n", lists(nk), nk);
    const auto t0 = clock_type::now();
    kvsift_bench::ivf_flat_peer f(keys, lists(nk), o.build.threads);
    builds["ivf"].seconds = seconds_since(t0);
    info << "faiss IVF-Flat: build " << builds["ivf"].seconds << " s, nlist " << f.nlist()
         << ", inner product; scanned includes the " << f.nlist() << " centroids\n";
    sweep_ivf("ivf", f);
    if (inserts) {
      std::fprintf(stderr, "faiss IVF-Flat: training on %zu keys, inserting the rest...\n", base);
      const auto t1 = clock_type::now();
      kvsift_bench::ivf_flat_peer fi(keys.row_range(0, base), lists(base), o.build.threads);
      const double build_s = seconds_since(t1);
      const auto s = insert_each(base, nk, [&](std::size_t i) { fi.insert(keys.row(i)); });
      report_insert("faiss IVF-Flat+insert", "ivf+insert", base, nk - base, build_s, s, info,
                    builds);
      info << "faiss IVF-Flat+insert: nlist " << fi.nlist() << " (centroids of the first " << base
           << " keys)\n";
      sweep_ivf("ivf+insert", fi);
    }
  }
#endif
  (void)o, (void)w, (void)exact, (void)n, (void)rows, (void)info, (void)E, (void)builds;
}

}  // namespace kvsift_bench
