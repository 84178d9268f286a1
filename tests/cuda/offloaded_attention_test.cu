// offloaded_attention: the paging of retrieved tokens from a pinned host tier into a small
// device tier, chained on the device (selection -> bucketed LRU -> table and copy list -> warp
// gather -> paged sparse_attention) in one call, against a double-precision attention over the
// same ids read from the full host K/V. 2 requests x 2 KV heads (4 pairs), GQA 2; host pages in
// a shuffled order (the host page map is used, not assumed); the device tier starts as NaN, so
// a page the chain fails to bring in, or a table entry that lags the LRU, cannot pass unnoticed.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include <kvsift/cuda/offloaded_attention.cuh>
#include <kvsift/memory/bucketed_lru.hpp>
#include <kvsift/memory/buffer_elasticity.hpp>

#include "cuda_test.cuh"
#include "test_util.cuh"

namespace {

using namespace kvsift::cuda_test;
namespace kc = kvsift::cuda;

constexpr int requests = 2, kv_heads = 2, pairs = requests * kv_heads, group = 2;
constexpr int qo_heads = pairs * group, d = 64, page = 16, tokens = 1024, pages = tokens / page;
constexpr int buckets = 8, topk = 12;

/// A layer's offloaded K/V: the full K/V token-major per pair ([pair][token][d]) on the host
/// for the oracle, the host tier (pinned, pages shuffled), the device tier and the LRU state.
struct offloaded_layer {
  int slots;
  std::vector<float> k_host, v_host;
  pinned_floats hk, hv;
  std::vector<std::uint64_t> host_page;  // [pair][page] -> host tier page
  device_buffer<std::uint64_t> d_host_page;
  device_buffer<float> dk, dv;
  device_buffer<std::uint32_t> keys, slot_of;
  device_buffer<std::uint8_t> ages;
  device_buffer<std::int32_t> table;
  kc::offloaded_kv_ref ref;

