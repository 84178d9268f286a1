#pragma once
// Bodies of <kvsift/index/insertable_graph.hpp>.

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/detail/prefetch.hpp"
#include "kvsift/core/detail/simd.hpp"
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
  /// The search requests the next expansion's adjacency row while it scores this one's.
  void prefetch_neighbors(id_t i) const noexcept {
    const std::span<const id_t> nb = g.neighbors(i);
    prefetch_row(nb.data(), nb.size_bytes());
  }
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

/// "a ranks before b" as a heap order: std::make_heap with it keeps the worst entry (lowest
/// key; ties: the higher id) of a kNN list in front, so replacing it (`replace_worst`) costs
/// O(log nq) instead of a scan of the list for the next worst.
inline bool worst_first(const scored_id& a, const scored_id& b) noexcept {
  return ranks_before(a, b);
}

/// Puts `v` in place of the front (worst) entry of the heap `h` (k entries, `worst_first`
/// order) and restores the heap: one sift-down, O(log k), where pop_heap + push_heap take two.
inline void replace_worst(scored_id* h, std::size_t k, scored_id v) noexcept {
  std::size_t i = 0;
  for (std::size_t c = 1; c < k; c = 2 * i + 1) {
    if (c + 1 < k && ranks_before(h[c], h[c + 1])) ++c;  // the worse child
    if (!ranks_before(v, h[c])) break;
    h[i] = h[c];
    i = c;
  }
  h[i] = v;
}

/// Inserts `v` into `top` (sorted best first, at most `t` entries) if it ranks among the `t`
/// best so far. O(1) for a rejected entry, O(t) for an accepted one: for t = 4 queries out of
/// thousands nearly every entry is rejected by one comparison.
inline void push_top(std::vector<scored_id>& top, std::size_t t, scored_id v) {
  if (top.size() == t && !ranks_before(v, top.back())) return;
  if (top.size() < t) top.push_back(v);
  std::size_t j = top.size() - 1;
  for (; j > 0 && ranks_before(v, top[j - 1]); --j) top[j] = top[j - 1];
  top[j] = v;
}

/// Scores of one f32 vector `x` against the m rows `row_at(0..m-1)` (each d floats), as
/// `M::score(row, x, d)`, into `out`. For the library's two metrics four rows share each load
/// of x (one pass over x per four rows instead of per row): the insert scores its training
/// queries this way, a quarter of its instructions before. The sums are formed in another
/// order than the one-row kernels', so a score may differ from M::score's in the last bits.
template <Metric M, class RowAt>
void score_rows_at(RowAt row_at, std::size_t m, std::size_t d, const float* x, float* out) {
  std::size_t i = 0;
  constexpr bool ip = std::same_as<M, inner_product>, euclid = std::same_as<M, l2>;
  if constexpr (ip || euclid) {
    using simd::load;
    using simd::vfloat;
    constexpr std::size_t w = simd::width;
    const auto term = [](vfloat q, vfloat xb, vfloat acc) {
      if constexpr (ip) {
        return acc + q * xb;
      } else {
        const vfloat t = q - xb;
        return acc + t * t;
      }
    };
    for (; i + 4 <= m; i += 4) {
      const float* r[4] = {row_at(i), row_at(i + 1), row_at(i + 2), row_at(i + 3)};
      // The next four rows are requested while these are scored: gathered rows lie anywhere
      // in the m x d matrix, and each is a run of cache misses the hardware prefetcher only
      // picks up a few lines in.
      for (std::size_t j = i + 4; j < std::min(i + 8, m); ++j) {
        prefetch_row(row_at(j), d * sizeof(float));
      }
      vfloat s0{}, s1{}, s2{}, s3{};
      std::size_t c = 0;
      for (; c + w <= d; c += w) {
        const vfloat xb = load(x + c);
        s0 = term(load(r[0] + c), xb, s0);
        s1 = term(load(r[1] + c), xb, s1);
        s2 = term(load(r[2] + c), xb, s2);
        s3 = term(load(r[3] + c), xb, s3);
      }
      float a[4] = {simd::hsum(s0), simd::hsum(s1), simd::hsum(s2), simd::hsum(s3)};
      for (; c < d; ++c) {
        for (int j = 0; j < 4; ++j) {
          if constexpr (ip) {
            a[j] += r[j][c] * x[c];
          } else {
            const float t = r[j][c] - x[c];
            a[j] += t * t;
          }
        }
      }
      std::copy_n(a, 4, out + i);
    }
  }
  for (; i < m; ++i) out[i] = M::score(row_at(i), x, d);
}

