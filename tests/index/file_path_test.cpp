// kvsift::file_path (io/file_path.hpp): the file name parameter of every reader and writer,
// which replaced std::filesystem::path there so the I/O headers need not include <filesystem>.
// Callers must be able to pass what they passed before, and the few path operations the I/O
// code uses must agree with std::filesystem::path's.

#include <catch2/catch.hpp>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>

#include "../test_support.hpp"
#include "kvsift/io/file_path.hpp"
#include "kvsift/io/vector_io.hpp"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using kvsift_test::message_of;

namespace {
std::string name_of(const kvsift::file_path& p) { return p.string(); }
}  // namespace

TEST_CASE("file_path converts from every string and path type callers have", "[io]") {
  const std::string s = "dir/keys.fbin";
  CHECK(name_of("dir/keys.fbin") == s);
  CHECK(name_of(s) == s);
  CHECK(name_of(std::string_view(s)) == s);
  CHECK(name_of(fs::path("dir") / "keys.fbin") == s);
  CHECK(std::string(kvsift::file_path(s).c_str()) == s);
}

TEST_CASE("file_path's filename, extension and parent_path agree with std::filesystem", "[io]") {
  for (const char* c : {"keys.fbin", "dir/keys.fbin", "/abs/dir/keys.NPY", "a.b.c", "a.",
                        ".profile", "dir/.profile", ".", "..", "dir/..", "dir.d/file", "dir/",
                        "a//b.npy", "/", "/b", "b", ""}) {
    INFO("path '" << c << "'");
    const fs::path ref(c);
    const kvsift::file_path p(c);
    CHECK(p.filename() == ref.filename().string());
    CHECK(p.extension() == ref.extension().string());
    CHECK(p.parent_path() == ref.parent_path().string());
  }
}

TEST_CASE("readers take a std::filesystem::path and name it in their errors", "[io]") {
  const fs::path missing = fs::temp_directory_path() / "kvsift_no_such_dir" / "keys.fbin";
  CHECK_THROWS_AS(kvsift::read_fbin(missing), kvsift::io_error);
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)kvsift::read_fbin(missing); }),
             Contains(missing.string()) && Contains("no such file"));
  CHECK_THAT(
      message_of<std::invalid_argument>([&] { (void)kvsift::read_vectors(fs::path("keys.txt")); }),
      Contains("'.txt'") && Contains("expected .fbin or .npy"));
  CHECK_THAT(
      message_of<kvsift::io_error>([] { (void)kvsift::read_fbin(fs::temp_directory_path()); }),
      Contains("not a regular file"));
}