  explicit offloaded_layer(int slots_per_pair)
      : slots(slots_per_pair),
        k_host(std::size_t{pairs} * tokens * d),
        v_host(k_host.size()),
        hk(k_host.size()),
        hv(k_host.size()),
        host_page(std::size_t{pairs} * pages),
        d_host_page(host_page.size()),
        dk(std::vector<float>((std::size_t{pairs} * slots + 1) * page * d,
                              std::numeric_limits<float>::quiet_NaN())),
        dv(dk.size()),
        keys(std::size_t{pairs} * slots),
        slot_of(std::size_t{pairs} * pages),
        ages(std::size_t{pairs} * slots),
        table(std::size_t{pairs} * pages) {
    for (auto& x : k_host) x = uniform(-1.0f, 1.0f);
    for (auto& x : v_host) x = uniform(-1.0f, 1.0f);
    std::iota(host_page.begin(), host_page.end(), std::uint64_t{0});
    std::shuffle(host_page.begin(), host_page.end(), rng());
    const std::size_t page_floats = std::size_t{page} * d;
    for (std::size_t lp = 0; lp < host_page.size(); ++lp) {  // logical page -> its host page
      std::copy_n(&k_host[lp * page_floats], page_floats, hk.p + host_page[lp] * page_floats);
      std::copy_n(&v_host[lp * page_floats], page_floats, hv.p + host_page[lp] * page_floats);
    }
    KVSIFT_CUDA_CHECK(cudaMemcpy(d_host_page.get(), host_page.data(),
                                 host_page.size() * sizeof(std::uint64_t), cudaMemcpyHostToDevice));
    KVSIFT_CUDA_CHECK(
        cudaMemcpy(dv.get(), dk.get(), dk.size() * sizeof(float), cudaMemcpyDeviceToDevice));
    const std::uint64_t host_pages = host_page.size();
    const std::uint64_t dev_pages = std::uint64_t{pairs} * slots + 1;
    const std::uint64_t bytes = page_floats * sizeof(float);
    ref.lru = {keys.get(), ages.get(), slot_of.get(), pairs, static_cast<std::uint32_t>(slots),
               pages};
    ref.page_table = table.get();
    ref.host_page = d_host_page.get();
    ref.k_pools = {hk.p, host_pages, dk.get(), dev_pages, bytes};
    ref.v_pools = {hv.p, host_pages, dv.get(), dev_pages, bytes};
    ref.page_size = page;
    ref.head_dim = d;
    kc::offloaded_reset(ref, nullptr);
  }
};

/// Runs one call with indptr/ids in device memory (or pinned host memory, as a CPU search
/// would leave them); returns the status word and fills o / lse.
int run(offloaded_layer& L, const std::vector<float>& q, const std::vector<std::int64_t>& indptr,
        const std::vector<std::int32_t>& ids, std::size_t max_ids, bool pinned_lists,
        std::vector<float>& o, std::vector<float>& lse) {
  device_buffer<float> d_q(q), d_o(q.size()), d_lse(qo_heads);
  device_buffer<int> status(std::vector<int>{0}), attention_status(std::vector<int>{0});
  kc::offloaded_attention_params p;
  p.attention.status = attention_status.get();  // ids past the pages are checked, not read
  const std::size_t ws_bytes = kc::offloaded_attention_workspace_size(L.ref, qo_heads, max_ids, p);
  device_buffer<unsigned char> ws(ws_bytes);
  device_buffer<std::int64_t> d_indptr(indptr);
  device_buffer<std::int32_t> d_ids(ids.empty() ? std::vector<std::int32_t>{0} : ids);
  std::int64_t* p_indptr = nullptr;
  std::int32_t* p_ids = nullptr;
  if (pinned_lists) {
    KVSIFT_CUDA_CHECK(cudaMallocHost(&p_indptr, indptr.size() * sizeof(std::int64_t)));
    KVSIFT_CUDA_CHECK(cudaMallocHost(&p_ids, std::max<std::size_t>(ids.size(), 1) * 4));
    std::copy(indptr.begin(), indptr.end(), p_indptr);
    std::copy(ids.begin(), ids.end(), p_ids);
  }
  kc::offloaded_attention<float>(L.ref, d_q.get(), qo_heads,
                                 pinned_lists ? p_indptr : d_indptr.get(),
                                 pinned_lists ? p_ids : d_ids.get(), max_ids, d_o.get(),
                                 d_lse.get(), ws.get(), ws_bytes, nullptr, p, status.get());
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  if (pinned_lists) {
    cudaFreeHost(p_indptr);
    cudaFreeHost(p_ids);
  }
  o = d_o.download();
  lse = d_lse.download();
  return status.download()[0];
}

/// Mismatches of (o, lse) against the double oracle over the same ids.
std::size_t mismatches(const offloaded_layer& L, const std::vector<float>& q,
                       const std::vector<std::int64_t>& indptr,
                       const std::vector<std::int32_t>& ids, const std::vector<float>& o,
                       const std::vector<float>& lse) {
  const auto [ref_o, ref_lse] = attention_reference(q, L.k_host.data(), L.v_host.data(), tokens, d,
                                                    group, indptr, ids, 1.0 / std::sqrt(d));
  std::size_t bad = 0;
  for (int h = 0; h < qo_heads; ++h) {
    bad += !(std::fabs(lse[h] - ref_lse[h]) <= 1e-5 * (1.0 + std::fabs(ref_lse[h])));
    for (int j = 0; j < d; ++j) {
      const std::size_t at = static_cast<std::size_t>(h) * d + j;
      bad += !(std::fabs(o[at] - ref_o[at]) <= 1e-5);
    }
  }
  return bad;
}

/// The device table is the LRU's slot_of (resident -> pair * slots + slot, else the guard) and
/// every resident device page holds its host page's K and V.
std::size_t table_errors(const offloaded_layer& L) {
  const auto so = L.slot_of.download();
  const auto table = L.table.download();
  const auto dk = L.dk.download(), dv = L.dv.download();
  const int guard = pairs * L.slots;
  const std::size_t page_floats = std::size_t{page} * d;
  std::size_t bad = 0;
  for (std::size_t e = 0; e < so.size(); ++e) {
    const int pair = static_cast<int>(e / pages);
    const int want = so[e] == ~0u ? guard : pair * L.slots + static_cast<int>(so[e]);
    bad += table[e] != want;
    if (so[e] == ~0u) continue;
    const std::size_t dev = static_cast<std::size_t>(want) * page_floats;
    bad += !std::equal(dk.begin() + static_cast<std::ptrdiff_t>(dev),
                       dk.begin() + static_cast<std::ptrdiff_t>(dev + page_floats),
                       L.k_host.begin() + static_cast<std::ptrdiff_t>(e * page_floats));
    bad += !std::equal(dv.begin() + static_cast<std::ptrdiff_t>(dev),
                       dv.begin() + static_cast<std::ptrdiff_t>(dev + page_floats),
                       L.v_host.begin() + static_cast<std::ptrdiff_t>(e * page_floats));
  }
  return bad;
}

}  // namespace