/// `score_rows` over a row-major m x d matrix.
template <Metric M>
void score_rows(const float* rows, std::size_t m, std::size_t d, const float* x, float* out) {
  score_rows_at<M>([rows, d](std::size_t i) { return rows + i * d; }, m, d, x, out);
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
  kept_count_.assign(n, unknown_layout);
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
  knn_.resize(cells);
  best_.resize(m);
  worst_key_.resize(m);
  for (std::size_t i = 0; i < m; ++i) {
    scored_id* list = &knn_[i * k];
    for (std::size_t j = 0; j < k; ++j) {
      const id_t id = train_knn.ids[i * k + j];
      list[j] = {id == invalid_id ? -std::numeric_limits<float>::infinity()
                                  : to_key<M>(M::score(&queries_[i * d], row(id), d)),
                 id};
    }
    best_[i] = *std::min_element(list, list + k, detail::rank_order{});
    std::make_heap(list, list + k, detail::worst_first);
    worst_key_[i] = list[0].key;
  }
  if (params.query_candidates > 0) {  // the kNN lists read backwards: key -> its lists
    const std::size_t hcap = holder_cap();
    holders_.resize(n);
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t j = 0; j < k; ++j) {
        const id_t id = knn_[i * k + j].id;
        // Queries in ascending order, so a capped list keeps a key's lowest holders.
        if (id != invalid_id && holders_[id].size() < hcap) {
          holders_[id].push_back(static_cast<id_t>(i));
        }
      }
    }
    gathered_.assign((m + 63) / 64, 0);
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
  detail::grow_to(kept_count_, need);
  if (params_.query_candidates > 0) detail::grow_to(holders_, need);
  for (std::size_t i = 0; i < count; ++i) insert_one(keys.row(i));
  return static_cast<id_t>(n);
}

