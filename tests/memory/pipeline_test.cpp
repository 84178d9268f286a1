#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "../test_support.hpp"
#include "kvsift/core/dense_matrix.hpp"
#include "kvsift/decode/graph_token_retrieval.hpp"
#include "kvsift/decode/sparse_algorithm.hpp"
#include "kvsift/index/flat_index.hpp"
#include "kvsift/memory/bucketed_lru.hpp"
#include "kvsift/memory/offload.hpp"
#include "kvsift/testing/ood_generator.hpp"

using kvsift::id_t;
using kvsift::matrix_view;
using kvsift::partitioning;
using kvsift_test::message_of;

namespace {

// Scores every partition summary (a mean key) against the query and keeps the best `budget`;
// shared by the two test-only algorithms below, which differ only in how they group tokens.
struct summary_index {
  partitioning parts;
  kvsift::dense_matrix<float> means;
  [[nodiscard]] const partitioning& partitions() const noexcept { return parts; }
};

summary_index summarise(partitioning parts, matrix_view<const float> keys) {
  summary_index idx{std::move(parts), kvsift::dense_matrix<float>(0, 0)};
  idx.means = kvsift::dense_matrix<float>(idx.parts.partitions(), keys.cols());
  for (std::size_t p = 0; p < idx.parts.partitions(); ++p) {
    for (std::size_t j = idx.parts.offsets[p]; j < idx.parts.offsets[p + 1]; ++j)
      for (std::size_t c = 0; c < keys.cols(); ++c)
        idx.means.row(p)[c] += keys.row(idx.parts.tokens[j])[c];
  }
  return idx;
}

void select_by_summary(const summary_index& idx, std::span<const float> q, std::size_t budget,
                       kvsift::search_workspace& ws, std::vector<id_t>& out) {
  ws.topk.reset(budget);
  for (std::size_t p = 0; p < idx.parts.partitions(); ++p) {
    const float s = kvsift::inner_product::score(q.data(), idx.means.row(p), q.size());
    ws.topk.push(s, static_cast<id_t>(p));
  }
  out.clear();
  for (const auto& e : ws.topk.sorted()) out.push_back(e.id);
}

// A coarse block algorithm (blocks of 20 contiguous tokens: two pages each, the last shorter).
struct block_algorithm {
  using index_type = summary_index;
  [[nodiscard]] index_type index(matrix_view<const float> keys) const {
    partitioning parts;
    parts.tokens.resize(keys.rows());
    std::iota(parts.tokens.begin(), parts.tokens.end(), id_t{0});
    for (std::size_t t = 20; t < keys.rows(); t += 20) parts.offsets.push_back(t);
    parts.offsets.push_back(keys.rows());
    return summarise(std::move(parts), keys);
  }
  void select(const index_type& idx, std::span<const float> q, std::size_t budget,
              kvsift::search_workspace& ws, std::vector<id_t>& out) const {
    select_by_summary(idx, q, budget, ws, out);
  }
};

// A user-written algorithm the library knows nothing about: strided "clusters" (token t goes
// to cluster t % 8), so a partition's tokens are not contiguous in the prompt.
struct strided_cluster_algorithm {
  using index_type = summary_index;
  [[nodiscard]] index_type index(matrix_view<const float> keys) const {
    partitioning parts;
    for (id_t c = 0; c < 8; ++c) {
      for (id_t t = c; t < keys.rows(); t += 8) parts.tokens.push_back(t);
      parts.offsets.push_back(parts.tokens.size());
    }
    return summarise(std::move(parts), keys);
  }
  void select(const index_type& idx, std::span<const float> q, std::size_t budget,
              kvsift::search_workspace& ws, std::vector<id_t>& out) const {
    select_by_summary(idx, q, budget, ws, out);
  }
};

static_assert(kvsift::SparseAlgorithm<block_algorithm>);
static_assert(kvsift::SparseAlgorithm<strided_cluster_algorithm>);
static_assert(kvsift::SparseAlgorithm<kvsift::graph_token_retrieval>);

struct data {
  kvsift::testing::ood_data ood;
  kvsift::dense_matrix<float> values;
};

const data& shared_data() {
  static const data d = [] {
    data out{kvsift::testing::make_ood({.keys = 1500, .queries = 260, .dim = 32, .seed = 5}),
             kvsift::dense_matrix<float>(1500, 16)};
    std::mt19937 rng(1);
    std::normal_distribution<float> n;
    for (std::size_t i = 0; i < 1500; ++i)
      for (std::size_t c = 0; c < 16; ++c) out.values.row(i)[c] = n(rng);
    return out;
  }();
  return d;
}

// index -> offload -> (select -> retrieve)*: after every step each token of every selected
// partition is in the GPU buffer, K and V bit-exact, where the policy says its page is.
// Returns the selections.
template <kvsift::SparseAlgorithm A>
std::vector<std::vector<id_t>> run_pipeline(const A& algo, std::size_t budget,
                                            std::size_t capacity) {
  const auto& d = shared_data();
  const auto keys = d.ood.key_view();
  const auto idx = algo.index(keys);
  const auto kv = kvsift::offload(idx.partitions(), keys, d.values.cview(), 16);
  kvsift::partition_map<kvsift::bucketed_lru<>> map(kv.spec,
                                                    kvsift::bucketed_lru<>(capacity, kv.pages));
  std::vector<float> gpu(capacity * kv.page_floats(), std::numeric_limits<float>::quiet_NaN());
  kvsift::search_workspace ws;
  std::vector<id_t> sel;
  kvsift::retrieve_result r;
  std::vector<std::vector<id_t>> selections;
  std::size_t copied = 0;
  const auto queries = d.ood.query_view().row_range(200, 60);
  for (std::size_t i = 0; i < queries.rows(); ++i) {
    algo.select(idx, queries.row_span(i), budget, ws, sel);
    REQUIRE(!sel.empty());
    kvsift::retrieve(map, kv, sel, gpu, r);
    copied += r.copies.size();
    const auto& parts = idx.partitions();
    for (const id_t p : sel) {
      REQUIRE(map.resident(p));
      for (std::size_t j = parts.offsets[p]; j < parts.offsets[p + 1]; ++j) {
        const id_t t = parts.tokens[j];
        const std::size_t slot = kv.token_slot[t];
        const id_t g = map.policy().slot_of(static_cast<id_t>(slot / kv.page_tokens));
        REQUIRE(g != kvsift::invalid_id);
        const float* row =
            gpu.data() + (g * kv.page_tokens + slot % kv.page_tokens) * kv.slot_floats();
        REQUIRE(std::equal(row, row + 32, keys.row(t)));
        REQUIRE(std::equal(row + 32, row + 48, d.values.row(t)));
      }
    }
    selections.push_back(sel);
  }
  REQUIRE(copied > 0);
  return selections;
}

}  // namespace

