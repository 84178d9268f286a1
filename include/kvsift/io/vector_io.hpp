#pragma once
// Reading and writing vector sets in the two formats ANN benchmarks and Python tooling use:
//
//   .fbin / .ibin  uint32 n, uint32 d (little-endian), then n * d float32 / uint32 values
//                  (big-ann-benchmarks format).
//   .npy           NumPy format 1.0 / 2.0, C-order 1-D or 2-D arrays of '<f4' or '<f2'.
//
// Sizes read from a file are validated against the file's actual size before anything is
// allocated, so a corrupted or truncated file is an io_error and never undefined behaviour.
// Payloads are read with one bulk read straight into the result (no per-element I/O).
// Writes go to a temporary beside `path` and are renamed into place, so a failed write never leaves
// a partial file at `path`.

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <limits>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvsift/core/dense_matrix.hpp"
#include "kvsift/core/element.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/matrix_view.hpp"
#include "kvsift/io/detail/binary_io.hpp"
#include "kvsift/io/file_path.hpp"

namespace kvsift {

/// A row-major matrix of uint32 ids as stored in .ibin files (ground-truth neighbour lists).
/// A plain aggregate: `data.size() == rows * cols` is the invariant writers check.
struct id_matrix {
  std::vector<std::uint32_t> data;
  std::size_t rows = 0;
  std::size_t cols = 0;
};

namespace detail {

/// Reads exactly `bytes` bytes or throws; the caller has already checked them against the
/// file size, so a short read means the file changed underneath us or a device error.
inline void read_exact(std::istream& in, void* out, std::uint64_t bytes, const std::string& where,
                       const char* what) {
  if (bytes == 0) return;
  require<io_error>(
      bytes <= static_cast<std::uint64_t>(std::numeric_limits<std::streamsize>::max()), "'", where,
      "': ", what, " of ", bytes, " bytes is too large to read");
  in.read(static_cast<char*>(out), static_cast<std::streamsize>(bytes));
  const auto got = static_cast<std::uint64_t>(in.gcount());
  require<io_error>(got == bytes, "'", where, "': truncated ", what, ": expected ", bytes,
                    " bytes, got ", got, " bytes");
}

/// Writes `bytes` bytes or throws (disk full, closed stream).
inline void write_exact(std::ostream& out, const void* data, std::size_t bytes,
                        const std::string& where) {
  if (bytes == 0) return;
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  require<io_error>(static_cast<bool>(out), "'", where, "': write of ", bytes,
                    " bytes failed (disk full?)");
}

/// Writes the rows of `m` back to back; one write when the view is contiguous.
template <class T>
void write_rows(std::ostream& out, matrix_view<const T> m, const std::string& where) {
  if (m.contiguous()) {
    write_exact(out, m.data(), m.rows() * m.cols() * sizeof(T), where);
  } else {
    for (std::size_t i = 0; i < m.rows(); ++i) {
      write_exact(out, m.row(i), m.cols() * sizeof(T), where);
    }
  }
}

/// Payload of a .fbin / .ibin file.
template <class T>
struct bin_contents {
  std::vector<T> data;
  std::size_t rows = 0;
  std::size_t cols = 0;
};

/// Reads a big-ann-benchmarks binary file whose payload is n * d values of T.
template <class T>
bin_contents<T> read_bin_file(const file_path& path, const char* format) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) == 4);
  input_file f = open_input_file(path);
  const std::string where = path.string();
  constexpr std::uint64_t header_bytes = 2 * sizeof(std::uint32_t);
  require<io_error>(f.size >= header_bytes, "'", where, "': not a ", format, " file: expected ",
                    header_bytes, " bytes of header (n, d), got ", f.size, " bytes");
  std::uint32_t header[2];
  read_exact(f.stream, header, header_bytes, where, "header");
  const std::uint64_t n = header[0];
  const std::uint64_t d = header[1];
  // n rows of dimension 0 need no payload, so any n matched the 8-byte file and loaded as
  // billions of phantom rows. An empty set is 0 x d (d may be 0).
  require<io_error>(n == 0 || d > 0, "'", where, "': ", format, " header says ", n, " x ", d,
                    ": a non-empty set needs a dimension > 0");
  const std::uint64_t count = n * d;  // both < 2^32: cannot overflow
  // count * 4 can overflow 64 bits for a garbage header; such a header cannot match any file.
  require<io_error>(count <= (std::numeric_limits<std::uint64_t>::max() - header_bytes) / sizeof(T),
                    "'", where, "': corrupted ", format, " header: ", n, " x ", d,
                    " values overflow a 64-bit byte count");
  const std::uint64_t expected = header_bytes + count * sizeof(T);
  require<io_error>(f.size == expected, "'", where, "': ", format, " header says ", n, " x ", d,
                    ", so expected ", expected, " bytes in the file, got ", f.size, " bytes");
  require<io_error>(count <= std::numeric_limits<std::size_t>::max() / sizeof(T), "'", where,
                    "': ", n, " x ", d, " values do not fit in memory on this platform");
  bin_contents<T> out;
  out.data.resize(static_cast<std::size_t>(count));
  read_exact(f.stream, out.data.data(), count * sizeof(T), where, "payload");
  out.rows = static_cast<std::size_t>(n);
  out.cols = static_cast<std::size_t>(d);
  return out;
}

