// The decode chain on the GPU: retrieved token ids -> head-wise pages -> the CUDA bucketed LRU
// step decides which pages stay in a small device pool -> the warp gather copies the missing
// pages from pinned host pages into the admitted slots (K and V pools) -> the page table is
// rebuilt from the LRU's slot_of -> paged sparse_attention over the retrieved ids equals a
// double-precision CPU attention over the same ids read from the full K/V. Several steps with
// drifting queries (pages hit, miss and are evicted); 2 KV heads, GQA 2. A page the chain
// fails to bring in reads a NaN poison page, so it cannot pass unnoticed. The CPU twin is
// tests/decode/lru_gather_attention_test.cpp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <vector>

#include <kvsift/cuda/bucketed_lru.cuh>
#include <kvsift/cuda/page_gather.cuh>
#include <kvsift/cuda/sparse_attention.cuh>
#include <kvsift/memory/bucketed_lru.hpp>

#include "cuda_test.cuh"
#include "test_util.cuh"

namespace {

using namespace kvsift::cuda_test;

constexpr int kv_heads = 2, qo_heads = 4, group = qo_heads / kv_heads, d = 64, page = 16;
constexpr int tokens = 2048, pages = tokens / page, slots = 32, topk = 12, buckets = 8;

}  // namespace

