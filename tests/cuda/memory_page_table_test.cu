// The page table's lookup handle in device code: the directory and the segment pool copied to
// the GPU answer every lookup exactly as the host table does.

#include <cstdint>
#include <random>
#include <vector>

#include <kvsift/memory/page_table.hpp>

#include "cuda_test.cuh"
#include "test_util.cuh"

using kvsift::cuda_test::device_buffer;

namespace {

__global__ void lookup_kernel(kvsift::page_table_ref v, const kvsift::page_key* keys,
                              std::uint32_t n, kvsift::page_id* out) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = v.lookup(keys[i]);
}

}  // namespace

TEST_CASE("memory_page_table_view_on_device", "[cuda][memory_page_table]") {
  const kvsift::page_table_params p{3, 2, 2, 300, 64, 30};
  kvsift::page_table t(p);
  std::mt19937 rng(2);
  std::vector<kvsift::page_key> keys;
  for (int i = 0; i < 4000; ++i) {
    const kvsift::page_key k{
        static_cast<std::uint32_t>(rng() % 3), static_cast<std::uint32_t>(rng() % 2),
        static_cast<std::uint32_t>(rng() % 2), static_cast<std::uint32_t>(rng() % 300)};
    keys.push_back(k);
    if (i % 2 == 0 && t.lookup(k) == kvsift::no_page) {
      try {
        t.map(k, static_cast<kvsift::page_id>(i));
      } catch (const kvsift::pool_exhausted&) {
      }
    }
  }
  CHECK(t.mapped_pages() > 500);
  const auto host = t.ref();
  const std::size_t dir = p.requests * p.layers * p.heads * host.segments_per_head;
  const std::size_t pool = p.pool_segments * p.segment_pages;
  device_buffer<std::uint32_t> d_dir(
      std::vector<std::uint32_t>(host.directory, host.directory + dir));
  device_buffer<kvsift::page_id> d_pool(std::vector<kvsift::page_id>(host.pool, host.pool + pool));
  kvsift::page_table_ref dev = host;
  dev.directory = d_dir.get();
  dev.pool = d_pool.get();
  device_buffer<kvsift::page_key> d_keys(keys);
  device_buffer<kvsift::page_id> d_out(keys.size());
  lookup_kernel<<<(keys.size() + 255) / 256, 256>>>(
      dev, d_keys.get(), static_cast<std::uint32_t>(keys.size()), d_out.get());
  KVSIFT_CUDA_CHECK(cudaGetLastError());
  const auto out = d_out.download();
  int mismatches = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) mismatches += out[i] != t.lookup(keys[i]);
  CHECK(mismatches == 0);
}