/// Writes the (n, d) header of a .fbin / .ibin file, checking both fit in uint32.
inline void write_bin_header(std::ostream& out, std::size_t rows, std::size_t cols,
                             const char* format, const std::string& where) {
  constexpr std::size_t max = std::numeric_limits<std::uint32_t>::max();
  require(rows <= max && cols <= max, format, " stores uint32 sizes (at most ", max, "), got ",
          rows, " x ", cols, " for '", where, "'");
  require(rows == 0 || cols > 0, format, ": expected a dimension > 0 for ", rows, " rows, got ",
          rows, " x ", cols, " for '", where, "'");
  const std::uint32_t header[2] = {static_cast<std::uint32_t>(rows),
                                   static_cast<std::uint32_t>(cols)};
  write_exact(out, header, sizeof(header), where);
}

/// Parsed `.npy` header dictionary.
struct npy_header {
  std::string descr;
  bool fortran_order = false;
  std::vector<std::uint64_t> shape;
};

/// Parser for the Python dict literal in a .npy header, e.g.
///   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
/// Accepts exactly what np.save writes (keys in any order, either quote style, optional
/// trailing commas, whitespace); anything else is reported with what was expected and found.
class npy_header_parser {
 public:
  npy_header_parser(std::string_view text, const std::string& where) : s_(text), where_(where) {}

  npy_header parse() {
    npy_header h;
    bool seen_descr = false, seen_order = false, seen_shape = false;
    skip_ws();
    expect('{', "'{' opening the header dictionary");
    skip_ws();
    while (!at('}')) {
      const std::string key = parse_string("a quoted key");
      skip_ws();
      expect(':', "':' after key");
      skip_ws();
      if (key == "descr") {
        require_unseen(seen_descr, key);
        h.descr = parse_string("a dtype string such as '<f4' for 'descr'");
      } else if (key == "fortran_order") {
        require_unseen(seen_order, key);
        h.fortran_order = parse_bool();
      } else if (key == "shape") {
        require_unseen(seen_shape, key);
        h.shape = parse_shape();
      } else {
        fail<io_error>(prefix(), "unexpected key '", printable_bytes(key),
                       "', expected only 'descr', 'fortran_order' and 'shape'");
      }
      skip_ws();
      if (at(',')) {
        ++pos_;
        skip_ws();
      } else if (!at('}')) {
        fail_expected("',' or '}' after a value");
      }
    }
    ++pos_;  // '}'
    skip_ws();
    if (pos_ != s_.size()) fail_expected("end of header after '}'");
    require<io_error>(seen_descr, prefix(), "missing key 'descr'");
    require<io_error>(seen_order, prefix(), "missing key 'fortran_order'");
    require<io_error>(seen_shape, prefix(), "missing key 'shape'");
    return h;
  }