TEST_CASE("decode_chain_lru_gather_paged_attention_equals_dense", "[cuda][decode_chain]") {
  // Token-major host K/V per head ([head][token][dim]) is also the host page pool: logical page
  // p of head g is host page g * pages + p.
  const std::size_t page_floats = static_cast<std::size_t>(page) * d;
  const std::size_t host_floats = static_cast<std::size_t>(kv_heads) * tokens * d;
  pinned_floats hk(host_floats), hv(host_floats);
  std::vector<float> k_host(host_floats), v_host(host_floats);
  for (std::size_t i = 0; i < host_floats; ++i) {
    k_host[i] = hk.p[i] = uniform(-1.0f, 1.0f);
    v_host[i] = hv.p[i] = uniform(-1.0f, 1.0f);
  }
  // Device pools: `slots` pages per KV head, then one poison page of NaN.
  const int dev_pages = kv_heads * slots + 1, poison = kv_heads * slots;
  std::vector<float> init(static_cast<std::size_t>(dev_pages) * page_floats, 0.0f);
  std::fill(init.begin() + static_cast<std::ptrdiff_t>(poison * page_floats), init.end(),
            std::numeric_limits<float>::quiet_NaN());
  device_buffer<float> dk(init), dv(init);
  // The LRU state, one pair per KV head.
  device_buffer<std::uint32_t> keys(std::vector<std::uint32_t>(kv_heads * slots, ~0u));
  device_buffer<std::uint32_t> slot_of(std::vector<std::uint32_t>(kv_heads * pages, ~0u));
  device_buffer<std::uint8_t> ages(std::vector<std::uint8_t>(kv_heads * slots, 0));
  const kvsift::cuda::bucketed_lru_ref lru{keys.get(), ages.get(), slot_of.get(),
                                           kv_heads,   slots,      pages};
  std::vector<kvsift::bucketed_lru<buckets>> cpu(kv_heads,
                                                 kvsift::bucketed_lru<buckets>(slots, pages));
  const kvsift::cuda::page_pools_ref k_pools{hk.p, std::uint64_t{kv_heads} * pages, dk.get(),
                                             static_cast<std::uint64_t>(dev_pages),
                                             page_floats * sizeof(float)};
  const kvsift::cuda::page_pools_ref v_pools{hv.p, std::uint64_t{kv_heads} * pages, dv.get(),
                                             static_cast<std::uint64_t>(dev_pages),
                                             page_floats * sizeof(float)};
  kvsift::cuda::sparse_attention_params ap;
  device_buffer<int> att_status(std::vector<int>{0});
  ap.status = att_status.get();
  const std::size_t ws_bytes = kvsift::cuda::sparse_attention_workspace_size(qo_heads, d, ap);
  device_buffer<unsigned char> ws(ws_bytes);

  std::size_t hits = 0, misses = 0, evictions = 0, bad = 0;
  std::vector<float> q(static_cast<std::size_t>(qo_heads) * d);
  for (int step = 0; step < 40; ++step) {
    if (step % 3 == 0) {
      for (auto& x : q) x = uniform(-1.5f, 1.5f);  // queries drift: a new one every 3 steps
    }
    // Retrieval (host, exact): ids per query head; pages per KV head (both heads of a group).
    std::vector<std::int64_t> indptr{0};
    std::vector<std::int32_t> ids;
    std::vector<std::vector<std::uint32_t>> sel(kv_heads);
    for (int h = 0; h < qo_heads; ++h) {
      const auto got =
          exact_topk(k_host, h / group, tokens, d, &q[static_cast<std::size_t>(h) * d], topk);
      ids.insert(ids.end(), got.begin(), got.end());
      indptr.push_back(static_cast<std::int64_t>(ids.size()));
      for (auto t : got) sel[h / group].push_back(static_cast<std::uint32_t>(t / page));
    }
    std::vector<std::uint32_t> flat;
    std::vector<std::uint64_t> offsets{0};
    for (int g = 0; g < kv_heads; ++g) {
      flat.insert(flat.end(), sel[g].begin(), sel[g].end());
      offsets.push_back(flat.size());
    }
    // The LRU step on the device.
    device_buffer<std::uint32_t> d_sel(flat), ek(flat.size()), es(flat.size()), ak(flat.size()),
        as(flat.size()), counts(3 * kv_heads);
    device_buffer<std::uint64_t> d_off(offsets);
    device_buffer<int> lru_status(std::vector<int>(kv_heads, -1));
    kvsift::cuda::bucketed_lru_step(lru,
                                    {d_sel.get(), d_off.get(), ek.get(), es.get(), ak.get(),
                                     as.get(), counts.get(), lru_status.get()},
                                    buckets, nullptr);
    KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
    const auto st = lru_status.download();
    const auto cnt = counts.download();
    const auto h_ak = ak.download(), h_as = as.download();
    // The copy list: every admitted page, host page -> device slot of its head.
    std::vector<kvsift::page_copy> copies;
    for (int g = 0; g < kv_heads; ++g) {
      REQUIRE(st[g] == kvsift::cuda::lru_ok);
      kvsift::replacement_step ref;  // the CPU twin on the same trace: same admissions
      std::vector<kvsift::id_t> pg(sel[g].begin(), sel[g].end());
      cpu[g].step(pg, ref);
      const std::set<std::uint32_t> distinct(sel[g].begin(), sel[g].end());
      CHECK(cnt[3 * g] + cnt[3 * g + 2] == distinct.size());
      CHECK(cnt[3 * g] == ref.hits);
      REQUIRE(cnt[3 * g + 2] == ref.admitted_keys.size());
      hits += cnt[3 * g];
      misses += cnt[3 * g + 2];
      evictions += cnt[3 * g + 1];
      for (std::uint32_t i = 0; i < cnt[3 * g + 2]; ++i) {
        const std::size_t at = offsets[g] + i;
        CHECK(h_ak[at] == ref.admitted_keys[i]);
        CHECK(h_as[at] == ref.admitted_slots[i]);
        copies.push_back({std::uint64_t{static_cast<std::uint64_t>(g)} * pages + h_ak[at],
                          std::uint64_t{static_cast<std::uint64_t>(g)} * slots + h_as[at]});
      }
    }
    // The warp gather brings the missing pages in (K and V pools share the copy list).
    device_buffer<kvsift::page_copy> d_copies(copies);
    device_buffer<int> gather_status(std::vector<int>{0});
    kvsift::cuda::gather_pages(d_copies.get(), copies.size(), k_pools, gather_status.get(),
                               nullptr);
    kvsift::cuda::gather_pages(d_copies.get(), copies.size(), v_pools, gather_status.get(),
                               nullptr);
    // The page table from the LRU's slot_of: resident -> its slot, otherwise the poison page.
    KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(gather_status.download()[0] == 0);
    const auto so = slot_of.download();
    std::vector<std::int32_t> table(static_cast<std::size_t>(kv_heads) * pages);
    for (int g = 0; g < kv_heads; ++g)
      for (int p = 0; p < pages; ++p) {
        const std::uint32_t s = so[static_cast<std::size_t>(g) * pages + p];
        table[static_cast<std::size_t>(g) * pages + p] = s == ~0u ? poison : g * slots + int(s);
      }
    device_buffer<std::int32_t> d_table(table);
    const kvsift::cuda::paged_kv_ref<float> kv{dk.get(), dv.get(),      dev_pages, page,
                                               d,        d_table.get(), kv_heads,  pages};
    device_buffer<float> d_q(q), d_o(q.size()), d_lse(qo_heads);
    device_buffer<std::int64_t> d_indptr(indptr);
    device_buffer<std::int32_t> d_ids(ids);
    kvsift::cuda::sparse_attention<float>(d_q.get(), qo_heads, d, kv, d_indptr.get(), d_ids.get(),
                                          d_o.get(), d_lse.get(), ws.get(), ws_bytes, nullptr, ap);
    KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(att_status.download()[0] == 0);
    const auto o = d_o.download();
    const auto lse = d_lse.download();
    // Dense attention over the same ids from the full host K/V, in double.
    const auto [ref_o, ref_lse] = attention_reference(
        q, k_host.data(), v_host.data(), tokens, d, group, indptr, ids, 1.0 / std::sqrt(double(d)));
    for (int h = 0; h < qo_heads; ++h) {
      bad += !(std::fabs(lse[h] - ref_lse[h]) <= 1e-5 * (1.0 + std::fabs(ref_lse[h])));
      for (int j = 0; j < d; ++j) {
        const std::size_t at = static_cast<std::size_t>(h) * d + j;
        bad += !(std::fabs(o[at] - ref_o[at]) <= 1e-5);
      }
    }
  }
  CHECK(bad == 0);
  // The trace exercises the policy: pages are reused, missed and evicted.
  INFO("hits " << hits << " misses " << misses << " evictions " << evictions);
  CHECK(hits > 100);
  CHECK(misses > 100);
  CHECK(evictions > 50);
}
