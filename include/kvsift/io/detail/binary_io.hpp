#pragma once
// Primitives for kvsift's binary file formats: a running checksum, checked readers and
// writers, the common file header, and the open/atomic-replace plumbing.
//
// Index files have the layout
//     file_header | payload | uint64 fnv1a64 of every byte before it
// A reader never trusts a size it read from the file: every read is checked against the
// bytes that actually remain *before* anything is allocated, so a truncated or corrupted file
// is an io_error, never undefined behaviour or a multi-gigabyte allocation.

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <ios>
#include <istream>
#include <limits>
#include <ostream>
#include <streambuf>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvsift/core/detail/threads.hpp"
#include "kvsift/core/element.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/io/file_path.hpp"

namespace kvsift::detail {

// Files are little-endian and are read and written by copying memory. Every platform kvsift
// targets (x86-64, AArch64, CUDA hosts) is little-endian; a big-endian port would need byte
// swaps here and in vector_io, so refuse to compile rather than silently misread files.
static_assert(std::endian::native == std::endian::little,
              "kvsift file I/O assumes a little-endian host");

/// Types that may be copied to and from a file byte for byte: trivially copyable, every bit
/// pattern read back is a valid value (so no bool, no pointers) and no padding bytes on the
/// write side (arithmetic, enums, or types with unique object representations such as
/// std::array<char, N>, half, bfloat16).
template <class T>
concept BinaryPod =
    std::is_trivially_copyable_v<T> && !std::is_same_v<std::remove_cv_t<T>, bool> &&
    !std::is_pointer_v<T> && !std::is_member_pointer_v<T> &&
    (std::is_arithmetic_v<T> || std::is_enum_v<T> || std::has_unique_object_representations_v<T>);

/// Renders bytes from a file for an error message: printable ASCII as is, the rest as \xNN,
/// so a corrupted header cannot inject control characters into logs.
inline std::string printable_bytes(std::string_view bytes) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size());
  for (const char ch : bytes) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 0xf]);
    }
  }
  return out;
}

/// 64-bit FNV-1a over a byte stream, updated incrementally. Detects accidental corruption
/// (truncation, bit flips, a file overwritten mid-way); it is not a cryptographic hash.
/// Thread safety: none (plain value type); distinct objects are independent.
struct fnv1a64 {
  static constexpr std::uint64_t offset_basis = 14695981039346656037ull;
  static constexpr std::uint64_t prime = 1099511628211ull;

  std::uint64_t state = offset_basis;

  /// Folds `size` bytes at `data` into the checksum. O(size), noexcept.
  void update(const void* data, std::size_t size) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    std::uint64_t h = state;
    for (std::size_t i = 0; i < size; ++i) {
      h ^= p[i];
      h *= prime;
    }
    state = h;
  }

  /// Checksum of every byte passed to update() so far. O(1), noexcept.
  [[nodiscard]] std::uint64_t value() const noexcept { return state; }
};

/// Writes PODs to a std::ostream while checksumming every byte written.
/// Thread safety: none; one writer per stream.
class binary_writer {
 public:
  /// The stream must outlive the writer and be opened in binary mode.
  explicit binary_writer(std::ostream& out) noexcept : out_(&out) {}

  /// Writes the bytes of `value`. O(sizeof(T)).
  /// @throw io_error if the stream fails.
  template <BinaryPod T>
  void write_pod(const T& value) {
    write_bytes(&value, sizeof(T), "value");
  }

  /// Writes `count` elements starting at `data` (may be null when count == 0). O(count).
  /// @throw io_error if the stream fails or count * sizeof(T) overflows.
  template <BinaryPod T>
  void write_array(const T* data, std::size_t count) {
    require<io_error>(count <= std::numeric_limits<std::size_t>::max() / sizeof(T),
                      "binary_writer: array of ", count, " elements of ", sizeof(T),
                      " bytes overflows size_t");
    write_bytes(data, count * sizeof(T), "array");
  }