 private:
  [[nodiscard]] std::string prefix() const {
    return concat("'", where_, "': malformed .npy header: ");
  }

  [[noreturn]] void fail_expected(const char* expected) const {
    const std::string_view rest = s_.substr(std::min(pos_, s_.size()));
    if (rest.empty()) fail<io_error>(prefix(), "expected ", expected, ", found end of header");
    fail<io_error>(prefix(), "expected ", expected, ", found '",
                   printable_bytes(rest.substr(0, 16)), "' at offset ", pos_);
  }

  void require_unseen(bool& seen, const std::string& key) const {
    require<io_error>(!seen, prefix(), "duplicate key '", key, "'");
    seen = true;
  }

  [[nodiscard]] bool at(char c) const noexcept { return pos_ < s_.size() && s_[pos_] == c; }

  void skip_ws() noexcept {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }

  void expect(char c, const char* expected) {
    if (!at(c)) fail_expected(expected);
    ++pos_;
  }

  std::string parse_string(const char* expected) {
    if (!at('\'') && !at('"')) fail_expected(expected);
    const char quote = s_[pos_++];
    const std::size_t end = s_.find(quote, pos_);
    if (end == std::string_view::npos) fail_expected("a closing quote");
    std::string out(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return out;
  }

  bool parse_bool() {
    using namespace std::string_view_literals;
    if (s_.substr(pos_).starts_with("True"sv)) {
      pos_ += 4;
      return true;
    }
    if (s_.substr(pos_).starts_with("False"sv)) {
      pos_ += 5;
      return false;
    }
    fail_expected("True or False for 'fortran_order'");
  }

  std::vector<std::uint64_t> parse_shape() {
    expect('(', "a tuple such as (3, 4) for 'shape'");
    std::vector<std::uint64_t> shape;
    skip_ws();
    while (!at(')')) {
      // More dimensions than any array we accept means a garbage header; stop early.
      require<io_error>(shape.size() < 32, prefix(), "shape has more than 32 dimensions");
      shape.push_back(parse_uint());
      skip_ws();
      if (at(',')) {
        ++pos_;
        skip_ws();
      } else if (!at(')')) {
        fail_expected("',' or ')' in 'shape'");
      }
    }
    ++pos_;  // ')'
    return shape;
  }

  std::uint64_t parse_uint() {
    const auto is_digit = [&] { return pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; };
    if (!is_digit()) fail_expected("a non-negative integer in 'shape'");
    std::uint64_t v = 0;
    while (is_digit()) {
      const auto digit = static_cast<std::uint64_t>(s_[pos_] - '0');
      require<io_error>(v <= (std::numeric_limits<std::uint64_t>::max() - digit) / 10, prefix(),
                        "a dimension in 'shape' overflows 64 bits");
      v = v * 10 + digit;
      ++pos_;
    }
    return v;
  }

  std::string_view s_;
  const std::string& where_;
  std::size_t pos_ = 0;
};

inline constexpr std::string_view npy_magic{"\x93NUMPY", 6};
// np.load's default limit is 10000 bytes; be generous but keep a corrupted length from
// making us read (and parse) an arbitrarily large "header".
inline constexpr std::uint64_t npy_max_header_bytes = 1u << 20;

inline std::string shape_string(const std::vector<std::uint64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    s += std::to_string(shape[i]);
    s += (shape.size() == 1 || i + 1 < shape.size()) ? "," : "";
    if (i + 1 < shape.size()) s += " ";
  }
  return s + ")";
}

}  // namespace detail

