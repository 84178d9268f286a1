#include "kvsift/core/dense_matrix.hpp"
#include "../test_support.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace {

// Takes a read-only view, as every consumer of vectors does; exercises the implicit conversion.
float sum_of(kvsift::matrix_view<const float> m) {
  float s = 0;
  for (std::size_t i = 0; i < m.rows(); ++i) {
    for (std::size_t j = 0; j < m.cols(); ++j) s += m(i, j);
  }
  return s;
}

using kvsift_test::message_of;

}  // namespace

TEST_CASE("dense_matrix zero-fills and indexes row-major", "[core]") {
  kvsift::dense_matrix<float> m(2, 3);
  REQUIRE(m.rows() == 2);
  REQUIRE(m.cols() == 3);
  REQUIRE(m.size() == 6);
  REQUIRE_FALSE(m.empty());
  for (std::size_t i = 0; i < m.size(); ++i) CHECK(m.data()[i] == 0.0f);

  m(1, 2) = 5.0f;
  m.row(0)[1] = 7.0f;
  CHECK(m.data()[5] == 5.0f);
  CHECK(m.data()[1] == 7.0f);
  CHECK(m.row(1) == m.data() + 3);

  const auto v = m.view();
  CHECK(v.rows() == 2);
  CHECK(v.cols() == 3);
  CHECK(v.contiguous());
  CHECK(v(1, 2) == 5.0f);
  v(0, 0) = 1.0f;  // a mutable view writes through
  CHECK(m(0, 0) == 1.0f);

  const auto cv = m.cview();
  CHECK(cv.data() == m.data());
  CHECK(sum_of(m) == 13.0f);  // implicit conversion to matrix_view<const float>

  const kvsift::dense_matrix<float>& cm = m;
  CHECK(cm(1, 2) == 5.0f);
  CHECK(cm.row(1)[2] == 5.0f);
  CHECK(cm.view().data() == m.data());
}

TEST_CASE("dense_matrix takes ownership of data of the right size", "[core]") {
  std::vector<float> data{1, 2, 3, 4, 5, 6};
  const float* p = data.data();
  kvsift::dense_matrix<float> m(3, 2, std::move(data));
  CHECK(m.data() == p);  // moved, not copied
  CHECK(m(2, 1) == 6.0f);
  CHECK(m(1, 0) == 3.0f);
}

TEST_CASE("dense_matrix rejects data of the wrong size", "[core]") {
  const auto msg = message_of<kvsift::dimension_mismatch>(
      [] { kvsift::dense_matrix<float> m(2, 3, std::vector<float>(5)); });
  CHECK_THAT(msg, Catch::Contains("expected 2 x 3 = 6 elements, got 5"));
  CHECK_THROWS_AS(kvsift::dense_matrix<float>(0, 3, std::vector<float>(1)),
                  kvsift::dimension_mismatch);
  CHECK_NOTHROW(kvsift::dense_matrix<float>(0, 3, std::vector<float>{}));
}

TEST_CASE("dense_matrix rejects a shape whose size overflows", "[core]") {
  const std::size_t big = std::numeric_limits<std::size_t>::max() / 2;
  CHECK_THROWS_AS(kvsift::dense_matrix<float>(big, 3), kvsift::invalid_argument);
  // Without the overflow check rows * cols would wrap to a small number and match the data.
  const std::size_t half_range = std::size_t{1} << (sizeof(std::size_t) * 4);
  CHECK_THROWS_AS(kvsift::dense_matrix<float>(half_range, half_range, std::vector<float>{}),
                  kvsift::invalid_argument);
}

TEST_CASE("dense_matrix copies are deep and moved-from matrices are empty", "[core]") {
  kvsift::dense_matrix<float> a(2, 2, {1, 2, 3, 4});
  kvsift::dense_matrix<float> b = a;
  b(0, 0) = 9;
  CHECK(a(0, 0) == 1);

  kvsift::dense_matrix<float> c = std::move(a);
  CHECK(c.rows() == 2);
  CHECK(c(1, 1) == 4);
  CHECK(a.rows() == 0);  // NOLINT(bugprone-use-after-move): the state is documented
  CHECK(a.cols() == 0);
  CHECK(a.size() == 0);
  CHECK(a.view().empty());

  kvsift::dense_matrix<float> d;
  d = std::move(c);
  CHECK(d(1, 0) == 3);
  CHECK(c.rows() == 0);  // NOLINT(bugprone-use-after-move)
  CHECK(c.size() == 0);
}

TEST_CASE("convert f32 -> f16 -> f32 round trips within f16 precision", "[core]") {
  const std::size_t rows = 4, cols = 5;
  kvsift::dense_matrix<float> src(rows, cols);
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < cols; ++j) {
      src(i, j) = std::sin(static_cast<float>(i * cols + j)) * 100.0f;
    }
  }
  const kvsift::dense_matrix<kvsift::half> h = kvsift::convert<kvsift::half>(src);
  REQUIRE(h.rows() == rows);
  REQUIRE(h.cols() == cols);
  const kvsift::dense_matrix<float> back = kvsift::convert<float>(h);
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < cols; ++j) {
      // Round to nearest with an 11-bit significand: relative error at most 2^-11.
      CHECK(std::fabs(back(i, j) - src(i, j)) <= std::fabs(src(i, j)) * 0x1p-11f);
    }
  }
  // f16 -> f32 is exact, so a second round trip changes nothing.
  const auto again = kvsift::convert<float>(kvsift::convert<kvsift::half>(back));
  for (std::size_t k = 0; k < back.size(); ++k) CHECK(again.data()[k] == back.data()[k]);
}

TEST_CASE("convert accepts strided, const and mutable views", "[core]") {
  std::vector<float> storage{1, 2, -1, 3, 4, -1};  // 2 x 2 with stride 3
  const kvsift::matrix_view<const float> strided(storage.data(), 2, 2, 3);
  const auto same = kvsift::convert<float, float>(strided);
  REQUIRE(same.cols() == 2);
  CHECK(same(0, 0) == 1);
  CHECK(same(0, 1) == 2);
  CHECK(same(1, 0) == 3);
  CHECK(same(1, 1) == 4);

  const kvsift::matrix_view<float> mutable_view(storage.data(), 2, 2, 3);
  const auto bf = kvsift::convert<kvsift::bfloat16>(mutable_view);
  CHECK(static_cast<float>(bf(1, 1)) == 4.0f);

  const kvsift::dense_matrix<float> empty;
  CHECK(kvsift::convert<kvsift::half>(empty).rows() == 0);
}
