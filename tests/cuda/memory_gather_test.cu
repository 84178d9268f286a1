// Page gather / scatter: exactly the requested pages are copied, byte for byte, and nothing
// else is touched; bad page ids are reported in the status and skipped; offsets past 2^31
// bytes work.

#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <kvsift/cuda/page_gather.cuh>

#include "cuda_test.cuh"
#include "test_util.cuh"

using kvsift::page_copy;
using kvsift::cuda_test::device_buffer;
using kvsift::cuda_test::pinned_bytes;

TEST_CASE("memory_gather_copies_exactly_the_requested_pages", "[cuda][memory_gather]") {
  const std::uint64_t page = 4112, host_pages = 64, dev_pages = 40;  // 4 KB + 16: not a 2^k
  pinned_bytes host(page * host_pages);
  std::mt19937 rng(3);
  for (std::uint64_t i = 0; i < page * host_pages; ++i) host.bytes()[i] = rng() & 0xff;
  device_buffer<unsigned char> dev(std::vector<unsigned char>(page * dev_pages, 0xAB));
  std::vector<std::uint64_t> dst(dev_pages);
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(dst.begin(), dst.end(), rng);
  std::vector<page_copy> copies;
  for (int i = 0; i < 30; ++i) copies.push_back({rng() % host_pages, dst[i]});
  copies.push_back({host_pages + 5, dst[30]});  // bad host page: reported, skipped
  copies.push_back({1, dev_pages});             // bad device page
  device_buffer<page_copy> d_copies(copies);
  device_buffer<int> status(std::vector<int>{0});
  const kvsift::cuda::page_pools_ref pools{host.p, host_pages, dev.get(), dev_pages, page};
  kvsift::cuda::gather_pages(d_copies.get(), copies.size(), pools, status.get(), nullptr);
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK(status.download()[0] == kvsift::cuda::gather_page_out_of_range);
  const auto out = dev.download();
  std::vector<bool> written(dev_pages, false);
  for (int i = 0; i < 30; ++i) {
    written[copies[i].gpu_page] = true;
    CHECK(std::memcmp(out.data() + copies[i].gpu_page * page,
                      host.bytes() + copies[i].cpu_page * page, page) == 0);
  }
  for (std::uint64_t g = 0; g < dev_pages; ++g) {
    if (written[g]) continue;
    bool untouched = true;
    for (std::uint64_t b = 0; b < page; ++b) untouched = untouched && out[g * page + b] == 0xAB;
    CHECK(untouched);
  }

  // Back: scatter 10 device pages into a zeroed host pool; everything else stays zero.
  pinned_bytes back(page * host_pages);
  std::memset(back.p, 0, page * host_pages);
  std::vector<page_copy> home;
  for (int i = 0; i < 10; ++i) home.push_back({static_cast<std::uint64_t>(2 * i + 1), dst[i]});
  device_buffer<page_copy> d_home(home);
  const kvsift::cuda::page_pools_ref back_pools{back.p, host_pages, dev.get(), dev_pages, page};
  kvsift::cuda::scatter_pages(d_home.get(), home.size(), back_pools, nullptr, nullptr);
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  for (std::uint64_t h = 0; h < host_pages; ++h) {
    const bool target = h % 2 == 1 && h < 20;
    if (target) {
      CHECK(std::memcmp(back.bytes() + h * page, out.data() + dst[h / 2] * page, page) == 0);
    } else {
      bool zero = true;
      for (std::uint64_t b = 0; b < page; ++b) zero = zero && back.bytes()[h * page + b] == 0;
      CHECK(zero);
    }
  }
}

TEST_CASE("memory_gather_offsets_past_2_31_bytes", "[cuda][memory_gather]") {
  const std::uint64_t page = 32768, dev_pages = 70000;  // 2.29 GB device pool
  pinned_bytes host(page * 4);
  for (std::uint64_t i = 0; i < page * 4; ++i) host.bytes()[i] = static_cast<unsigned char>(i * 7);
  device_buffer<unsigned char> dev(page * dev_pages);
  const std::vector<page_copy> copies{{3, dev_pages - 1}, {2, 65537}};
  device_buffer<page_copy> d_copies(copies);
  const kvsift::cuda::page_pools_ref pools{host.p, 4, dev.get(), dev_pages, page};
  kvsift::cuda::gather_pages(d_copies.get(), copies.size(), pools, nullptr, nullptr);
  std::vector<unsigned char> got(page);
  for (const auto& c : copies) {
    KVSIFT_CUDA_CHECK(
        cudaMemcpy(got.data(), dev.get() + c.gpu_page * page, page, cudaMemcpyDeviceToHost));
    CHECK(std::memcmp(got.data(), host.bytes() + c.cpu_page * page, page) == 0);
  }
}

TEST_CASE("memory_gather_rejects_bad_parameters", "[cuda][memory_gather]") {
  device_buffer<unsigned char> dev(4096);
  pinned_bytes host(4096);
  device_buffer<page_copy> copies(std::vector<page_copy>{{0, 0}});
  kvsift::cuda::page_pools_ref pools{host.p, 1, dev.get(), 1, 4096};
  auto bad = pools;
  bad.page_bytes = 100;  // not a multiple of 16
  CHECK_THROWS_AS(kvsift::cuda::gather_pages(copies.get(), 1, bad, nullptr, nullptr),
                  kvsift::invalid_argument);
  bad = pools;
  bad.host = nullptr;
  CHECK_THROWS_AS(kvsift::cuda::scatter_pages(copies.get(), 1, bad, nullptr, nullptr),
                  kvsift::invalid_argument);
  bad = pools;
  bad.device = dev.get() + 8;  // misaligned
  CHECK_THROWS_AS(kvsift::cuda::gather_pages(copies.get(), 1, bad, nullptr, nullptr),
                  kvsift::invalid_argument);
  kvsift::cuda::gather_pages(nullptr, 0, bad, nullptr, nullptr);  // nothing to do: no throw
}
