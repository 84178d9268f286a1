// The CUDA bucketed LRU step against the CPU reference: identical hits, evictions and
// admissions (entry by entry) and identical slot/age state on the same multi-pair trace,
// including steps where a pair reports an error status and must stay unchanged.

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include <kvsift/cuda/bucketed_lru.cuh>
#include <kvsift/memory/bucketed_lru.hpp>

#include "cuda_test.cuh"
#include "test_util.cuh"

using kvsift::cuda_test::device_buffer;

namespace {

constexpr int buckets = 8;
using cpu_lru = kvsift::bucketed_lru<buckets>;

struct device_lru {
  device_buffer<std::uint32_t> keys, slot_of;
  device_buffer<std::uint8_t> ages;
  kvsift::cuda::bucketed_lru_ref ref;
  device_lru(std::uint32_t pairs, std::uint32_t capacity, std::uint32_t pages)
      : keys(std::vector<std::uint32_t>(std::size_t{pairs} * capacity, ~0u)),
        slot_of(std::vector<std::uint32_t>(std::size_t{pairs} * pages, ~0u)),
        ages(std::vector<std::uint8_t>(std::size_t{pairs} * capacity, 0)) {
    ref = {keys.get(), ages.get(), slot_of.get(), pairs, capacity, pages};
  }
};

}  // namespace

TEST_CASE("memory_bucketed_lru_matches_cpu", "[cuda][memory_lru]") {
  const std::uint32_t pairs = 7, capacity = 48, pages = 300;
  device_lru dev(pairs, capacity, pages);
  std::vector<cpu_lru> cpu(pairs, cpu_lru(capacity, pages));
  std::mt19937 rng(17);
  int compared_evictions = 0, error_steps = 0;
  for (int step = 0; step < 150; ++step) {
    std::vector<std::vector<std::uint32_t>> sel(pairs);
    std::vector<std::uint64_t> offsets{0};
    std::vector<std::uint32_t> flat;
    for (std::uint32_t p = 0; p < pairs; ++p) {
      const std::uint32_t n = p == 6 ? 0 : 8 + rng() % 30;  // pair 6: always empty
      const std::uint32_t base = (step / 5) * 7 + p * 13;
      for (std::uint32_t i = 0; i < n; ++i) {
        sel[p].push_back(rng() % 4 ? (base + rng() % 60) % pages : rng() % pages);
      }
      if (n > 0) sel[p].push_back(sel[p][0]);                     // a duplicate
      if (p == 3 && step % 17 == 5) sel[p].push_back(pages + 2);  // out of range
      if (p == 5 && step % 23 == 7) {                             // demand > capacity
        for (std::uint32_t i = 0; i < 60; ++i) sel[p].push_back(i);
      }
      flat.insert(flat.end(), sel[p].begin(), sel[p].end());
      offsets.push_back(flat.size());
    }
    device_buffer<std::uint32_t> d_sel(flat), ek(flat.size() + 1), es(flat.size() + 1),
        ak(flat.size() + 1), as(flat.size() + 1), counts(3 * pairs);
    device_buffer<std::uint64_t> d_off(offsets);
    device_buffer<int> status(std::vector<int>(pairs, -1));
    kvsift::cuda::lru_step_io io{d_sel.get(), d_off.get(), ek.get(),     es.get(),
                                 ak.get(),    as.get(),    counts.get(), status.get()};
    kvsift::cuda::bucketed_lru_step(dev.ref, io, buckets, nullptr);
    KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
    const auto h_st = status.download();
    const auto h_counts = counts.download();
    const auto h_ek = ek.download(), h_es = es.download(), h_ak = ak.download(),
               h_as = as.download();
    for (std::uint32_t p = 0; p < pairs; ++p) {
      kvsift::replacement_step ref;
      int expect = kvsift::cuda::lru_ok;
      try {
        cpu[p].step(sel[p], ref);
      } catch (const kvsift::out_of_range&) {
        expect = kvsift::cuda::lru_page_out_of_range;
      } catch (const kvsift::invalid_argument&) {
        expect = kvsift::cuda::lru_demand_exceeds_buffer;
      }
      CHECK(h_st[p] == expect);
      if (expect != kvsift::cuda::lru_ok) {
        ++error_steps;
        continue;
      }
      CHECK(h_counts[3 * p] == ref.hits);
      CHECK(h_counts[3 * p + 1] == ref.evicted_keys.size());
      CHECK(h_counts[3 * p + 2] == ref.admitted_keys.size());
      for (std::size_t i = 0; i < ref.evicted_keys.size(); ++i) {
        CHECK(h_ek[offsets[p] + i] == ref.evicted_keys[i]);
        CHECK(h_es[offsets[p] + i] == ref.evicted_slots[i]);
        ++compared_evictions;
      }
      for (std::size_t i = 0; i < ref.admitted_keys.size(); ++i) {
        CHECK(h_ak[offsets[p] + i] == ref.admitted_keys[i]);
        CHECK(h_as[offsets[p] + i] == ref.admitted_slots[i]);
      }
    }
    // Full state: slot contents and ages.
    const auto keys = dev.keys.download();
    const auto ages = dev.ages.download();
    for (std::uint32_t p = 0; p < pairs; ++p) {
      for (std::uint32_t s = 0; s < capacity; ++s) {
        CHECK(keys[p * capacity + s] == cpu[p].key_in(s));
        if (cpu[p].key_in(s) != kvsift::invalid_id)
          CHECK(ages[p * capacity + s] == cpu[p].age_of(s));
      }
    }
  }
  CHECK(compared_evictions > 500);  // the trace really exercised eviction
  CHECK(error_steps >= 10);
}

