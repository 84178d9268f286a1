#pragma once
// Bodies of <kvsift/index/insertable_graph.hpp>.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/detail/simd_kernels.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/topk.hpp"
#include "kvsift/index/roargraph_builder.hpp"
#include "kvsift/search/beam_search.hpp"

namespace kvsift {
namespace detail {

/// The first `n` keys of an insertable graph as a `VectorStore`, for `rng_prune`.
template <Element T>
struct key_rows {
  using value_type = T;
  const T* data;
  std::size_t n, d;
  [[nodiscard]] std::size_t size() const noexcept { return n; }
  [[nodiscard]] std::size_t dim() const noexcept { return d; }
  [[nodiscard]] const T* row(std::size_t i) const noexcept { return data + i * d; }
};
static_assert(VectorStore<key_rows<float>>);

/// The graph under Euclidean distance: the insert searches it as the build's step 3 does.
template <class G>
struct euclidean_view {
  using metric_type = l2;
  const G& g;
  [[nodiscard]] std::size_t size() const noexcept { return g.size(); }
  [[nodiscard]] std::size_t dim() const noexcept { return g.dim(); }
  [[nodiscard]] std::span<const id_t> entry_points() const noexcept { return g.entry_points(); }
  [[nodiscard]] id_t entry_point() const noexcept { return g.entry_point(); }
  [[nodiscard]] std::span<const id_t> neighbors(id_t i) const noexcept { return g.neighbors(i); }
  void prefetch(id_t i) const noexcept { g.prefetch(i); }
  [[nodiscard]] float score(const float* q, id_t i) const noexcept {
    return l2::score(q, g.row(i), g.dim());
  }
};

/// Grows `v`'s capacity to at least `need`, at least doubling it: appending one key at a time
/// costs amortised O(1) per element instead of a copy of the whole array per insert.
template <class V>
void grow_to(V& v, std::size_t need) {
  if (v.capacity() >= need) return;
  const std::size_t doubled = v.capacity() > v.max_size() / 2 ? v.max_size() : 2 * v.capacity();
  v.reserve(std::max(need, doubled));
}

/// Slot of the worst entry of a kNN list (lowest key; ties: the higher id ranks lower).
inline std::uint32_t worst_slot(const float* keys, const id_t* ids, std::size_t k) noexcept {
  std::size_t w = 0;
  for (std::size_t j = 1; j < k; ++j) {
    if (ranks_before({keys[w], ids[w]}, {keys[j], ids[j]})) w = j;
  }
  return static_cast<std::uint32_t>(w);
}

/// Slot of the best entry of a kNN list (highest key; ties: the lower id).
inline std::uint32_t best_slot(const float* keys, const id_t* ids, std::size_t k) noexcept {
  std::size_t b = 0;
  for (std::size_t j = 1; j < k; ++j) {
    if (ranks_before({keys[j], ids[j]}, {keys[b], ids[b]})) b = j;
  }
  return static_cast<std::uint32_t>(b);
}

}  // namespace detail

template <Element T, Metric M>
template <VectorStore Store>
requires std::same_as<typename Store::value_type, T> insertable_graph<T, M>::insertable_graph(
    const graph_index<Store, M>& built, matrix_view<const float> train_queries,
    const knn_result& train_knn, const graph_insert_params& params)
    : params_(params) {
  const std::size_t n = built.size(), d = built.dim(), R = built.max_degree();
  detail::require(n > 0, "insertable_graph: expected a non-empty graph, got 0 keys");
  detail::require(params.L > 0, "insertable_graph: expected L >= 1, got 0");
  detail::require(params.degree <= R, "insertable_graph: expected degree <= max_degree = ", R,
                  ", got ", params.degree);
  detail::require(train_queries.rows() > 0,
                  "insertable_graph: expected at least one training query, got 0");
  require_dim(d, train_queries.cols(), "insertable_graph: training query dimension");
  const std::size_t m = train_queries.rows(), k = train_knn.k;
  detail::require(train_knn.rows == m && k > 0, "insertable_graph: expected a kNN result of ", m,
                  " rows (one per training query) and k > 0, got ", train_knn.rows, " x ", k);
  const std::size_t cells = checked_mul(m, k, "insertable_graph: kNN of m x k");
  detail::require(train_knn.ids.size() == cells, "insertable_graph: kNN result of ", m, " x ", k,
                  " holds ", train_knn.ids.size(), " ids, expected ", cells);
  for (std::size_t c = 0; c < cells; ++c) {
    const id_t id = train_knn.ids[c];
    detail::require<out_of_range>(id == invalid_id || id < n, "insertable_graph: kNN row ", c / k,
                                  " holds id ", id, ", expected < ", n);
  }
  require_finite(train_queries, "insertable_graph: training queries");
  (void)checked_bytes<float>(checked_mul(m, d, "insertable_graph: queries m x d"),
                             "insertable_graph: query bytes");

  dim_ = d;
  R_ = R;
  degree_ = params.degree != 0 ? params.degree : std::max<std::size_t>(1, R / 2);
  keys_.resize(n * d);
  for (std::size_t i = 0; i < n; ++i) {
    std::copy_n(built.store().row(i), d, keys_.begin() + static_cast<std::ptrdiff_t>(i * d));
  }
  adj_.assign(built.adjacency().begin(), built.adjacency().end());
  degrees_.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    degrees_[i] = static_cast<std::uint32_t>(built.neighbors(static_cast<id_t>(i)).size());
  }
  entries_.assign(built.entry_points().begin(), built.entry_points().end());
  m_ = m;
  nq_ = k;
  queries_.resize(m * d);
  for (std::size_t i = 0; i < m; ++i) {
    std::copy_n(train_queries.row(i), d, queries_.begin() + static_cast<std::ptrdiff_t>(i * d));
  }
  knn_ids_ = train_knn.ids;
  knn_keys_.resize(cells);
  worst_.resize(m);
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < k; ++j) {
      const id_t id = knn_ids_[i * k + j];
      knn_keys_[i * k + j] = id == invalid_id ? -std::numeric_limits<float>::infinity()
                                              : to_key<M>(M::score(&queries_[i * d], row(id), d));
    }
    worst_[i] = detail::worst_slot(&knn_keys_[i * k], &knn_ids_[i * k], k);
  }
}

