#pragma once
// kvsift::file_path: the file name parameter of kvsift's file I/O (vectors, ground truth,
// graphs). Callers pass what they have: a string literal, a std::string, a std::string_view or
// a std::filesystem::path all convert implicitly. It is not std::filesystem::path itself
// because <filesystem> costs every includer of the I/O headers about 0.3 s of compile time
// (g++ 12 -O2, tools/compile_time.py) for path algebra kvsift never needs: the files are
// opened with POSIX calls, which take a C string.

#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

namespace kvsift {

/// A file name in the native (POSIX, narrow) encoding. Value type; thread safety as
/// std::string.
class file_path {
 public:
  file_path(const char* s) : s_(s) {}             // NOLINT: implicit by design
  file_path(std::string s) : s_(std::move(s)) {}  // NOLINT
  file_path(std::string_view s) : s_(s) {}        // NOLINT
  /// From std::filesystem::path (or any path type whose native() is a narrow string), without
  /// naming it: this header does not include <filesystem>.
  template <class Path>
  requires requires(const Path& p) {
    { p.native() } -> std::convertible_to<std::string_view>;
  }
  file_path(const Path& p) : s_(std::string_view(p.native())) {}  // NOLINT

  [[nodiscard]] const std::string& string() const noexcept { return s_; }
  [[nodiscard]] const char* c_str() const noexcept { return s_.c_str(); }

  /// The last component ("b.fbin" of "a/b.fbin"); empty when the name ends with '/'.
  [[nodiscard]] std::string filename() const {
    const std::size_t slash = s_.rfind('/');
    return slash == std::string::npos ? s_ : s_.substr(slash + 1);
  }
  /// The directory part ("a" of "a/b.fbin", "/" of "/b", "" of "b"), as
  /// std::filesystem::path::parent_path.
  [[nodiscard]] std::string parent_path() const {
    std::size_t slash = s_.rfind('/');
    if (slash == std::string::npos) return {};
    while (slash > 0 && s_[slash - 1] == '/') --slash;  // "a//b" -> "a"
    return slash == 0 ? std::string("/") : s_.substr(0, slash);
  }
  /// The extension with its dot (".fbin" of "a/b.fbin"), as
  /// std::filesystem::path::extension: empty when the last component has no dot, or only a
  /// leading one (".profile"), and for "." and "..".
  [[nodiscard]] std::string extension() const {
    const std::string name = filename();
    if (name == "." || name == "..") return {};
    const std::size_t dot = name.rfind('.');
    return dot == std::string::npos || dot == 0 ? std::string() : name.substr(dot);
  }

 private:
  std::string s_;
};

}  // namespace kvsift
