#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../test_support.hpp"
#include "kvsift/core/dense_matrix.hpp"
#include "kvsift/core/vector_store.hpp"
#include "kvsift/index/block_index.hpp"
#include "kvsift/index/flat_index.hpp"

namespace {

using Catch::Matchers::Contains;
using kvsift::id_t;
using kvsift_test::message_of;

constexpr std::size_t dim = 16;

// Keys with locality, as in real KV caches: each run of 32 adjacent tokens is drawn around its
// own centre, so a few blocks hold a query's best tokens. Queries are drawn around centres too.
kvsift::dense_matrix<float> local_keys(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  kvsift::dense_matrix<float> m(n, dim);
  std::vector<float> centre(dim);
  for (std::size_t t = 0; t < n; ++t) {
    if (t % 32 == 0)
      for (auto& c : centre) c = 2.0f * g(rng);
    for (std::size_t j = 0; j < dim; ++j) m(t, j) = centre[j] + 0.5f * g(rng);
  }
  return m;
}

std::vector<float> random_query(std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> q(dim);
  for (auto& x : q) x = g(rng);
  return q;
}

float best_in(const kvsift::dense_matrix<float>& k, std::span<const float> q,
              kvsift::token_range r) {
  float best = -std::numeric_limits<float>::infinity();
  for (std::size_t t = r.first; t < r.last; ++t)
    best = std::max(best, kvsift::inner_product::score(q.data(), k.row(t), dim));
  return best;
}

}  // namespace

TEST_CASE("block_index: block to token-range mapping", "[block_index]") {
  const auto keys = local_keys(100, 1);
  const kvsift::block_index<> idx(keys.cview(), 32);
  CHECK(idx.blocks() == 4);
  CHECK(idx.size() == 100);
  CHECK(idx.tokens_of(0).first == 0);
  CHECK(idx.tokens_of(0).last == 32);
  CHECK(idx.tokens_of(3).first == 96);
  CHECK(idx.tokens_of(3).last == 100);  // the short last block
  CHECK(idx.summary_bytes() == 4 * 3 * dim * sizeof(float));
  std::vector<id_t> toks;
  const std::vector<std::size_t> blocks{3, 1};
  idx.tokens(blocks, toks, kvsift::id_below{40});
  CHECK(toks == std::vector<id_t>{32, 33, 34, 35, 36, 37, 38, 39});
}

TEST_CASE("block_index: Quest min/max score is a true upper bound, mean a lower bound",
          "[block_index]") {
  const auto keys = local_keys(500, 2);
  const kvsift::block_index<> idx(keys.cview(), 24);
  std::mt19937 rng(3);
  for (int i = 0; i < 50; ++i) {
    const auto q = random_query(rng);
    for (std::size_t b = 0; b < idx.blocks(); ++b) {
      const auto bb = idx.bounds(q, b);
      const float best = best_in(keys, q, idx.tokens_of(b));
      REQUIRE(bb.upper >= best);
      REQUIRE(bb.lower <= best + 1e-4f * std::abs(best) + 1e-4f);
    }
  }
}

TEST_CASE("block_index: InfLLM representatives are block keys and a lower bound", "[block_index]") {
  const auto keys = local_keys(200, 4);
  const auto queries = local_keys(200, 5);
  const kvsift::block_index<kvsift::representative_keys> idx(keys.cview(), 32, queries.cview(),
                                                             kvsift::representative_keys(3));
  CHECK(idx.summary_bytes() == idx.blocks() * 3 * dim * sizeof(float));
  std::mt19937 rng(6);
  for (int i = 0; i < 20; ++i) {
    const auto q = random_query(rng);
    for (std::size_t b = 0; b < idx.blocks(); ++b) {
      const auto bb = idx.bounds(q, b);
      CHECK(bb.upper == bb.lower);
      REQUIRE(bb.lower <= best_in(keys, q, idx.tokens_of(b)));
    }
  }
  // One token per block: the representative is that key, so the bound is exact.
  const kvsift::block_index<kvsift::representative_keys> single(keys.cview(), 1, queries.cview());
  const auto q = random_query(rng);
  for (std::size_t b = 0; b < 10; ++b) {
    CHECK(single.bounds(q, b).lower == kvsift::inner_product::score(q.data(), keys.row(b), dim));
  }
}

