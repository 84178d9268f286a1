#include "kvsift/index/knn.hpp"
#if defined(KVSIFT_TESTS_EIGEN)
#include "kvsift/index/knn_eigen.hpp"
#endif
#include "../test_support.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using kvsift::id_t;

using kvsift_test::message_of;

// Brute force in double over the widened keys; ties broken by lower id.
template <class T>
kvsift::knn_result oracle(kvsift::matrix_view<const float> q, kvsift::matrix_view<const T> keys,
                          std::size_t k) {
  kvsift::knn_result out;
  out.rows = q.rows();
  out.k = k;
  out.ids.assign(q.rows() * k, kvsift::invalid_id);
  out.scores.assign(q.rows() * k, -std::numeric_limits<float>::infinity());
  for (std::size_t i = 0; i < q.rows(); ++i) {
    std::vector<std::pair<double, id_t>> s;
    for (std::size_t j = 0; j < keys.rows(); ++j) {
      double acc = 0;
      for (std::size_t c = 0; c < keys.cols(); ++c) {
        acc += static_cast<double>(q(i, c)) * kvsift::to_float(keys(j, c));
      }
      s.emplace_back(acc, static_cast<id_t>(j));
    }
    std::sort(s.begin(), s.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    for (std::size_t j = 0; j < std::min(k, s.size()); ++j) {
      out.ids[i * k + j] = s[j].second;
      out.scores[i * k + j] = static_cast<float>(s[j].first);
    }
  }
  return out;
}

// Keys and queries of small integers: every dot product is exact in f32 and in f16/bf16, so
// engine and oracle must agree bit for bit, ties included. Every key appears twice (ids i and
// i + n/2 hold the same vector) to create exact ties.
struct fixture {
  std::size_t n, d, m, stride;
  std::vector<float> keys, queries;
};

fixture make(std::size_t n, std::size_t d, std::size_t m, std::size_t stride, unsigned seed) {
  fixture f{n, d, m, stride, {}, {}};
  std::mt19937 rng(seed);
  f.keys.assign(n * stride, 1e30f);  // padding columns poison the result if read
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t c = 0; c < d; ++c) {
      f.keys[i * stride + c] = i >= n / 2 && i - n / 2 < n / 2
                                   ? f.keys[(i - n / 2) * stride + c]
                                   : static_cast<float>(static_cast<int>(rng() % 7) - 3);
    }
  }
  f.queries.assign(m * stride, -1e30f);
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t c = 0; c < d; ++c) {
      f.queries[i * stride + c] = static_cast<float>(static_cast<int>(rng() % 5) - 2);
    }
  }
  return f;
}

template <class T, class Engine = kvsift::cpu_knn_engine>
void check_engine(const fixture& f, std::size_t k, const kvsift::cpu_knn_params& p) {
  std::vector<T> conv(f.keys.size());
  for (std::size_t i = 0; i < f.keys.size(); ++i) conv[i] = kvsift::from_float<T>(f.keys[i]);
  const kvsift::matrix_view<const T> keys(conv.data(), f.n, f.d, f.stride);
  const kvsift::matrix_view<const float> q(f.queries.data(), f.m, f.d, f.stride);
  const auto got = Engine(p).search(q, keys, k);
  const auto want = oracle(q, keys, k);
  REQUIRE(got.rows == f.m);
  REQUIRE(got.k == k);
  REQUIRE(got.ids.size() == f.m * k);
  REQUIRE(got.scores.size() == f.m * k);
  for (std::size_t i = 0; i < f.m; ++i) {
    const auto gi = got.row_ids(i), wi = want.row_ids(i);
    const auto gs = got.row_scores(i), wsc = want.row_scores(i);
    for (std::size_t j = 0; j < k; ++j) {
      INFO("query " << i << " rank " << j << " k " << k << " n " << f.n);
      REQUIRE(gi[j] == wi[j]);
      REQUIRE(gs[j] == wsc[j]);
    }
  }
}

}  // namespace