TEST_CASE("memory_bucketed_lru_per_pair_limits_match_cpu_set_limit", "[cuda][memory_lru]") {
  // Buffer elasticity's shares: every pair's limit moves each step (below what it holds, so
  // the step must evict the excess first, and back up), read from pinned memory as an engine
  // would leave them; pair 2 sometimes gets a limit above the capacity (refused, unchanged).
  const std::uint32_t pairs = 5, capacity = 40, pages = 200;
  device_lru dev(pairs, capacity, pages);
  std::uint32_t* limits = nullptr;
  KVSIFT_CUDA_CHECK(cudaMallocHost(&limits, pairs * sizeof(std::uint32_t)));
  dev.ref.limits = limits;
  std::vector<cpu_lru> cpu(pairs, cpu_lru(capacity, pages));
  std::mt19937 rng(29);
  int shrink_evictions = 0, refused = 0, over_limit = 0, more_than_selected = 0;
  for (int step = 0; step < 120; ++step) {
    std::vector<std::vector<std::uint32_t>> sel(pairs);
    std::vector<std::uint64_t> offsets{0};
    std::vector<std::uint32_t> flat;
    for (std::uint32_t p = 0; p < pairs; ++p) {
      const std::uint32_t n = 3 + rng() % 12;
      for (std::uint32_t i = 0; i < n; ++i)
        sel[p].push_back((step * 2 + p * 31 + rng() % 40) % pages);
      std::set<std::uint32_t> distinct(sel[p].begin(), sel[p].end());
      // Mostly at least the demand, sometimes 2 below it (refused as over the limit).
      const std::uint32_t lo = static_cast<std::uint32_t>(distinct.size());
      limits[p] = step % 13 == 4 && p == 1 ? lo - 2 : lo + rng() % (capacity - lo + 1);
      if (p == 2 && step % 11 == 3) limits[p] = capacity + 1;
      flat.insert(flat.end(), sel[p].begin(), sel[p].end());
      offsets.push_back(flat.size());
    }
    // Evictions get a capacity-strided range per pair: a lowered limit can evict more pages
    // than the pair selects.
    device_buffer<std::uint32_t> d_sel(flat), ek(pairs * capacity), es(pairs * capacity),
        ak(flat.size() + 1), as(flat.size() + 1), counts(3 * pairs);
    device_buffer<std::uint64_t> d_off(offsets);
    device_buffer<int> status(std::vector<int>(pairs, -1));
    kvsift::cuda::lru_step_io io{d_sel.get(), d_off.get(),  ek.get(),     es.get(), ak.get(),
                                 as.get(),    counts.get(), status.get(), capacity};
    kvsift::cuda::bucketed_lru_step(dev.ref, io, buckets, nullptr);
    KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
    const auto h_st = status.download();
    const auto h_ek = ek.download(), h_es = es.download(), h_ak = ak.download(),
               h_as = as.download();
    for (std::uint32_t p = 0; p < pairs; ++p) {
      kvsift::replacement_step ref;
      int expect = kvsift::cuda::lru_ok;
      const std::size_t before = cpu[p].resident();
      try {
        cpu[p].set_limit(limits[p]);
        cpu[p].step(sel[p], ref);
      } catch (const kvsift::invalid_argument&) {
        expect = limits[p] > capacity ? kvsift::cuda::lru_limit_out_of_range
                                      : kvsift::cuda::lru_demand_exceeds_buffer;
      }
      CHECK(h_st[p] == expect);
      if (expect != kvsift::cuda::lru_ok) {
        refused += expect == kvsift::cuda::lru_limit_out_of_range;
        over_limit += expect == kvsift::cuda::lru_demand_exceeds_buffer;
        continue;
      }
      CHECK(cpu[p].resident() <= limits[p]);
      if (before > limits[p]) {
        shrink_evictions += static_cast<int>(ref.evicted_keys.size());
        more_than_selected += ref.evicted_keys.size() > sel[p].size();
      }
      for (std::size_t i = 0; i < ref.evicted_keys.size(); ++i) {
        CHECK(h_ek[p * capacity + i] == ref.evicted_keys[i]);
        CHECK(h_es[p * capacity + i] == ref.evicted_slots[i]);
      }
      for (std::size_t i = 0; i < ref.admitted_keys.size(); ++i) {
        CHECK(h_ak[offsets[p] + i] == ref.admitted_keys[i]);
        CHECK(h_as[offsets[p] + i] == ref.admitted_slots[i]);
      }
    }
    const auto keys = dev.keys.download();
    for (std::uint32_t p = 0; p < pairs; ++p) {
      for (std::uint32_t s = 0; s < capacity; ++s)
        CHECK(keys[p * capacity + s] == cpu[p].key_in(s));
    }
  }
  cudaFreeHost(limits);
  CHECK(shrink_evictions > 100);  // lowered limits really forced evictions
  CHECK(more_than_selected > 0);  // ... beyond a selection's length (the strided range)
  CHECK(refused >= 5);
  CHECK(over_limit >= 5);
}

