// Benchmark of offloaded_attention (kvsift/cuda/offloaded_attention.cuh): retrieved tokens paged
// in from pinned host memory as the bucketed LRU decides, then attended, per decode step of one
// layer, CUDA events.
//
// Build and run from the repository root:
// clang-format off
//   nvcc -arch=sm_90 -std=c++20 -O3 -I include -I cuda/include bench/cuda/offloaded_attention_bench.cu -o offloaded_attention_bench
//   ./offloaded_attention_bench [--requests 16] [--tokens 32768] [--slots 1024] [--k 100] [--reuse 0.8]
// clang-format on
//
// B requests x 8 KV heads (pairs), 32 query heads per request (GQA 4), head dim 128, f16, pages
// of 16 tokens; every pair's K/V lives in a pinned host tier, `slots` pages per pair fit on the
// device. Each step every query head retrieves k token ids; a fraction `reuse` of them repeat
// the head's previous step (decode queries drift slowly), the rest are new random tokens. All
// in one run:
//   offloaded   offloaded_attention per step (selection, LRU, table, gather of the admitted
//               pages, attention), median over the steps after the first (the cold fill)
//   resident    sparse_attention over the same ids with every token already on the device
//               (what the step costs without offloading; the GPU would need the whole cache)
//   full        sparse_attention over every token of every pair (full attention, resident)
//   bulk copy   one cudaMemcpyAsync of the median step's admitted bytes (the copy limit)
// and the paging overhead (offloaded - resident) against the bulk copy of the same bytes.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include <kvsift/cuda/offloaded_attention.cuh>
#include <kvsift/memory/bucketed_lru.hpp>

#include "bench_util.cuh"

