#pragma once
// parallel_for over a fixed number of threads with dynamic chunking. Results are deterministic
// whenever each index writes only its own output: scheduling changes who computes an index,
// never what is computed.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace kvsift {

/// Number of threads to use when the caller passes 0: the hardware concurrency (at least 1).
inline std::size_t default_thread_count() noexcept {
  return std::max<std::size_t>(1, std::thread::hardware_concurrency());
}

/// Calls `fn(i, thread_index)` for every i in [0, n) on `threads` threads (0 = hardware
/// concurrency; the calling thread is one of them). Indices are handed out in chunks of
/// `chunk`. The first exception thrown by `fn` stops further work and is rethrown here.
/// Complexity: n calls of fn. Thread safety: fn must be safe to call concurrently.
template <class Fn>
void parallel_for(std::size_t n, std::size_t threads, Fn&& fn, std::size_t chunk = 1) {
  if (n == 0) return;
  if (threads == 0) threads = default_thread_count();
  chunk = std::max<std::size_t>(chunk, 1);
  threads = std::min(threads, (n + chunk - 1) / chunk);
  if (threads <= 1) {
    for (std::size_t i = 0; i < n; ++i) fn(i, std::size_t{0});
    return;
  }
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&](std::size_t t) {
    try {
      while (!failed.load(std::memory_order_relaxed)) {
        const std::size_t begin = next.fetch_add(chunk, std::memory_order_relaxed);
        if (begin >= n) break;
        const std::size_t end = std::min(n, begin + chunk);
        for (std::size_t i = begin; i < end; ++i) fn(i, t);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      failed.store(true, std::memory_order_relaxed);
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(worker, t);
  worker(0);
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace kvsift