TEST_CASE("cpu_knn_engine equals a brute-force oracle", "[index][knn]") {
  // n not a multiple of the key block, m not a multiple of the query block.
  const fixture f = make(61, 19, 23, 24, 17);
  for (std::size_t k : {std::size_t{1}, std::size_t{10}, f.n, f.n + 5}) {
    for (std::size_t threads : {1u, 2u, 3u}) {
      const kvsift::cpu_knn_params p{threads, 5, 7};
      check_engine<float>(f, k, p);
      check_engine<kvsift::half>(f, k, p);
      check_engine<kvsift::bfloat16>(f, k, p);
    }
  }
  // Default blocks (a single block each).
  check_engine<float>(f, 10, {});
  check_engine<kvsift::half>(f, 10, {});
}

#if defined(KVSIFT_TESTS_EIGEN)
TEST_CASE("eigen_knn_engine (the peer over Eigen's GEMM) equals a brute-force oracle",
          "[index][knn]") {
  const fixture f = make(61, 19, 23, 24, 17);
  for (std::size_t k : {std::size_t{1}, std::size_t{10}, f.n + 5}) {
    const kvsift::cpu_knn_params p{2, 5, 7};
    check_engine<float, kvsift::eigen_knn_engine>(f, k, p);
    check_engine<kvsift::half, kvsift::eigen_knn_engine>(f, k, p);
    check_engine<kvsift::bfloat16, kvsift::eigen_knn_engine>(f, k, p);
  }
}
#endif

TEST_CASE("cpu_knn_engine pads k > n with invalid_id and -inf", "[index][knn]") {
  const fixture f = make(6, 4, 3, 4, 2);
  const kvsift::matrix_view<const float> keys(f.keys.data(), f.n, f.d);
  const kvsift::matrix_view<const float> q(f.queries.data(), f.m, f.d);
  const auto r = kvsift::cpu_knn_engine({1, 2, 4}).search(q, keys, 9);
  for (std::size_t i = 0; i < f.m; ++i) {
    for (std::size_t j = 0; j < 9; ++j) {
      if (j < 6) {
        CHECK(r.row_ids(i)[j] < 6);
        CHECK(std::isfinite(r.row_scores(i)[j]));
      } else {
        CHECK(r.row_ids(i)[j] == kvsift::invalid_id);
        CHECK(r.row_scores(i)[j] == -std::numeric_limits<float>::infinity());
      }
    }
  }
}

TEST_CASE("cpu_knn_engine is independent of thread count and blocking on real data",
          "[index][knn]") {
  std::mt19937 rng(99);
  std::normal_distribution<float> nd;
  const std::size_t n = 301, d = 33, m = 41;
  std::vector<float> keys(n * d), q(m * d);
  for (auto& x : keys) x = nd(rng);
  for (auto& x : q) x = nd(rng);
  const kvsift::matrix_view<const float> kv(keys.data(), n, d), qv(q.data(), m, d);
  const auto a = kvsift::cpu_knn_engine({1, 7, 13}).search(qv, kv, 12);
  const auto b = kvsift::cpu_knn_engine({2, 7, 13}).search(qv, kv, 12);
  CHECK(a.ids == b.ids);
  CHECK(a.scores == b.scores);
  // Each score is one sum over the dimensions in index order, whatever the blocks: other
  // block sizes (1 x 1, tiles cut at every edge, one block) give the same bits.
  for (const kvsift::cpu_knn_params p :
       {kvsift::cpu_knn_params{1, 1, 1}, kvsift::cpu_knn_params{2, 5, 33},
        kvsift::cpu_knn_params{1, 1000, 1000}}) {
    const auto c = kvsift::cpu_knn_engine(p).search(qv, kv, 12);
    CHECK(a.ids == c.ids);
    CHECK(a.scores == c.scores);
  }
  // Ids agree with the (double precision) oracle, scores to f32 rounding.
  const auto want = oracle(qv, kv, 12);
  std::size_t agree = 0;
  for (std::size_t i = 0; i < m * 12; ++i) {
    agree += a.ids[i] == want.ids[i];
    REQUIRE(std::fabs(a.scores[i] - want.scores[i]) <= 1e-4f * (1 + std::fabs(want.scores[i])));
  }
  CHECK(agree == m * 12);
}