TEST_CASE("offloaded_attention_pages_retrieved_tokens_in_and_equals_attention_over_them",
          "[cuda][offloaded]") {
  offloaded_layer L(2 * topk);  // a pair's two query heads select at most 24 pages
  std::vector<kvsift::bucketed_lru<buckets>> twin(
      pairs, kvsift::bucketed_lru<buckets>(static_cast<std::size_t>(L.slots), pages));
  std::size_t hits = 0, admitted = 0, evicted = 0, bad = 0, table_bad = 0;
  std::vector<float> q(static_cast<std::size_t>(qo_heads) * d), o, lse;
  for (int step = 0; step < 30; ++step) {
    if (step % 3 == 0) {
      for (auto& x : q) x = uniform(-1.5f, 1.5f);  // queries drift: a new one every 3 steps
    }
    std::vector<std::int64_t> indptr{0};
    std::vector<std::int32_t> ids;
    std::vector<std::vector<kvsift::id_t>> sel(pairs);
    for (int h = 0; h < qo_heads; ++h) {
      const auto got =
          exact_topk(L.k_host, h / group, tokens, d, &q[static_cast<std::size_t>(h) * d], topk);
      ids.insert(ids.end(), got.begin(), got.end());
      indptr.push_back(static_cast<std::int64_t>(ids.size()));
      for (auto t : got) sel[h / group].push_back(static_cast<kvsift::id_t>(t / page));
    }
    // Odd steps read the lists from pinned host memory (a CPU search's output, not copied).
    const int st = run(L, q, indptr, ids, ids.size(), step % 2 == 1, o, lse);
    CHECK(st == 0);
    bad += mismatches(L, q, indptr, ids, o, lse);
    table_bad += table_errors(L);
    // The CPU twin of the policy on the same trace: the same slot for every page.
    const auto so = L.slot_of.download();
    for (int p = 0; p < pairs; ++p) {
      kvsift::replacement_step r;
      twin[p].step(sel[p], r);
      hits += r.hits;
      admitted += r.admitted_keys.size();
      evicted += r.evicted_keys.size();
      for (int lp = 0; lp < pages; ++lp) {
        table_bad += so[static_cast<std::size_t>(p) * pages + lp] !=
                     twin[p].slot_of(static_cast<kvsift::id_t>(lp));
      }
    }
  }
  CHECK(bad == 0);
  CHECK(table_bad == 0);
  INFO("hits " << hits << " admitted " << admitted << " evicted " << evicted);
  CHECK(hits > 100);
  CHECK(admitted > 100);
  CHECK(evicted > 50);
}

