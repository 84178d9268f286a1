#include "kvsift/io/vector_io.hpp"

#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "../test_support.hpp"
#include "kvsift/io/detail/binary_io.hpp"

namespace fs = std::filesystem;

namespace {

// A fresh directory per test case, removed afterwards, so parallel runs cannot collide.
class temp_dir {
 public:
  temp_dir() {
    std::random_device rd;
    const auto tag = std::to_string(rd()) + "_" + std::to_string(rd());
    path_ = fs::temp_directory_path() / ("kvsift_vector_io_test_" + tag);
    fs::create_directories(path_);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  [[nodiscard]] fs::path operator/(const std::string& name) const { return path_ / name; }
  [[nodiscard]] const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <class T>
std::string bytes_of(const T& v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// An .fbin image: header (n, d) followed by `payload_floats` floats 0, 1, 2, ...
std::string fbin_bytes(std::uint32_t n, std::uint32_t d, std::size_t payload_floats) {
  std::string s = bytes_of(n) + bytes_of(d);
  for (std::size_t i = 0; i < payload_floats; ++i) s += bytes_of(static_cast<float>(i));
  return s;
}

// A hand-written .npy image with the given version, header dict and data bytes; the header
// is padded with spaces and a newline to a 64-byte boundary as NumPy does.
std::string npy_bytes(int major, const std::string& dict, const std::string& data) {
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  std::string header = dict;
  const std::size_t unpadded = 8 + len_bytes + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::string s("\x93NUMPY", 6);
  s.push_back(static_cast<char>(major));
  s.push_back('\0');
  const auto len = static_cast<std::uint32_t>(header.size());
  for (std::size_t i = 0; i < len_bytes; ++i)
    s.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  return s + header + data;
}

std::string f4_dict(const std::string& shape) {
  return "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
}

using kvsift_test::message_of;

kvsift::dense_matrix<float> sample(std::size_t rows, std::size_t cols) {
  kvsift::dense_matrix<float> m(rows, cols);
  for (std::size_t i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(i) * 0.25f - 3.0f;
  return m;
}

void check_equal(const kvsift::dense_matrix<float>& a, const kvsift::dense_matrix<float>& b) {
  REQUIRE(a.rows() == b.rows());
  REQUIRE(a.cols() == b.cols());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a.data()[i] == b.data()[i]);
}

}  // namespace

// ---------------------------------------------------------------- .fbin / .ibin

TEST_CASE("fbin round trip", "[io]") {
  temp_dir dir;
  const auto p = dir / "v.fbin";
  const auto m = sample(7, 5);
  kvsift::write_fbin(p, m);
  CHECK(fs::file_size(p) == 8 + 7 * 5 * 4);
  CHECK_FALSE(fs::exists(dir / "v.fbin.tmp"));
  check_equal(kvsift::read_fbin(p), m);
  check_equal(kvsift::read_vectors(p), m);

  // Overwriting an existing file replaces it.
  const auto m2 = sample(2, 3);
  kvsift::write_fbin(p, m2);
  check_equal(kvsift::read_fbin(p), m2);
}

TEST_CASE("fbin writes a strided view row by row and an empty set", "[io]") {
  temp_dir dir;
  std::vector<float> storage{1, 2, 99, 3, 4, 99};
  kvsift::write_fbin(dir / "s.fbin", kvsift::matrix_view<const float>(storage.data(), 2, 2, 3));
  const auto r = kvsift::read_fbin(dir / "s.fbin");
  REQUIRE(r.rows() == 2);
  REQUIRE(r.cols() == 2);
  CHECK(r(0, 1) == 2);
  CHECK(r(1, 0) == 3);

  kvsift::write_fbin(dir / "e.fbin", kvsift::dense_matrix<float>(0, 16));
  const auto e = kvsift::read_fbin(dir / "e.fbin");
  CHECK(e.rows() == 0);
  CHECK(e.cols() == 16);
}

TEST_CASE("ibin round trip and size validation", "[io]") {
  temp_dir dir;
  const kvsift::id_matrix ids{{1, 2, 3, 4000000000u, 5, 6}, 2, 3};
  kvsift::write_ibin(dir / "gt.ibin", ids);
  const auto r = kvsift::read_ibin(dir / "gt.ibin");
  CHECK(r.rows == 2);
  CHECK(r.cols == 3);
  CHECK(r.data == ids.data);

  const kvsift::id_matrix bad{{1, 2, 3}, 2, 3};
  const auto msg =
      message_of<kvsift::dimension_mismatch>([&] { kvsift::write_ibin(dir / "bad.ibin", bad); });
  CHECK_THAT(msg, Catch::Contains("expected 2 x 3 = 6 ids, got 3"));
  CHECK_FALSE(fs::exists(dir / "bad.ibin"));
}

TEST_CASE("missing file is an io_error naming the path", "[io]") {
  temp_dir dir;
  const auto p = dir / "nope.fbin";
  const auto msg = message_of<kvsift::io_error>([&] { (void)kvsift::read_fbin(p); });
  CHECK_THAT(msg, Catch::Contains(p.string()));
  CHECK_THROWS_AS(kvsift::read_npy(dir / "nope.npy"), kvsift::io_error);
  CHECK_THROWS_AS(kvsift::read_ibin(dir / "nope.ibin"), kvsift::io_error);
  CHECK_THROWS_AS(kvsift::read_vectors(dir / "nope.npy"), kvsift::io_error);
  // A directory is not a vector file either.
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)kvsift::read_fbin(dir.path()); }),
             Catch::Contains("not a regular file"));
}