template <Element T, Metric M>
void insertable_graph<T, M>::insert_one(const T* key) {
  const std::size_t n = size(), d = dim_;
  const auto x = static_cast<id_t>(n);
  xf_.resize(d);
  detail::widen(key, xf_.data(), d);

  // The graph search from x (pool L, Euclidean, as the build's step 3 searches): candidates
  // for x's edges, and with the query-side index the keys whose queries x is scored against.
  const std::size_t L = std::min(params_.L, n);
  found_.resize(L);
  scores_.resize(L);
  const detail::euclidean_view<insertable_graph> eg{*this};
  const auto s = beam_search(eg, std::span<const float>(xf_), {L, L}, ws_, std::span<id_t>(found_),
                             std::span<float>(scores_));
  found_.resize(s.count);

  // 1. The training queries x is scored against (`qids_`, ascending, keys in `qkeys_`): every
  //    one, or those whose lists hold the keys the search found.
  const std::size_t t = params_.query_neighbors;
  qids_.clear();
  if (t > 0 || params_.update_query_knn) {
    if (params_.query_candidates > 0) {
      gather_queries();
      qkeys_.resize(qids_.size());
      detail::score_rows_at<M>([&](std::size_t j) { return &queries_[std::size_t{qids_[j]} * d]; },
                               qids_.size(), d, xf_.data(), qkeys_.data());
    } else {
      qids_.resize(m_);
      std::iota(qids_.begin(), qids_.end(), id_t{0});
      qkeys_.resize(m_);
      detail::score_rows<M>(queries_.data(), m_, d, xf_.data(), qkeys_.data());
    }
    for (float& k : qkeys_) k = to_key<M>(k);
  }
  // 2. Candidates: the nearest queries' kNN keys, then the keys the graph search found.
  // Each candidate once (a key in several lists, or also found), deduplicated by a visited
  // set over the keys: no sort of the ids. The pruning ranks the candidates, so the order
  // they are scored in does not matter. The ids are gathered first and scored after, each
  // row requested a few candidates ahead of its scoring: the candidates are random rows of
  // the keys, and scored as they were found each was a run of cache misses of its own.
  cands_.clear();
  ids_.clear();
  offered_keys_.reset(n);
  const auto offer = [&](id_t c) {
    if (offered_keys_.try_insert(c)) ids_.push_back(c);
  };
  if (t > 0) {
    top_.clear();
    for (std::size_t j = 0; j < qids_.size(); ++j) detail::push_top(top_, t, {qkeys_[j], qids_[j]});
    for (const scored_id& q : top_) {
      const scored_id* list = &knn_[static_cast<std::size_t>(q.id) * nq_];
      for (std::size_t j = 0; j < nq_; ++j) {
        if (list[j].id != invalid_id) offer(list[j].id);
      }
    }
  }
  for (const id_t c : found_) offer(c);
  constexpr std::size_t ahead = 4;
  for (std::size_t j = 0; j < std::min(ahead, ids_.size()); ++j) prefetch(ids_[j]);
  for (std::size_t j = 0; j < ids_.size(); ++j) {
    if (j + ahead < ids_.size()) prefetch(ids_[j + ahead]);
    cands_.push_back({to_key<l2>(l2::score(xf_.data(), row(ids_[j]), d)), ids_[j]});
  }
  // 3. Its own edges, pruned as the build prunes.
  const detail::key_rows<T> old_keys{keys_.data(), n, d};
  detail::rng_prune<detail::key_rows<T>, l2>(old_keys, cands_, degree_, params_.fill, scratch_,
                                             kept_);

  // Commit the key and its row: capacity was reserved, nothing below reallocates.
  keys_.insert(keys_.end(), key, key + d);
  adj_.resize(adj_.size() + R_, invalid_id);
  std::copy(kept_.begin(), kept_.end(), adj_.begin() + static_cast<std::ptrdiff_t>(n * R_));
  degrees_.push_back(static_cast<std::uint32_t>(kept_.size()));
  kept_count_.push_back(unknown_layout);
  if (params_.query_candidates > 0) holders_.emplace_back();  // capacity reserved by insert
  targets_.assign(kept_.begin(), kept_.end());
  // 4. The kNN lists (and the pivots of those x enters become targets).
  if (params_.update_query_knn) update_lists(x);
  // 5. Reverse edges.
  link_back(x, targets_);
  // 6. The projection's reverse edge: a pivot p that kept x (p -> x) is linked back from x
  //    (x -> p), as the build links every key a pivot keeps back to it (`project`). Without
  //    it the late queries of the SmolLM2 8K dump missed the attention sink (key 0, the pivot
  //    of most lists) in 291 of 410 answers after the inserts: recall@100 0.9836 / 0.9922 at
  //    pool 100 / 200, against 0.9867 / 0.9979 with it (the rebuild: 0.9972 / 0.9999).
  id_t* row_x = &adj_[n * R_];
  for (std::size_t i = kept_.size(); i < targets_.size() && degrees_[x] < R_; ++i) {
    const id_t p = targets_[i];
    const auto nb = neighbors(p);
    if (std::find(nb.begin(), nb.end(), x) == nb.end()) continue;
    if (std::find(row_x, row_x + degrees_[x], p) != row_x + degrees_[x]) continue;
    row_x[degrees_[x]++] = p;
  }
}