template <Element T, Metric M>
id_t insertable_graph<T, M>::insert(matrix_view<const T> keys) {
  const std::size_t n = size(), count = keys.rows();
  if (count == 0) return static_cast<id_t>(n);
  // Everything that can be wrong with the batch is found here, before any state changes.
  // Shapes and sizes first: they are checked before any key is read.
  require_dim(dim_, keys.cols(), "insertable_graph::insert: key dimension");
  const std::size_t need = checked_add(n, count, "insertable_graph::insert: n + count");
  detail::require<out_of_range>(need <= max_index_size, "insertable_graph::insert: ", n, " keys + ",
                                count, " new ones exceed the id space of ", max_index_size,
                                " keys (ids are 32-bit)");
  const std::size_t need_keys = checked_mul(need, dim_, "insertable_graph::insert: keys n x d");
  const std::size_t need_adj = checked_mul(need, R_, "insertable_graph::insert: graph n x R");
  (void)checked_bytes<T>(need_keys, "insertable_graph::insert: key bytes");
  (void)checked_bytes<id_t>(need_adj, "insertable_graph::insert: graph bytes");
  require_finite(keys, "insertable_graph::insert: keys");
  // Room for the whole batch (std::vector::reserve changes nothing if it throws), so the
  // appends below never reallocate.
  detail::grow_to(keys_, need_keys);
  detail::grow_to(adj_, need_adj);
  detail::grow_to(degrees_, need);
  for (std::size_t i = 0; i < count; ++i) insert_one(keys.row(i));
  return static_cast<id_t>(n);
}

template <Element T, Metric M>
void insertable_graph<T, M>::insert_one(const T* key) {
  const std::size_t n = size(), d = dim_;
  const auto x = static_cast<id_t>(n);
  xf_.resize(d);
  detail::widen(key, xf_.data(), d);

  // 1. The new key against every training query: its nearest queries, and their kNN updates.
  const std::size_t t = std::min(params_.query_neighbors, m_);
  const bool score_queries = t > 0 || params_.update_query_knn;
  if (score_queries) {
    qkeys_.resize(m_);
    for (std::size_t i = 0; i < m_; ++i) {
      qkeys_[i] = to_key<M>(M::score(&queries_[i * d], key, d));
    }
  }
  // 2. Candidates: the nearest queries' kNN keys, then the keys a graph search finds.
  merged_.clear();
  if (t > 0) {
    ws_.topk.reset(t);
    for (std::size_t i = 0; i < m_; ++i) ws_.topk.push(qkeys_[i], static_cast<id_t>(i));
    for (const scored_id& q : ws_.topk.sorted()) {
      const id_t* list = &knn_ids_[static_cast<std::size_t>(q.id) * nq_];
      for (std::size_t j = 0; j < nq_; ++j) {
        if (list[j] != invalid_id) merged_.push_back(list[j]);
      }
    }
  }
  const std::size_t L = std::min(params_.L, n);
  ids_.resize(L);
  scores_.resize(L);
  const detail::euclidean_view<insertable_graph> eg{*this};
  const auto s = beam_search(eg, std::span<const float>(xf_), {L, L}, ws_, std::span<id_t>(ids_),
                             std::span<float>(scores_));
  merged_.insert(merged_.end(), ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(s.count));
  std::sort(merged_.begin(), merged_.end());
  merged_.erase(std::unique(merged_.begin(), merged_.end()), merged_.end());
  cands_.clear();
  for (const id_t c : merged_) cands_.push_back({to_key<l2>(l2::score(xf_.data(), row(c), d)), c});
  // 3. Its own edges, pruned as the build prunes.
  const detail::key_rows<T> old_keys{keys_.data(), n, d};
  detail::rng_prune<detail::key_rows<T>, l2>(old_keys, cands_, degree_, params_.fill, scratch_,
                                             kept_);

  // Commit the key and its row: capacity was reserved, nothing below reallocates.
  keys_.insert(keys_.end(), key, key + d);
  adj_.resize(adj_.size() + R_, invalid_id);
  std::copy(kept_.begin(), kept_.end(), adj_.begin() + static_cast<std::ptrdiff_t>(n * R_));
  degrees_.push_back(static_cast<std::uint32_t>(kept_.size()));
  // 4. The kNN lists: x replaces the worst entry of every list it beats (ties: the older key,
  //    with the lower id, stays), so each list stays its query's exact top-nq.
  //    The pivot (best key) of every list x enters gets x as a candidate edge: the projection
  //    (build step 2) links each query's pivot to the query's other kNN keys.
  targets_.assign(kept_.begin(), kept_.end());
  if (params_.update_query_knn) {
    for (std::size_t i = 0; i < m_; ++i) {
      float* lk = &knn_keys_[i * nq_];
      id_t* li = &knn_ids_[i * nq_];
      const std::uint32_t w = worst_[i];
      if (!ranks_before({qkeys_[i], x}, {lk[w], li[w]})) continue;
      lk[w] = qkeys_[i];
      li[w] = x;
      worst_[i] = detail::worst_slot(lk, li, nq_);
      const id_t pivot = li[detail::best_slot(lk, li, nq_)];
      if (pivot != x && std::find(targets_.begin(), targets_.end(), pivot) == targets_.end()) {
        targets_.push_back(pivot);
      }
    }
  }
  // 5. Reverse edges.
  link_back(x, targets_);
}