  /// Appends the checksum of everything written so far (the trailer of an index file).
  /// The trailer itself is then folded into checksum(), which is harmless: nothing follows.
  /// O(1). @throw io_error if the stream fails.
  void write_checksum() {
    const std::uint64_t sum = checksum_.value();
    write_pod(sum);
  }

  /// Bytes written so far and their checksum. O(1), noexcept.
  [[nodiscard]] std::uint64_t bytes_written() const noexcept { return written_; }
  [[nodiscard]] std::uint64_t checksum() const noexcept { return checksum_.value(); }

 private:
  void write_bytes(const void* data, std::size_t size, const char* what) {
    if (size == 0) return;
    require<io_error>(
        size <= static_cast<std::uint64_t>(std::numeric_limits<std::streamsize>::max()),
        "binary_writer: ", what, " of ", size, " bytes is too large for a stream");
    out_->write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
    require<io_error>(static_cast<bool>(*out_), "binary_writer: write of ", size,
                      " bytes failed after ", written_, " bytes (disk full or stream closed?)");
    checksum_.update(data, size);
    written_ += size;
  }

  std::ostream* out_;
  fnv1a64 checksum_;
  std::uint64_t written_ = 0;
};

/// Reads PODs from a std::istream holding a known number of bytes, checksumming every byte
/// read. Each read is checked against remaining() before any buffer is allocated or filled.
/// Thread safety: none; one reader per stream.
class binary_reader {
 public:
  /// `size` is the number of bytes readable from the stream's current position (for a file:
  /// its size, see open_input_file). The stream must outlive the reader.
  binary_reader(std::istream& in, std::uint64_t size) noexcept : in_(&in), size_(size) {}

  /// Reads one T. O(sizeof(T)).
  /// @throw io_error "truncated ..." if fewer than sizeof(T) bytes remain.
  template <BinaryPod T>
  [[nodiscard]] T read_pod(const char* what = "value") {
    T value;
    read_bytes(&value, 1, sizeof(T), what);
    return value;
  }

  /// Reads `count` elements into `out` (which must have room for them). O(count).
  /// @throw io_error "truncated ..." if fewer than count * sizeof(T) bytes remain; nothing is
  ///        read in that case.
  template <BinaryPod T>
  void read_array(T* out, std::size_t count, const char* what = "array") {
    read_bytes(out, count, sizeof(T), what);
  }

  /// Reads `count` elements into a new vector, checking remaining() *before* allocating, so a
  /// corrupted count cannot trigger a huge allocation. O(count).
  /// @throw io_error "truncated ..." if fewer than count * sizeof(T) bytes remain.
  template <BinaryPod T>
  [[nodiscard]] std::vector<T> read_vector(std::size_t count, const char* what = "array") {
    require_available(count, sizeof(T), what);
    std::vector<T> out(count);
    read_bytes(out.data(), count, sizeof(T), what);
    return out;
  }

  /// Throws unless `count` elements of `elem_size` bytes remain. Lets a format validate a
  /// size field right after reading it. O(1).
  /// @throw io_error "truncated <what>: expected N more bytes, M remain".
  void require_available(std::uint64_t count, std::size_t elem_size, const char* what) const {
    const std::uint64_t rem = remaining();
    if (elem_size != 0 && count > rem / elem_size) [[unlikely]] {
      // count * elem_size may not fit in 64 bits; report it without overflowing.
      if (count > std::numeric_limits<std::uint64_t>::max() / elem_size) {
        fail<io_error>("truncated ", what, ": expected ", count, " x ", elem_size, " more bytes, ",
                       rem, " remain");
      }
      fail<io_error>("truncated ", what, ": expected ", count * elem_size, " more bytes, ", rem,
                     " remain");
    }
  }

  /// Reads the stored trailer and compares it with the checksum of every byte read before
  /// it. O(1).
  /// @throw io_error on truncation or mismatch.
  void verify_checksum() {
    const std::uint64_t computed = checksum_.value();
    const auto stored = read_pod<std::uint64_t>("checksum");
    require<io_error>(stored == computed, "checksum mismatch: the file stores 0x", hex{stored},
                      ", its contents hash to 0x", hex{computed}, "; the file is corrupted");
  }

