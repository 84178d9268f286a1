#pragma once
// A monotonic clock in seconds for build statistics, without <chrono>: in libstdc++ 12 its
// calendar and time-zone parts cost every includer about 0.3 s of compile time
// (tools/compile_time.py). POSIX systems read CLOCK_MONOTONIC (what steady_clock reads there);
// elsewhere, or with KVSIFT_STD_THREADS, steady_clock.

#if !defined(KVSIFT_STD_THREADS) && __has_include(<time.h>) && __has_include(<unistd.h>)
#include <time.h>
#define KVSIFT_DETAIL_POSIX_CLOCK 1
#else
#include <chrono>
#define KVSIFT_DETAIL_POSIX_CLOCK 0
#endif

namespace kvsift::detail {

/// Seconds on a monotonic clock since an unspecified start; only differences mean anything.
inline double monotonic_seconds() noexcept {
#if KVSIFT_DETAIL_POSIX_CLOCK
  ::timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
#else
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
#endif
}

/// Seconds elapsed since `t0`, a value of monotonic_seconds().
inline double seconds_since(double t0) noexcept { return monotonic_seconds() - t0; }

}  // namespace kvsift::detail
