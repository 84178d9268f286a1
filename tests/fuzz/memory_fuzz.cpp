// Fuzz target (c): the memory and reorder data structures driven by operations decoded from
// the input, each checked against a simple model after every operation:
//   0 segment_allocator   vs a std::set of ids in use
//   1 page_table          vs a std::map key -> physical page (and "nothing changes on a throw")
//   2 exact_lru / bucketed_lru<256> in lockstep: equal while no age saturates (< 255 steps),
//     page limits changing between steps, plus the per-step invariants of
//     tests/memory/replacement_test.cpp
//   3 prefix_reorder plan_batch: columns a permutation, every row mapped to a request whose
//     row is equal (dedup), requests are rows
// Byte 0 picks the structure, the following bytes its shape, the rest the operations. A model
// mismatch calls std::abort (a crash to libFuzzer); kvsift's documented errors are expected
// for out-of-range operations and must leave the structure unchanged.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <numeric>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "kvsift/memory/bucketed_lru.hpp"
#include "kvsift/memory/exact_lru.hpp"
#include "kvsift/memory/page_table.hpp"
#include "kvsift/memory/segment_allocator.hpp"
#include "kvsift/reorder/prefix_reorder.hpp"

namespace {

using kvsift::id_t;

/// Reads bytes off the input; past the end it returns 0 and done() turns true.
class input {
 public:
  input(const std::uint8_t* d, std::size_t n) : d_(d), n_(n) {}
  [[nodiscard]] bool done() const noexcept { return i_ >= n_; }
  std::uint8_t byte() { return i_ < n_ ? d_[i_++] : 0; }
  std::uint32_t u16() { return byte() | (std::uint32_t{byte()} << 8); }

