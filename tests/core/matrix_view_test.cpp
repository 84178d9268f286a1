#include "kvsift/core/matrix_view.hpp"
#include "../test_support.hpp"

#include <catch2/catch.hpp>

#include <limits>
#include <numeric>
#include <string>
#include <vector>

namespace {

using kvsift_test::message_of;

}  // namespace

using Catch::Matchers::Contains;

TEST_CASE("matrix_view: strides and element access", "[core][matrix_view]") {
  std::vector<float> buf(4 * 7);
  std::iota(buf.begin(), buf.end(), 0.0f);
  const kvsift::matrix_view<float> v(buf.data(), 4, 5, 7);
  CHECK(v.rows() == 4);
  CHECK(v.cols() == 5);
  CHECK(v.stride() == 7);
  CHECK_FALSE(v.contiguous());
  CHECK(v(2, 3) == 2 * 7 + 3);
  CHECK(v.row(3)[4] == 25.0f);
  CHECK(v.row_span(1).size() == 5);
  CHECK(v.row_span(1)[0] == 7.0f);

  const kvsift::matrix_view<float> c(buf.data(), 4, 7);
  CHECK(c.stride() == 7);
  CHECK(c.contiguous());

  const kvsift::matrix_view<const float> cv = v;  // const conversion keeps the stride
  CHECK(cv.stride() == 7);
  CHECK(cv(3, 1) == 22.0f);

  const auto sub = v.row_range(1, 2);
  CHECK(sub.rows() == 2);
  CHECK(sub.stride() == 7);
  CHECK(sub(0, 0) == 7.0f);
  CHECK(sub(1, 4) == 18.0f);
  CHECK(v.row_range(4, 0).rows() == 0);
  CHECK(v.row_range(0, 4).rows() == 4);
}

TEST_CASE("matrix_view: construction and row_range errors", "[core][matrix_view]") {
  std::vector<float> buf(40);
  const auto msg = message_of<kvsift::invalid_argument>(
      [&] { kvsift::matrix_view<float> bad(buf.data(), 4, 6, 5); });
  CHECK_THAT(msg, Contains("6") && Contains("5"));
  const auto null_msg =
      message_of<kvsift::invalid_argument>([&] { kvsift::matrix_view<float> bad(nullptr, 3, 2); });
  CHECK_THAT(null_msg, Contains("null") && Contains("3 x 2"));
  CHECK_NOTHROW(kvsift::matrix_view<float>(nullptr, 0, 5));
  CHECK_NOTHROW(kvsift::matrix_view<float>(nullptr, 5, 0));

  const kvsift::matrix_view<float> v(buf.data(), 4, 10);
  CHECK_THROWS_AS(v.row_range(5, 0), kvsift::out_of_range);
  CHECK_THROWS_AS(v.row_range(3, 2), kvsift::out_of_range);
  CHECK_THROWS_AS(v.row_range(1, std::numeric_limits<std::size_t>::max()), kvsift::out_of_range);
  const auto rr = message_of<kvsift::out_of_range>([&] { (void)v.row_range(2, 3); });
  CHECK_THAT(rr, Contains("[2, 5)") && Contains("4 rows"));
}

TEST_CASE("require_finite names the offending row and column", "[core][matrix_view]") {
  std::vector<float> buf(3 * 8, 1.0f);
  const kvsift::matrix_view<const float> v(buf.data(), 3, 4, 8);
  CHECK_NOTHROW(kvsift::require_finite(v, "keys"));
  buf[1 * 8 + 6] = std::numeric_limits<float>::quiet_NaN();  // outside the view (stride pad)
  CHECK_NOTHROW(kvsift::require_finite(v, "keys"));
  buf[2 * 8 + 3] = std::numeric_limits<float>::quiet_NaN();
  auto msg = message_of<kvsift::non_finite_value>([&] { kvsift::require_finite(v, "keys"); });
  CHECK_THAT(msg, Contains("keys") && Contains("row 2") && Contains("column 3") && Contains("nan"));
  buf[1 * 8 + 0] = -std::numeric_limits<float>::infinity();
  msg = message_of<kvsift::non_finite_value>([&] { kvsift::require_finite(v, "queries"); });
  CHECK_THAT(msg,
             Contains("queries") && Contains("row 1") && Contains("column 0") && Contains("inf"));

  std::vector<kvsift::half> h(4, kvsift::half(1.0f));
  h[3].bits = 0x7c00;  // +Inf
  const kvsift::matrix_view<const kvsift::half> hv(h.data(), 2, 2);
  msg = message_of<kvsift::non_finite_value>([&] { kvsift::require_finite(hv, "f16"); });
  CHECK_THAT(msg, Contains("row 1") && Contains("column 1"));
}

TEST_CASE("require_dim", "[core][matrix_view]") {
  CHECK_NOTHROW(kvsift::require_dim(64, 64, "q"));
  const auto msg =
      message_of<kvsift::dimension_mismatch>([] { kvsift::require_dim(64, 63, "query"); });
  CHECK_THAT(msg, Contains("query") && Contains("64") && Contains("63"));
}