TEST_CASE("truncated fbin reports expected and actual sizes", "[io]") {
  temp_dir dir;
  const auto p = dir / "t.fbin";
  write_file(p, fbin_bytes(10, 4, 30));  // header says 10 x 4, only 30 floats follow
  const auto msg = message_of<kvsift::io_error>([&] { (void)kvsift::read_fbin(p); });
  CHECK_THAT(msg, Catch::Contains("expected 168 bytes"));
  CHECK_THAT(msg, Catch::Contains("got 128 bytes"));
  CHECK_THAT(msg, Catch::Contains("10 x 4"));
}

TEST_CASE("fbin with trailing garbage is rejected", "[io]") {
  temp_dir dir;
  const auto p = dir / "g.fbin";
  write_file(p, fbin_bytes(10, 4, 40) + "junk");
  const auto msg = message_of<kvsift::io_error>([&] { (void)kvsift::read_fbin(p); });
  CHECK_THAT(msg, Catch::Contains("expected 168 bytes"));
  CHECK_THAT(msg, Catch::Contains("got 172 bytes"));
}

TEST_CASE("zero-size and header-only-short files are rejected", "[io]") {
  temp_dir dir;
  write_file(dir / "z.fbin", "");
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)kvsift::read_fbin(dir / "z.fbin"); }),
             Catch::Contains("got 0 bytes"));
  write_file(dir / "z.npy", "");
  CHECK_THROWS_AS(kvsift::read_npy(dir / "z.npy"), kvsift::io_error);
  write_file(dir / "z.ibin", "abc");
  CHECK_THROWS_AS(kvsift::read_ibin(dir / "z.ibin"), kvsift::io_error);
}

TEST_CASE("absurd fbin header is an io_error without a huge allocation", "[io]") {
  temp_dir dir;
  const auto p = dir / "huge.fbin";
  // 2^32-1 squared floats: the byte count overflows 64 bits.
  write_file(p, fbin_bytes(0xffffffffu, 0xffffffffu, 4));
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)kvsift::read_fbin(p); }),
             Catch::Contains("overflow"));
  // Large but representable: 64 GiB claimed by a 24-byte file.
  write_file(p, fbin_bytes(1u << 24, 1024, 4));
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)kvsift::read_fbin(p); }),
             Catch::Contains("got 24 bytes"));
}

