// Benchmark of the page gather / scatter kernels (kvsift/cuda/page_gather.cuh), CUDA events.
//
// Build and run from the repository root:
// clang-format off
//   nvcc -arch=sm_90 -std=c++20 -O3 -I include -I cuda/include bench/cuda/page_gather_bench.cu -o page_gather_bench
//   ./page_gather_bench
// clang-format on
//
// For 4, 8, 16 and 32 KB pages, moves 64 MiB of randomly scattered pages between a 1 GiB
// pinned host pool and a 256 MiB device pool, and reports, all measured in the same run:
//   bulk   one cudaMemcpyAsync of 64 MiB contiguous pinned memory (the bandwidth ceiling)
//   gather one gather_pages launch over the scattered pages (target >= 90% of bulk)
//   memcpy one cudaMemcpyAsync per page (the naive way; the speed-up is gather / memcpy)
// and the same for the way back (scatter_pages vs bulk device-to-host); then the kernels'
// bandwidth at other grid sizes (gather_policy::blocks_per_sm).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <kvsift/cuda/page_gather.cuh>

#include "bench_util.cuh"

namespace {

using kvsift::page_copy;
using kvsift::cuda_bench::median_ms;

double gbps(std::uint64_t bytes, float ms) {
  return static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

}  // namespace

int main() {
  kvsift::cuda_bench::bench_setup setup;
  if (!kvsift::cuda_bench::start_bench(setup)) return 0;
  cudaStream_t s = setup.stream;
  const std::uint64_t host_bytes = std::uint64_t{1} << 30, dev_bytes = std::uint64_t{256} << 20;
  const std::uint64_t moved = std::uint64_t{64} << 20;
  void* host = nullptr;
  void* dev = nullptr;
  void* bulk_dev = nullptr;
  KVSIFT_CUDA_CHECK(cudaMallocHost(&host, host_bytes));
  KVSIFT_CUDA_CHECK(cudaMalloc(&dev, dev_bytes));
  KVSIFT_CUDA_CHECK(cudaMalloc(&bulk_dev, moved));
  std::memset(host, 1, host_bytes);
  std::printf("%-8s %-6s | %-28s | %-28s\n", "page", "pages", "host->device GB/s",
              "device->host GB/s");
  std::printf("%-8s %-6s | %6s %6s %5s %6s %5s | %6s %6s %5s %6s %5s\n", "", "", "bulk", "gather",
              "%bulk", "memcpy", "x", "bulk", "scattr", "%bulk", "memcpy", "x");
  std::mt19937_64 rng(1);
  for (const std::uint64_t page : {4096u, 8192u, 16384u, 32768u}) {
    const std::uint64_t n = moved / page;
    std::vector<std::uint64_t> hp(host_bytes / page), dp(dev_bytes / page);
    std::iota(hp.begin(), hp.end(), 0);
    std::iota(dp.begin(), dp.end(), 0);
    std::shuffle(hp.begin(), hp.end(), rng);
    std::shuffle(dp.begin(), dp.end(), rng);
    std::vector<page_copy> copies(n);
    for (std::uint64_t i = 0; i < n; ++i) copies[i] = {hp[i], dp[i]};
    page_copy* d_copies = nullptr;
    KVSIFT_CUDA_CHECK(cudaMalloc(&d_copies, n * sizeof(page_copy)));
    KVSIFT_CUDA_CHECK(
        cudaMemcpy(d_copies, copies.data(), n * sizeof(page_copy), cudaMemcpyHostToDevice));
    const kvsift::cuda::page_pools_ref pools{host, host_bytes / page, dev, dev_bytes / page, page};
    auto* hb = static_cast<unsigned char*>(host);
    auto* db = static_cast<unsigned char*>(dev);

    // One direction: the bulk copy, the kernel, one cudaMemcpyAsync per page.
    auto measure = [&](bool to_device) {
      const cudaMemcpyKind kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
      const float bulk = median_ms(
          [&](cudaStream_t st) {
            KVSIFT_CUDA_CHECK(cudaMemcpyAsync(to_device ? bulk_dev : host,
                                              to_device ? host : bulk_dev, moved, kind, st));
          },
          s);
      const float kernel = median_ms(
          [&](cudaStream_t st) {
            if (to_device) {
              kvsift::cuda::gather_pages(d_copies, n, pools, nullptr, st);
            } else {
              kvsift::cuda::scatter_pages(d_copies, n, pools, nullptr, st);
            }
          },
          s);
      const float per_page = median_ms(
          [&](cudaStream_t st) {
            for (const auto& c : copies) {
              unsigned char* h = hb + c.cpu_page * page;
              unsigned char* d = db + c.gpu_page * page;
              KVSIFT_CUDA_CHECK(
                  cudaMemcpyAsync(to_device ? d : h, to_device ? h : d, page, kind, st));
            }
          },
          s, 1, 5);
      std::printf(" | %6.1f %6.1f %4.0f%% %6.2f %5.1f", gbps(moved, bulk), gbps(moved, kernel),
                  100.0 * bulk / kernel, gbps(moved, per_page), per_page / kernel);
    };
    std::printf("%5lu KB %6lu", static_cast<unsigned long>(page / 1024),
                static_cast<unsigned long>(n));
    measure(true);
    measure(false);
    std::printf("\n");
    // Launch tuning: kernel GB/s for other grid sizes (the default is 8 blocks per SM).
    std::printf("%16s blocks/SM:", "");
    for (const int b : {2, 4, 16, 32}) {
      const kvsift::cuda::gather_policy pol{b};
      const float g = median_ms(
          [&](cudaStream_t st) {
            kvsift::cuda::gather_pages(d_copies, n, pools, nullptr, st, pol);
          },
          s);
      const float sc = median_ms(
          [&](cudaStream_t st) {
            kvsift::cuda::scatter_pages(d_copies, n, pools, nullptr, st, pol);
          },
          s);
      std::printf("  %d: %.1f / %.1f", b, gbps(moved, g), gbps(moved, sc));
    }
    std::printf("  (gather / scatter GB/s)\n");
    KVSIFT_CUDA_CHECK(cudaFree(d_copies));
  }
  KVSIFT_CUDA_CHECK(cudaFree(bulk_dev));
  KVSIFT_CUDA_CHECK(cudaFree(dev));
  KVSIFT_CUDA_CHECK(cudaFreeHost(host));
  return 0;
}