template <Element T, Metric M>
void insertable_graph<T, M>::check_queries(matrix_view<const float> queries) {
  // Everything that can be wrong with the batch, then room for all of it, before any change.
  const std::size_t count = queries.rows();
  require_dim(dim_, queries.cols(), "insertable_graph::add_queries: query dimension");
  const std::size_t need = checked_add(m_, count, "insertable_graph::add_queries: m + count");
  detail::require<out_of_range>(need <= max_index_size, "insertable_graph::add_queries: ", m_,
                                " training queries + ", count, " new ones exceed ", max_index_size,
                                " (query numbers are 32-bit)");
  const std::size_t need_q = checked_mul(need, dim_, "insertable_graph::add_queries: m x d");
  const std::size_t need_knn = checked_mul(need, nq_, "insertable_graph::add_queries: m x nq");
  (void)checked_bytes<float>(need_q, "insertable_graph::add_queries: query bytes");
  (void)checked_bytes<scored_id>(need_knn, "insertable_graph::add_queries: kNN bytes");
  require_finite(queries, "insertable_graph::add_queries: queries");
  detail::grow_to(queries_, need_q);
  detail::grow_to(knn_, need_knn);
  detail::grow_to(best_, need);
  detail::grow_to(worst_key_, need);
  if (params_.query_candidates > 0) detail::grow_to(gathered_, (need + 63) / 64);
}

template <Element T, Metric M>
std::size_t insertable_graph<T, M>::add_queries(matrix_view<const float> queries,
                                                std::size_t pool) {
  detail::require(pool > 0, "insertable_graph::add_queries: expected pool >= 1, got 0");
  const std::size_t first = m_;
  if (queries.rows() == 0) return first;
  check_queries(queries);
  const std::size_t k = std::min(nq_, size()), L = std::max(pool, nq_);
  found_.resize(k);
  scores_.resize(k);
  for (std::size_t i = 0; i < queries.rows(); ++i) {
    const auto st = beam_search(*this, std::span<const float>(queries.row(i), dim_), {k, L}, ws_,
                                std::span<id_t>(found_), std::span<float>(scores_));
    cands_.clear();
    for (std::size_t j = 0; j < st.count; ++j) cands_.push_back({to_key<M>(scores_[j]), found_[j]});
    add_query(queries.row(i), cands_);
  }
  return first;
}

template <Element T, Metric M>
std::size_t insertable_graph<T, M>::add_queries(matrix_view<const float> queries,
                                                const knn_result& lists) {
  const std::size_t first = m_, count = queries.rows(), k = lists.k, n = size();
  detail::require(lists.rows == count, "insertable_graph::add_queries: expected lists of ", count,
                  " rows (one per query), got ", lists.rows);
  if (count == 0) return first;
  detail::require(k > 0, "insertable_graph::add_queries: expected lists with k >= 1, got 0");
  const std::size_t cells = checked_mul(count, k, "insertable_graph::add_queries: lists rows x k");
  detail::require(lists.ids.size() == cells, "insertable_graph::add_queries: lists of ", count,
                  " x ", k, " hold ", lists.ids.size(), " ids, expected ", cells);
  offered_keys_.reset(n);
  for (std::size_t r = 0; r < count; ++r) {
    for (std::size_t j = 0; j < k; ++j) {
      const id_t id = lists.ids[r * k + j];
      if (id == invalid_id) continue;
      detail::require<out_of_range>(id < n, "insertable_graph::add_queries: lists row ", r,
                                    " holds id ", id, ", expected < ", n);
      detail::require(offered_keys_.try_insert(id), "insertable_graph::add_queries: lists row ", r,
                      " holds id ", id, " twice");
    }
    offered_keys_.reset(n);
  }
  check_queries(queries);
  for (std::size_t r = 0; r < count; ++r) {
    const float* q = queries.row(r);
    cands_.clear();
    for (std::size_t j = 0; j < k; ++j) {
      const id_t id = lists.ids[r * k + j];
      if (id != invalid_id) cands_.push_back({to_key<M>(M::score(q, row(id), dim_)), id});
    }
    if (cands_.size() > nq_) {  // the best nq, as the build's kNN keeps
      std::nth_element(cands_.begin(), cands_.begin() + static_cast<std::ptrdiff_t>(nq_),
                       cands_.end(), detail::rank_order{});
      cands_.resize(nq_);
    }
    add_query(q, cands_);
  }
  return first;
}

