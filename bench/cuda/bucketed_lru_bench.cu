// Benchmark of the bucketed LRU step kernel (kvsift/cuda/bucketed_lru.cuh), CUDA events.
//
// Build and run from the repository root:
// clang-format off
//   nvcc -arch=sm_90 -std=c++20 -O3 -I include -I cuda/include bench/cuda/bucketed_lru_bench.cu -o bucketed_lru_bench
//   ./bucketed_lru_bench
// clang-format on
//
// 32 requests x 8 KV heads = 256 (request, head) pairs, 4096 resident GPU pages each out of
// 8192 logical pages (128K tokens / 16), 256 selected pages per head per step (a drifting hot
// set plus random pages, so every step evicts). Reports the median time of one step (target
// < 50 us on an H100) and, as the baseline measured in the same run, the CPU reference
// (kvsift::bucketed_lru<64>, one thread, all 256 pairs) on the same steps.

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <set>
#include <span>
#include <vector>

#include <kvsift/cuda/bucketed_lru.cuh>
#include <kvsift/memory/bucketed_lru.hpp>

#include "bench_util.cuh"

int main() {
  kvsift::cuda_bench::bench_setup setup;
  if (!kvsift::cuda_bench::start_bench(setup)) return 0;
  const std::uint32_t pairs = 32 * 8, capacity = 4096, pages = 8192, per_step = 256;
  const int steps = 48;
  std::mt19937 rng(9);
  // Step 0 fills every slot; the others select 256 distinct pages around a drifting window.
  std::vector<std::vector<std::uint32_t>> flat(steps + 1);
  std::vector<std::vector<std::uint64_t>> offsets(steps + 1, {0});
  for (int t = 0; t <= steps; ++t) {
    for (std::uint32_t p = 0; p < pairs; ++p) {
      if (t == 0) {
        for (std::uint32_t k = 0; k < capacity; ++k) flat[t].push_back(k);
      } else {
        std::set<std::uint32_t> sel;
        const std::uint32_t base = (p * 131 + t * 97) % pages;
        while (sel.size() < per_step) {
          sel.insert(rng() % 5 ? (base + rng() % 2048) % pages : rng() % pages);
        }
        flat[t].insert(flat[t].end(), sel.begin(), sel.end());
      }
      offsets[t].push_back(flat[t].size());
    }
  }
  std::uint32_t *keys, *slot_of, *sel, *ek, *es, *ak, *as, *counts;
  std::uint8_t* ages;
  std::uint64_t* off;
  int* status;
  const std::size_t max_sel = flat[0].size();
  KVSIFT_CUDA_CHECK(cudaMalloc(&keys, std::size_t{pairs} * capacity * 4));
  KVSIFT_CUDA_CHECK(cudaMalloc(&ages, std::size_t{pairs} * capacity));
  KVSIFT_CUDA_CHECK(cudaMalloc(&slot_of, std::size_t{pairs} * pages * 4));
  KVSIFT_CUDA_CHECK(cudaMemset(keys, 0xff, std::size_t{pairs} * capacity * 4));
  KVSIFT_CUDA_CHECK(cudaMemset(ages, 0, std::size_t{pairs} * capacity));
  KVSIFT_CUDA_CHECK(cudaMemset(slot_of, 0xff, std::size_t{pairs} * pages * 4));
  KVSIFT_CUDA_CHECK(cudaMalloc(&sel, (steps + 1) * max_sel * 4));
  KVSIFT_CUDA_CHECK(cudaMalloc(&off, (steps + 1) * (pairs + 1) * 8));
  for (int t = 0; t <= steps; ++t) {
    KVSIFT_CUDA_CHECK(
        cudaMemcpy(sel + t * max_sel, flat[t].data(), flat[t].size() * 4, cudaMemcpyHostToDevice));
    KVSIFT_CUDA_CHECK(cudaMemcpy(off + t * (pairs + 1), offsets[t].data(), (pairs + 1) * 8,
                                 cudaMemcpyHostToDevice));
  }
  for (auto** p : {&ek, &es, &ak, &as}) KVSIFT_CUDA_CHECK(cudaMalloc(p, max_sel * 4));
  KVSIFT_CUDA_CHECK(cudaMalloc(&counts, pairs * 3 * 4));
  KVSIFT_CUDA_CHECK(cudaMalloc(&status, pairs * sizeof(int)));
  const kvsift::cuda::bucketed_lru_ref ref{keys, ages, slot_of, pairs, capacity, pages};
  auto io_for = [&](int t) {
    return kvsift::cuda::lru_step_io{
        sel + t * max_sel, off + t * (pairs + 1), ek, es, ak, as, counts, status};
  };
  kvsift::cuda::bucketed_lru_step(ref, io_for(0), 64, setup.stream);  // fill
  int t = 0;
  auto step = [&](cudaStream_t st) {
    t = t % steps + 1;
    kvsift::cuda::bucketed_lru_step(ref, io_for(t), 64, st);
  };
  for (int i = 0; i < steps; ++i) step(setup.stream);  // reach the steady state
  const float gpu_ms = kvsift::cuda_bench::median_ms(step, setup.stream, 5, 100);
  std::vector<std::uint32_t> h_counts(pairs * 3);
  KVSIFT_CUDA_CHECK(cudaMemcpy(h_counts.data(), counts, pairs * 12, cudaMemcpyDeviceToHost));
  std::uint64_t hits = 0, ev = 0;
  for (std::uint32_t p = 0; p < pairs; ++p) {
    hits += h_counts[3 * p];
    ev += h_counts[3 * p + 1];
  }

  // CPU reference on the same steps (one thread).
  std::vector<kvsift::bucketed_lru<64>> cpu(pairs, kvsift::bucketed_lru<64>(capacity, pages));
  kvsift::replacement_step out;
  auto cpu_step = [&](int tt) {
    for (std::uint32_t p = 0; p < pairs; ++p) {
      cpu[p].step(std::span<const std::uint32_t>(flat[tt].data() + offsets[tt][p],
                                                 offsets[tt][p + 1] - offsets[tt][p]),
                  out);
    }
  };
  cpu_step(0);
  for (int i = 1; i <= steps; ++i) cpu_step(i);
  const auto c0 = std::chrono::steady_clock::now();
  for (int i = 1; i <= steps; ++i) cpu_step(i);
  const double cpu_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count() /
      steps;
  std::printf("bucketed LRU step, %u pairs x %u slots, %u selected/pair, 64 buckets\n", pairs,
              capacity, per_step);
  std::printf("  last step: %.1f hits and %.1f evictions per pair\n",
              static_cast<double>(hits) / pairs, static_cast<double>(ev) / pairs);
  std::printf("  GPU one launch: %.1f us (target < 50 us)\n", gpu_ms * 1e3);
  std::printf("  CPU reference (1 thread, same steps): %.1f us -> GPU speed-up %.0fx\n",
              cpu_ms * 1e3, cpu_ms / gpu_ms);
  return 0;
}
