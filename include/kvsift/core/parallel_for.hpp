#pragma once
// parallel_for over a fixed number of threads with dynamic chunking. Results are deterministic
// whenever each index writes only its own output: scheduling changes who computes an index,
// never what is computed.

#include <algorithm>
#include <cstddef>
#include <exception>
#include <vector>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/core/detail/threads.hpp"

namespace kvsift {

/// Number of threads to use when the caller passes 0: the hardware concurrency (at least 1).
inline std::size_t default_thread_count() noexcept { return detail::hardware_threads(); }

namespace detail {
/// Test seam, null in production: when set, it is called with the worker index before each
/// worker thread is created, and an exception it throws stands in for a failed thread
/// creation (std::system_error when the system is out of threads), which a test cannot
/// provoke reliably. Not thread-safe to change while a parallel_for runs.
inline void (*parallel_for_spawn_hook)(std::size_t worker) = nullptr;
}  // namespace detail

/// Calls `fn(i, thread_index)` for every i in [0, n) on `threads` threads (0 = hardware
/// concurrency; the calling thread is one of them). Indices are handed out in chunks of
/// `chunk` (0 counts as 1; a chunk beyond n is n). The first exception thrown by `fn` stops
/// further work and is rethrown here. If a worker thread cannot be created, the workers
/// already started are stopped and joined and that exception (std::system_error) is rethrown:
/// no call of fn runs after the return.
/// Complexity: n calls of fn. Thread safety: fn must be safe to call concurrently.
template <class Fn>
void parallel_for(std::size_t n, std::size_t threads, Fn&& fn, std::size_t chunk = 1) {
  if (n == 0) return;
  if (threads == 0) threads = default_thread_count();
  // Clamped to n so neither the thread count (n + chunk - 1 wrapped for a huge chunk) nor the
  // shared cursor (begin + chunk) can overflow.
  chunk = std::clamp<std::size_t>(chunk, 1, n);
  threads = std::min(threads, ceil_div(n, chunk));
  if (threads <= 1) {
    for (std::size_t i = 0; i < n; ++i) fn(i, std::size_t{0});
    return;
  }
  detail::relaxed_counter next{0};
  // 1 once a call of fn threw (or a thread could not be started): the others stop. The thread
  // that sets it first stores its exception.
  detail::relaxed_counter failed{0};
  std::exception_ptr error;  // read only after every worker is joined (the join publishes it)
  auto worker = [&](std::size_t t) {
    try {
      while (failed.load() == 0) {
        const std::size_t begin = next.fetch_add(chunk);
        if (begin >= n) break;
        const std::size_t end = begin + std::min(chunk, n - begin);
        for (std::size_t i = begin; i < end; ++i) fn(i, t);
      }
    } catch (...) {
      if (failed.exchange(1) == 0) error = std::current_exception();  // the first one wins
    }
  };
  struct worker_call {  // what thread t runs
    decltype(worker)* w;
    std::size_t t;
    void operator()() const { (*w)(t); }
  };
  std::vector<worker_call> calls;
  calls.reserve(threads - 1);
  for (std::size_t t = 1; t < threads; ++t) calls.push_back({&worker, t});
  std::vector<detail::joinable_thread> pool;
  try {
    pool.reserve(threads - 1);
    for (std::size_t t = 1; t < threads; ++t) {
      if (detail::parallel_for_spawn_hook != nullptr) detail::parallel_for_spawn_hook(t);
      pool.emplace_back(calls[t - 1]);
    }
  } catch (...) {
    // Stop the started workers, join them (clear() destroys, and a joinable_thread joins when
    // destroyed), then report the failure.
    failed.store(1);
    pool.clear();
    throw;
  }
  worker(0);
  pool.clear();  // joins
  if (error) std::rethrow_exception(error);
}

}  // namespace kvsift