template <Element T, Metric M>
void insertable_graph<T, M>::add_query(const float* q, std::span<scored_id> entries) {
  // Query m_ with at most nq entries (distinct ids < size()); the storage was reserved by
  // check_queries, so only the key -> query lists can allocate.
  const std::size_t i = m_;
  queries_.insert(queries_.end(), q, q + dim_);
  knn_.resize((i + 1) * nq_, {-std::numeric_limits<float>::infinity(), invalid_id});
  scored_id* list = &knn_[i * nq_];
  std::copy(entries.begin(), entries.end(), list);
  best_.push_back(*std::min_element(list, list + nq_, detail::rank_order{}));
  std::make_heap(list, list + nq_, detail::worst_first);
  worst_key_.push_back(list[0].key);
  if (params_.query_candidates > 0) {
    // The new query has the highest number: appending keeps each key's list ascending.
    for (const scored_id& e : entries) {
      if (holders_[e.id].size() < holder_cap()) holders_[e.id].push_back(static_cast<id_t>(i));
    }
    gathered_.resize((i + 1 + 63) / 64, 0);
  }
  m_ = i + 1;
}

template <Element T, Metric M>
void insertable_graph<T, M>::gather_queries() {
  // Nearest found key first: the queries whose lists hold the keys nearest x are the ones
  // that rank x high (x would sit near those keys in their answers). Each key's holders are
  // in query order, so where the cap falls inside a key's list the lowest queries are taken:
  // the gathered set depends on the lists' contents only. A bit per query marks the gathered
  // ones; reading the marked words back gives them in ascending order (the list walk, and so
  // the order of the reverse edges, is in query order) and clears them, O(m / 64) words
  // instead of a sort of up to C ids (9% of an insert's instructions on the sample).
  const std::size_t cap = params_.query_candidates;
  std::size_t count = 0;
  for (const id_t y : found_) {
    for (const id_t q : holders_[y]) {
      std::uint64_t& word = gathered_[q >> 6];
      const std::uint64_t bit = std::uint64_t{1} << (q & 63u);
      if ((word & bit) != 0) continue;
      word |= bit;
      if (++count == cap) break;
    }
    if (count == cap) break;
  }
  qids_.resize(count);
  std::size_t at = 0;
  for (std::size_t w = 0; at < count; ++w) {
    for (std::uint64_t word = gathered_[w]; word != 0; word &= word - 1) {
      qids_[at++] = static_cast<id_t>(w * 64 + static_cast<std::size_t>(std::countr_zero(word)));
    }
    gathered_[w] = 0;
  }
}