template <Element T, Metric M>
void insertable_graph<T, M>::link_back(id_t x, std::span<const id_t> chosen) {
  const std::size_t d = dim_;
  const detail::key_rows<T> all{keys_.data(), size(), d};
  bool linked = false;
  for (const id_t y : chosen) {
    id_t* row_y = &adj_[static_cast<std::size_t>(y) * R_];
    const std::uint32_t deg = degrees_[y];
    if (deg < R_) {
      row_y[deg] = x;
      degrees_[y] = deg + 1;
      linked = true;
      continue;
    }
    // A full row: re-pruned around y with x as one more candidate (the build's rule).
    xf_.resize(d);
    detail::widen(this->row(y), xf_.data(), d);
    cands_.clear();
    for (std::size_t j = 0; j <= deg; ++j) {
      const id_t c = j < deg ? row_y[j] : x;
      cands_.push_back({to_key<l2>(l2::score(xf_.data(), this->row(c), d)), c});
    }
    detail::rng_prune<detail::key_rows<T>, l2>(all, cands_, R_, params_.fill, scratch_, ids_);
    std::copy(ids_.begin(), ids_.end(), row_y);
    std::fill(row_y + ids_.size(), row_y + R_, invalid_id);
    degrees_[y] = static_cast<std::uint32_t>(ids_.size());
    linked |= std::find(ids_.begin(), ids_.end(), x) != ids_.end();
  }
  // No row kept x: without an in-edge no search could reach it. It takes the place of the
  // lowest-ranked edge of its nearest chosen neighbour (the build's repair does the same).
  if (!linked && !chosen.empty()) {
    const id_t y = chosen.front();
    adj_[static_cast<std::size_t>(y) * R_ + degrees_[y] - 1] = x;
  }
}

template <Element T, Metric M>
degree_stats insertable_graph<T, M>::degrees() const noexcept {
  degree_stats s;
  if (degrees_.empty()) return s;
  s.min = std::numeric_limits<std::size_t>::max();
  std::size_t total = 0;
  for (const std::uint32_t deg : degrees_) {
    s.min = std::min<std::size_t>(s.min, deg);
    s.max = std::max<std::size_t>(s.max, deg);
    s.zero_degree += deg == 0 ? 1 : 0;
    total += deg;
  }
  s.mean = static_cast<double>(total) / static_cast<double>(degrees_.size());
  return s;
}

template <Element T, Metric M>
insertable_graph_memory insertable_graph<T, M>::memory() const noexcept {
  return {keys_.size() * sizeof(T), adj_.size() * sizeof(id_t) + degrees_.size() * 4,
          queries_.size() * sizeof(float), knn_ids_.size() * (sizeof(id_t) + sizeof(float))};
}

template <Element T, Metric M>
graph_index<owning_store<T>, M> insertable_graph<T, M>::snapshot() const {
  return graph_index<owning_store<T>, M>(owning_store<T>(keys_, dim_), R_, adj_, entries_);
}

template <Metric M, KnnEngine Engine, Element T>
insertable_graph<T, M> build_insertable(const roargraph_builder<M, Engine>& builder,
                                        matrix_view<const T> keys,
                                        matrix_view<const float> train_queries,
                                        const graph_insert_params& params) {
  const knn_result knn = builder.training_knn(keys, train_queries);
  const auto g = builder.build_from_knn(view_store<T>(keys), knn);
  return insertable_graph<T, M>(g, train_queries, knn, params);
}

}  // namespace kvsift
