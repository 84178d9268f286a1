// Benchmark of offloaded_attention (kvsift/cuda/offloaded_attention.cuh): retrieved tokens paged
// in from pinned host memory as the bucketed LRU decides, then attended, per decode step of one
// layer, CUDA events.
//
// Build and run from the repository root:
// clang-format off
//   nvcc -arch=sm_90 -std=c++20 -O3 -I include -I cuda/include bench/cuda/offloaded_attention_bench.cu -o offloaded_attention_bench
//   ./offloaded_attention_bench [--requests 16] [--tokens 32768] [--slots 1024] [--k 100] [--reuse 0.8] [--budget PAGES]
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
// and the paging overhead (offloaded - resident) against the bulk copy of the same bytes, and
// the same offloaded steps with per-pair limits given (all equal to the slots: the cost of
// reading them).
//
// --budget PAGES: buffer elasticity against a uniform split of PAGES device pages over the
// pairs, same trace, same run. Request r's demand bursts (2k ids per head for 8 steps from step
// 3r, k / 2 otherwise), so a fixed share either wastes pages or refuses a bursting pair; the
// elastic arm gives each request its pairs' distinct pages plus a share of the buffer
// (`buffer_elasticity`, `pair_page_limits`) and the LRU honours the per-pair limits.

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
#include <kvsift/memory/buffer_elasticity.hpp>

#include "bench_util.cuh"