// ---------------------------------------------------------------- .npy

TEST_CASE("npy f4 round trip is NumPy-compatible", "[io]") {
  temp_dir dir;
  const auto p = dir / "v.npy";
  const auto m = sample(6, 3);
  kvsift::write_npy(p, m);
  const std::string bytes = read_file(p);
  REQUIRE(bytes.size() > 10);
  CHECK(bytes.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
  const std::size_t header_len =
      static_cast<unsigned char>(bytes[8]) |
      (static_cast<std::size_t>(static_cast<unsigned char>(bytes[9])) << 8);
  CHECK((10 + header_len) % 64 == 0);  // data aligned as NumPy writes it
  CHECK(bytes[10 + header_len - 1] == '\n');
  CHECK_THAT(bytes.substr(10, header_len), Catch::Contains("'shape': (6, 3)"));
  CHECK(bytes.size() == 10 + header_len + 6 * 3 * 4);
  check_equal(kvsift::read_npy(p), m);
  check_equal(kvsift::read_vectors(p), m);
}

TEST_CASE("npy f2 is converted to float exactly", "[io]") {
  temp_dir dir;
  const auto p = dir / "h.npy";
  // 1, -2, 0.5 / 65504 (max f16), 0, 2^-24 (smallest subnormal)
  const std::vector<std::uint16_t> halves{0x3c00, 0xc000, 0x3800, 0x7bff, 0x0000, 0x0001};
  write_file(p, npy_bytes(1, "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 3), }",
                          bytes_of(halves)));
  const auto m = kvsift::read_npy(p);
  REQUIRE(m.rows() == 2);
  REQUIRE(m.cols() == 3);
  CHECK(m(0, 0) == 1.0f);
  CHECK(m(0, 1) == -2.0f);
  CHECK(m(0, 2) == 0.5f);
  CHECK(m(1, 0) == 65504.0f);
  CHECK(m(1, 1) == 0.0f);
  CHECK(m(1, 2) == 0x1p-24f);
}

TEST_CASE("npy f2 larger than one conversion chunk", "[io]") {
  temp_dir dir;
  const auto p = dir / "big.npy";
  const std::size_t rows = 1100, cols = 1000;  // > 2^19 halves: several chunks
  std::vector<std::uint16_t> halves(rows * cols);
  for (std::size_t i = 0; i < halves.size(); ++i) {
    halves[i] = kvsift::half::from_float(static_cast<float>(i % 2048));
  }
  write_file(p, npy_bytes(1, "{'descr': '<f2', 'fortran_order': False, 'shape': (1100, 1000), }",
                          bytes_of(halves)));
  const auto m = kvsift::read_npy(p);
  REQUIRE(m.size() == rows * cols);
  bool all_equal = true;
  for (std::size_t i = 0; i < m.size(); ++i) {
    all_equal = all_equal && m.data()[i] == static_cast<float>(i % 2048);
  }
  CHECK(all_equal);
}

TEST_CASE("npy 1-D array is read as one row", "[io]") {
  temp_dir dir;
  const auto p = dir / "one.npy";
  const std::vector<float> v{1.5f, 2.5f, 3.5f, 4.5f};
  write_file(p, npy_bytes(1, f4_dict("(4,)"), bytes_of(v)));
  const auto m = kvsift::read_npy(p);
  REQUIRE(m.rows() == 1);
  REQUIRE(m.cols() == 4);
  CHECK(m(0, 3) == 4.5f);
}

TEST_CASE("npy format 2.0 header and alternative spellings", "[io]") {
  temp_dir dir;
  const std::vector<float> v{1, 2, 3, 4, 5, 6};
  write_file(dir / "v2.npy", npy_bytes(2, f4_dict("(3, 2)"), bytes_of(v)));
  const auto m = kvsift::read_npy(dir / "v2.npy");
  REQUIRE(m.rows() == 3);
  REQUIRE(m.cols() == 2);
  CHECK(m(2, 1) == 6);

  // Key order, double quotes, no trailing comma, extra whitespace: all valid Python literals.
  write_file(dir / "alt.npy",
             npy_bytes(1, "{ \"shape\" : ( 2 , 3 ) ,\"fortran_order\":False,\"descr\":\"<f4\"}",
                       bytes_of(v)));
  const auto a = kvsift::read_npy(dir / "alt.npy");
  CHECK(a.rows() == 2);
  CHECK(a.cols() == 3);
  CHECK(a(1, 0) == 4);
}

TEST_CASE("npy rejects fortran order, foreign dtypes and shapes", "[io]") {
  temp_dir dir;
  const auto p = dir / "bad.npy";
  const std::string data(24, '\0');

  write_file(p, npy_bytes(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", data));
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)kvsift::read_npy(p); }),
             Catch::Contains("fortran_order True") && Catch::Contains("C-order"));

  write_file(p, npy_bytes(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", data));
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)kvsift::read_npy(p); }),
             Catch::Contains("big-endian dtype '>f4'") && Catch::Contains("'<f4' or '<f2'"));

  write_file(p, npy_bytes(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", data));
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)kvsift::read_npy(p); }),
             Catch::Contains("unsupported dtype '<f8'") && Catch::Contains("'<f4' or '<f2'"));

  write_file(p, npy_bytes(1, f4_dict("(1, 2, 3)"), data));
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)kvsift::read_npy(p); }),
             Catch::Contains("1-D or 2-D") && Catch::Contains("(1, 2, 3)"));

  write_file(p, npy_bytes(1, f4_dict("()"), data));
  CHECK_THROWS_AS(kvsift::read_npy(p), kvsift::io_error);
}

