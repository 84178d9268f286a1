#pragma once
// One function run on its own thread, its result (or exception) collected later: the part of
// std::async the build pipeline used, without <future> (which costs every includer ~0.3 s of
// compile time for shared states, promises and packaged tasks kvsift never needs).

#include <exception>
#include <optional>
#include <thread>
#include <utility>

namespace kvsift::detail {

/// Runs `f()` on a new thread at construction. get() waits and returns its result or rethrows
/// its exception; the destructor waits too, so whatever `f` references stays alive until `f`
/// is done even when the owner unwinds. Neither copyable nor movable (the thread writes into
/// this object). @throw std::system_error from the constructor if no thread can be started.
template <class T>
class background_task {
 public:
  template <class F>
  explicit background_task(F f)
      : thread_([this, f = std::move(f)]() mutable {
          try {
            value_.emplace(f());
          } catch (...) {
            error_ = std::current_exception();
          }
        }) {}
  background_task(const background_task&) = delete;
  background_task& operator=(const background_task&) = delete;
  ~background_task() {
    if (thread_.joinable()) thread_.join();
  }

  /// Waits for the function; returns its result or rethrows its exception. Call once.
  T get() {
    if (thread_.joinable()) thread_.join();
    if (error_) std::rethrow_exception(error_);
    return std::move(*value_);
  }

 private:
  std::optional<T> value_;
  std::exception_ptr error_;
  std::thread thread_;  // last: it starts after the members it writes are constructed
};

}  // namespace kvsift::detail