 private:
  const std::uint8_t* d_;
  std::size_t n_, i_ = 0;
};

void require(bool ok) {
  if (!ok) std::abort();
}

void fuzz_segment_allocator(input& in) {
  const std::size_t cap = 1 + in.byte() % 64;
  kvsift::segment_allocator a(cap);
  std::set<std::size_t> used;
  while (!in.done()) {
    const std::uint8_t op = in.byte();
    if (op % 2 == 0) {
      try {
        const std::size_t id = a.allocate();
        require(id < cap && used.insert(id).second);
      } catch (const kvsift::pool_exhausted&) {
        require(used.size() == cap);
      }
    } else {
      const std::size_t id = in.byte() % (cap + 2);  // sometimes out of range
      try {
        a.release(id);
        require(used.erase(id) == 1);
      } catch (const kvsift::invalid_argument&) {
        require(used.count(id) == 0);  // releasing a free or out-of-range id throws
      }
    }
    require(a.used_count() == used.size() && a.free_count() == cap - used.size());
    for (std::size_t id = 0; id < cap; ++id) require(a.in_use(id) == (used.count(id) == 1));
  }
}

void fuzz_page_table(input& in) {
  kvsift::page_table_params p;
  p.requests = 1 + in.byte() % 3;
  p.layers = 1 + in.byte() % 2;
  p.heads = 1 + in.byte() % 2;
  p.pages_per_head = 1 + in.byte() % 40;
  p.segment_pages = std::size_t{1} << (in.byte() % 5);
  p.pool_segments = 1 + in.byte() % 12;
  kvsift::page_table t(p);
  using key_t = std::tuple<std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t>;
  std::map<key_t, kvsift::page_id> model;
  auto key_of = [&](input& s) {
    // Values one past each bound are out of range on purpose.
    kvsift::page_key k;
    k.request = s.byte() % (p.requests + 1);
    k.layer = s.byte() % (p.layers + 1);
    k.head = s.byte() % (p.heads + 1);
    k.page = s.byte() % (p.pages_per_head + 1);
    return k;
  };
  auto in_shape = [&](const kvsift::page_key& k) {
    return k.request < p.requests && k.layer < p.layers && k.head < p.heads &&
           k.page < p.pages_per_head;
  };
  auto check_all = [&] {
    require(t.mapped_pages() == model.size());
    for (std::uint32_t r = 0; r < p.requests; ++r)
      for (std::uint32_t l = 0; l < p.layers; ++l)
        for (std::uint32_t h = 0; h < p.heads; ++h)
          for (std::uint32_t g = 0; g < p.pages_per_head; ++g) {
            const auto it = model.find({r, l, h, g});
            const kvsift::page_id want = it == model.end() ? kvsift::no_page : it->second;
            require(t.lookup({r, l, h, g}) == want);
            require(t.ref().lookup({r, l, h, g}) == want);  // the device handle agrees
          }
  };
  std::uint32_t next_phys = 0;
  while (!in.done()) {
    const std::uint8_t op = in.byte() % 4;
    if (op <= 1) {
      const auto k = key_of(in);
      const kvsift::page_id phys = next_phys++;
      try {
        t.map(k, phys);
        require(in_shape(k) &&
                model.emplace(key_t{k.request, k.layer, k.head, k.page}, phys).second);
      } catch (const kvsift::invalid_argument&) {
        // Bad key, already mapped, or pool exhausted: the model is unchanged and so must be t.
        require(!in_shape(k) || model.count({k.request, k.layer, k.head, k.page}) == 1 ||
                t.free_segments() == 0);
      }
    } else if (op == 2) {
      const auto k = key_of(in);
      try {
        const kvsift::page_id phys = t.unmap(k);
        const auto it = model.find({k.request, k.layer, k.head, k.page});
        require(it != model.end() && it->second == phys);
        model.erase(it);
      } catch (const kvsift::invalid_argument&) {
        require(!in_shape(k) || model.count({k.request, k.layer, k.head, k.page}) == 0);
      }
    } else {
      const std::size_t r = in.byte() % (p.requests + 1);
      try {
        t.release_request(r);
        require(r < p.requests);
        std::erase_if(model, [&](const auto& kv) { return std::get<0>(kv.first) == r; });
      } catch (const kvsift::invalid_argument&) {
        require(r >= p.requests);
      }
    }
    check_all();
  }
}

template <class P>
void check_step(const P& p, std::span<const id_t> selected, const kvsift::replacement_step& st) {
  const std::set<id_t> distinct(selected.begin(), selected.end());
  require(st.hits + st.misses() == distinct.size());
  require(p.resident() <= p.capacity());
  std::set<id_t> slots;
  for (const id_t k : distinct) {
    const id_t s = p.slot_of(k);
    require(s != kvsift::invalid_id && s < p.capacity());
    slots.insert(s);
  }
  require(slots.size() == distinct.size());
  for (const id_t k : st.evicted_keys)
    require(distinct.count(k) == 0 && p.slot_of(k) == kvsift::invalid_id);
  for (std::size_t i = 0; i < st.admitted_keys.size(); ++i) {
    require(p.slot_of(st.admitted_keys[i]) == st.admitted_slots[i]);
  }
}

void fuzz_lru(input& in) {
  const std::size_t cap = 1 + in.byte() % 16, keys = 1 + in.byte() % 48;
  kvsift::exact_lru exact(cap, keys);
  kvsift::bucketed_lru<256> bucketed(cap, keys);
  kvsift::replacement_step a, b;
  std::size_t steps = 0;
  while (!in.done() && steps < 250) {  // ages saturate at 255: equality holds before that
    if (const std::uint8_t op = in.byte(); op % 4 == 0) {  // a new page limit, cap + 1 refused
      const std::size_t limit = in.byte() % (cap + 2);
      bool threw_a = false, threw_b = false;
      try {
        exact.set_limit(limit);
      } catch (const kvsift::invalid_argument&) {
        threw_a = true;
      }
      try {
        bucketed.set_limit(limit);
      } catch (const kvsift::invalid_argument&) {
        threw_b = true;
      }
      require(threw_a == threw_b && threw_a == (limit > cap));
      require(exact.limit() == bucketed.limit() && exact.limit() <= cap);
    }
    std::vector<id_t> sel(in.byte() % (cap + 3));
    for (auto& s : sel) s = static_cast<id_t>(in.byte() % (keys + 1));  // keys: out of range
    bool threw_a = false, threw_b = false;
    try {
      exact.step(sel, a);
    } catch (const kvsift::invalid_argument&) {
      threw_a = true;
    }
    try {
      bucketed.step(sel, b);
    } catch (const kvsift::invalid_argument&) {
      threw_b = true;
    }
    require(threw_a == threw_b);
    if (threw_a) continue;  // both unchanged (checked by the next step's comparison)
    ++steps;
    check_step(exact, sel, a);
    check_step(bucketed, sel, b);
    require(a.hits == b.hits && a.evicted_keys == b.evicted_keys &&
            a.admitted_slots == b.admitted_slots && a.admitted_keys == b.admitted_keys);
    require(exact.resident() == bucketed.resident());
    require(exact.resident() <= exact.limit());  // a lowered limit is enforced by this step
  }
}

void fuzz_prefix_reorder(input& in) {
  const std::size_t rows = in.byte() % 12, cols = 1 + in.byte() % 4;
  kvsift::table_rows t(rows, std::vector<std::string>(cols));
  static const char* const words[] = {"a", "b", "a b", "", "c d e", "b a"};
  for (auto& r : t)
    for (auto& c : r) c = words[in.byte() % 6];
  if (in.byte() % 8 == 0 && rows > 1) t.back().push_back("ragged");  // must throw
  kvsift::batch_plan_params bp;
  const std::uint8_t f = in.byte();
  bp.reorder_columns = f & 1;
  bp.sort_rows = f & 2;
  bp.dedup = f & 4;
  try {
    const auto plan = kvsift::plan_batch(t, bp);
    std::vector<std::size_t> perm = plan.columns;
    std::sort(perm.begin(), perm.end());
    std::vector<std::size_t> iota(cols);
    std::iota(iota.begin(), iota.end(), std::size_t{0});
    require(rows == 0 || perm == iota);
    require(plan.request_of_row.size() == rows);
    for (std::size_t r = 0; r < rows; ++r) {
      require(plan.request_of_row[r] < plan.requests.size());
      require(t[plan.requests[plan.request_of_row[r]]] == t[r]);  // same answer, same row
    }
    if (!bp.dedup) require(plan.requests.size() == rows);
  } catch (const kvsift::invalid_argument&) {
    require(rows > 1 && t.back().size() != cols);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  input in(data, size);
  switch (in.byte() % 4) {
    case 0:
      fuzz_segment_allocator(in);
      break;
    case 1:
      fuzz_page_table(in);
      break;
    case 2:
      fuzz_lru(in);
      break;
    default:
      fuzz_prefix_reorder(in);
      break;
  }
  return 0;
}
