#pragma once
// Shared pieces of the libFuzzer targets: a per-process scratch file (the loaders take paths, so
// each input is written to one first; /dev/shm when present keeps that off the disk) and the
// rule for exceptions: kvsift's documented errors (invalid_argument and its subclasses, io_error)
// are the expected answer to bad bytes; anything else escapes and libFuzzer reports it as a
// crash, as it does for sanitizer reports.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "kvsift/core/error.hpp"

namespace kvsift_fuzz {

/// A scratch path unique to this process, with the given extension (the readers dispatch on it).
inline std::filesystem::path scratch(const std::string& ext) {
  const std::filesystem::path dir = std::filesystem::is_directory("/dev/shm")
                                        ? "/dev/shm"
                                        : std::filesystem::temp_directory_path();
  return dir / ("kvsift_fuzz_" + std::to_string(::getpid()) + ext);
}

inline void write_file(const std::filesystem::path& p, const std::uint8_t* data, std::size_t size) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!f) std::abort();  // the harness itself failed, not the library
}

/// Runs `f`, swallowing only kvsift's documented error types.
template <class F>
void expect_kvsift_errors_only(F&& f) {
  try {
    f();
  } catch (const kvsift::invalid_argument&) {
  } catch (const kvsift::io_error&) {
  }
}

}  // namespace kvsift_fuzz
