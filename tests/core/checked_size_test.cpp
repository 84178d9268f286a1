#include "kvsift/core/checked_size.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>

#include "../test_support.hpp"

using kvsift_test::message_of;

namespace {
constexpr std::size_t size_max = std::numeric_limits<std::size_t>::max();
}

TEST_CASE("checked_mul and checked_add return the exact value or throw", "[core][checked]") {
  CHECK(kvsift::checked_mul(0, size_max, "x") == 0);
  CHECK(kvsift::checked_mul(size_max, 1, "x") == size_max);
  CHECK(kvsift::checked_mul(std::size_t{1} << 32, (std::size_t{1} << 32) - 1, "x") ==
        (std::size_t{1} << 32) * ((std::size_t{1} << 32) - 1));
  const auto msg = message_of<kvsift::invalid_argument>(
      [] { (void)kvsift::checked_mul(std::size_t{1} << 32, std::size_t{1} << 32, "adjacency"); });
  CHECK_THAT(msg, Catch::Contains("adjacency") && Catch::Contains("4294967296 x 4294967296"));
  // The three-factor form catches a wrap in either product.
  CHECK(kvsift::checked_mul(3, 5, 7, "x") == 105);
  CHECK_THROWS_AS(kvsift::checked_mul(size_max / 2, 3, 1, "x"), kvsift::invalid_argument);
  CHECK_THROWS_AS(kvsift::checked_mul(2, size_max / 2, 3, "x"), kvsift::invalid_argument);
  CHECK(kvsift::checked_mul(2, size_max / 2, 1, "x") == size_max - 1);

  CHECK(kvsift::checked_add(size_max - 1, 1, "x") == size_max);
  CHECK_THROWS_AS(kvsift::checked_add(size_max, 1, "x"), kvsift::invalid_argument);
  CHECK(kvsift::checked_bytes<double>(size_max / 8, "x") == (size_max / 8) * 8);
  CHECK_THROWS_AS(kvsift::checked_bytes<double>(size_max / 8 + 1, "x"), kvsift::invalid_argument);
}

TEST_CASE("checked_ceil_div does not wrap where a + b - 1 would", "[core][checked]") {
  CHECK(kvsift::checked_ceil_div(0, 16, "x") == 0);
  CHECK(kvsift::checked_ceil_div(16, 16, "x") == 1);
  CHECK(kvsift::checked_ceil_div(17, 16, "x") == 2);
  // size_max + 16 - 1 wraps to 14: a hand-written ceil would say 0 pages.
  CHECK(kvsift::checked_ceil_div(size_max, 16, "x") == size_max / 16 + 1);
  CHECK_THROWS_AS(kvsift::checked_ceil_div(5, 0, "x"), kvsift::invalid_argument);
}

TEST_CASE("require_indexable keeps positions clear of invalid_id", "[core][checked]") {
  CHECK_NOTHROW(kvsift::require_indexable(0, "keys"));
  CHECK_NOTHROW(kvsift::require_indexable(kvsift::max_index_size, "keys"));
  // With n = 2^32 the last position is 2^32 - 1 == invalid_id.
  const auto msg = message_of<kvsift::out_of_range>(
      [] { kvsift::require_indexable(kvsift::max_index_size + 1, "keys"); });
  CHECK_THAT(msg, Catch::Contains("keys") && Catch::Contains("4294967296"));
}

TEST_CASE("checked_cast rejects values the target cannot hold", "[core][checked]") {
  CHECK(kvsift::checked_cast<std::uint32_t>(std::size_t{4294967295u}, "x") == 4294967295u);
  CHECK_THROWS_AS(kvsift::checked_cast<std::uint32_t>(std::size_t{1} << 32, "layers"),
                  kvsift::invalid_argument);
  CHECK_THROWS_AS(kvsift::checked_cast<std::size_t>(-1, "x"), kvsift::invalid_argument);
  CHECK(kvsift::checked_cast<int>(std::int64_t{-5}, "x") == -5);
  CHECK_THROWS_AS(kvsift::checked_cast<int>(std::int64_t{1} << 40, "x"), kvsift::invalid_argument);
  const auto msg = message_of<kvsift::invalid_argument>(
      [] { (void)kvsift::checked_cast<std::uint32_t>(std::size_t{1} << 33, "heads"); });
  CHECK_THAT(msg, Catch::Contains("heads") && Catch::Contains("8589934592"));
}
