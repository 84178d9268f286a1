#pragma once
// kvsift-bench peer: hnswlib HNSW built on the keys in inner-product space (Debian
// libhnswlib-dev, header-only). Compiled only when KVSIFT_BENCH_HNSWLIB is defined, so the
// library never depends on hnswlib.
//
// Scanned fraction must mean the same as for kvsift's indexes (vectors scored / keys), so the
// space is wrapped in one that counts every distance call, per thread, instead of trusting
// hnswlib's own metric_distance_computations (which skips the entry point and counts per hop).

#include <hnswlib/hnswlib.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>

#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/core/parallel_for.hpp"
#include "kvsift/search/search_workspace.hpp"

namespace kvsift_bench {

/// hnswlib's InnerProductSpace with a per-thread count of distance evaluations.
/// Not copyable: hnswlib keeps pointers to the distance parameter.
class counting_ip_space final : public hnswlib::SpaceInterface<float> {
 public:
  explicit counting_ip_space(std::size_t dim)
      : inner_(dim), param_{inner_.get_dist_func(), inner_.get_dist_func_param()} {}
  counting_ip_space(const counting_ip_space&) = delete;
  counting_ip_space& operator=(const counting_ip_space&) = delete;

  std::size_t get_data_size() override { return inner_.get_data_size(); }
  hnswlib::DISTFUNC<float> get_dist_func() override { return &counted; }
  void* get_dist_func_param() override { return &param_; }

  /// Distance evaluations of the calling thread since its last reset.
  static std::size_t& count() noexcept {
    thread_local std::size_t c = 0;
    return c;
  }

 private:
  struct param {
    hnswlib::DISTFUNC<float> f;
    void* p;
  };
  static float counted(const void* a, const void* b, const void* p) {
    ++count();
    const auto* pp = static_cast<const param*>(p);
    return pp->f(a, b, pp->p);
  }
  hnswlib::InnerProductSpace inner_;
  param param_;
};

/// HNSW over `keys` (label = row id), inner-product distance 1 - q.k.
class hnsw_peer {
 public:
  /// Builds over keys [0, base) (0 = every row) with `threads` threads (0 = all cores), with
  /// room for every row of `keys`, so that the rest can join with insert();
  /// O(n log n * M * ef_construction) distances.
  /// @throw kvsift::invalid_argument if keys is empty, base > keys.rows() or M < 2.
  hnsw_peer(kvsift::matrix_view<const float> keys, std::size_t M, std::size_t ef_construction,
            std::size_t threads, std::size_t base = 0)
      : space_(std::make_unique<counting_ip_space>(keys.cols())) {
    kvsift::detail::require(keys.rows() > 0, "hnsw_peer: expected keys, got none");
    kvsift::detail::require(base <= keys.rows(), "hnsw_peer: expected base <= ", keys.rows(),
                            " keys, got ", base);
    kvsift::detail::require(M >= 2, "hnsw_peer: expected M >= 2, got ", M);
    const std::size_t built = base == 0 ? keys.rows() : base;
    hnsw_ = std::make_unique<hnswlib::HierarchicalNSW<float>>(space_.get(), keys.rows(), M,
                                                              ef_construction, /*seed=*/100);
    // hnswlib's addPoint is thread-safe; insert the first point alone so the others have an
    // entry point, as hnswlib's own parallel example does.
    hnsw_->addPoint(keys.row(0), 0);
    kvsift::parallel_for(built - 1, threads, [&](std::size_t i, std::size_t) {
      hnsw_->addPoint(keys.row(i + 1), i + 1);
    });
  }

  /// Adds `key` under label `id` (< the constructor's keys.rows()), on the calling thread:
  /// hnswlib's own insert, the one it builds with. O(log n * M * ef_construction) distances.
  void insert(const float* key, std::size_t id) { hnsw_->addPoint(key, id); }

  /// Top-k with search list size ef (hnswlib uses max(ef, k)). Not thread-safe (setEf).
  /// Writes ids best first (invalid_id past the results) and raw inner products.
  kvsift::search_stats search(std::span<const float> q, std::size_t ef, std::span<kvsift::id_t> ids,
                              std::span<float> scores) {
    hnsw_->setEf(ef);
    counting_ip_space::count() = 0;
    auto heap = hnsw_->searchKnn(q.data(), ids.size());
    kvsift::search_stats s;
    s.distance_computations = counting_ip_space::count();
    s.count = heap.size();
    std::fill(ids.begin(), ids.end(), kvsift::invalid_id);
    // The heap pops the farthest first: fill from the back.
    for (std::size_t i = heap.size(); i-- > 0; heap.pop()) {
      ids[i] = static_cast<kvsift::id_t>(heap.top().second);
      scores[i] = 1.0f - heap.top().first;
    }
    return s;
  }

 private:
  std::unique_ptr<counting_ip_space> space_;
  std::unique_ptr<hnswlib::HierarchicalNSW<float>> hnsw_;
};

}  // namespace kvsift_bench
