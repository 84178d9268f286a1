#include <catch2/catch.hpp>

#include <vector>

#include "kvsift/index/gqa_sampling.hpp"

using namespace kvsift;
using Catch::Matchers::Contains;

TEST_CASE("GQA sampling takes a fraction of every head, in order, deterministically",
          "[index][gqa]") {
  const std::size_t m = 1000, d = 4;
  std::vector<std::vector<float>> heads(3, std::vector<float>(m * d));
  for (std::size_t h = 0; h < 3; ++h) {
    for (std::size_t i = 0; i < m; ++i) heads[h][i * d] = static_cast<float>(h * m + i);
  }
  std::vector<matrix_view<const float>> views;
  for (auto& h : heads) views.emplace_back(h.data(), m, d);

  const auto s = sample_gqa_queries(views, 0.1, 11);
  REQUIRE(s.rows() == 300);
  REQUIRE(s.cols() == d);
  for (std::size_t h = 0; h < 3; ++h) {
    for (std::size_t i = 0; i < 100; ++i) {
      const float tag = s(h * 100 + i, 0);
      CHECK(tag >= static_cast<float>(h * m));  // rows of head h, stacked head by head
      CHECK(tag < static_cast<float>((h + 1) * m));
      if (i > 0) CHECK(tag > s(h * 100 + i - 1, 0));  // original order, no duplicates
    }
  }
  const auto again = sample_gqa_queries(views, 0.1, 11);
  CHECK(std::equal(s.data(), s.data() + s.size(), again.data()));
  const auto other = sample_gqa_queries(views, 0.1, 12);
  CHECK_FALSE(std::equal(s.data(), s.data() + s.size(), other.data()));
  CHECK(sample_gqa_queries(views, 1.0).rows() == 3 * m);
}

TEST_CASE("GQA sampling rejects bad input", "[index][gqa]") {
  std::vector<float> a(40), b(30);
  std::vector<matrix_view<const float>> ok{{a.data(), 10, 4}};
  CHECK_THROWS_WITH(sample_gqa_queries(ok, 0.0), Contains("(0, 1]") && Contains("got 0"));
  CHECK_THROWS_WITH(sample_gqa_queries(ok, 1.5), Contains("1.5"));
  CHECK_THROWS_WITH(sample_gqa_queries({}, 0.5), Contains("got 0"));
  std::vector<matrix_view<const float>> mixed{{a.data(), 10, 4}, {b.data(), 10, 3}};
  CHECK_THROWS_AS(sample_gqa_queries(mixed, 0.5), dimension_mismatch);
  std::vector<matrix_view<const float>> empty{{a.data(), 10, 4}, {a.data(), 0, 4}};
  CHECK_THROWS_WITH(sample_gqa_queries(empty, 0.5), Contains("head 1"));
}