TEST_CASE("block_index: InfLLM picks the key its block's own queries attend to most",
          "[block_index]") {
  // Small random keys, except offset 2 of every block: a large key that every query is
  // aligned with. Causally it is seen by queries 2..7 of its block and takes nearly all of
  // their attention, more than key 0 gets (all of query 0's, half of query 1's).
  std::mt19937 rng(15);
  std::normal_distribution<float> g(0.0f, 0.1f);
  kvsift::dense_matrix<float> keys(32, dim), queries(32, dim);
  for (std::size_t t = 0; t < 32; ++t) {
    for (std::size_t j = 0; j < dim; ++j) keys(t, j) = g(rng);
    queries(t, 0) = 6.0f;
    if (t % 8 == 2) keys(t, 0) = 6.0f;
  }
  const kvsift::block_index<kvsift::representative_keys> idx(keys.cview(), 8, queries.cview(),
                                                             kvsift::representative_keys(1));
  std::mt19937 qrng(16);
  for (int i = 0; i < 5; ++i) {
    const auto q = random_query(qrng);
    for (std::size_t b = 0; b < idx.blocks(); ++b) {
      CHECK(idx.bounds(q, b).lower ==
            kvsift::inner_product::score(q.data(), keys.row(b * 8 + 2), dim));
    }
  }
}

TEST_CASE("block_index: recall of the exact top-k tokens grows with the blocks fetched",
          "[block_index]") {
  const std::size_t n = 2048, k = 16;
  const auto keys = local_keys(n, 7);
  const auto queries = local_keys(n, 8);
  const kvsift::flat_index<kvsift::view_store<float>> flat(kvsift::view_store(keys.cview()));
  const kvsift::block_index<> quest(keys.cview(), 32);
  const kvsift::block_index<kvsift::representative_keys> infllm(keys.cview(), 32, queries.cview());
  kvsift::search_workspace ws;
  kvsift::block_result res;
  std::vector<id_t> ids(k), toks;
  std::vector<float> scores(k);
  std::mt19937 rng(9);
  const std::vector<std::size_t> fetched{1, 2, 4, 8, 64};
  std::vector<double> recall_q(fetched.size()), recall_i(fetched.size());
  const int nq = 40;
  for (int i = 0; i < nq; ++i) {
    const auto q = random_query(rng);
    flat.topk(q, k, ws, ids, scores);
    const std::set<id_t> truth(ids.begin(), ids.end());
    for (std::size_t f = 0; f < fetched.size(); ++f) {
      for (auto* recall : {&recall_q, &recall_i}) {
        if (recall == &recall_q)
          quest.topk(q, fetched[f], ws, res);
        else
          infllm.topk(q, fetched[f], ws, res);
        REQUIRE(res.blocks.size() == fetched[f]);
        REQUIRE(std::is_sorted(res.scores.rbegin(), res.scores.rend()));
        toks.clear();
        quest.tokens(res.blocks, toks);
        std::size_t hit = 0;
        for (id_t t : toks) hit += truth.count(t);
        (*recall)[f] += static_cast<double>(hit) / static_cast<double>(k) / nq;
      }
    }
  }
  for (std::size_t f = 1; f < fetched.size(); ++f) {
    CHECK(recall_q[f] >= recall_q[f - 1]);
    CHECK(recall_i[f] >= recall_i[f - 1]);
  }
  CHECK(recall_q.back() == Approx(1.0));  // every block fetched
  CHECK(recall_i.back() == Approx(1.0));
  WARN("recall@16 with 4 of 64 blocks: quest " << recall_q[2] << ", infllm " << recall_i[2]);
  CHECK(recall_q[2] >= 0.8);  // measured 0.98
  CHECK(recall_i[2] >= 0.8);  // measured 0.98
}