template <Element T, Metric M>
void insertable_graph<T, M>::update_lists(id_t x) {
  // x replaces the worst entry of every offered list it beats (ties: the older key, with the
  // lower id, stays), so each list stays its query's top-nq over the keys offered to it.
  // The pivot (best key) of every list x enters gets x as a candidate edge: the projection
  // (build step 2) links each query's pivot to the query's other kNN keys.
  // Each list is a heap with its worst entry in front (O(log nq) per replacement) and its
  // best entry kept beside it: the best only changes when x beats it (it is never the one
  // replaced, unless nq = 1, where x then beats it too).
  const std::size_t lists = params_.query_knn_lists, scored = qids_.size();
  offered_.resize(scored);
  std::iota(offered_.begin(), offered_.end(), std::uint32_t{0});
  if (lists != 0 && lists < scored) {  // x's `lists` nearest scored queries, in id order
    std::nth_element(offered_.begin(), offered_.begin() + static_cast<std::ptrdiff_t>(lists - 1),
                     offered_.end(), [&](std::uint32_t a, std::uint32_t b) {
                       return qkeys_[a] != qkeys_[b] ? qkeys_[a] > qkeys_[b] : qids_[a] < qids_[b];
                     });
    offered_.resize(lists);
    std::sort(offered_.begin(), offered_.end());
  }
  // The lists x enters, in offered order. x's key is finite and its id the highest, so it
  // beats a list's worst entry exactly when its key is higher (an empty slot's key is -inf).
  // The worst keys sit in their own array: most queries reject x, and a scan of it touches m
  // floats, not m lists. Each list x enters, and the key -> query list of the key it drops,
  // is a cache miss of its own (on Gemma-3 32K, half of this function's time went to those
  // loads): the lists' heads are requested here, the key -> query lists a few lists ahead of
  // the walk below.
  entering_.clear();
  for (const std::uint32_t j : offered_) {
    if (!(qkeys_[j] > worst_key_[qids_[j]])) continue;
    entering_.push_back(j);
    detail::prefetch_row(&knn_[std::size_t{qids_[j]} * nq_], 4 * 64);  // the heap's top levels
  }
  const bool index = params_.query_candidates > 0;
  // x's backward list, sized to the lists it enters: the walk allocates nothing.
  if (index) holders_.back().reserve(std::min(entering_.size(), holder_cap()));
  const auto dropped_holders = [&](std::size_t e) -> const std::vector<id_t>* {
    const id_t y = knn_[std::size_t{qids_[entering_[e]]} * nq_].id;
    return y == invalid_id ? nullptr : &holders_[y];
  };
  constexpr std::size_t ahead = 8;  // lists: the vector's header; ahead / 2: its ids
  id_t last_pivot = invalid_id;
  for (std::size_t e = 0; e < entering_.size(); ++e) {
    if (index && e + ahead < entering_.size()) {
      if (const auto* h = dropped_holders(e + ahead)) __builtin_prefetch(h);
    }
    if (index && e + ahead / 2 < entering_.size()) {
      const auto* h = dropped_holders(e + ahead / 2);
      if (h != nullptr && !h->empty()) __builtin_prefetch(h->data());
    }
    const std::uint32_t j = entering_[e];
    const id_t i = qids_[j];
    scored_id* list = &knn_[std::size_t{i} * nq_];
    const scored_id nx{qkeys_[j], x};
    if (index && list[0].id != invalid_id) {  // the replaced key no longer holds this list
      // (A capped list may not have recorded it.)
      std::vector<id_t>& h = holders_[list[0].id];
      const auto at = std::lower_bound(h.begin(), h.end(), i);
      if (at != h.end() && *at == i) h.erase(at);
    }
    // Ascending: the walk is in query order, and a capped list keeps the lowest queries.
    if (index && holders_.back().size() < holder_cap()) holders_.back().push_back(i);
    detail::replace_worst(list, nq_, nx);
    worst_key_[i] = list[0].key;
    if (ranks_before(nx, best_[i])) best_[i] = nx;
    // Most lists a key enters share a few pivots (the sink above all): the last one seen
    // spares the search of the targets for it.
    const id_t pivot = best_[i].id;
    if (pivot == x || pivot == last_pivot) continue;
    last_pivot = pivot;
    if (std::find(targets_.begin(), targets_.end(), pivot) == targets_.end()) {
      targets_.push_back(pivot);
    }
  }
}

