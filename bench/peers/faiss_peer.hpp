#pragma once
// kvsift-bench peer: faiss IVF-Flat with the inner-product metric (Debian libfaiss-dev).
// Compiled only when KVSIFT_BENCH_FAISS is defined, so the library never depends on faiss.
//
// Scanned fraction = (keys in the probed lists + the centroids scored to pick them) / keys,
// the same "vectors scored" count as kvsift's search_stats::distance_computations.

#include <faiss/IndexFlat.h>
#include <faiss/IndexIVF.h>
#include <faiss/IndexIVFFlat.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/search/search_workspace.hpp"

namespace kvsift_bench {

class ivf_flat_peer {
  using idx = faiss::Index::idx_t;  // faiss::idx_t only from faiss 1.7.4 on

 public:
  /// Default list count ~ 4 sqrt(n), the usual faiss rule of thumb.
  static std::size_t default_nlist(std::size_t n) {
    return std::max<std::size_t>(1, static_cast<std::size_t>(4.0 * std::sqrt(double(n))));
  }

  /// Trains k-means on the keys themselves and adds them; `threads` OpenMP threads (0 = all).
  /// `keys` must be contiguous (stride == cols).
  /// @throw kvsift::invalid_argument if keys is empty or not contiguous, or nlist is 0 or > n.
  ivf_flat_peer(kvsift::matrix_view<const float> keys, std::size_t nlist, std::size_t threads)
      : quantizer_(static_cast<idx>(keys.cols())),
        index_(&quantizer_, keys.cols(), nlist, faiss::METRIC_INNER_PRODUCT),
        nlist_(nlist) {
    kvsift::detail::require(keys.rows() > 0, "ivf_flat_peer: expected keys, got none");
    kvsift::detail::require(keys.contiguous(), "ivf_flat_peer: expected contiguous keys (stride ",
                            keys.cols(), "), got stride ", keys.stride());
    kvsift::detail::require(nlist > 0 && nlist <= keys.rows(),
                            "ivf_flat_peer: expected nlist in [1, ", keys.rows(), "], got ", nlist);
    const int before = omp_get_max_threads();
    if (threads) omp_set_num_threads(static_cast<int>(threads));
    index_.verbose = false;
    index_.train(static_cast<idx>(keys.rows()), keys.data());
    index_.add(static_cast<idx>(keys.rows()), keys.data());
    omp_set_num_threads(before);
  }

  /// Adds one key on the calling thread, with the next id (the keys added so far): faiss's own
  /// add, which scores the key against every centroid and appends it to the nearest list;
  /// the centroids stay those of the keys it was trained on. O(nlist d).
  void insert(const float* key) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(1);
    index_.add(1, key);
    omp_set_num_threads(before);
  }

  [[nodiscard]] std::size_t nlist() const noexcept { return nlist_; }

  /// Top-k probing `nprobe` lists, on the calling thread only (latency is single-threaded for
  /// every index). Not thread-safe: faiss keeps its scan counters in a global.
  kvsift::search_stats search(std::span<const float> q, std::size_t nprobe,
                              std::span<kvsift::id_t> ids, std::span<float> scores) {
    faiss::SearchParametersIVF sp;
    sp.nprobe = nprobe;
    labels_.resize(ids.size());
    const int before = omp_get_max_threads();
    omp_set_num_threads(1);
    faiss::indexIVF_stats.reset();
    index_.search(1, q.data(), static_cast<idx>(ids.size()), scores.data(), labels_.data(), &sp);
    kvsift::search_stats s;
    s.distance_computations = faiss::indexIVF_stats.ndis + nlist_;
    omp_set_num_threads(before);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = labels_[i] < 0 ? kvsift::invalid_id : static_cast<kvsift::id_t>(labels_[i]);
      s.count += labels_[i] < 0 ? 0 : 1;
    }
    return s;
  }

 private:
  faiss::IndexFlatIP quantizer_;
  faiss::IndexIVFFlat index_;
  std::size_t nlist_;
  std::vector<idx> labels_;
};

}  // namespace kvsift_bench