/// Reads a .fbin file (uint32 n, uint32 d, n * d float32, little-endian) into an n x d matrix.
/// Complexity: O(file size), one bulk read. Thread safety: safe to call concurrently (for a
/// file nobody is writing).
/// @throw io_error naming the path if the file is missing or unreadable, smaller than its
///        8-byte header, or its size differs from 8 + 4 * n * d ("expected N bytes in the
///        file, got M bytes"), the header's sizes overflow, or it states n > 0 rows of
///        dimension 0 (which would need no payload: phantom rows).
inline dense_matrix<float> read_fbin(const file_path& path) {
  auto c = detail::read_bin_file<float>(path, ".fbin");
  return dense_matrix<float>(c.rows, c.cols, std::move(c.data));
}

/// Writes `m` as .fbin, atomically replacing `path` (see detail::atomic_write).
/// Complexity: O(rows * cols). Thread safety: concurrent writes to distinct paths are safe.
/// @throw invalid_argument if rows or cols exceed uint32, or rows > 0 have dimension 0 (the
///        readers refuse such files); io_error naming the path if the
///        file cannot be written (then `path` is left unchanged).
inline void write_fbin(const file_path& path, matrix_view<const float> m) {
  const std::string where = path.string();
  detail::atomic_write(path, [&](std::ostream& out) {
    detail::write_bin_header(out, m.rows(), m.cols(), ".fbin", where);
    detail::write_rows(out, m, where);
  });
}

/// Reads a .ibin file (uint32 n, uint32 d, n * d uint32 ids). Same format checks, complexity
/// and thread safety as read_fbin.
/// @throw io_error as read_fbin.
inline id_matrix read_ibin(const file_path& path) {
  auto c = detail::read_bin_file<std::uint32_t>(path, ".ibin");
  return id_matrix{std::move(c.data), c.rows, c.cols};
}

/// Writes `ids` as .ibin, atomically replacing `path`.
/// Complexity: O(rows * cols). Thread safety: concurrent writes to distinct paths are safe.
/// @throw dimension_mismatch if ids.data.size() != ids.rows * ids.cols; invalid_argument if
///        rows or cols exceed uint32; io_error naming the path if the file cannot be written.
inline void write_ibin(const file_path& path, const id_matrix& ids) {
  const std::size_t expected = detail::checked_element_count(ids.rows, ids.cols, "write_ibin");
  detail::require<dimension_mismatch>(ids.data.size() == expected, "write_ibin: expected ",
                                      ids.rows, " x ", ids.cols, " = ", expected, " ids, got ",
                                      ids.data.size());
  const std::string where = path.string();
  detail::atomic_write(path, [&](std::ostream& out) {
    detail::write_bin_header(out, ids.rows, ids.cols, ".ibin", where);
    detail::write_exact(out, ids.data.data(), ids.data.size() * sizeof(std::uint32_t), where);
  });
}