TEST_CASE("npy rejects malformed headers", "[io]") {
  temp_dir dir;
  const auto p = dir / "bad.npy";
  const std::string data(8, '\0');
  const auto msg_for = [&](const std::string& dict) {
    write_file(p, npy_bytes(1, dict, data));
    return message_of<kvsift::io_error>([&] { (void)kvsift::read_npy(p); });
  };
  CHECK_THAT(msg_for("{'descr': '<f4', 'shape': (2,), }"),
             Catch::Contains("missing key 'fortran_order'"));
  CHECK_THAT(msg_for("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}"),
             Catch::Contains("unexpected key 'x'"));
  CHECK_THAT(msg_for("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}"),
             Catch::Contains("duplicate key 'descr'"));
  CHECK_THAT(msg_for("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,)}"),
             Catch::Contains("expected True or False"));
  CHECK_THAT(msg_for("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -1)}"),
             Catch::Contains("expected a non-negative integer"));
  CHECK_THAT(msg_for("{'descr': '<f4', 'fortran_order': False, 'shape': (2,"),
             Catch::Contains("found end of header"));
  CHECK_THAT(msg_for("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} trailing"),
             Catch::Contains("expected end of header"));
  CHECK_THAT(msg_for("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}"),
             Catch::Contains("expected a dtype string"));
  CHECK_THAT(msg_for("{'descr': '<f4', 'fortran_order': False, "
                     "'shape': (99999999999999999999999, 1)}"),
             Catch::Contains("overflows"));
  CHECK_THAT(msg_for("{'descr': '<f4', 'fortran_order': False, "
                     "'shape': (4294967296, 4294967296)}"),
             Catch::Contains("overflows"));
}

TEST_CASE("npy with corrupted magic or unsupported version", "[io]") {
  temp_dir dir;
  const auto p = dir / "m.npy";
  const std::vector<float> v{1, 2};
  std::string bytes = npy_bytes(1, f4_dict("(2,)"), bytes_of(v));
  bytes[1] = 'X';
  write_file(p, bytes);
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)kvsift::read_npy(p); }),
             Catch::Contains("expected magic '\\x93NUMPY', got '\\x93XUMPY'"));

  bytes = npy_bytes(1, f4_dict("(2,)"), bytes_of(v));
  bytes[6] = 3;
  write_file(p, bytes);
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)kvsift::read_npy(p); }),
             Catch::Contains("version 3.0, expected 1.0 or 2.0"));
}