TEST_CASE("offloaded_attention_honours_per_pair_limits_from_buffer_elasticity",
          "[cuda][offloaded]") {
  // Every page of a pair has a slot, but the pairs share 128 pages through buffer_elasticity: each
  // step every request's mandatory pages are its pairs' distinct pages, and the limits
  // (pair_page_limits, in pinned memory) follow the allocation. Request 0's demand doubles for a
  // while and takes request 1's buffering pages, whose pairs must evict down to their lowered
  // limits at the same step. The output stays exact, the device tier never holds more than the
  // budget, and the CPU twin with set_limit agrees slot for slot.
  offloaded_layer L(pages);
  std::uint32_t* limits = nullptr;
  KVSIFT_CUDA_CHECK(cudaMallocHost(&limits, pairs * sizeof(std::uint32_t)));
  L.ref.lru.limits = limits;
  constexpr std::size_t budget = 128;
  kvsift::buffer_elasticity elastic(budget);
  REQUIRE(elastic.admit(0, 4000, 0, 40));
  REQUIRE(elastic.admit(1, 2000, 0, 40));
  std::vector<kvsift::bucketed_lru<buckets>> twin(pairs,
                                                  kvsift::bucketed_lru<buckets>(pages, pages));
  std::vector<float> q(static_cast<std::size_t>(qo_heads) * d), o, lse;
  std::vector<kvsift::reclaimed_pages> taken;
  std::size_t bad = 0, table_bad = 0, shrink_evictions = 0, max_resident = 0;
  for (int step = 0; step < 24; ++step) {
    if (step % 3 == 0) {
      for (auto& x : q) x = uniform(-1.5f, 1.5f);
    }
    const int k_req0 = step >= 8 && step < 16 ? 3 * topk / 2 : topk;  // request 0's spike
    std::vector<std::int64_t> indptr{0};
    std::vector<std::int32_t> ids;
    std::vector<std::vector<kvsift::id_t>> sel(pairs);
    for (int h = 0; h < qo_heads; ++h) {
      const int pair = h / group;
      const auto got = exact_topk(L.k_host, pair, tokens, d, &q[static_cast<std::size_t>(h) * d],
                                  pair < kv_heads ? k_req0 : topk);
      ids.insert(ids.end(), got.begin(), got.end());
      indptr.push_back(static_cast<std::int64_t>(ids.size()));
      for (auto t : got) sel[pair].push_back(static_cast<kvsift::id_t>(t / page));
    }
    std::vector<std::size_t> mandatory(pairs);
    for (int p = 0; p < pairs; ++p) {
      mandatory[p] = std::set<kvsift::id_t>(sel[p].begin(), sel[p].end()).size();
    }
    for (std::uint64_t r = 0; r < requests; ++r) {
      elastic.set_mandatory(r, r == 0 ? 4000 : 2000,
                            mandatory[r * kv_heads] + mandatory[r * kv_heads + 1], taken);
    }
    std::vector<std::uint32_t> lim(pairs);
    kvsift::pair_page_limits(elastic, std::vector<std::uint64_t>{0, 1}, mandatory, lim);
    std::copy(lim.begin(), lim.end(), limits);
    CHECK(run(L, q, indptr, ids, ids.size(), step % 2 == 0, o, lse) == 0);
    bad += mismatches(L, q, indptr, ids, o, lse);
    table_bad += table_errors(L);
    const auto so = L.slot_of.download();
    std::size_t resident = 0;
    for (int p = 0; p < pairs; ++p) {
      kvsift::replacement_step r;
      const std::size_t before = twin[p].resident();
      twin[p].set_limit(lim[p]);
      twin[p].step(sel[p], r);
      if (before > lim[p]) shrink_evictions += r.evicted_keys.size();
      resident += twin[p].resident();
      for (int lp = 0; lp < pages; ++lp) {
        const auto s = so[static_cast<std::size_t>(p) * pages + lp];
        table_bad += s != twin[p].slot_of(static_cast<kvsift::id_t>(lp));
      }
    }
    CHECK(resident <= budget);
    max_resident = std::max(max_resident, resident);
  }
  // Every limit falls to 1 while each head selects one token: each pair evicts far more pages
  // than it selects (their list has its own capacity-sized range in the workspace), and the
  // table still follows the LRU.
  std::vector<std::int64_t> one{0};
  std::vector<std::int32_t> first;
  for (int h = 0; h < qo_heads; ++h) {
    first.push_back(3);
    one.push_back(h + 1);
  }
  std::fill(limits, limits + pairs, 1u);
  CHECK(run(L, q, one, first, first.size(), false, o, lse) == 0);
  CHECK(mismatches(L, q, one, first, o, lse) == 0);
  CHECK(table_errors(L) == 0);
  const auto so_one = L.slot_of.download();
  CHECK(std::count_if(so_one.begin(), so_one.end(), [](auto x) { return x != ~0u; }) == pairs);
  cudaFreeHost(limits);
  CHECK(bad == 0);
  CHECK(table_bad == 0);
  CHECK(shrink_evictions > 0);
  CHECK(max_resident > budget / 2);
}