namespace {

namespace kc = kvsift::cuda;
using kvsift::cuda_bench::median_ms;

constexpr int kv_heads = 8, group = 4, d = 128, page = 16, buckets = 64;

template <class T>
T* device_alloc(std::size_t n) {
  T* p = nullptr;
  KVSIFT_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
  return p;
}

float event_ms(cudaStream_t s, const std::function<void()>& f) {
  cudaEvent_t a, b;
  KVSIFT_CUDA_CHECK(cudaEventCreate(&a));
  KVSIFT_CUDA_CHECK(cudaEventCreate(&b));
  KVSIFT_CUDA_CHECK(cudaEventRecord(a, s));
  f();
  KVSIFT_CUDA_CHECK(cudaEventRecord(b, s));
  KVSIFT_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  KVSIFT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  KVSIFT_CUDA_CHECK(cudaEventDestroy(a));
  KVSIFT_CUDA_CHECK(cudaEventDestroy(b));
  return ms;
}

float median(std::vector<float> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t requests = 16, tokens = 32768, slots = 1024, k = 100, steps = 40;
  double reuse = 0.8;
  kvsift::cuda_bench::parse_options(
      argc, argv,
      {kvsift::cuda_bench::size_option("--requests", requests),
       kvsift::cuda_bench::size_option("--tokens", tokens),
       kvsift::cuda_bench::size_option("--slots", slots), kvsift::cuda_bench::size_option("--k", k),
       kvsift::cuda_bench::size_option("--steps", steps),
       kvsift::cuda_bench::double_option("--reuse", reuse)});
  kvsift::cuda_bench::bench_setup setup;
  if (!kvsift::cuda_bench::start_bench(setup)) return 0;
  cudaStream_t s = setup.stream;
  const std::size_t pairs = requests * kv_heads, heads = pairs * group, pages = tokens / page;
  const std::size_t page_elems = std::size_t{page} * d, page_bytes = page_elems * sizeof(__half);
  const std::size_t host_pages = pairs * pages, dev_pages = pairs * slots + 1;
  std::printf(
      "# offloaded_attention: %zu requests x %d KV heads = %zu pairs, %zu query heads, "
      "%zu tokens per pair, head dim %d, f16, pages of %d tokens (%zu B), %zu device "
      "slots per pair, top-%zu per head, reuse %.2f, %zu steps\n",
      requests, kv_heads, pairs, heads, tokens, d, page, page_bytes, slots, k, reuse, steps);

  // Host tier (pinned): K and V, logical page p of pair i at host page i * pages + p. Values
  // are a fixed pattern (speed only); the device copies of everything for the baselines.
  __half* hk = nullptr;
  __half* hv = nullptr;
  KVSIFT_CUDA_CHECK(cudaMallocHost(&hk, host_pages * page_bytes));
  KVSIFT_CUDA_CHECK(cudaMallocHost(&hv, host_pages * page_bytes));
  for (std::size_t i = 0; i < host_pages * page_elems; ++i) {
    hk[i] = __float2half(static_cast<float>(i % 13) * 0.01f);
    hv[i] = __float2half(static_cast<float>(i % 7) * 0.1f);
  }
  auto* all_k = device_alloc<__half>(host_pages * page_elems);
  auto* all_v = device_alloc<__half>(host_pages * page_elems);
  KVSIFT_CUDA_CHECK(cudaMemcpy(all_k, hk, host_pages * page_bytes, cudaMemcpyHostToDevice));
  KVSIFT_CUDA_CHECK(cudaMemcpy(all_v, hv, host_pages * page_bytes, cudaMemcpyHostToDevice));
  std::vector<std::int32_t> identity(host_pages);
  std::iota(identity.begin(), identity.end(), 0);
  auto* d_identity = device_alloc<std::int32_t>(host_pages);
  KVSIFT_CUDA_CHECK(
      cudaMemcpy(d_identity, identity.data(), host_pages * 4, cudaMemcpyHostToDevice));
  std::vector<std::uint64_t> host_page(host_pages);
  std::iota(host_page.begin(), host_page.end(), std::uint64_t{0});

  // Device tier and state.
  kc::offloaded_kv_ref kv;
  kv.lru = {device_alloc<std::uint32_t>(pairs * slots), device_alloc<std::uint8_t>(pairs * slots),
            device_alloc<std::uint32_t>(pairs * pages), static_cast<std::uint32_t>(pairs),
            static_cast<std::uint32_t>(slots),          static_cast<std::uint32_t>(pages)};
  kv.page_table = device_alloc<std::int32_t>(pairs * pages);
  auto* d_host_page = device_alloc<std::uint64_t>(host_pages);
  KVSIFT_CUDA_CHECK(
      cudaMemcpy(d_host_page, host_page.data(), host_pages * 8, cudaMemcpyHostToDevice));
  kv.host_page = d_host_page;
  auto* dk = device_alloc<__half>(dev_pages * page_elems);
  auto* dv = device_alloc<__half>(dev_pages * page_elems);
  kv.k_pools = {hk, host_pages, dk, dev_pages, page_bytes};
  kv.v_pools = {hv, host_pages, dv, dev_pages, page_bytes};
  kv.page_size = page;
  kv.head_dim = d;
  kc::offloaded_reset(kv, s);

  // The retrieval trace: per step and head, k ids, `reuse` of them from the previous step.
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(tokens) - 1);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  std::vector<std::vector<std::int32_t>> trace(steps, std::vector<std::int32_t>(heads * k));
  for (std::size_t st = 0; st < steps; ++st) {
    for (std::size_t i = 0; i < heads * k; ++i) {
      trace[st][i] = st > 0 && coin(rng) < reuse ? trace[st - 1][i] : tok(rng);
    }
  }
  std::vector<std::int64_t> indptr(heads + 1);
  for (std::size_t h = 0; h <= heads; ++h) indptr[h] = static_cast<std::int64_t>(h * k);
  auto* d_indptr = device_alloc<std::int64_t>(heads + 1);
  KVSIFT_CUDA_CHECK(cudaMemcpy(d_indptr, indptr.data(), (heads + 1) * 8, cudaMemcpyHostToDevice));
  auto* d_ids = device_alloc<std::int32_t>(steps * heads * k);
  for (std::size_t st = 0; st < steps; ++st) {
    KVSIFT_CUDA_CHECK(cudaMemcpy(d_ids + st * heads * k, trace[st].data(), heads * k * 4,
                                 cudaMemcpyHostToDevice));
  }
  // Pages admitted per step, from the CPU twin of the policy (the GPU's equals it).
  std::vector<kvsift::bucketed_lru<buckets>> twin(pairs,
                                                  kvsift::bucketed_lru<buckets>(slots, pages));
  std::vector<std::size_t> admitted(steps, 0), hits(steps, 0), distinct(steps, 0);
  for (std::size_t st = 0; st < steps; ++st) {
    for (std::size_t p = 0; p < pairs; ++p) {
      std::vector<kvsift::id_t> sel;
      for (std::size_t i = p * group * k; i < (p + 1) * group * k; ++i) {
        sel.push_back(static_cast<kvsift::id_t>(trace[st][i] / page));
      }
      kvsift::replacement_step r;
      twin[p].step(sel, r);
      admitted[st] += r.admitted_keys.size();
      hits[st] += r.hits;
      distinct[st] += r.hits + r.admitted_keys.size();
    }
  }

  auto* q = device_alloc<float>(heads * d);
  std::vector<float> hq(heads * d);
  for (auto& x : hq) x = static_cast<float>(coin(rng) - 0.5);
  KVSIFT_CUDA_CHECK(cudaMemcpy(q, hq.data(), heads * d * 4, cudaMemcpyHostToDevice));
  auto* o = device_alloc<float>(heads * d);
  auto* lse = device_alloc<float>(heads);
  const std::size_t ws_bytes = kc::offloaded_attention_workspace_size(kv, int(heads), heads * k);
  auto* ws = device_alloc<unsigned char>(ws_bytes);
  auto* status = device_alloc<int>(1);
  KVSIFT_CUDA_CHECK(cudaMemset(status, 0, 4));

