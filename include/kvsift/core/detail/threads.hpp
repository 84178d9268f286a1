#pragma once
// The threading primitives kvsift needs (start a thread, join it, count work off a shared
// relaxed counter, a plain mutex for rare calls), without <thread>, <atomic> and <mutex>. In
// libstdc++ 12 those headers and the <chrono> they pull in for timed waits cost every includer
// about 0.35 s of compile time (g++ 12 -O2, tools/compile_time.py), and every header that builds or
// searches in parallel included them. On POSIX systems with GCC or Clang kvsift uses pthreads and
// the __atomic builtins, which cost almost nothing to include; elsewhere, or when
// KVSIFT_STD_THREADS is defined, the standard library (the tests compile both).

#include <cstddef>
#include <system_error>

#if !defined(KVSIFT_STD_THREADS) && (defined(__GNUC__) || defined(__clang__)) && \
    __has_include(<pthread.h>) && __has_include(<unistd.h>)
#define KVSIFT_DETAIL_PTHREADS 1
#include <pthread.h>
#include <unistd.h>
#else
#define KVSIFT_DETAIL_PTHREADS 0
#include <atomic>
#include <mutex>
#include <thread>
#endif

namespace kvsift::detail {

// joinable_thread: a thread running `fn()`, a callable the caller keeps alive until join().
// Unlike std::thread, destroying a joinable one joins it instead of calling std::terminate, so
// an owner that unwinds never leaves `fn` running on a dead frame. `fn` must not throw: an
// exception escaping it terminates the program, as with std::thread. Movable, not copyable.
// The constructor throws std::system_error if no thread can be started.
//
// relaxed_counter: a size_t shared between threads with relaxed ordering, enough for handing
// out work (fetch_add) and for a stop flag polled between work items. What the threads write
// is published by joining them, not by this counter.
//
// plain_mutex: lock() / unlock(), not recursive; scoped_lock holds one for its scope. For
// rare calls from several threads (progress callbacks), not for hot paths.

#if KVSIFT_DETAIL_PTHREADS

/// Logical CPUs online (at least 1): what std::thread::hardware_concurrency reports.
inline std::size_t hardware_threads() noexcept {
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<std::size_t>(n) : 1;
}

class joinable_thread {
 public:
  template <class Fn>
  explicit joinable_thread(Fn& fn) : id_(start(fn)), joinable_(true) {}
  joinable_thread(joinable_thread&& o) noexcept : id_(o.id_), joinable_(o.joinable_) {
    o.joinable_ = false;
  }
  joinable_thread(const joinable_thread&) = delete;
  joinable_thread& operator=(const joinable_thread&) = delete;
  joinable_thread& operator=(joinable_thread&&) = delete;
  ~joinable_thread() { join(); }

#if defined(__GNUC__) && !defined(__clang__)
// g++ 12 reports the members as maybe uninitialized when a joinable_thread inside a disengaged
// std::optional is destroyed on a path it cannot prove unreachable (build_pipeline's
// optional<background_task>); every constructor initialises both.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
  /// Waits for `fn` to return; a no-op once joined.
  void join() noexcept {
    if (joinable_) ::pthread_join(id_, nullptr);
    joinable_ = false;
  }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

 private:
  template <class Fn>
  static void* run(void* fn) noexcept {  // noexcept: an escaping exception terminates
    (*static_cast<Fn*>(fn))();
    return nullptr;
  }
  template <class Fn>
  static ::pthread_t start(Fn& fn) {
    ::pthread_t id{};
    const int rc = ::pthread_create(&id, nullptr, &run<Fn>, &fn);
    if (rc != 0) throw std::system_error(rc, std::generic_category(), "pthread_create");
    return id;
  }

  ::pthread_t id_;
  bool joinable_;
};

class relaxed_counter {
 public:
  explicit relaxed_counter(std::size_t v = 0) noexcept : v_(v) {}
  relaxed_counter(const relaxed_counter&) = delete;
  relaxed_counter& operator=(const relaxed_counter&) = delete;

  std::size_t fetch_add(std::size_t n) noexcept {
    return __atomic_fetch_add(&v_, n, __ATOMIC_RELAXED);
  }
  /// Stores `v` and returns the previous value.
  std::size_t exchange(std::size_t v) noexcept {
    return __atomic_exchange_n(&v_, v, __ATOMIC_RELAXED);
  }
  [[nodiscard]] std::size_t load() const noexcept { return __atomic_load_n(&v_, __ATOMIC_RELAXED); }
  void store(std::size_t v) noexcept { __atomic_store_n(&v_, v, __ATOMIC_RELAXED); }

 private:
  std::size_t v_;
};

class plain_mutex {
 public:
  plain_mutex() noexcept = default;
  plain_mutex(const plain_mutex&) = delete;
  plain_mutex& operator=(const plain_mutex&) = delete;
  ~plain_mutex() { ::pthread_mutex_destroy(&m_); }
  void lock() noexcept { ::pthread_mutex_lock(&m_); }
  void unlock() noexcept { ::pthread_mutex_unlock(&m_); }

 private:
  ::pthread_mutex_t m_ = PTHREAD_MUTEX_INITIALIZER;
};

#else  // the standard library: the same interface over std::thread and std::atomic

inline std::size_t hardware_threads() noexcept {
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? n : 1;
}

class joinable_thread {
 public:
  template <class Fn>
  explicit joinable_thread(Fn& fn) : thread_([&fn] { fn(); }) {}
  joinable_thread(joinable_thread&&) noexcept = default;
  joinable_thread(const joinable_thread&) = delete;
  joinable_thread& operator=(const joinable_thread&) = delete;
  joinable_thread& operator=(joinable_thread&&) = delete;
  ~joinable_thread() { join(); }
  void join() noexcept {
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::thread thread_;
};

class relaxed_counter {
 public:
  explicit relaxed_counter(std::size_t v = 0) noexcept : v_(v) {}
  std::size_t fetch_add(std::size_t n) noexcept {
    return v_.fetch_add(n, std::memory_order_relaxed);
  }
  std::size_t exchange(std::size_t v) noexcept { return v_.exchange(v, std::memory_order_relaxed); }
  [[nodiscard]] std::size_t load() const noexcept { return v_.load(std::memory_order_relaxed); }
  void store(std::size_t v) noexcept { v_.store(v, std::memory_order_relaxed); }

 private:
  std::atomic<std::size_t> v_;
};

class plain_mutex {
 public:
  void lock() { m_.lock(); }
  void unlock() { m_.unlock(); }

 private:
  std::mutex m_;
};

#endif

/// Holds `m` locked for its scope.
class scoped_lock {
 public:
  explicit scoped_lock(plain_mutex& m) : m_(m) { m_.lock(); }
  scoped_lock(const scoped_lock&) = delete;
  scoped_lock& operator=(const scoped_lock&) = delete;
  ~scoped_lock() { m_.unlock(); }

 private:
  plain_mutex& m_;
};

}  // namespace kvsift::detail