  /// Throws unless every byte has been consumed, so trailing garbage is not ignored. O(1).
  /// @throw io_error naming the number of unread bytes.
  void require_end(const char* what = "file") const {
    require<io_error>(remaining() == 0, what, ": expected end of data, ", remaining(),
                      " unread bytes remain");
  }

  /// Bytes not yet read, bytes read, and the checksum of the bytes read. O(1), noexcept.
  [[nodiscard]] std::uint64_t remaining() const noexcept { return size_ - consumed_; }
  [[nodiscard]] std::uint64_t bytes_read() const noexcept { return consumed_; }
  [[nodiscard]] std::uint64_t checksum() const noexcept { return checksum_.value(); }

 private:
  void read_bytes(void* out, std::size_t count, std::size_t elem_size, const char* what) {
    require_available(count, elem_size, what);
    const std::size_t bytes = count * elem_size;  // cannot overflow: bounded by remaining()
    if (bytes == 0) return;
    in_->read(static_cast<char*>(out), static_cast<std::streamsize>(bytes));
    const auto got = static_cast<std::uint64_t>(in_->gcount());
    // The stream ended before the size we were promised (file shrank, size was wrong).
    require<io_error>(got == bytes, "truncated ", what, ": expected ", bytes,
                      " more bytes, the stream ended after ", got);
    checksum_.update(out, bytes);
    consumed_ += bytes;
  }

  std::istream* in_;
  std::uint64_t size_;
  std::uint64_t consumed_ = 0;
  fnv1a64 checksum_;
};

/// Common header of kvsift index files; written field by field, 32 bytes, little-endian.
struct file_header {
  std::array<char, 8> magic{};  ///< identifies the file kind, e.g. "KVSGRAPH"
  std::uint32_t version = 0;    ///< format version, starting at 1
  element_type type = element_type::f32;
  std::uint64_t rows = 0;
  std::uint64_t dims = 0;
};

/// Builds a magic from an 8-character string literal; the array reference makes a literal of
/// the wrong length a compile error.
consteval std::array<char, 8> make_magic(const char (&s)[9]) {
  std::array<char, 8> m{};
  for (std::size_t i = 0; i < 8; ++i) m[i] = s[i];
  return m;
}

/// Writes `h` through `w` (so it is covered by the checksum). O(1).
/// @throw io_error if the stream fails.
inline void write_header(binary_writer& w, const file_header& h) {
  w.write_pod(h.magic);
  w.write_pod(h.version);
  w.write_pod(h.type);
  w.write_pod(h.rows);
  w.write_pod(h.dims);
}

/// Reads a header and validates it: magic, 1 <= version <= max_version, a known element
/// type, and rows * dims that fits in 64 bits. Sizes are not checked against the file here;
/// the payload reads do that before allocating. O(1).
/// @throw io_error "expected magic 'X', got 'Y'", "unsupported version V, this build reads up
///        to W", unknown element type, overflowing shape, or truncation.
inline file_header read_header(binary_reader& r, const std::array<char, 8>& expected_magic,
                               std::uint32_t max_version) {
  file_header h;
  h.magic = r.read_pod<std::array<char, 8>>("header magic");
  require<io_error>(h.magic == expected_magic, "expected magic '",
                    printable_bytes({expected_magic.data(), expected_magic.size()}), "', got '",
                    printable_bytes({h.magic.data(), h.magic.size()}), "'");
  h.version = r.read_pod<std::uint32_t>("header version");
  require<io_error>(h.version >= 1 && h.version <= max_version, "unsupported version ", h.version,
                    ", this build reads up to ", max_version);
  const auto type = r.read_pod<std::uint32_t>("header element type");
  require<io_error>(type <= static_cast<std::uint32_t>(element_type::bf16), "unknown element type ",
                    type, ", expected 0 (f32), 1 (f16) or 2 (bf16)");
  h.type = static_cast<element_type>(type);
  h.rows = r.read_pod<std::uint64_t>("header rows");
  h.dims = r.read_pod<std::uint64_t>("header dims");
  require<io_error>(h.dims == 0 || h.rows <= std::numeric_limits<std::uint64_t>::max() / h.dims,
                    "corrupted header: ", h.rows, " rows x ", h.dims, " dims overflows");
  return h;
}