TEST_CASE("truncated npy is an io_error at every cut point", "[io]") {
  temp_dir dir;
  const auto p = dir / "t.npy";
  const std::vector<float> v{1, 2, 3, 4, 5, 6};
  const std::string full = npy_bytes(1, f4_dict("(2, 3)"), bytes_of(v));

  write_file(p, full.substr(0, full.size() - 4));
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)kvsift::read_npy(p); }),
             Catch::Contains("truncated") && Catch::Contains("needs 24 bytes of data, got 20"));

  // Every prefix, including ones that cut the magic, the length field and the header.
  for (std::size_t cut = 0; cut < full.size(); ++cut) {
    write_file(p, full.substr(0, cut));
    CHECK_THROWS_AS(kvsift::read_npy(p), kvsift::io_error);
  }

  write_file(p, full + "xx");
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)kvsift::read_npy(p); }),
             Catch::Contains("trailing data"));
}

TEST_CASE("read_vectors dispatches on the extension", "[io]") {
  temp_dir dir;
  const auto m = sample(2, 2);
  kvsift::write_npy(dir / "UPPER.NPY", m);
  check_equal(kvsift::read_vectors(dir / "UPPER.NPY"), m);

  write_file(dir / "v.txt", "1 2 3");
  const auto msg =
      message_of<kvsift::invalid_argument>([&] { (void)kvsift::read_vectors(dir / "v.txt"); });
  CHECK_THAT(msg, Catch::Contains("'.txt'") && Catch::Contains(".fbin") && Catch::Contains(".npy"));
  CHECK_THROWS_AS(kvsift::read_vectors(dir / "noext"), kvsift::invalid_argument);
}

// ---------------------------------------------------------------- atomic writes

TEST_CASE("failed writes leave no partial file", "[io]") {
  temp_dir dir;
  const auto m = sample(2, 2);

  // Parent directory missing: cannot even create the temporary.
  const auto missing = dir / "no_such_dir" / "v.fbin";
  CHECK_THAT(message_of<kvsift::io_error>([&] { kvsift::write_fbin(missing, m); }),
             Catch::Contains(missing.string()));
  CHECK_FALSE(fs::exists(missing));

  // Target is a directory: the rename fails and the temporary is cleaned up.
  fs::create_directories(dir / "occupied.npy" / "child");
  CHECK_THROWS_AS(kvsift::write_npy(dir / "occupied.npy", m), kvsift::io_error);
  CHECK_FALSE(fs::exists(dir / "occupied.npy.tmp"));

  // A writer that fails half-way leaves the previous file intact.
  const auto p = dir / "keep.fbin";
  kvsift::write_fbin(p, m);
  const std::string before = read_file(p);
  CHECK_THROWS_AS(kvsift::detail::atomic_write(p,
                                               [](std::ostream& out) {
                                                 out << "partial";
                                                 throw std::runtime_error("boom");
                                               }),
                  std::runtime_error);
  CHECK(read_file(p) == before);
  CHECK_FALSE(fs::exists(dir / "keep.fbin.tmp"));
}

// ---------------------------------------------------------------- binary_io primitives

TEST_CASE("fnv1a64 matches reference values and is incremental", "[io]") {
  kvsift::detail::fnv1a64 h;
  CHECK(h.value() == 0xcbf29ce484222325ull);
  h.update("a", 1);
  CHECK(h.value() == 0xaf63dc4c8601ec8cull);

  kvsift::detail::fnv1a64 whole, parts;
  const std::string s = "foobar";
  whole.update(s.data(), s.size());
  parts.update(s.data(), 2);
  parts.update(s.data() + 2, 0);
  parts.update(s.data() + 2, 4);
  CHECK(whole.value() == parts.value());
  CHECK(whole.value() == 0x85944171f73967e8ull);
}