  std::vector<float> offloaded(steps);
  for (std::size_t st = 0; st < steps; ++st) {
    offloaded[st] = event_ms(s, [&] {
      kc::offloaded_attention<__half>(kv, q, int(heads), d_indptr, d_ids + st * heads * k,
                                      heads * k, o, lse, ws, ws_bytes, s, {}, status);
    });
  }
  int h_status = 0;
  KVSIFT_CUDA_CHECK(cudaMemcpy(&h_status, status, 4, cudaMemcpyDeviceToHost));

  // Baselines: the same ids over resident K/V, full attention, and the copy limit.
  const kc::paged_kv_ref<__half> resident{
      all_k, all_v, std::int64_t(host_pages), page, d, d_identity, int(pairs), int(pages)};
  const std::size_t att_ws = kc::sparse_attention_workspace_size(int(heads), d);
  auto* aws = att_ws > 0 ? device_alloc<unsigned char>(att_ws) : nullptr;
  std::vector<float> resident_ms(steps);
  for (std::size_t st = 0; st < steps; ++st) {
    resident_ms[st] = event_ms(s, [&] {
      kc::sparse_attention<__half>(q, int(heads), d, resident, d_indptr, d_ids + st * heads * k, o,
                                   lse, aws, att_ws, s);
    });
  }
  std::vector<std::int64_t> all_indptr(heads + 1);
  for (std::size_t h = 0; h <= heads; ++h) all_indptr[h] = static_cast<std::int64_t>(h * tokens);
  std::vector<std::int32_t> all_ids(heads * tokens);
  for (std::size_t i = 0; i < all_ids.size(); ++i) all_ids[i] = std::int32_t(i % tokens);
  auto* d_all_indptr = device_alloc<std::int64_t>(heads + 1);
  auto* d_all_ids = device_alloc<std::int32_t>(all_ids.size());
  KVSIFT_CUDA_CHECK(
      cudaMemcpy(d_all_indptr, all_indptr.data(), (heads + 1) * 8, cudaMemcpyHostToDevice));
  KVSIFT_CUDA_CHECK(
      cudaMemcpy(d_all_ids, all_ids.data(), all_ids.size() * 4, cudaMemcpyHostToDevice));
  const float full_ms = median_ms(
      [&](cudaStream_t st) {
        kc::sparse_attention<__half>(q, int(heads), d, resident, d_all_indptr, d_all_ids, o, lse,
                                     aws, att_ws, st);
      },
      s, 2, 10);

  std::vector<float> warm(offloaded.begin() + 1, offloaded.end());
  std::vector<float> warm_resident(resident_ms.begin() + 1, resident_ms.end());
  std::vector<std::size_t> adm(admitted.begin() + 1, admitted.end());
  std::nth_element(adm.begin(), adm.begin() + adm.size() / 2, adm.end());
  const std::size_t median_pages = adm[adm.size() / 2];
  const std::size_t moved = median_pages * page_bytes * 2;  // K and V
  const float bulk_ms = median_ms(
      [&](cudaStream_t st) {
        KVSIFT_CUDA_CHECK(cudaMemcpyAsync(all_k, hk, moved, cudaMemcpyHostToDevice, st));
      },
      s, 2, 20);
  double hit_rate = 0;
  for (std::size_t st = 1; st < steps; ++st) hit_rate += double(hits[st]) / double(distinct[st]);
  hit_rate /= double(steps - 1);
  const float off_ms = median(warm), res_ms = median(warm_resident);
  std::printf("status word %d (0 = every page in, every id valid)\n", h_status);
  std::printf("| measure | value |\n|---|---|\n");
  std::printf("| first step (cold: every selected page comes in) | %.3f ms, %zu pages |\n",
              offloaded[0], admitted[0]);
  std::printf("| offloaded step, median of steps 2..%zu | %.3f ms |\n", steps, off_ms);
  std::printf("| pages admitted per step (median) / page hit rate | %zu (%.1f MB K+V) / %.3f |\n",
              median_pages, moved / 1e6, hit_rate);
  std::printf("| resident: same ids, every token on the device | %.3f ms |\n", res_ms);
  std::printf("| full attention over every token, resident | %.3f ms |\n", full_ms);
  std::printf("| bulk pinned->device copy of the median step's bytes | %.3f ms (%.1f GB/s) |\n",
              bulk_ms, moved / (bulk_ms * 1e-3) / 1e9);
  std::printf("| paging overhead (offloaded - resident) | %.3f ms = %.2fx the bulk copy |\n",
              off_ms - res_ms, (off_ms - res_ms) / bulk_ms);
  std::printf("| device memory for K/V: offloaded / resident | %.1f MB / %.1f MB |\n",
              2.0 * dev_pages * page_bytes / 1e6, 2.0 * host_pages * page_bytes / 1e6);
  return h_status == 0 ? 0 : 1;
}
