#pragma once
// Helpers shared by kvsift's Catch2 tests.

#include <catch2/catch.hpp>

#include <string>

namespace kvsift_test {

/// Runs `f`, which must throw `E`, and returns the exception's message (the test fails if
/// nothing or something else is thrown), so a test can check that the message names the
/// expected and the actual value.
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("the expected exception was not thrown");
  return {};
}

}  // namespace kvsift_test
