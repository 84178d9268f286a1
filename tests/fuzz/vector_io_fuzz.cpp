// Fuzz target (b): the .fbin / .ibin / .npy readers (io/vector_io.hpp) and the .npy header
// dictionary parser on arbitrary bytes. Byte 0 selects the reader; the rest is the file (or, for
// the parser, the header text). A read either throws kvsift's io_error / invalid_argument or
// returns a matrix whose size agrees with the file; it never reads out of bounds or allocates
// from an unchecked size (ASan reports an allocation beyond its limit as a crash).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "kvsift/io/vector_io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint8_t* body = data + 1;
  const std::size_t n = size - 1;
  switch (data[0] % 4) {
    case 0: {
      const auto p = kvsift_fuzz::scratch(".fbin");
      kvsift_fuzz::write_file(p, body, n);
      kvsift_fuzz::expect_kvsift_errors_only([&] {
        const auto m = kvsift::read_fbin(p);
        // 8-byte header + rows x cols floats, exactly (trailing bytes are an error).
        if (8 + m.rows() * m.cols() * sizeof(float) != n) std::abort();
      });
      break;
    }
    case 1: {
      const auto p = kvsift_fuzz::scratch(".ibin");
      kvsift_fuzz::write_file(p, body, n);
      kvsift_fuzz::expect_kvsift_errors_only([&] { (void)kvsift::read_ibin(p); });
      break;
    }
    case 2: {
      const auto p = kvsift_fuzz::scratch(".npy");
      kvsift_fuzz::write_file(p, body, n);
      kvsift_fuzz::expect_kvsift_errors_only([&] {
        const auto m = kvsift::read_npy(p);
        if (m.rows() != 0 && m.cols() == 0) std::abort();
      });
      break;
    }
    default: {
      const std::string_view text(reinterpret_cast<const char*>(body), n);
      kvsift_fuzz::expect_kvsift_errors_only([&] {
        const auto h = kvsift::detail::npy_header_parser(text, "fuzz").parse();
        (void)h;
      });
      break;
    }
  }
  return 0;
}