TEST_CASE("pipeline: token-level graph retrieval fetches its top-k tokens", "[memory]") {
  const auto& d = shared_data();
  const kvsift::roargraph_params p{.nq = 50, .M = 16, .L = 100, .threads = 2, .batch = 16};
  const kvsift::graph_token_retrieval algo(d.ood.query_view().row_range(0, 200), p, 100);
  const auto sel = run_pipeline(algo, 32, 64);
  // Recall of the selection against the exact top-32 (the oracle).
  const kvsift::flat_index<kvsift::view_store<float>> flat(
      kvsift::view_store<float>(d.ood.key_view()));
  const auto exact = kvsift::exact_topk(flat, d.ood.query_view().row_range(200, 60), 32, 2);
  std::size_t found = 0;
  for (std::size_t i = 0; i < sel.size(); ++i) {
    const std::set<id_t> truth(exact.row_ids(i).begin(), exact.row_ids(i).end());
    for (const id_t t : sel[i]) found += truth.count(t);
  }
  REQUIRE(static_cast<double>(found) / (32.0 * sel.size()) >= 0.9);
}

TEST_CASE("pipeline: a block algorithm and a user-written algorithm plug in", "[memory]") {
  run_pipeline(block_algorithm{}, 4, 16);
  run_pipeline(strided_cluster_algorithm{}, 2, 40);  // two clusters of 188 tokens: 24 pages
}