TEST_CASE("offloaded_attention_with_every_token_is_full_attention", "[cuda][offloaded]") {
  offloaded_layer L(pages);  // the device tier holds every page
  std::vector<float> q(static_cast<std::size_t>(qo_heads) * d), o, lse;
  for (auto& x : q) x = uniform(-1.0f, 1.0f);
  std::vector<std::int64_t> indptr{0};
  std::vector<std::int32_t> ids;
  for (int h = 0; h < qo_heads; ++h) {
    for (int t = tokens - 1; t >= 0; --t) ids.push_back(t);  // any order
    indptr.push_back(static_cast<std::int64_t>(ids.size()));
  }
  CHECK(run(L, q, indptr, ids, ids.size(), false, o, lse) == 0);
  CHECK(mismatches(L, q, indptr, ids, o, lse) == 0);
  // A second step over the same tokens is all hits: nothing moves, the result is the same.
  std::vector<float> o2, lse2;
  CHECK(run(L, q, indptr, ids, ids.size(), false, o2, lse2) == 0);
  CHECK(o2 == o);
  CHECK(table_errors(L) == 0);
}

TEST_CASE("offloaded_attention_reports_bad_device_data_and_leaves_the_pair_unchanged",
          "[cuda][offloaded]") {
  offloaded_layer L(4);
  std::vector<float> q(static_cast<std::size_t>(qo_heads) * d, 0.5f), o, lse;
  // Head 0 (pair 0) names a token past the pair's pages; the other heads one page each.
  std::vector<std::int64_t> indptr{0};
  std::vector<std::int32_t> ids;
  for (int h = 0; h < qo_heads; ++h) {
    ids.push_back(h == 0 ? tokens + 5 : h * 3);
    indptr.push_back(static_cast<std::int64_t>(ids.size()));
  }
  CHECK(run(L, q, indptr, ids, ids.size(), false, o, lse) == kc::offloaded_page_out_of_range);
  const auto so = L.slot_of.download();
  CHECK(std::all_of(so.begin(), so.begin() + pages, [](auto s) { return s == ~0u; }));
  CHECK(std::count_if(so.begin() + pages, so.end(), [](auto s) { return s != ~0u; }) ==
        pairs - 1);  // pairs 1..3 each brought their page in
  CHECK(table_errors(L) == 0);
  // Pair 1 selects 5 distinct pages with 4 slots.
  indptr.assign(1, 0);
  ids.clear();
  for (int h = 0; h < qo_heads; ++h) {
    if (h == 2) {
      for (int pg = 0; pg < 5; ++pg) ids.push_back(pg * page);
    } else {
      ids.push_back(1);
    }
    indptr.push_back(static_cast<std::int64_t>(ids.size()));
  }
  CHECK(run(L, q, indptr, ids, ids.size(), false, o, lse) == kc::offloaded_over_capacity);
  CHECK(table_errors(L) == 0);
  // Fewer ids allowed than retrieved: only the first max_ids are paged in (here all of pair
  // 0's), the other pairs select nothing, and the bit says so.
  offloaded_layer N(4);
  indptr.assign(1, 0);
  ids.clear();
  for (int h = 0; h < qo_heads; ++h) {
    if (h == 0) {
      ids.insert(ids.end(), {5 * page, 6 * page + 3});
    } else {
      ids.push_back(h == 1 ? 7 * page : 3 * page);
    }
    indptr.push_back(static_cast<std::int64_t>(ids.size()));
  }
  CHECK(run(N, q, indptr, ids, 3, false, o, lse) == kc::offloaded_too_many_ids);
  const auto so_n = N.slot_of.download();
  for (int pg = 0; pg < pages; ++pg) {
    CHECK((so_n[pg] != ~0u) == (pg == 5 || pg == 6 || pg == 7));
  }
  CHECK(std::all_of(so_n.begin() + pages, so_n.end(), [](auto s) { return s == ~0u; }));
  CHECK(table_errors(N) == 0);
  // A host page map entry beyond the host tier: that copy is skipped and flagged.
  offloaded_layer M(4);
  const std::vector<std::uint64_t> broken(M.host_page.size(), M.host_page.size() + 7);
  KVSIFT_CUDA_CHECK(cudaMemcpy(M.d_host_page.get(), broken.data(),
                               broken.size() * sizeof(std::uint64_t), cudaMemcpyHostToDevice));
  std::vector<std::int64_t> one{0};
  std::vector<std::int32_t> t1;
  for (int h = 0; h < qo_heads; ++h) {
    t1.push_back(1);
    one.push_back(h + 1);
  }
  CHECK((run(M, q, one, t1, t1.size(), false, o, lse) & kc::offloaded_bad_copy) != 0);
  // A pair's limit above its capacity: that pair is skipped and flagged, the others proceed.
  offloaded_layer E(4);
  device_buffer<std::uint32_t> d_limits(std::vector<std::uint32_t>{4, 5, 2, 0});
  E.ref.lru.limits = d_limits.get();
  CHECK(run(E, q, one, t1, t1.size(), false, o, lse) ==
        (kc::offloaded_limit_out_of_range | kc::offloaded_over_capacity));  // pair 3: limit 0
  const auto so_e = E.slot_of.download();
  CHECK(so_e[1 * pages + 0] == ~0u);  // pair 1 (limit 5 > 4 slots) unchanged
  CHECK(so_e[3 * pages + 0] == ~0u);  // pair 3 (limit 0) refused its one page
  CHECK(so_e[0 * pages + 0] != ~0u);
  CHECK(so_e[2 * pages + 0] != ~0u);
  CHECK(table_errors(E) == 0);
}