namespace {

namespace kc = kvsift::cuda;
using kvsift::cuda_bench::event_ms;
using kvsift::cuda_bench::median_ms;

constexpr int kv_heads = 8, group = 4, d = 128, page = 16, buckets = 64;

template <class T>
T* device_alloc(std::size_t n) {
  T* p = nullptr;
  KVSIFT_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
  return p;
}

float median(std::vector<float> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t requests = 16, tokens = 32768, slots = 1024, k = 100, steps = 40, budget = 0;
  double reuse = 0.8;
  kvsift::cuda_bench::parse_options(
      argc, argv,
      {kvsift::cuda_bench::size_option("--requests", requests),
       kvsift::cuda_bench::size_option("--tokens", tokens),
       kvsift::cuda_bench::size_option("--slots", slots), kvsift::cuda_bench::size_option("--k", k),
       kvsift::cuda_bench::size_option("--steps", steps),
       kvsift::cuda_bench::size_option("--budget", budget),
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

  // The retrieval trace: per step and head, k ids (with --budget, request r's k changes over
  // time, below), `reuse` of them from the previous step where it had them.
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(tokens) - 1);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  auto k_of = [&](std::size_t st, std::size_t head) {
    if (budget == 0) return k;
    // Staggered bursts: request r retrieves 2k for 8 steps starting at step 3r (mod steps),
    // k / 2 otherwise (DIPR-like budgets that follow the query, not a fixed k).
    const std::size_t r = head / (kv_heads * group);
    return (st + steps - (3 * r) % steps) % steps < 8 ? 2 * k : k / 2;
  };
  std::vector<std::vector<std::int32_t>> trace(steps);
  std::vector<std::vector<std::int64_t>> indptr(steps, std::vector<std::int64_t>(heads + 1, 0));
  for (std::size_t st = 0; st < steps; ++st) {
    for (std::size_t h = 0; h < heads; ++h) {
      const std::size_t n = k_of(st, h);
      for (std::size_t j = 0; j < n; ++j) {
        const std::size_t prev_n =
            st > 0 ? std::size_t(indptr[st - 1][h + 1] - indptr[st - 1][h]) : 0;
        const bool again = j < prev_n && coin(rng) < reuse;
        trace[st].push_back(again ? trace[st - 1][std::size_t(indptr[st - 1][h]) + j] : tok(rng));
      }
      indptr[st][h + 1] = static_cast<std::int64_t>(trace[st].size());
    }
  }
  std::size_t max_ids = 0;
  for (const auto& t : trace) max_ids = std::max(max_ids, t.size());
  auto* d_indptr = device_alloc<std::int64_t>(steps * (heads + 1));
  auto* d_ids = device_alloc<std::int32_t>(steps * max_ids);
  for (std::size_t st = 0; st < steps; ++st) {
    KVSIFT_CUDA_CHECK(cudaMemcpy(d_indptr + st * (heads + 1), indptr[st].data(), (heads + 1) * 8,
                                 cudaMemcpyHostToDevice));
    KVSIFT_CUDA_CHECK(cudaMemcpy(d_ids + st * max_ids, trace[st].data(), trace[st].size() * 4,
                                 cudaMemcpyHostToDevice));
  }
  // Each pair's selection (pages, in order) and its distinct pages, per step.
  std::vector<std::vector<std::vector<kvsift::id_t>>> sel(
      steps, std::vector<std::vector<kvsift::id_t>>(pairs));
  std::vector<std::vector<std::size_t>> distinct_of(steps, std::vector<std::size_t>(pairs));
  for (std::size_t st = 0; st < steps; ++st) {
    for (std::size_t p = 0; p < pairs; ++p) {
      for (auto i = indptr[st][p * group]; i < indptr[st][(p + 1) * group]; ++i) {
        sel[st][p].push_back(static_cast<kvsift::id_t>(trace[st][std::size_t(i)] / page));
      }
      std::vector<kvsift::id_t> u = sel[st][p];
      std::sort(u.begin(), u.end());
      distinct_of[st][p] = std::size_t(std::unique(u.begin(), u.end()) - u.begin());
    }
  }

  auto* q = device_alloc<float>(heads * d);
  std::vector<float> hq(heads * d);
  for (auto& x : hq) x = static_cast<float>(coin(rng) - 0.5);
  KVSIFT_CUDA_CHECK(cudaMemcpy(q, hq.data(), heads * d * 4, cudaMemcpyHostToDevice));
  auto* o = device_alloc<float>(heads * d);
  auto* lse = device_alloc<float>(heads);
  const std::size_t ws_bytes = kc::offloaded_attention_workspace_size(kv, int(heads), max_ids);
  auto* ws = device_alloc<unsigned char>(ws_bytes);
  auto* status = device_alloc<int>(1);
  std::uint32_t* limits = nullptr;  // pinned: the kernel reads this step's limits directly
  KVSIFT_CUDA_CHECK(cudaMallocHost(&limits, pairs * sizeof(std::uint32_t)));

  // One arm: the whole trace from an empty device tier, with per-pair limits from
  // `limits_of(step)` (empty: none). Times from CUDA events; pages moved, hits and refused
  // pairs from the CPU twin of the policy with the same limits (the GPU's steps equal it,
  // tests/cuda/memory_lru_test.cu).
  struct arm_result {
    std::vector<float> ms;
    std::vector<std::size_t> admitted, hits, distinct;
    std::size_t refused = 0, max_held = 0;
    int status = 0;
  };
  auto run_arm = [&](const std::function<std::vector<std::uint32_t>(std::size_t)>& limits_of) {
    arm_result a;
    kc::offloaded_reset(kv, s);
    KVSIFT_CUDA_CHECK(cudaMemset(status, 0, 4));
    std::vector<kvsift::bucketed_lru<buckets>> twin(pairs,
                                                    kvsift::bucketed_lru<buckets>(slots, pages));
    for (std::size_t st = 0; st < steps; ++st) {
      const std::vector<std::uint32_t> lim = limits_of(st);
      kv.lru.limits = lim.empty() ? nullptr : limits;
      std::copy(lim.begin(), lim.end(), limits);
      a.ms.push_back(event_ms(s, [&] {
        kc::offloaded_attention<__half>(kv, q, int(heads), d_indptr + st * (heads + 1),
                                        d_ids + st * max_ids, trace[st].size(), o, lse, ws,
                                        ws_bytes, s, {}, status);
      }));
      std::size_t adm = 0, hit = 0, dist = 0, held = 0;
      for (std::size_t p = 0; p < pairs; ++p) {
        kvsift::replacement_step r;
        try {
          if (!lim.empty()) twin[p].set_limit(lim[p]);
          twin[p].step(sel[st][p], r);
        } catch (const kvsift::invalid_argument&) {
          ++a.refused;  // the GPU skips the pair too (status bit 2): its heads read the guard
        }
        adm += r.admitted_keys.size();
        hit += r.hits;
        dist += distinct_of[st][p];
        held += twin[p].resident();
      }
      a.admitted.push_back(adm);
      a.hits.push_back(hit);
      a.distinct.push_back(dist);
      a.max_held = std::max(a.max_held, held);
    }
    KVSIFT_CUDA_CHECK(cudaMemcpy(&a.status, status, 4, cudaMemcpyDeviceToHost));
    kv.lru.limits = nullptr;
    return a;
  };
  auto median_after_first = [](const auto& v) {
    std::vector<double> w(v.begin() + 1, v.end());
    std::nth_element(w.begin(), w.begin() + w.size() / 2, w.end());
    return w[w.size() / 2];
  };
  auto hit_rate = [](const arm_result& a) {
    double h = 0;
    for (std::size_t st = 1; st < a.hits.size(); ++st)
      h += double(a.hits[st]) / double(a.distinct[st]);
    return h / double(a.hits.size() - 1);
  };

  if (budget > 0) {
    // Elasticity against a uniform split of the same device pages, same trace, same run.
    std::size_t peak = 0;
    for (std::size_t st = 0; st < steps; ++st) {
      peak = std::max(
          peak, std::accumulate(distinct_of[st].begin(), distinct_of[st].end(), std::size_t{0}));
    }
    std::printf(
        "# budget %zu device pages for all pairs (%.1f MB K+V); peak demand of a step "
        "%zu distinct pages; slots per pair %zu\n",
        budget, 2.0 * budget * page_bytes / 1e6, peak, slots);
    const auto uniform_limit = static_cast<std::uint32_t>(std::min(budget / pairs, slots));
    const arm_result uni =
        run_arm([&](std::size_t) { return std::vector<std::uint32_t>(pairs, uniform_limit); });
    if (peak > budget) {
      std::printf("the budget is below the peak demand: every arm would refuse pairs\n");
      return 2;
    }
    kvsift::buffer_elasticity elastic(budget);
    std::vector<std::uint64_t> ids(requests);
    std::iota(ids.begin(), ids.end(), std::uint64_t{0});
    for (std::uint64_t r = 0; r < requests; ++r) elastic.admit(r, tokens, 0, budget / requests);
    const arm_result ela = run_arm([&](std::size_t st) {
      // Each step: a request's mandatory pages are its pairs' distinct pages (what a CPU
      // search's ids name), the free pages go back out as buffers, and the limits follow.
      std::vector<kvsift::reclaimed_pages> moved;
      for (std::uint64_t r = 0; r < requests; ++r) {
        std::size_t m = 0;
        for (std::size_t h = 0; h < kv_heads; ++h) m += distinct_of[st][r * kv_heads + h];
        elastic.set_mandatory(r, tokens, m, moved);
      }
      elastic.distribute_free(moved);
      std::vector<std::uint32_t> lim(pairs);
      kvsift::pair_page_limits(elastic, ids, distinct_of[st], lim);
      for (auto& l : lim) l = std::min<std::uint32_t>(l, static_cast<std::uint32_t>(slots));
      return lim;
    });
    std::printf(
        "| arm | step (median of 2..%zu) | pages in / step | page hit rate | pairs "
        "refused (over their limit) | most pages held | status |\n|---|---|---|---|---|"
        "---|---|\n",
        steps);
    for (const auto* a : {&uni, &ela}) {
      std::printf("| %s | %.3f ms | %.0f | %.3f | %zu of %zu | %zu | %d |\n",
                  a == &uni ? "uniform split" : "buffer elasticity", median_after_first(a->ms),
                  median_after_first(a->admitted), hit_rate(*a), a->refused, pairs * steps,
                  a->max_held, a->status);
    }
    return 0;
  }

  // Without a budget: every pair may fill its slots; the same arm with explicit limits equal
  // to the capacity measures what reading the limits costs.
  const arm_result free_arm = run_arm([](std::size_t) { return std::vector<std::uint32_t>{}; });
  const arm_result capped = run_arm([&](std::size_t) {
    return std::vector<std::uint32_t>(pairs, static_cast<std::uint32_t>(slots));
  });
  const std::vector<float>& offloaded = free_arm.ms;
  const std::vector<std::size_t>& admitted = free_arm.admitted;
  const int h_status = free_arm.status | capped.status;

  // Baselines: the same ids over resident K/V, full attention, and the copy limit.
  const kc::paged_kv_ref<__half> resident{
      all_k, all_v, std::int64_t(host_pages), page, d, d_identity, int(pairs), int(pages)};
  const std::size_t att_ws = kc::sparse_attention_workspace_size(int(heads), d);
  auto* aws = att_ws > 0 ? device_alloc<unsigned char>(att_ws) : nullptr;
  std::vector<float> resident_ms(steps);
  for (std::size_t st = 0; st < steps; ++st) {
    resident_ms[st] = event_ms(s, [&] {
      kc::sparse_attention<__half>(q, int(heads), d, resident, d_indptr + st * (heads + 1),
                                   d_ids + st * max_ids, o, lse, aws, att_ws, s);
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

  std::vector<float> warm_resident(resident_ms.begin() + 1, resident_ms.end());
  const auto median_pages = static_cast<std::size_t>(median_after_first(admitted));
  const std::size_t moved = median_pages * page_bytes * 2;  // K and V
  const float bulk_ms = median_ms(
      [&](cudaStream_t st) {
        KVSIFT_CUDA_CHECK(cudaMemcpyAsync(all_k, hk, moved, cudaMemcpyHostToDevice, st));
      },
      s, 2, 20);
  const auto off_ms = static_cast<float>(median_after_first(offloaded));
  const float res_ms = median(warm_resident);
  std::printf("status word %d (0 = every page in, every id valid)\n", h_status);
  std::printf("| measure | value |\n|---|---|\n");
  std::printf("| first step (cold: every selected page comes in) | %.3f ms, %zu pages |\n",
              offloaded[0], admitted[0]);
  std::printf("| offloaded step, median of steps 2..%zu | %.3f ms |\n", steps, off_ms);
  std::printf("| same, per-pair limits given (all = slots) | %.3f ms (%.3fx) |\n",
              median_after_first(capped.ms), median_after_first(capped.ms) / off_ms);
  std::printf("| pages admitted per step (median) / page hit rate | %zu (%.1f MB K+V) / %.3f |\n",
              median_pages, moved / 1e6, hit_rate(free_arm));
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
