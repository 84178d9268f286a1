#include "kvsift/core/parallel_for.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <stdexcept>
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