TEST_CASE("binary_reader detects truncation before allocating", "[io]") {
  std::istringstream in(std::string("abc"));
  kvsift::detail::binary_reader r(in, 3);
  CHECK(r.remaining() == 3);
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)r.read_pod<std::uint32_t>("rows"); }),
             Catch::Contains("truncated rows: expected 4 more bytes, 3 remain"));
  CHECK(r.remaining() == 3);  // a failed read consumes nothing

  // A corrupted count of 2^60 floats must fail on the size check, not in the allocator.
  CHECK_THAT(
      message_of<kvsift::io_error>(
          [&] { (void)r.read_vector<float>(std::size_t{1} << 60, "vectors"); }),
      Catch::Contains("truncated vectors: expected 4611686018427387904 more bytes, 3 remain"));
  CHECK_THROWS_AS(r.read_vector<std::uint64_t>(std::numeric_limits<std::size_t>::max()),
                  kvsift::io_error);
  std::array<char, 4> buf{};
  CHECK_THROWS_AS(r.read_array(buf.data(), 4), kvsift::io_error);
  r.read_array(buf.data(), 3);
  CHECK(std::string(buf.data(), 3) == "abc");
  CHECK(r.remaining() == 0);
  CHECK_NOTHROW(r.require_end());

  // The stream is shorter than the size we were told: still an io_error, not garbage.
  std::istringstream short_in(std::string("ab"));
  kvsift::detail::binary_reader liar(short_in, 8);
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)liar.read_pod<std::uint32_t>(); }),
             Catch::Contains("truncated"));
}

TEST_CASE("binary writer and reader round trip with a checksum trailer", "[io]") {
  constexpr auto magic = kvsift::detail::make_magic("KVSGRAPH");
  std::ostringstream out;
  kvsift::detail::binary_writer w(out);
  kvsift::detail::file_header h{magic, 2, kvsift::element_type::f16, 3, 4};
  kvsift::detail::write_header(w, h);
  const std::vector<std::uint32_t> payload{7, 8, 9};
  w.write_pod(std::uint64_t{payload.size()});
  w.write_array(payload.data(), payload.size());
  w.write_checksum();
  const std::string file = out.str();
  CHECK(file.size() == 32 + 8 + 12 + 8);
  CHECK(w.bytes_written() == file.size());

  const auto read_all = [&](const std::string& bytes, std::uint32_t max_version) {
    std::istringstream in(bytes);
    kvsift::detail::binary_reader r(in, bytes.size());
    const auto rh = kvsift::detail::read_header(r, magic, max_version);
    const auto n = r.read_pod<std::uint64_t>("count");
    r.require_available(n, sizeof(std::uint32_t), "payload");
    auto ids = r.read_vector<std::uint32_t>(static_cast<std::size_t>(n), "payload");
    r.verify_checksum();
    r.require_end();
    return std::make_pair(rh, ids);
  };

  const auto [rh, ids] = read_all(file, 2);
  CHECK(rh.magic == magic);
  CHECK(rh.version == 2);
  CHECK(rh.type == kvsift::element_type::f16);
  CHECK(rh.rows == 3);
  CHECK(rh.dims == 4);
  CHECK(ids == payload);

  SECTION("a flipped payload bit fails the checksum") {
    std::string bad = file;
    bad[32 + 8 + 5] ^= 0x10;
    CHECK_THAT(message_of<kvsift::io_error>([&] { (void)read_all(bad, 2); }),
               Catch::Contains("checksum mismatch"));
  }
  SECTION("a wrong magic names both") {
    std::string bad = file;
    bad.replace(0, 8, "NOTGRAPH");
    CHECK_THAT(message_of<kvsift::io_error>([&] { (void)read_all(bad, 2); }),
               Catch::Contains("expected magic 'KVSGRAPH', got 'NOTGRAPH'"));
  }
  SECTION("a newer version is refused") {
    CHECK_THAT(message_of<kvsift::io_error>([&] { (void)read_all(file, 1); }),
               Catch::Contains("unsupported version 2, this build reads up to 1"));
  }
  SECTION("an unknown element type is refused") {
    std::string bad = file;
    bad[12] = 9;
    CHECK_THAT(message_of<kvsift::io_error>([&] { (void)read_all(bad, 2); }),
               Catch::Contains("unknown element type 9"));
  }
  SECTION("a truncated file is refused at every cut point") {
    for (std::size_t cut = 0; cut < file.size(); ++cut) {
      CHECK_THROWS_AS(read_all(file.substr(0, cut), 2), kvsift::io_error);
    }
  }
  SECTION("trailing bytes are refused") {
    CHECK_THAT(message_of<kvsift::io_error>([&] { (void)read_all(file + "x", 2); }),
               Catch::Contains("1 unread bytes remain"));
  }
}

