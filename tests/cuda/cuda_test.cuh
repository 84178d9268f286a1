#pragma once
// A minimal test harness for the CUDA tests: a registry of named test functions and CHECK
// macros that count failures. Plain C++ (no Catch2) so that the executable can report itself
// as skipped (exit code 77) on a machine without a GPU; see main.cu.

#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace kvsift::cuda_test {

struct test_case {
  const char* name;
  void (*fn)();
};

inline std::vector<test_case>& registry() {
  static std::vector<test_case> tests;
  return tests;
}

/// Failed checks of the test that is running.
inline int& current_failures() {
  static int n = 0;
  return n;
}

inline bool add(const char* name, void (*fn)()) {
  registry().push_back({name, fn});
  return true;
}

inline void report_failure(const char* file, int line, const std::string& msg) {
  ++current_failures();
  if (current_failures() <= 10) std::printf("  %s:%d: %s\n", file, line, msg.c_str());
}

}  // namespace kvsift::cuda_test

#define KVSIFT_CT_CAT2(a, b) a##b
#define KVSIFT_CT_CAT(a, b) KVSIFT_CT_CAT2(a, b)

/// Defines and registers a test function: `TEST_CASE_CUDA(merge_basic) { CHECK(...); }`.
#define TEST_CASE_CUDA(name)                                            \
  static void name();                                                   \
  [[maybe_unused]] static const bool KVSIFT_CT_CAT(name, _registered) = \
      ::kvsift::cuda_test::add(#name, &name);                           \
  static void name()

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) ::kvsift::cuda_test::report_failure(__FILE__, __LINE__, #cond); \
  } while (0)

/// |actual - expected| <= tol, or exactly equal (so inf == inf passes); NaN never passes.
#define CHECK_NEAR(actual, expected, tol)                                                  \
  do {                                                                                     \
    const double kvsift_ct_a = static_cast<double>(actual);                                \
    const double kvsift_ct_e = static_cast<double>(expected);                              \
    if (!(std::fabs(kvsift_ct_a - kvsift_ct_e) <= static_cast<double>(tol)) &&             \
        !(kvsift_ct_a == kvsift_ct_e)) {                                                   \
      ::kvsift::cuda_test::report_failure(                                                 \
          __FILE__, __LINE__,                                                              \
          std::string(#actual " = ") + std::to_string(kvsift_ct_a) + ", expected " +       \
              std::to_string(kvsift_ct_e) + " (tol " + std::to_string(double(tol)) + ")"); \
    }                                                                                      \
  } while (0)

#define CHECK_THROWS_AS(expr, type)                                                              \
  do {                                                                                           \
    bool kvsift_ct_caught = false;                                                               \
    try {                                                                                        \
      (void)(expr);                                                                              \
    } catch (const type&) {                                                                      \
      kvsift_ct_caught = true;                                                                   \
    } catch (...) {                                                                              \
    }                                                                                            \
    if (!kvsift_ct_caught) {                                                                     \
      ::kvsift::cuda_test::report_failure(__FILE__, __LINE__, "expected " #type " from " #expr); \
    }                                                                                            \
  } while (0)