/// An open input file and its size in bytes.
struct input_file {
  std::ifstream stream;
  std::uint64_t size = 0;
};

/// Opens a regular file for binary reading. O(1) system calls.
/// @throw io_error naming the path if it does not exist, is not a regular file, or cannot be
///        opened.
inline input_file open_input_file(const file_path& path) {
  struct ::stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    fail<io_error>("cannot open '", path.string(), "': ",
                   e == ENOENT ? std::string("no such file") : std::generic_category().message(e));
  }
  require<io_error>(S_ISREG(st.st_mode), "cannot open '", path.string(), "': not a regular file");
  input_file f;
  f.stream.open(path.c_str(), std::ios::binary);
  require<io_error>(f.stream.is_open(), "cannot open '", path.string(), "' for reading");
  // Size from the open handle rather than the path, so it describes the file we read.
  f.stream.seekg(0, std::ios::end);
  const std::streamoff end = f.stream.tellg();
  require<io_error>(end >= 0, "cannot determine the size of '", path.string(), "'");
  f.stream.seekg(0, std::ios::beg);
  require<io_error>(static_cast<bool>(f.stream), "cannot seek in '", path.string(), "'");
  f.size = static_cast<std::uint64_t>(end);
  return f;
}

/// std::streambuf over a POSIX file descriptor (not owned), so atomic_write writes the very
/// file it created exclusively instead of reopening it by name. Thread safety: none.
class fd_streambuf : public std::streambuf {
 public:
  explicit fd_streambuf(int fd) : fd_(fd) { setp(buf_.data(), buf_.data() + buf_.size()); }
  fd_streambuf(const fd_streambuf&) = delete;
  fd_streambuf& operator=(const fd_streambuf&) = delete;
  /// errno of the first failed write, 0 if none.
  [[nodiscard]] int error() const noexcept { return error_; }