TEST_CASE("cpu_knn_engine ranks NaN products last", "[index][knn]") {
  std::vector<float> keys = {1, 0, std::numeric_limits<float>::quiet_NaN(), 0, 0.5f, 0};
  std::vector<float> q = {1, 0};
  const auto r = kvsift::cpu_knn_engine({1, 1, 1}).search(
      kvsift::matrix_view<const float>(q.data(), 1, 2),
      kvsift::matrix_view<const float>(keys.data(), 3, 2), 3);
  CHECK(r.ids[0] == 0);
  CHECK(r.ids[1] == 2);
  CHECK(r.ids[2] == 1);
  CHECK(r.scores[2] == -std::numeric_limits<float>::infinity());
}

TEST_CASE("cpu_knn_engine rejects bad input", "[index][knn]") {
  using Catch::Matchers::Contains;
  std::vector<float> keys(20, 1.0f), q(8, 1.0f);
  const kvsift::cpu_knn_engine e;
  const kvsift::matrix_view<const float> kv(keys.data(), 5, 4), qv(q.data(), 2, 4);
  auto msg = message_of<kvsift::invalid_argument>([&] { (void)e.search(qv, kv, 0); });
  CHECK_THAT(msg, Contains("k must be > 0") && Contains("0"));
  msg = message_of<kvsift::invalid_argument>(
      [&] { (void)e.search(qv, kvsift::matrix_view<const float>(keys.data(), 0, 4), 3); });
  CHECK_THAT(msg, Contains("0 keys"));
  msg = message_of<kvsift::invalid_argument>(
      [&] { (void)e.search(kvsift::matrix_view<const float>(q.data(), 0, 4), kv, 3); });
  CHECK_THAT(msg, Contains("got 0"));
  msg = message_of<kvsift::dimension_mismatch>(
      [&] { (void)e.search(kvsift::matrix_view<const float>(q.data(), 2, 3), kv, 3); });
  CHECK_THAT(msg, Contains("expected dimension 4") && Contains("got 3"));
}

// Regression: key_block = SIZE_MAX reached Eigen as a negative size (abort); block sizes are
// now clamped, so any value gives the oracle's answer.
TEST_CASE("cpu_knn_engine clamps absurd block sizes", "[index][knn][rel]") {
  const fixture f = make(61, 19, 23, 24, 17);
  constexpr std::size_t huge = std::numeric_limits<std::size_t>::max();
  for (const kvsift::cpu_knn_params p :
       {kvsift::cpu_knn_params{2, huge, huge}, kvsift::cpu_knn_params{1, 0, 0},
        kvsift::cpu_knn_params{2, 3, huge}, kvsift::cpu_knn_params{1, huge, 5}}) {
    check_engine<float>(f, 10, p);
    check_engine<kvsift::half>(f, 7, p);
  }
}

// Regressions: keys of dimension 0, more keys than 32-bit ids, and a queries x k
// product that overflows are refused before anything is read or allocated.
TEST_CASE("cpu_knn_engine rejects degenerate and overflow-sized shapes", "[index][knn][rel]") {
  using Catch::Matchers::Contains;
  std::vector<float> buf(64, 1.0f);
  const kvsift::cpu_knn_engine e({1, 4, 4});
  const kvsift::matrix_view<const float> q(buf.data(), 2, 4);
  auto msg = kvsift_test::message_of<kvsift::out_of_range>([&] {
    (void)e.search(q, kvsift::matrix_view<const float>(buf.data(), std::size_t{1} << 32, 4), 3);
  });
  CHECK_THAT(msg, Contains("knn") && Contains("4294967296"));
  msg = kvsift_test::message_of<kvsift::invalid_argument>([&] {
    (void)e.search(kvsift::matrix_view<const float>(buf.data(), 2, 0),
                   kvsift::matrix_view<const float>(buf.data(), 5, 0), 3);
  });
  CHECK_THAT(msg, Contains("dimension > 0") && Contains("5 x 0"));
  msg = kvsift_test::message_of<kvsift::invalid_argument>([&] {
    (void)e.search(q, kvsift::matrix_view<const float>(buf.data(), 4, 4),
                   std::numeric_limits<std::size_t>::max());
  });
  CHECK_THAT(msg, Contains("queries x k") && Contains("overflows"));
}
