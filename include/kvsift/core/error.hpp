#pragma once
// Error types and the formatted-message helpers used at every API boundary.
//
// Two tiers, as in faiss: user errors throw `kvsift::invalid_argument` (or a named subclass)
// with a message naming the expected and the actual value; internal invariants use assert.

#include <charconv>
#include <concepts>
#include <cstdio>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
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

/// A message argument printed in lower-case hexadecimal without prefix (`os << std::hex << v`).
struct hex {
  unsigned long long value;
};

/// One argument of an error message, formatted as `std::ostream`'s defaults would print it (so
/// messages read as they always did) but without <sstream>, which alone cost every includer
/// of kvsift ~0.45 s of compile time: integers in decimal, bool as 1/0, floating point as %g,
/// strings as they are, and a path-like type (a `.string()` member, e.g.
/// std::filesystem::path) quoted as `os << path` quotes it.
///
/// The constructors are deliberately few and mostly non-templates: every distinct argument
/// list of `require` used to instantiate its own formatting chain (string literals of each
/// length are distinct types), ~130 chains in the umbrella header.
class message_piece {
 public:
  message_piece(std::string_view s) : text_(s) {}        // NOLINT: implicit by design
  message_piece(const char* s) : text_(s) {}             // NOLINT
  message_piece(const std::string& s) : text_(s) {}      // NOLINT
  message_piece(char c) : text_(1, c) {}                 // NOLINT
  message_piece(bool b) : text_(1, b ? '1' : '0') {}     // NOLINT
  message_piece(double v) { format_double(v); }          // NOLINT
  message_piece(float v) { format_double(v); }           // NOLINT
  message_piece(hex h) { format_integer(h.value, 16); }  // NOLINT
  template <class T>
  requires std::is_integral_v<T> || std::is_enum_v<T> message_piece(T v) {  // NOLINT
    if constexpr (std::is_enum_v<T>) {
      format_integer(static_cast<std::underlying_type_t<T>>(v), 10);
    } else {
      format_integer(v, 10);
    }
  }
  template <class P>
  requires requires(const P& p) {
    { p.string() } -> std::convertible_to<std::string>;
  }
  message_piece(const P& path) {  // NOLINT
    text_ += '"';
    for (const char c : std::string(path.string())) {
      if (c == '"' || c == '\\') text_ += '\\';
      text_ += c;
    }
    text_ += '"';
  }

  [[nodiscard]] const std::string& text() const noexcept { return text_; }

 private:
  template <class I>
  void format_integer(I v, int base) {
    char buf[24];
    text_.assign(buf, std::to_chars(buf, buf + sizeof buf, v, base).ptr);
  }
  void format_double(double v) {
    char buf[32];
    const int n = std::snprintf(buf, sizeof buf, "%g", v);
    text_.assign(buf, static_cast<std::size_t>(n > 0 ? n : 0));
  }

  std::string text_;
};

/// The pieces joined. Not a template, so each message costs one call, not an instantiation.
inline std::string join_message(std::initializer_list<message_piece> pieces) {
  std::string out;
  for (const message_piece& p : pieces) out += p.text();
  return out;
}

/// The arguments formatted as `message_piece`s and joined: concat("n = ", n) == "n = 7".
template <class... Args>
[[nodiscard]] std::string concat(const Args&... args) {
  return join_message({message_piece(args)...});
}

/// Throws `E` with the concatenated message; kept out of line of the hot path by [[noreturn]].
template <class E = invalid_argument, class... Args>
[[noreturn]] void fail(const Args&... args) {
  throw E(join_message({message_piece(args)...}));
}

/// Throws `E` unless `cond`; the message arguments are only formatted on failure.
template <class E = invalid_argument, class... Args>
void require(bool cond, const Args&... args) {
  if (!cond) [[unlikely]] {
    throw E(join_message({message_piece(args)...}));
  }
}

}  // namespace detail
}  // namespace kvsift