/// Reads a .npy file (format 1.0 or 2.0) holding a C-order 2-D array, or a 1-D array read as
/// a single row, of dtype '<f4' or '<f2' ('<f2' is converted to float exactly).
/// Complexity: O(file size); '<f4' is one bulk read, '<f2' is read in 1 MiB chunks and
/// converted. Thread safety: safe to call concurrently (for a file nobody is writing).
/// @throw io_error naming the path and what was expected and found, for: a missing or
///        unreadable file, a bad magic, an unsupported format version, a malformed header,
///        fortran_order True, a big-endian or unsupported dtype, an array that is not 1-D or
///        2-D, rows of dimension 0 (shape (n, 0) with n > 0, or (0,)), or a data section
///        shorter (truncated) or longer than the shape requires.
inline dense_matrix<float> read_npy(const file_path& path) {
  detail::input_file f = detail::open_input_file(path);
  const std::string where = path.string();

  constexpr std::uint64_t preamble = 8;  // magic (6) + major + minor
  detail::require<io_error>(f.size >= preamble + 2, "'", where,
                            "': truncated .npy file: expected at least 10 bytes, got ", f.size,
                            " bytes");
  char pre[preamble];
  detail::read_exact(f.stream, pre, preamble, where, "preamble");
  const std::string_view magic(pre, 6);
  detail::require<io_error>(magic == detail::npy_magic, "'", where,
                            "': not a .npy file: expected magic '\\x93NUMPY', got '",
                            detail::printable_bytes(magic), "'");
  const int major = static_cast<unsigned char>(pre[6]);
  const int minor = static_cast<unsigned char>(pre[7]);
  detail::require<io_error>((major == 1 || major == 2) && minor == 0, "'", where,
                            "': unsupported .npy format version ", major, ".", minor,
                            ", expected 1.0 or 2.0");

  // Version 1.0 stores the header length as uint16, 2.0 as uint32 (both little-endian).
  const std::uint64_t len_bytes = major == 1 ? 2 : 4;
  detail::require<io_error>(f.size >= preamble + len_bytes, "'", where,
                            "': truncated .npy file: expected ", preamble + len_bytes,
                            " bytes of preamble, got ", f.size, " bytes");
  unsigned char len_buf[4] = {};
  detail::read_exact(f.stream, len_buf, len_bytes, where, "header length");
  std::uint64_t header_len = 0;
  for (std::uint64_t i = len_bytes; i-- > 0;) header_len = (header_len << 8) | len_buf[i];
  const std::uint64_t after_len = f.size - preamble - len_bytes;
  detail::require<io_error>(header_len <= after_len, "'", where,
                            "': truncated .npy file: header length is ", header_len,
                            " bytes, but only ", after_len, " bytes follow");
  detail::require<io_error>(header_len <= detail::npy_max_header_bytes, "'", where,
                            "': .npy header length ", header_len, " exceeds the limit of ",
                            detail::npy_max_header_bytes, " bytes");
  std::string text(static_cast<std::size_t>(header_len), '\0');
  detail::read_exact(f.stream, text.data(), header_len, where, "header");
  const detail::npy_header h = detail::npy_header_parser(text, where).parse();

  const bool is_f2 = h.descr == "<f2";
  if (!is_f2 && h.descr != "<f4") {
    if (!h.descr.empty() && h.descr.front() == '>') {
      detail::fail<io_error>("'", where, "': big-endian dtype '", detail::printable_bytes(h.descr),
                             "' is not supported, expected little-endian '<f4' or '<f2'");
    }
    detail::fail<io_error>("'", where, "': unsupported dtype '", detail::printable_bytes(h.descr),
                           "', expected '<f4' or '<f2'");
  }
  detail::require<io_error>(!h.fortran_order, "'", where,
                            "': fortran_order True is not supported, expected a C-order array "
                            "(save np.ascontiguousarray(a))");
  detail::require<io_error>(h.shape.size() == 1 || h.shape.size() == 2, "'", where,
                            "': expected a 1-D or 2-D array, got shape ",
                            detail::shape_string(h.shape));

  const std::uint64_t rows = h.shape.size() == 1 ? 1 : h.shape[0];
  const std::uint64_t cols = h.shape.back();
  // As for .fbin: rows of dimension 0 carry no data, so (2^64 - 1, 0) matched an empty payload.
  // A 2-D array with 0 rows is the empty set; a 1-D array of 0 elements is one 0-dim vector and
  // is rejected like any other.
  detail::require<io_error>(rows == 0 || cols > 0, "'", where, "': shape ",
                            detail::shape_string(h.shape),
                            " holds rows of dimension 0; a non-empty set needs a dimension > 0");
  const std::uint64_t elem = is_f2 ? 2 : 4;
  const std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  detail::require<io_error>(cols == 0 || rows <= max / cols / elem, "'", where, "': shape ",
                            detail::shape_string(h.shape), " overflows a 64-bit byte count");
  const std::uint64_t count = rows * cols;
  const std::uint64_t data_bytes = count * elem;
  const std::uint64_t available = after_len - header_len;
  detail::require<io_error>(available >= data_bytes, "'", where, "': truncated .npy file: shape ",
                            detail::shape_string(h.shape), " of '", h.descr, "' needs ", data_bytes,
                            " bytes of data, got ", available, " bytes");
  detail::require<io_error>(available == data_bytes, "'", where, "': .npy shape ",
                            detail::shape_string(h.shape), " of '", h.descr, "' needs ", data_bytes,
                            " bytes of data, got ", available, " bytes (trailing data)");
  detail::require<io_error>(data_bytes <= std::numeric_limits<std::size_t>::max(), "'", where,
                            "': ", data_bytes, " bytes do not fit in memory on this platform");

  dense_matrix<float> out(static_cast<std::size_t>(rows), static_cast<std::size_t>(cols));
  if (!is_f2) {
    detail::read_exact(f.stream, out.data(), data_bytes, where, "data");
  } else {
    // Chunked so the f16 staging buffer stays small next to a result of hundreds of MB.
    constexpr std::size_t chunk = std::size_t{1} << 19;  // halves (1 MiB)
    std::vector<half> buf(std::min<std::size_t>(chunk, static_cast<std::size_t>(count)));
    float* dst = out.data();
    for (std::size_t done = 0; done < count;) {
      const std::size_t n =
          std::min<std::size_t>(buf.size(), static_cast<std::size_t>(count) - done);
      detail::read_exact(f.stream, buf.data(), n * sizeof(half), where, "data");
      for (std::size_t i = 0; i < n; ++i) dst[done + i] = to_float(buf[i]);
      done += n;
    }
  }
  return out;
}