TEST_CASE("pipeline: offload and retrieve reject bad input", "[memory]") {
  const auto& d = shared_data();
  const auto keys = d.ood.key_view().row_range(0, 40);
  const auto values = d.values.cview().row_range(0, 40);
  partitioning parts;
  parts.tokens.resize(40);
  std::iota(parts.tokens.begin(), parts.tokens.end(), id_t{0});
  parts.offsets = {0, 25, 40};
  REQUIRE_THROWS_AS(kvsift::offload(parts, keys, d.values.cview().row_range(0, 39), 16),
                    kvsift::dimension_mismatch);
  REQUIRE_THROWS_AS(kvsift::offload(parts, keys, values, 0), kvsift::invalid_argument);
  REQUIRE_THROWS_AS(kvsift::offload(parts, keys.row_range(0, 0), values.row_range(0, 0), 16),
                    kvsift::invalid_argument);
  auto dup = parts;
  dup.tokens[3] = 4;
  REQUIRE_THAT(
      message_of<kvsift::invalid_argument>([&] { (void)kvsift::offload(dup, keys, values, 16); }),
      Catch::Contains("token 4 appears twice"));
  auto empty = parts;
  empty.offsets = {0, 0, 40};
  REQUIRE_THROWS_AS(kvsift::offload(empty, keys, values, 16), kvsift::invalid_argument);
  auto short_parts = parts;
  short_parts.offsets = {0, 25, 39};
  REQUIRE_THROWS_AS(kvsift::offload(short_parts, keys, values, 16), kvsift::invalid_argument);
  kvsift::dense_matrix<float> bad(40, 16);
  bad.row(7)[3] = std::numeric_limits<float>::infinity();
  REQUIRE_THROWS_AS(kvsift::offload(parts, keys, bad.cview(), 16), kvsift::non_finite_value);

  const auto kv = kvsift::offload(parts, keys, values, 16);
  REQUIRE(kv.pages == 3);  // 25 tokens on pages 0-1; the second partition starts on page 2
  REQUIRE(kv.slot_token[25] == kvsift::invalid_id);  // padding up to the fresh page
  kvsift::partition_map<kvsift::bucketed_lru<>> map(kv.spec, kvsift::bucketed_lru<>(2, kv.pages));
  kvsift::retrieve_result r;
  std::vector<float> wrong(3 * kv.page_floats());
  REQUIRE_THROWS_AS(kvsift::retrieve(map, kv, std::vector<id_t>{0}, wrong, r),
                    kvsift::dimension_mismatch);
  std::vector<float> gpu(2 * kv.page_floats());
  REQUIRE_THROWS_AS(kvsift::retrieve(map, kv, std::vector<id_t>{2}, gpu, r), kvsift::out_of_range);
  REQUIRE_THROWS_AS(kvsift::retrieve(map, kv, std::vector<id_t>{0, 1}, gpu, r),
                    kvsift::invalid_argument);  // 3 pages > 2 GPU pages
  kvsift::retrieve(map, kv, std::vector<id_t>{0}, gpu, r);
  REQUIRE(r.copies.size() == 2);
}

TEST_CASE("graph_token_retrieval rejects bad input", "[memory]") {
  const auto& d = shared_data();
  const kvsift::roargraph_params p{.nq = 10, .M = 8, .L = 20, .threads = 1, .batch = 16};
  REQUIRE_THROWS_AS(kvsift::graph_token_retrieval(d.ood.query_view().row_range(0, 0), p),
                    kvsift::invalid_argument);
  REQUIRE_THROWS_AS(kvsift::graph_token_retrieval(d.ood.query_view().row_range(0, 20), p, 0),
                    kvsift::invalid_argument);
  const kvsift::graph_token_retrieval algo(d.ood.query_view().row_range(0, 20), p, 20);
  kvsift::dense_matrix<float> nan_keys(50, 32);
  nan_keys.row(3)[1] = std::numeric_limits<float>::quiet_NaN();
  REQUIRE_THROWS_AS((void)algo.index(nan_keys.cview()), kvsift::non_finite_value);
  REQUIRE_THROWS_AS((void)algo.index(d.ood.key_view().row_range(0, 0)), kvsift::invalid_argument);
  const auto idx = algo.index(d.ood.key_view().row_range(0, 100));
  REQUIRE(idx.partitions().partitions() == 100);
  kvsift::search_workspace ws;
  std::vector<id_t> out;
  const std::vector<float> short_query(31, 0.0f);
  REQUIRE_THROWS_AS(algo.select(idx, short_query, 5, ws, out), kvsift::dimension_mismatch);
  REQUIRE_THROWS_AS(algo.select(idx, d.ood.query_view().row_span(0), 0, ws, out),
                    kvsift::invalid_argument);
  algo.select(idx, d.ood.query_view().row_span(0), 200, ws, out);  // budget > tokens: all found
  REQUIRE(out.size() == 100);
}
