#pragma once
// One function run on its own thread, its result (or exception) collected later: the part of
// std::async the build pipeline used, without <future> (which costs every includer ~0.3 s of
// compile time for shared states, promises and packaged tasks kvsift never needs).

#include <exception>
#include <optional>
#include <utility>

#include "kvsift/core/detail/std_function.hpp"
#include "kvsift/core/detail/threads.hpp"

namespace kvsift::detail {

/// Runs `f()` on a new thread at construction. get() waits and returns its result or rethrows
/// its exception; the destructor waits too, so whatever `f` references stays alive until `f`
/// is done even when the owner unwinds. Neither copyable nor movable (the thread writes into
/// this object). @throw std::system_error from the constructor if no thread can be started.
template <class T>
class background_task {
 public:
  template <class F>
  explicit background_task(F f) : run_(std::move(f), this), thread_(run_) {}
  background_task(const background_task&) = delete;
  background_task& operator=(const background_task&) = delete;
  ~background_task() = default;  // thread_ is destroyed first and joins

  /// Waits for the function; returns its result or rethrows its exception. Call once.
  T get() {
    thread_.join();
    if (error_) std::rethrow_exception(error_);
    return std::move(*value_);
  }

 private:
  // What the thread runs: `f()` into value_, or its exception into error_.
  struct runner {
    template <class F>
    runner(F f, background_task* owner)
        : call([owner, f = std::move(f)]() mutable {
            try {
              owner->value_.emplace(f());
            } catch (...) {
              owner->error_ = std::current_exception();
            }
          }) {}
    void operator()() { call(); }
    std::function<void()> call;
  };

  std::optional<T> value_;
  std::exception_ptr error_;
  runner run_;
  joinable_thread thread_;  // last: it starts after the members it writes are constructed
};

}  // namespace kvsift::detail
