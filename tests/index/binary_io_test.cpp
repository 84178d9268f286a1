// atomic_write (io/detail/binary_io.hpp): the file replacement under every index and vector
// writer. The attacks and accidents it must survive: a symlink, FIFO or device at the target,
// a symlink planted at the old predictable temporary name, an unwritable directory, a writer
// that fails half-way. In each case the original must be intact and no temporary left behind.

#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>

#include "../test_support.hpp"
#include "kvsift/io/detail/binary_io.hpp"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using kvsift_test::message_of;

namespace {

struct temp_dir {
  fs::path path;
  temp_dir()
      : path(fs::temp_directory_path() /
             ("kvsift_atomic_" + std::to_string(std::random_device{}()))) {
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
  // Entries other than the given names: leftovers of a failed write.
  [[nodiscard]] std::size_t entries() const {
    std::size_t n = 0;
    for (const auto& e : fs::directory_iterator(path)) {
      (void)e;
      ++n;
    }
    return n;
  }
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void spit(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

void write_new(const fs::path& p) {
  kvsift::detail::atomic_write(p, [](std::ostream& out) { out << "NEW"; });
}

}  // namespace

TEST_CASE("atomic_write replaces a regular file and keeps its permissions", "[io][rel]") {
  temp_dir d;
  const fs::path p = d.path / "a.bin";
  write_new(p);  // a new file
  CHECK(slurp(p) == "NEW");
  spit(p, "OLD");
  fs::permissions(p, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  kvsift::detail::atomic_write(p, [](std::ostream& out) { out << std::string(200000, 'x'); });
  CHECK(slurp(p) == std::string(200000, 'x'));  // larger than the stream buffer
  CHECK((fs::status(p).permissions() & fs::perms::all) ==
        (fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read));
  CHECK(d.entries() == 1);
}

TEST_CASE("atomic_write refuses a symlink at the target", "[io][rel]") {
  temp_dir d;
  const fs::path victim = d.path / "victim", link = d.path / "link";
  spit(victim, "VICTIM");
  fs::create_symlink(victim, link);
  const auto msg = message_of<kvsift::io_error>([&] { write_new(link); });
  CHECK_THAT(msg, Contains("symbolic link") && Contains(link.string()));
  CHECK(fs::is_symlink(fs::symlink_status(link)));
  CHECK(slurp(victim) == "VICTIM");
  CHECK(d.entries() == 2);
}

TEST_CASE("atomic_write refuses a FIFO or a device at the target", "[io][rel]") {
  temp_dir d;
  const fs::path fifo = d.path / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto msg = message_of<kvsift::io_error>([&] { write_new(fifo); });
  CHECK_THAT(msg, Contains("FIFO") && Contains(fifo.string()));
  CHECK(fs::is_fifo(fs::symlink_status(fifo)));
  CHECK(d.entries() == 1);
  // /dev/null exists everywhere; the refusal comes from lstat before anything is created.
  msg = message_of<kvsift::io_error>([&] { write_new("/dev/null"); });
  CHECK_THAT(msg, Contains("character device") && Contains("/dev/null"));
  CHECK(fs::is_character_file(fs::status("/dev/null")));
}

TEST_CASE("atomic_write does not follow a symlink planted at path.tmp", "[io][rel]") {
  temp_dir d;
  const fs::path victim = d.path / "victim", p = d.path / "index.bin";
  spit(victim, "VICTIM");
  fs::create_symlink(victim, d.path / "index.bin.tmp");  // the old, predictable temporary
  write_new(p);
  CHECK(slurp(victim) == "VICTIM");
  CHECK(slurp(p) == "NEW");
  CHECK_FALSE(fs::is_symlink(fs::symlink_status(p)));
  CHECK(fs::is_symlink(fs::symlink_status(d.path / "index.bin.tmp")));
  CHECK(d.entries() == 3);
}

TEST_CASE("atomic_write failures leave the original intact and no temporary", "[io][rel]") {
  temp_dir d;
  const fs::path p = d.path / "index.bin";
  spit(p, "ORIGINAL");
  SECTION("the writer throws half-way") {
    CHECK_THROWS_AS(kvsift::detail::atomic_write(p,
                                                 [](std::ostream& out) {
                                                   out << std::string(100000, 'y');
                                                   throw std::runtime_error("writer failed");
                                                 }),
                    std::runtime_error);
  }
  SECTION("the target's parent is not a directory") {
    const auto msg = message_of<kvsift::io_error>([&] { write_new(p / "child"); });
    CHECK_THAT(msg, Contains((p / "child").string()));
  }
  SECTION("the directory is not writable") {
    if (::geteuid() == 0) {
      // root writes through permission bits; the case is then covered by the parent-is-a-file
      // section (creation of the temporary fails the same way).
      WARN("running as root: an unwritable directory cannot be simulated with chmod");
    } else {
      fs::permissions(d.path, fs::perms::owner_read | fs::perms::owner_exec);
      const auto msg = message_of<kvsift::io_error>([&] { write_new(p); });
      CHECK_THAT(msg, Contains("cannot create a temporary") && Contains(p.string()));
      fs::permissions(d.path, fs::perms::owner_all);
    }
  }
  CHECK(slurp(p) == "ORIGINAL");
  CHECK(d.entries() == 1);
}
