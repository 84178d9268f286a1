#pragma once
// What the CUDA tests add to Catch2: CHECK_NEAR, a tolerance check that also passes on exact
// equality (so inf == inf passes) and never on NaN, with both values in the report.
//
// The tests are plain Catch2 TEST_CASEs compiled by nvcc; main.cpp (compiled by the host
// compiler, which keeps Catch2's implementation out of nvcc) exits with 77 before running any
// of them when no CUDA device is present, which CTest reports as skipped (SKIP_RETURN_CODE).

#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <string>

namespace kvsift::cuda_test {

/// Matches a double within `tol` of `expected`, or equal to it; NaN never matches.
class near_matcher : public Catch::MatcherBase<double> {
 public:
  near_matcher(double expected, double tol) : expected_(expected), tol_(tol) {}
  bool match(const double& actual) const override {
    return std::fabs(actual - expected_) <= tol_ || actual == expected_;
  }
  std::string describe() const override {
    std::ostringstream s;
    s.precision(9);
    s << "is within " << tol_ << " of " << expected_;
    return s.str();
  }

 private:
  double expected_;
  double tol_;
};

}  // namespace kvsift::cuda_test

/// |actual - expected| <= tol, or exactly equal (so inf == inf passes); NaN never passes.
#define CHECK_NEAR(actual, expected, tol) \
  CHECK_THAT(                             \
      static_cast<double>(actual),        \
      ::kvsift::cuda_test::near_matcher(static_cast<double>(expected), static_cast<double>(tol)))