TEST_CASE("memory_bucketed_lru_rejects_bad_parameters", "[cuda][memory_lru]") {
  device_lru dev(1, 4, 10);
  device_buffer<std::uint32_t> buf(8);
  device_buffer<std::uint64_t> off(std::vector<std::uint64_t>{0, 0});
  device_buffer<int> status(1);
  kvsift::cuda::lru_step_io io{buf.get(), off.get(), buf.get(), buf.get(),
                               buf.get(), buf.get(), buf.get(), status.get()};
  CHECK_THROWS_AS(kvsift::cuda::bucketed_lru_step(dev.ref, io, 0, nullptr),
                  kvsift::invalid_argument);  // a zero-bucket timestamp range
  CHECK_THROWS_AS(kvsift::cuda::bucketed_lru_step(dev.ref, io, 257, nullptr),
                  kvsift::invalid_argument);
  auto big = dev.ref;
  big.capacity = kvsift::cuda::bucketed_lru_ref::max_capacity + 1;
  CHECK_THROWS_AS(kvsift::cuda::bucketed_lru_step(big, io, 8, nullptr), kvsift::invalid_argument);
  auto limited = dev.ref;
  limited.limits = buf.get();
  CHECK_THROWS_WITH(kvsift::cuda::bucketed_lru_step(limited, io, 8, nullptr),
                    Catch::Contains("give eviction_stride >= the capacity of 4, got 0"));
  auto strided = io;
  strided.eviction_stride = 3;
  CHECK_THROWS_WITH(kvsift::cuda::bucketed_lru_step(dev.ref, strided, 8, nullptr),
                    Catch::Contains("expected eviction_stride 0 or >= the capacity of 4, got 3"));
  auto no_io = io;
  no_io.status = nullptr;
  CHECK_THROWS_AS(kvsift::cuda::bucketed_lru_step(dev.ref, no_io, 8, nullptr),
                  kvsift::invalid_argument);
}