template <Element T, Metric M>
void insertable_graph<T, M>::link_back(id_t x, std::span<const id_t> chosen) {
  const std::size_t d = dim_;
  const float* xf = xf_.data();  // x, widened by insert_one
  bool linked = false;
  linked_ = false;
  // A pipeline of requests over the targets (random rows, most of them full ones whose
  // leading edges this loop reads): the key and adjacency row of the target two ahead, and
  // the first edges' keys of the next one, whose adjacency row was requested a target ago.
  const auto request = [&](id_t y) {
    prefetch(y);
    detail::prefetch_row(&adj_[static_cast<std::size_t>(y) * R_], R_ * sizeof(id_t));
  };
  for (std::size_t t = 0; t < std::min<std::size_t>(2, chosen.size()); ++t) request(chosen[t]);
  for (std::size_t t = 0; t < chosen.size(); ++t) {
    const id_t y = chosen[t];
    if (t + 2 < chosen.size()) request(chosen[t + 2]);
    if (t + 1 < chosen.size()) {
      const id_t next = chosen[t + 1];
      const id_t* row_next = &adj_[static_cast<std::size_t>(next) * R_];
      for (std::uint32_t j = 0; j < std::min<std::uint32_t>(2, degrees_[next]); ++j) {
        prefetch(row_next[j]);
      }
    }
    id_t* row_y = &adj_[static_cast<std::size_t>(y) * R_];
    const std::uint32_t deg = degrees_[y];
    if (deg < R_) {
      row_y[deg] = x;
      degrees_[y] = deg + 1;
      kept_count_[y] = unknown_layout;
      linked = true;
      continue;
    }
    // A full row: the build re-prunes it with x as one more candidate (RNG in rank order
    // around y, then filled to R). Once a row is laid out as that pruning leaves it (its kept
    // edges, then the pruned ones, each in rank order; `kept_count_`), most inserts need only
    // a few distances instead of the O(R^2) of a re-pruning (half of all insert instructions
    // on the sample): while x is occluded by a kept edge ranking before it, the kept edges
    // stay kept (a pruned candidate occludes nothing) and the fill drops the farthest pruned
    // candidate, x or the row's last edge. The result is the re-pruning's, edge for edge.
    const std::uint32_t kept = kept_count_[y];
    if (!params_.fill || kept == unknown_layout) {
      reprune_row(y, x);
      continue;
    }
    yf_.resize(d);
    detail::widen(row(y), yf_.data(), d);
    const auto rank = [&](id_t c) {
      return scored_id{to_key<l2>(l2::score(yf_.data(), row(c), d)), c};
    };
    const scored_id sx{to_key<l2>(l2::score(xf, row(y), d)), x};
    bool occluded = false;
    std::uint32_t at = 0;  // x's rank among the kept edges
    for (; at < kept && !occluded; ++at) {
      if (!ranks_before(rank(row_y[at]), sx)) break;
      occluded = to_key<l2>(l2::score(xf, row(row_y[at]), d)) > sx.key;
    }
    if (!occluded) {
      // x becomes a kept edge. If it occludes none of the kept edges ranking after it, they
      // stay kept, so every pruned edge keeps the kept edge that occluded it: the re-pruning
      // would keep the kept edges with x among them and the pruned ones after, and the fill
      // drops the last pruned edge. Otherwise (or with R kept edges already) x may free
      // pruned edges, and the whole row is decided again. On the sample 1.7 of the 2.8 full
      // re-prunings per insert were of this kind, on OOD 32768 x 128 3.2 of 4.6.
      bool frees = kept == R_;
      for (std::uint32_t j = at; j < kept && !frees; ++j) {
        frees = to_key<l2>(l2::score(xf, row(row_y[j]), d)) > rank(row_y[j]).key;
      }
      if (frees) {
        reprune_row(y, x);
        continue;
      }
      std::copy_backward(row_y + at, row_y + R_ - 1, row_y + R_);
      row_y[at] = x;
      kept_count_[y] = kept + 1;
      linked = true;
      continue;
    }
    // With R kept edges x is the only pruned candidate and goes; otherwise the farthest of x
    // and the last (farthest) pruned edge goes, and x takes its rank among the pruned ones.
    if (kept == R_ || ranks_before(rank(row_y[R_ - 1]), sx)) continue;
    std::uint32_t pos = R_ - 1;
    for (; pos > kept && !ranks_before(rank(row_y[pos - 1]), sx); --pos)
      row_y[pos] = row_y[pos - 1];
    row_y[pos] = x;
    linked = true;
  }
  linked = linked || linked_;
  // No row took x: without an in-edge no search could reach it. It takes the place of the
  // lowest-ranked edge of its nearest chosen neighbour (the build's repair does the same).
  if (!linked && !chosen.empty()) {
    const id_t y = chosen.front();
    adj_[static_cast<std::size_t>(y) * R_ + degrees_[y] - 1] = x;
    kept_count_[y] = unknown_layout;
  }
}