TEST_CASE("block_index: block DIPR covers every exact in-range token, with and without a filter",
          "[block_index]") {
  const std::size_t n = 1000;
  const auto keys = local_keys(n, 10);
  const kvsift::flat_index<kvsift::view_store<float>> flat(kvsift::view_store(keys.cview()));
  const kvsift::block_index<> idx(keys.cview(), 40);
  kvsift::search_workspace ws;
  kvsift::block_result res;
  kvsift::dipr_result exact;
  std::mt19937 rng(11);
  std::size_t fetched_blocks = 0;
  for (int i = 0; i < 30; ++i) {
    const auto q = random_query(rng);
    for (const std::size_t prefix : {n, std::size_t{330}}) {
      const kvsift::id_below pred{prefix};
      flat.dipr(q, {.beta = 1.0f}, ws, exact, pred);
      idx.dipr(q, 1.0f, ws, res, pred);
      std::vector<id_t> toks;
      idx.tokens(res.blocks, toks, pred);
      const std::set<id_t> got(toks.begin(), toks.end());
      for (id_t t : exact.ids) REQUIRE(got.count(t) == 1);
      for (id_t t : toks) REQUIRE(t < prefix);
      fetched_blocks += res.blocks.size();
    }
  }
  WARN("block DIPR fetched " << fetched_blocks << " of " << 60 * idx.blocks() << " blocks");
  CHECK(fetched_blocks < 60 * idx.blocks() * 3 / 4);  // it prunes
}

TEST_CASE("block_index: filtered top-k only returns blocks with passing tokens", "[block_index]") {
  const auto keys = local_keys(300, 12);
  const kvsift::block_index<> idx(keys.cview(), 50);
  kvsift::search_workspace ws;
  kvsift::block_result res;
  std::mt19937 rng(13);
  idx.topk(random_query(rng), 10, ws, res, kvsift::id_below{120});
  CHECK(res.blocks.size() == 3);  // blocks 0, 1 and the partial block 2
  for (auto b : res.blocks) CHECK(b <= 2);
}

TEST_CASE("block_index: bad input", "[block_index]") {
  const auto keys = local_keys(64, 14);
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { kvsift::block_index<>(keys.cview(), 0); }),
             Contains("block_size > 0, got 0"));
  CHECK_THAT(message_of<kvsift::invalid_argument>(
                 [&] { kvsift::block_index<>(keys.cview().row_range(0, 0), 8); }),
             Contains("non-empty"));
  auto bad = local_keys(64, 14);
  bad(5, 3) = std::numeric_limits<float>::quiet_NaN();
  CHECK_THAT(message_of<kvsift::non_finite_value>([&] { kvsift::block_index<>(bad.cview(), 8); }),
             Contains("row 5, column 3"));
  CHECK_THAT(message_of<kvsift::dimension_mismatch>(
                 [&] { kvsift::block_index<kvsift::representative_keys>(keys.cview(), 8); }),
             Contains("expected 64 x 16, got 0 x 0"));
  bad(5, 3) = std::numeric_limits<float>::infinity();
  CHECK_THAT(message_of<kvsift::non_finite_value>([&] {
               kvsift::block_index<kvsift::representative_keys>(keys.cview(), 8, bad.cview());
             }),
             Contains("queries"));
  CHECK_THAT(message_of<kvsift::invalid_argument>([] { kvsift::representative_keys(0); }),
             Contains("r > 0"));

  const kvsift::block_index<> idx(keys.cview(), 8);
  kvsift::search_workspace ws;
  kvsift::block_result res;
  std::vector<float> q(dim, 1.0f), short_q(dim - 1, 1.0f);
  CHECK_THAT(message_of<kvsift::dimension_mismatch>([&] { idx.topk(short_q, 2, ws, res); }),
             Contains("expected query dimension 16, got 15"));
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { idx.topk(q, 0, ws, res); }),
             Contains("k must be > 0"));
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { idx.dipr(q, -1.0f, ws, res); }),
             Contains("beta >= 0, got -1"));
  CHECK_THAT(message_of<kvsift::invalid_argument>(
                 [&] { idx.dipr(q, std::numeric_limits<float>::quiet_NaN(), ws, res); }),
             Contains("finite beta"));
  CHECK_THAT(
      message_of<kvsift::out_of_range>([&] { idx.topk(q, 2, ws, res, kvsift::id_below{65}); }),
      Contains("[1, 64], got 65"));
  CHECK_THAT(message_of<kvsift::out_of_range>([&] { (void)idx.tokens_of(8); }),
             Contains("block < 8, got 8"));
  std::vector<id_t> toks;
  const std::vector<std::size_t> blocks{0, 9};
  CHECK_THAT(message_of<kvsift::out_of_range>([&] { idx.tokens(blocks, toks); }),
             Contains("blocks < 8, got 9"));
  CHECK(toks.empty());  // validated before anything was appended
  // A query holding NaN/Inf returns no blocks (the contract of every search, see
  // docs/algorithms.md): its scores would rank blocks arbitrarily.
  std::vector<float> nan_q(dim, std::numeric_limits<float>::quiet_NaN());
  idx.topk(nan_q, 3, ws, res);
  CHECK(res.blocks.empty());
  CHECK(res.stats.count == 0);
}

