// The decode chain on the CPU: retrieval (the plan executor) -> token ids -> head-wise pages ->
// bucketed LRU decides which pages stay in a small "HBM" pool -> missing pages are gathered
// from the host pool into the freed slots -> attention over the gathered pages (paged_kv)
// equals attention over the same ids read from the full K/V, bit for bit, and the
// double-precision oracle within 1e-5. Several steps with drifting queries, so pages hit,
// miss and are evicted; two KV heads with different selections.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "../attention/attention_reference.hpp"
#include "../search/search_fixture.hpp"
#include "kvsift/core/dense_matrix.hpp"
#include "kvsift/decode/plan_executor.hpp"
#include "kvsift/memory/bucketed_lru.hpp"

namespace {

using kvsift::id_t;
using kvsift_test::fx;

constexpr std::size_t heads = 2, page = 16, slots = 40;  // slots: HBM pages per KV head

/// Host pool: [head][logical page][page][dim] for K and for V (Spin's head-wise pages).
struct host_kv {
  std::size_t tokens, dim, pages;
  std::vector<float> k, v;
  [[nodiscard]] std::size_t page_floats() const { return page * dim; }
  [[nodiscard]] const float* k_page(std::size_t h, std::size_t p) const {
    return k.data() + (h * pages + p) * page_floats();
  }
  [[nodiscard]] const float* v_page(std::size_t h, std::size_t p) const {
    return v.data() + (h * pages + p) * page_floats();
  }
};

/// The CPU "warp gather": copies host page (h, key) into HBM page phys, K and V.
void gather(const host_kv& host, std::size_t h, std::size_t key, std::size_t phys,
            std::vector<float>& hbm_k, std::vector<float>& hbm_v) {
  const std::size_t pf = host.page_floats();
  std::copy_n(host.k_page(h, key), pf, hbm_k.data() + phys * pf);
  std::copy_n(host.v_page(h, key), pf, hbm_v.data() + phys * pf);
}

void run_chain(std::size_t& mismatches, std::size_t& evictions, std::size_t& hits,
               std::size_t& misses) {
  const auto& f = fx();
  const std::size_t n = f.data.key_view().rows(), d = f.data.key_view().cols();
  // Head 0 keys are the fixture's (graph-searchable); head 1 keys are a shuffled copy, so the
  // two heads select different pages. Values random.
  kvsift::dense_matrix<float> keys1(n, d), vals(n, heads * d);
  std::mt19937 rng(11);
  std::vector<std::size_t> perm(n);
  for (std::size_t i = 0; i < n; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (std::size_t i = 0; i < n; ++i) {
    std::copy_n(f.data.key_view().row(perm[i]), d, keys1.row(i));
    for (std::size_t j = 0; j < heads * d; ++j) vals.row(i)[j] = nd(rng);
  }
  // The full K/V in [token][head][dim] layout: the oracle's source.
  kvsift::dense_matrix<float> kfull(n, heads * d);
  for (std::size_t i = 0; i < n; ++i) {
    std::copy_n(f.data.key_view().row(i), d, kfull.row(i));
    std::copy_n(keys1.row(i), d, kfull.row(i) + d);
  }
  const kvsift::kv_view<float> full(kvsift::matrix_view<const float>(kfull.data(), n, d, heads * d),
                                    kvsift::matrix_view<const float>(vals.data(), n, d, heads * d),
                                    heads, d);
  host_kv host{n, d, (n + page - 1) / page, {}, {}};
  host.k.assign(heads * host.pages * host.page_floats(), 0.0f);
  host.v.assign(host.k.size(), 0.0f);
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t t = 0; t < n; ++t) {
      const std::size_t off = (h * host.pages + t / page) * host.page_floats() + (t % page) * d;
      std::copy_n(full.key(h, static_cast<id_t>(t)), d, host.k.data() + off);
      std::copy_n(full.value(h, static_cast<id_t>(t)), d, host.v.data() + off);
    }
  // HBM: `slots` pages per head plus one poison page (NaN) that every non-resident logical
  // page maps to, so reading a page the chain failed to bring in shows in the output.
  const std::size_t hbm_pages = heads * slots + 1, poison = heads * slots;
  std::vector<float> hbm_k(hbm_pages * host.page_floats(), 0.0f), hbm_v(hbm_k.size(), 0.0f);
  std::fill(hbm_k.begin() + static_cast<std::ptrdiff_t>(poison * host.page_floats()), hbm_k.end(),
            std::numeric_limits<float>::quiet_NaN());
  std::fill(hbm_v.begin() + static_cast<std::ptrdiff_t>(poison * host.page_floats()), hbm_v.end(),
            std::numeric_limits<float>::quiet_NaN());
  std::vector<std::uint32_t> table(heads * host.pages, static_cast<std::uint32_t>(poison));
  std::vector<kvsift::bucketed_lru<8>> lru(heads, kvsift::bucketed_lru<8>(slots, host.pages));

  // Retrieval through the executor: graph DIPR on head 0, exact top-k on head 1.
  const kvsift::view_store<float> store1(keys1.cview());
  const kvsift::flat_index<kvsift::view_store<float>> flat1(store1);
  const kvsift::default_plan_resources res0{.graph = &f.graph}, res1{.flat = &flat1};
  kvsift::plan p0, p1;
  p0.index = "graph";
  p0.query = "dipr";
  p0.params["beta"] = 4.0;
  p1.index = "flat";
  p1.query = "topk";
  kvsift::search_workspace ws;
  kvsift::plan_retrieval got;
  kvsift::replacement_step rs;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (std::size_t step = 0; step < 40; ++step) {
    // Queries drift: consecutive steps share most pages, later ones move on.
    const auto q = f.eval.row_span(step / 4);
    for (std::size_t h = 0; h < heads; ++h) {
      const kvsift::plan_step_params prm{.context = n, .budget = 24};
      if (h == 0)
        kvsift::default_plan_executor<kvsift::default_plan_resources>().retrieve(p0, res0, q, prm,
                                                                                 ws, got);
      else
        kvsift::default_plan_executor<kvsift::default_plan_resources>().retrieve(p1, res1, q, prm,
                                                                                 ws, got);
      REQUIRE_FALSE(got.ids.empty());
      std::vector<id_t> pages;
      for (id_t t : got.ids) pages.push_back(static_cast<id_t>(t / page));
      lru[h].step(pages, rs);
      const std::set<id_t> distinct(pages.begin(), pages.end());
      CHECK(rs.hits + rs.misses() == distinct.size());
      hits += rs.hits;
      misses += rs.misses();
      evictions += rs.evicted_keys.size();
      for (std::size_t i = 0; i < rs.evicted_keys.size(); ++i)
        table[h * host.pages + rs.evicted_keys[i]] = static_cast<std::uint32_t>(poison);
      for (std::size_t i = 0; i < rs.admitted_keys.size(); ++i) {
        const std::size_t phys = h * slots + rs.admitted_slots[i];
        gather(host, h, rs.admitted_keys[i], phys, hbm_k, hbm_v);
        table[h * host.pages + rs.admitted_keys[i]] = static_cast<std::uint32_t>(phys);
      }
      // Every resident slot holds its page, byte for byte.
      for (std::size_t s = 0; s < slots; ++s) {
        const id_t key = lru[h].key_in(s);
        if (key == kvsift::invalid_id) continue;
        if (std::memcmp(hbm_k.data() + (h * slots + s) * host.page_floats(), host.k_page(h, key),
                        host.page_floats() * sizeof(float)) != 0)
          ++mismatches;
      }
      const kvsift::paged_kv<float> paged(
          std::span<const float>(hbm_k), std::span<const float>(hbm_v),
          std::span<const std::uint32_t>(table),
          {.kv_heads = heads, .tokens = n, .head_dim = d, .page_size = page});
      const auto from_hbm = kvsift::sparse_attention(q, h, got.ids, paged);
      const auto from_full = kvsift::sparse_attention(q, h, got.ids, full);
      INFO("step " << step << " head " << h);
      CHECK(from_hbm.lse == from_full.lse);
      CHECK(from_hbm.o == from_full.o);
      kvsift_test::check_close(from_hbm,
                               kvsift_test::reference_attention(q, h, got.ids, full, scale), 1e-5);
    }
  }
}

}  // namespace

TEST_CASE("LRU -> gather -> paged attention equals dense attention over the same ids",
          "[decode][lru_gather_attention]") {
  std::size_t mismatches = 0, evictions = 0, hits = 0, misses = 0;
  run_chain(mismatches, evictions, hits, misses);
  CHECK(mismatches == 0);
  // The trace exercises the policy: pages are reused, missed and evicted.
  INFO("hits " << hits << " misses " << misses << " evictions " << evictions);
  CHECK(hits > 100);
  CHECK(misses > 100);
  CHECK(evictions > 50);
}
