#pragma once
// kvsift-bench --index hnsw,ivf: the peers (hnswlib, faiss IVF-Flat) measured against the same
// exact answers, when kvsift-bench was built with them (KVSIFT_BENCH_HNSWLIB / _FAISS).

#include <chrono>
#include <cstdio>
#include <map>
#include <ostream>
#include <string>
#include <vector>

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

/// hnswlib / faiss top-k rows, swept over ef / nprobe (only for --metric ip, no filter).
inline void run_peers(const options& o, const workload& w,
                      const std::vector<std::vector<kvsift::scored_id>>& exact, double n,
                      std::vector<row>& rows, std::ostream& info,
                      std::map<std::string, build_record>& builds) {
  const auto& E = w.eval;
#ifdef KVSIFT_BENCH_HNSWLIB
  if (o.uses("hnsw")) {
    std::fprintf(stderr, "building hnswlib HNSW over %zu keys...\n", w.keys.rows());
    const auto t0 = clock_type::now();
    kvsift_bench::hnsw_peer h(w.keys.cview(), o.hnsw_M, o.hnsw_ef_construction, o.build.threads);
    builds["hnsw"].seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
    info << "hnswlib: build " << builds["hnsw"].seconds << " s, M " << o.hnsw_M
         << ", ef_construction " << o.hnsw_ef_construction << ", inner-product space\n";
    for (std::size_t k : o.k) {
      for (std::size_t ef : o.ef) {
        if (ef < k) continue;
        rows.push_back(measure_topk(
            {"hnsw", "top-" + std::to_string(k), "ef=" + std::to_string(ef)}, k, E, exact, n,
            /*threads=*/0,
            [&](auto q, auto ids, auto scores, auto&) { return h.search(q, ef, ids, scores); }));
      }
    }
  }
#endif
#ifdef KVSIFT_BENCH_FAISS
  if (o.uses("ivf")) {
    const std::size_t nlist =
        o.nlist ? o.nlist : kvsift_bench::ivf_flat_peer::default_nlist(w.keys.rows());
    std::fprintf(stderr, "training faiss IVF-Flat (%zu lists) over %zu keys...\n", nlist,
                 w.keys.rows());
    const auto t0 = clock_type::now();
    kvsift_bench::ivf_flat_peer f(w.keys, nlist, o.build.threads);
    builds["ivf"].seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
    info << "faiss IVF-Flat: build " << builds["ivf"].seconds << " s, nlist " << nlist
         << ", inner product; scanned includes the " << nlist << " centroids\n";
    for (std::size_t k : o.k) {
      for (std::size_t np : o.nprobe) {
        if (np > nlist) continue;
        rows.push_back(measure_topk(
            {"ivf", "top-" + std::to_string(k), "nprobe=" + std::to_string(np)}, k, E, exact, n,
            /*threads=*/0,
            [&](auto q, auto ids, auto scores, auto&) { return f.search(q, np, ids, scores); }));
      }
    }
  }
#endif
  (void)o, (void)w, (void)exact, (void)n, (void)rows, (void)info, (void)E, (void)builds;
}

}  // namespace kvsift_bench
