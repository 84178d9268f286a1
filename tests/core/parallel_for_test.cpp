#include "kvsift/core/parallel_for.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

TEST_CASE("parallel_for visits every index exactly once", "[core][parallel_for]") {
  for (std::size_t n : {0u, 1u, 2u, 7u, 64u, 1000u}) {
    for (std::size_t threads : {0u, 1u, 2u, 3u, 8u}) {
      for (std::size_t chunk : {0u, 1u, 3u, 16u, 5000u}) {
        std::vector<std::atomic<int>> hits(n);
        std::atomic<std::size_t> max_thread{0};
        kvsift::parallel_for(
            n, threads,
            [&](std::size_t i, std::size_t t) {
              hits[i].fetch_add(1);
              std::size_t m = max_thread.load();
              while (t > m && !max_thread.compare_exchange_weak(m, t)) {
              }
            },
            chunk);
        INFO("n " << n << " threads " << threads << " chunk " << chunk);
        for (std::size_t i = 0; i < n; ++i) REQUIRE(hits[i].load() == 1);
        const std::size_t limit = threads == 0 ? kvsift::default_thread_count() : threads;
        CHECK(max_thread.load() < std::max<std::size_t>(limit, 1));
      }
    }
  }
}

TEST_CASE("parallel_for propagates an exception", "[core][parallel_for]") {
  for (std::size_t threads : {1u, 2u, 4u}) {
    std::atomic<int> calls{0};
    INFO("threads " << threads);
    CHECK_THROWS_AS(kvsift::parallel_for(500, threads,
                                         [&](std::size_t i, std::size_t) {
                                           ++calls;
                                           if (i == 137) throw std::runtime_error("boom 137");
                                         }),
                    std::runtime_error);
    CHECK(calls.load() >= 1);
    CHECK(calls.load() <= 500);
  }
  CHECK_THROWS_WITH(kvsift::parallel_for(10, 2,
                                         [](std::size_t i, std::size_t) {
                                           if (i == 9) throw std::logic_error("index 9 failed");
                                         }),
                    "index 9 failed");
  CHECK(kvsift::default_thread_count() >= 1);
}

// Regression: a thread that cannot be created used to unwind past the joinable threads
// already started, which calls std::terminate. The failure is injected through the test seam
// detail::parallel_for_spawn_hook (it throws std::system_error before worker 3 would be
// created, as std::thread's constructor does when the system is out of threads). Mutation
// checked: without the join-on-failure block this test aborts the test binary.
TEST_CASE("parallel_for joins started workers when a thread cannot be created", "[core][rel]") {
  std::atomic<std::size_t> calls{0};
  kvsift::detail::parallel_for_spawn_hook = [](std::size_t worker) {
    if (worker == 3)
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
  };
  bool threw = false;
  try {
    kvsift::parallel_for(100000, 8, [&](std::size_t, std::size_t) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      ++calls;
    });
  } catch (const std::system_error& e) {
    threw = e.code() == std::errc::resource_unavailable_try_again;
  }
  kvsift::detail::parallel_for_spawn_hook = nullptr;
  CHECK(threw);
  // Every started worker was joined: nothing runs after the return.
  const std::size_t after = calls.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(calls.load() == after);
  CHECK(after < 100000);  // the work was abandoned, not finished
  // And the next call works normally.
  std::atomic<std::size_t> sum{0};
  kvsift::parallel_for(1000, 4, [&](std::size_t i, std::size_t) { sum += i; });
  CHECK(sum == 999 * 1000 / 2);
}

TEST_CASE("parallel_for with a chunk beyond n runs every index once", "[core][rel]") {
  for (const std::size_t chunk :
       {std::size_t{0}, std::size_t{1000}, std::numeric_limits<std::size_t>::max()}) {
    std::vector<std::atomic<int>> hits(37);
    kvsift::parallel_for(
        37, 4, [&](std::size_t i, std::size_t) { ++hits[i]; }, chunk);
    CHECK(std::all_of(hits.begin(), hits.end(), [](const auto& h) { return h.load() == 1; }));
  }
}

// The threads under parallel_for (core/detail/threads.hpp): pthreads and the __atomic builtins
// on POSIX with GCC or Clang, the standard library elsewhere. kvsift_std_threads_tests compiles
// this file again with KVSIFT_STD_THREADS, so both implementations pass every test here.
#if defined(KVSIFT_STD_THREADS)
static_assert(KVSIFT_DETAIL_PTHREADS == 0, "KVSIFT_STD_THREADS must select std::thread");
#elif defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
static_assert(KVSIFT_DETAIL_PTHREADS == 1, "Linux with GCC or Clang must use pthreads");
#endif

TEST_CASE("default_thread_count is what std::thread reports", "[core][parallel_for]") {
  CHECK(kvsift::default_thread_count() ==
        std::max<std::size_t>(1, std::thread::hardware_concurrency()));
}

TEST_CASE("parallel_for runs calls on distinct threads concurrently", "[core][parallel_for]") {
  // Two calls that each wait for the other can only both finish if they run at the same time
  // on different threads: guards against a pool that silently runs everything on the caller.
  std::atomic<int> arrived{0};
  std::atomic<bool> timed_out{false};
  std::vector<std::thread::id> ids(2);
  kvsift::parallel_for(2, 2, [&](std::size_t i, std::size_t) {
    ids[i] = std::this_thread::get_id();
    arrived.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (arrived.load() < 2) {
      if (std::chrono::steady_clock::now() > deadline) {
        timed_out = true;
        return;
      }
      std::this_thread::yield();
    }
  });
  CHECK_FALSE(timed_out.load());
  CHECK(ids[0] != ids[1]);
}