template <Element T, Metric M>
void insertable_graph<T, M>::reprune_row(id_t y, id_t x) {
  // The build's rule (`detail::rng_prune`: candidates in rank order around y, kept unless a
  // kept one is nearer to them than y is, then filled with the pruned ones in rank order),
  // written out here because the row's layout (how many edges RNG kept) is needed as well.
  const std::size_t d = dim_;
  id_t* row_y = &adj_[static_cast<std::size_t>(y) * R_];
  const std::uint32_t deg = degrees_[y];
  yf_.resize(d);
  detail::widen(row(y), yf_.data(), d);
  cands_.clear();
  constexpr std::uint32_t ahead = 4;  // rows requested ahead of their scoring (insert_one)
  for (std::uint32_t j = 0; j < std::min(ahead, deg); ++j) prefetch(row_y[j]);
  for (std::uint32_t j = 0; j <= deg; ++j) {
    if (j + ahead < deg) prefetch(row_y[j + ahead]);
    const id_t c = j < deg ? row_y[j] : x;
    cands_.push_back({to_key<l2>(l2::score(yf_.data(), row(c), d)), c});
  }
  std::sort(cands_.begin(), cands_.end(), detail::rank_order{});
  ids_.clear();     // kept
  merged_.clear();  // pruned
  scratch_.resize(d);
  for (const scored_id& c : cands_) {
    if (ids_.size() >= R_) break;
    detail::widen(row(c.id), scratch_.data(), d);
    bool keep = true;
    for (const id_t r : ids_) {
      if (to_key<l2>(l2::score(scratch_.data(), row(r), d)) > c.key) {
        keep = false;
        break;
      }
    }
    (keep ? ids_ : merged_).push_back(c.id);
  }
  const std::size_t kept = ids_.size();
  for (std::size_t i = 0; params_.fill && i < merged_.size() && ids_.size() < R_; ++i) {
    ids_.push_back(merged_[i]);
  }
  std::copy(ids_.begin(), ids_.end(), row_y);
  std::fill(row_y + ids_.size(), row_y + R_, invalid_id);
  degrees_[y] = static_cast<std::uint32_t>(ids_.size());
  kept_count_[y] = static_cast<std::uint32_t>(kept);
  linked_ = linked_ || std::find(ids_.begin(), ids_.end(), x) != ids_.end();
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
  std::size_t index = gathered_.size() * sizeof(std::uint64_t);
  for (const auto& h : holders_) index += sizeof(h) + h.size() * sizeof(id_t);
  return {keys_.size() * sizeof(T),
          adj_.size() * sizeof(id_t) + (degrees_.size() + kept_count_.size()) * 4,
          queries_.size() * sizeof(float),
          (knn_.size() + best_.size()) * sizeof(scored_id) + worst_key_.size() * sizeof(float),
          index};
}

template <Element T, Metric M>
knn_result insertable_graph<T, M>::query_knn() const {
  knn_result r;
  r.rows = m_;
  r.k = nq_;
  r.ids.resize(knn_.size());
  r.scores.resize(knn_.size());
  std::vector<scored_id> list(nq_);
  for (std::size_t i = 0; i < m_; ++i) {
    std::copy_n(knn_.begin() + static_cast<std::ptrdiff_t>(i * nq_), nq_, list.begin());
    std::sort(list.begin(), list.end(), detail::rank_order{});
    for (std::size_t j = 0; j < nq_; ++j) {
      r.ids[i * nq_ + j] = list[j].id;
      r.scores[i * nq_ + j] = from_key<M>(list[j].key);
    }
  }
  return r;
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