 protected:
  int_type overflow(int_type ch) override {
    if (!drain()) return traits_type::eof();
    if (!traits_type::eq_int_type(ch, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(ch);
      pbump(1);
    }
    return traits_type::not_eof(ch);
  }
  int sync() override { return drain() ? 0 : -1; }

 private:
  bool drain() {
    const char* p = pbase();
    std::size_t left = static_cast<std::size_t>(pptr() - pbase());
    while (left > 0 && error_ == 0) {
      const ::ssize_t w = ::write(fd_, p, left);
      if (w < 0) {
        if (errno != EINTR) error_ = errno;
        continue;
      }
      p += w;
      left -= static_cast<std::size_t>(w);
    }
    setp(buf_.data(), buf_.data() + buf_.size());
    return error_ == 0;
  }

  int fd_;
  int error_ = 0;
  std::array<char, 1 << 16> buf_{};
};

/// What an existing non-regular file is, for an error message.
inline const char* file_kind(mode_t mode) noexcept {
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

/// 64 bits for a temporary's name: the clock, a process-wide counter and an address, mixed
/// (splitmix64). They need not be secret: O_EXCL | O_NOFOLLOW already refuse a planted file,
/// and a collision only costs another attempt. (std::random_device would need <random>.)
inline std::uint64_t temporary_name_bits() noexcept {
  static relaxed_counter counter;
  ::timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  std::uint64_t x = static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull +
                    static_cast<std::uint64_t>(ts.tv_nsec);
  x ^= std::uint64_t{counter.fetch_add(1)} * 0x9e3779b97f4a7c15ull;
  x ^= reinterpret_cast<std::uintptr_t>(&ts);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Replaces `path` atomically: `write(std::ostream&)` fills a new temporary in the target's
/// directory, named `.<name>.tmp.<pid>.<random>` and created with O_CREAT | O_EXCL (so a
/// symlink or file planted at a predictable name is never followed or reused), which is
/// fsynced and renamed over `path`; the directory is then fsynced so the rename survives a
/// power loss. Readers see the old file or the complete new one. If `path` exists it must be
/// a regular file (checked with lstat): a symlink, FIFO, device or directory there is refused,
/// never replaced or written through. An existing file's permission bits are kept; a new one
/// gets 0666 minus the umask. On every failure (including an exception from `write`) the
/// temporary is removed and `path` is untouched.
/// Complexity: that of `write` plus two fsyncs. Thread safety: concurrent writers of the same
/// or distinct paths are safe (distinct temporaries; the last rename wins).
/// @throw io_error naming the path (and the errno text) if the target is not a regular file,
///        or the temporary cannot be created, written, synced or renamed; any exception from
///        `write` is propagated.
template <class Write>
void atomic_write(const file_path& path, Write&& write) {
  const std::string where = path.string();
  struct ::stat st {};
  bool exists = false;
  if (::lstat(path.c_str(), &st) == 0) {
    exists = true;
    require<io_error>(S_ISREG(st.st_mode), "cannot write '", where, "': it is ",
                      file_kind(st.st_mode), ", expected a regular file or no file; refusing to ",
                      "replace it");
  } else {
    const int e = errno;
    require<io_error>(e == ENOENT, "cannot write '", where,
                      "': ", std::generic_category().message(e));
  }
  std::string dir = path.parent_path();
  if (dir.empty()) dir.push_back('.');  // (not `dir = "."`: g++ 12 warns -Wrestrict on it)

  // A fresh name per attempt; O_EXCL makes the creation fail rather than follow anything that
  // already has the name, and the loop only retries on that collision.
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 64 && fd < 0; ++attempt) {
    tmp = concat(dir, dir.back() == '/' ? "" : "/", ".", path.filename(), ".tmp.", ::getpid(), ".",
                 hex{temporary_name_bits()});
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    const int e = errno;
    fail<io_error>("cannot create a temporary in '", dir, "' to write '", where,
                   "': ", std::generic_category().message(e));
  }
  // Closes the descriptor and removes the temporary on every failure path.
  struct tmp_guard {
    int fd;
    const std::string* p;
    bool armed = true;
    ~tmp_guard() {
      if (fd >= 0) ::close(fd);
      if (armed) ::unlink(p->c_str());
    }
  } guard{fd, &tmp};
  auto fail_errno = [&](const char* step, int e) {
    fail<io_error>("writing '", where, "' failed: ", step, " of the temporary '", tmp,
                   "': ", std::generic_category().message(e));
  };
  if (exists && ::fchmod(fd, st.st_mode & 07777) != 0) fail_errno("fchmod", errno);
  {
    fd_streambuf buf(fd);
    std::ostream out(&buf);
    std::forward<Write>(write)(out);
    out.flush();
    if (buf.error() != 0) fail_errno("write", buf.error());
    require<io_error>(static_cast<bool>(out), "writing '", where, "' failed (stream error)");
  }
  if (::fsync(fd) != 0) fail_errno("fsync", errno);
  const int fd_to_close = std::exchange(guard.fd, -1);
  if (::close(fd_to_close) != 0) fail_errno("close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    fail<io_error>("cannot rename '", tmp, "' to '", where,
                   "': ", std::generic_category().message(e));
  }
  guard.armed = false;
  // Durability of the rename itself. Best effort: the new file is in place whatever happens
  // here, and some file systems refuse fsync on a directory (EINVAL), which is not an error.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    const int rc = ::fsync(dfd);
    const int e = errno;
    ::close(dfd);
    require<io_error>(
        rc == 0 || e == EINVAL || e == EROFS, "'", where,
        "' was replaced, but syncing its directory failed: ", std::generic_category().message(e));
  }
}

}  // namespace kvsift::detail