// Regression: (n + block_size - 1) / block_size wrapped to 0 blocks for a huge block size,
// so every search silently returned nothing.
TEST_CASE("block_index: a block size beyond n makes one block", "[block_index][rel]") {
  const auto keys = local_keys(64, 14);
  for (const std::size_t bs :
       {std::size_t{64}, std::size_t{1000}, std::numeric_limits<std::size_t>::max()}) {
    const kvsift::block_index<> idx(keys.cview(), bs);
    REQUIRE(idx.blocks() == 1);
    CHECK(idx.tokens_of(0).first == 0);
    CHECK(idx.tokens_of(0).last == 64);
    kvsift::search_workspace ws;
    kvsift::block_result res;
    const std::vector<float> q(16, 0.5f);
    idx.topk(q, 3, ws, res);
    CHECK(res.blocks == std::vector<std::size_t>{0});
    std::vector<id_t> toks;
    const std::vector<std::size_t> all{0};
    idx.tokens(all, toks);
    CHECK(toks.size() == 64);
  }
}

// Contract: a query holding NaN or Inf returns nothing, from topk and dipr alike.
TEST_CASE("block_index: a non-finite query returns no blocks", "[block_index][rel]") {
  const auto keys = local_keys(64, 14);
  const kvsift::block_index<> idx(keys.cview(), 8);
  kvsift::search_workspace ws;
  kvsift::block_result res;
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity()}) {
    std::vector<float> q(16, 0.5f);
    q[7] = bad;
    idx.topk(q, 3, ws, res);
    CHECK(res.blocks.empty());
    CHECK(res.stats.count == 0);
    idx.dipr(q, 1.0f, ws, res);
    CHECK(res.blocks.empty());
    CHECK(res.stats.count == 0);
  }
}

// Regression: token positions become 32-bit ids; more keys than that must be refused
// before any row is read (a view of 2^32 rows over 64 floats: stride 16, never dereferenced).
TEST_CASE("block_index: more keys than 32-bit ids is refused before reading",
          "[block_index][rel]") {
  std::vector<float> buf(64, 1.0f);
  const kvsift::matrix_view<const float> huge(buf.data(), std::size_t{1} << 32, 16);
  const auto msg = message_of<kvsift::out_of_range>([&] { kvsift::block_index<>(huge, 8); });
  CHECK_THAT(msg, Contains("block_index") && Contains("4294967296"));
}