TEST_CASE("offloaded_attention_refuses_bad_arguments_before_any_launch", "[cuda][offloaded]") {
  offloaded_layer L(8);
  device_buffer<float> q(std::size_t{qo_heads} * d), o(q.size()), lse(qo_heads);
  device_buffer<std::int64_t> indptr(std::vector<std::int64_t>(qo_heads + 1, 0));
  device_buffer<std::int32_t> ids(1);
  const std::size_t ws_bytes = kc::offloaded_attention_workspace_size(L.ref, qo_heads, 16);
  device_buffer<unsigned char> ws(ws_bytes);
  auto call = [&](const kc::offloaded_kv_ref& ref, int heads, std::size_t bytes,
                  kc::offloaded_attention_params p = {}) {
    return message_of([&] {
      kc::offloaded_attention<float>(ref, q.get(), heads, indptr.get(), ids.get(), 16, o.get(),
                                     lse.get(), ws.get(), bytes, nullptr, p);
    });
  };
  CHECK(contains(call(L.ref, qo_heads + 1, ws_bytes),
                 "expected num_qo_heads a positive multiple of the pairs (4), got 9"));
  CHECK(contains(call(L.ref, qo_heads, ws_bytes - 1), "is too small"));
  kc::offloaded_attention_params p;
  p.buckets = 1;
  CHECK(contains(call(L.ref, qo_heads, ws_bytes, p), "buckets must be in [2, 256], got 1"));
  auto wrong = L.ref;
  wrong.k_pools.page_bytes = 2048;
  CHECK(contains(call(wrong, qo_heads, ws_bytes), "page_bytes must be page_size * head_dim"));
  wrong = L.ref;
  wrong.v_pools.device_pages = std::uint64_t{pairs} * 8;  // no guard page
  CHECK(contains(call(wrong, qo_heads, ws_bytes), "must hold pairs * capacity + 1 = 33 pages"));
  wrong = L.ref;
  wrong.lru.capacity = 0;
  CHECK(contains(call(wrong, qo_heads, ws_bytes), "expected capacity in [1, 8192], got 0"));
  wrong = L.ref;
  wrong.head_dim = 32;
  CHECK(contains(call(wrong, qo_heads, ws_bytes), "head_dim must be 64, 128 or 256, got 32"));
  wrong = L.ref;
  wrong.page_table = nullptr;
  CHECK(contains(call(wrong, qo_heads, ws_bytes), "null page table"));
  // In half precision the same pools (float pages) are the wrong size.
  CHECK(contains(message_of([&] {
                   kc::offloaded_attention<__half>(L.ref, q.get(), qo_heads, indptr.get(),
                                                   ids.get(), 16, o.get(), lse.get(), ws.get(),
                                                   ws_bytes, nullptr);
                 }),
                 "got 4096"));
  CHECK(contains(message_of([&] {
                   (void)kc::offloaded_attention_workspace_size(L.ref, qo_heads,
                                                                std::size_t{1} << 41);
                 }),
                 "exceeds 2^40"));
  // offloaded_reset checks its memory too: a pageable host page table is refused.
  {
    std::vector<std::int32_t> host_table(4);
    auto on_host = L.ref;
    on_host.page_table = host_table.data();
    CHECK(contains(message_of([&] { kc::offloaded_reset(on_host, nullptr); }),
                   "offloaded_reset: page table must be device memory, got a host pointer"));
  }
  // Two GPUs: a stream of device 1, and this layer (device 0's) while device 1 is current.
  auto on = [&](cudaStream_t stream) {
    return message_of([&] {
      kc::offloaded_attention<float>(L.ref, q.get(), qo_heads, indptr.get(), ids.get(), 16, o.get(),
                                     lse.get(), ws.get(), ws_bytes, stream);
    });
  };
  const bool two = with_foreign_stream([&](cudaStream_t foreign) {
    CHECK(contains(on(foreign), "the stream belongs to device 1, expected the current device 0"));
    CHECK(contains(message_of([&] { kc::offloaded_reset(L.ref, foreign); }),
                   "the stream belongs to device 1"));
  });
  if (two) {
    KVSIFT_CUDA_CHECK(cudaSetDevice(1));
    const std::string m = on(nullptr);
    const std::string r = message_of([&] { kc::offloaded_reset(L.ref, nullptr); });
    KVSIFT_CUDA_CHECK(cudaSetDevice(0));
    INFO(m << " / " << r);
    CHECK(contains(m, "lives on device 0, expected the current device 1"));
    CHECK(contains(r, "lives on device 0, expected the current device 1"));
  }
  // Nothing ran: the LRU state is still empty.
  const auto so = L.slot_of.download();
  CHECK(std::all_of(so.begin(), so.end(), [](auto s) { return s == ~0u; }));
}