/// Writes `m` as a .npy file (format 1.0, dtype '<f4', C order, shape (rows, cols)),
/// atomically replacing `path`. np.load reads it back as a float32 2-D array.
/// Complexity: O(rows * cols). Thread safety: concurrent writes to distinct paths are safe.
/// @throw invalid_argument if rows > 0 have dimension 0 (read_npy refuses them); io_error
///        naming the path if the file cannot be written (then `path` is unchanged).
inline void write_npy(const file_path& path, matrix_view<const float> m) {
  const std::string where = path.string();
  require_vector_dim(m.rows(), m.cols(), "write_npy");
  std::string header = detail::concat("{'descr': '<f4', 'fortran_order': False, 'shape': (",
                                      m.rows(), ", ", m.cols(), "), }");
  // NumPy pads the header with spaces so the data starts 64-byte aligned, and ends it in '\n'.
  constexpr std::size_t preamble = 10;  // magic, version, uint16 header length
  const std::size_t unpadded = preamble + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  const auto len = static_cast<std::uint16_t>(header.size());  // < 200 bytes for 2 dims
  // Magic, version 1.0, then the header length as little-endian uint16.
  std::string pre(detail::npy_magic);
  pre += {'\x01', '\x00', static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  detail::atomic_write(path, [&](std::ostream& out) {
    detail::write_exact(out, pre.data(), pre.size(), where);
    detail::write_exact(out, header.data(), header.size(), where);
    detail::write_rows(out, m, where);
  });
}

/// Reads a vector set, choosing the format from the extension (case-insensitive): .fbin
/// (read_fbin) or .npy (read_npy).
/// Complexity, thread safety: those of the reader chosen.
/// @throw invalid_argument naming the extension and the supported ones for any other
///        extension; io_error from the reader.
inline dense_matrix<float> read_vectors(const file_path& path) {
  std::string ext = path.extension();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".fbin") return read_fbin(path);
  if (ext == ".npy") return read_npy(path);
  detail::fail("read_vectors: unsupported extension '", ext.empty() ? "(none)" : ext, "' of '",
               path.string(), "', expected .fbin or .npy");
}

}  // namespace kvsift
