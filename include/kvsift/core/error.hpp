#pragma once
// Error types and the formatted-message helpers used at every API boundary.
//
// Two tiers, as in faiss: user errors throw `kvsift::invalid_argument` (or a named subclass)
// with a message naming the expected and the actual value; internal invariants use assert.

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvsift {

/// Bad input at an API boundary: wrong shape, out-of-range value, NaN in build data.
class invalid_argument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// A dimension that does not match the one the callee expects.
class dimension_mismatch : public invalid_argument {
 public:
  using invalid_argument::invalid_argument;
};

/// An id (key, node, token) outside the valid range.
class out_of_range : public invalid_argument {
 public:
  using invalid_argument::invalid_argument;
};

/// A non-finite value (NaN, +-Inf) where finite data is required.
class non_finite_value : public invalid_argument {
 public:
  using invalid_argument::invalid_argument;
};

/// A file that cannot be read, is truncated, corrupted, or has an unexpected format.
class io_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

template <class... Args>
[[nodiscard]] std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

/// Throws `E` with the concatenated message; kept out of line of the hot path by [[noreturn]].
template <class E = invalid_argument, class... Args>
[[noreturn]] void fail(Args&&... args) {
  throw E(concat(std::forward<Args>(args)...));
}

/// Throws `E` unless `cond`; the message arguments are only formatted on failure.
template <class E = invalid_argument, class... Args>
void require(bool cond, Args&&... args) {
  if (!cond) [[unlikely]] {
    fail<E>(std::forward<Args>(args)...);
  }
}

}  // namespace detail
}  // namespace kvsift