TEST_CASE("read_header rejects a shape that overflows", "[io]") {
  constexpr auto magic = kvsift::detail::make_magic("KVSFLAT_");
  std::ostringstream out;
  kvsift::detail::binary_writer w(out);
  kvsift::detail::write_header(
      w, {magic, 1, kvsift::element_type::f32, std::uint64_t{1} << 40, std::uint64_t{1} << 40});
  std::istringstream in(out.str());
  kvsift::detail::binary_reader r(in, out.str().size());
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)kvsift::detail::read_header(r, magic, 1); }),
             Catch::Contains("overflows"));
}

// Regression: rows of dimension 0 need no payload, so a header of (2^32 - 1) x 0 or a shape
// of (2^64 - 1, 0) matched an empty data section and loaded as billions of phantom rows.
TEST_CASE("vector files with rows of dimension 0 are rejected", "[io][rel]") {
  temp_dir dir;
  const auto fb = dir / "zero.fbin";
  write_file(fb, fbin_bytes(0xffffffffu, 0, 0));
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)kvsift::read_fbin(fb); }),
             Catch::Contains("4294967295 x 0") && Catch::Contains("dimension > 0") &&
                 Catch::Contains(fb.string()));
  const auto ib = dir / "zero.ibin";
  write_file(ib, fbin_bytes(7, 0, 0));
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)kvsift::read_ibin(ib); }),
             Catch::Contains("7 x 0") && Catch::Contains("dimension > 0"));
  const auto np = dir / "zero.npy";
  write_file(np, npy_bytes(1, f4_dict("(18446744073709551615, 0)"), ""));
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)kvsift::read_npy(np); }),
             Catch::Contains("18446744073709551615") && Catch::Contains("dimension > 0"));
  write_file(np, npy_bytes(1, f4_dict("(0,)"), ""));
  CHECK_THAT(message_of<kvsift::io_error>([&] { (void)kvsift::read_npy(np); }),
             Catch::Contains("dimension > 0"));
  // The empty set stays valid: 0 rows, any dimension (0 included).
  write_file(fb, fbin_bytes(0, 0, 0));
  CHECK(kvsift::read_fbin(fb).rows() == 0);
  write_file(np, npy_bytes(1, f4_dict("(0, 0)"), ""));
  CHECK(kvsift::read_npy(np).rows() == 0);
  // The writers refuse what the readers would refuse.
  std::vector<float> buf(4);
  const kvsift::matrix_view<const float> flat(buf.data(), 3, 0);
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { kvsift::write_fbin(fb, flat); }),
             Catch::Contains("3 x 0"));
  CHECK_THAT(message_of<kvsift::invalid_argument>([&] { kvsift::write_npy(np, flat); }),
             Catch::Contains("3 x 0"));
}
