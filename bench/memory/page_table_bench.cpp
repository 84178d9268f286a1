// Two-level page table against a flat worst-case table (the baseline, measured in the same
// run) for the target configuration: 128K-token contexts, batch 32, 32 layers, 8 KV heads,
// 16-token pages (8192 logical pages per head), every (request, layer, head) mapping the
// first 10% of its pages.
//   bm_page_table_metadata/<segment_pages>: counters flat_MiB, two_level_MiB, ratio
//   bm_flat_lookup vs bm_two_level_lookup (checked, as an engine calls them) and the
//   *_view variants (unchecked, what a kernel does): items_per_second ratio = lookup speed.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "kvsift/core/error.hpp"
#include "kvsift/memory/page_table.hpp"

namespace {

constexpr std::uint32_t requests = 32, layers = 32, heads = 8, pages_per_head = 8192;
constexpr std::uint32_t mapped_per_head = pages_per_head / 10;  // 10% mapped

/// The baseline: one entry per logical page of the worst case, same checks as page_table.
/// Shape held at run time, as an engine sizes it (compile-time constants would turn the
/// index arithmetic into shifts that no real table gets).
class flat_page_table {
 public:
  flat_page_table(std::size_t r, std::size_t l, std::size_t h, std::size_t g)
      : requests_(r), layers_(l), heads_(h), pages_(g), table_(r * l * h * g, kvsift::no_page) {}
  [[nodiscard]] std::size_t index(kvsift::page_key k) const {
    return ((k.request * layers_ + k.layer) * heads_ + k.head) * pages_ + k.page;
  }
  void map(kvsift::page_key k, kvsift::page_id p) { table_[index(k)] = p; }
  [[nodiscard]] kvsift::page_id lookup(kvsift::page_key k) const {
    if (k.request >= requests_ || k.layer >= layers_ || k.head >= heads_ || k.page >= pages_)
        [[unlikely]] {
      kvsift::detail::fail<kvsift::out_of_range>("flat_page_table: key out of range");
    }
    return table_[index(k)];
  }
  void lookup(std::span<const kvsift::page_key> keys, std::span<kvsift::page_id> out) const {
    for (const auto& k : keys) (void)lookup(k);  // validate first, as page_table does
    for (std::size_t i = 0; i < keys.size(); ++i) out[i] = table_[index(keys[i])];
  }
  [[nodiscard]] kvsift::page_id lookup_unchecked(kvsift::page_key k) const {
    return table_[index(k)];
  }
  [[nodiscard]] std::size_t metadata_bytes() const {
    return table_.size() * sizeof(kvsift::page_id);
  }

 private:
  std::size_t requests_, layers_, heads_, pages_;
  std::vector<kvsift::page_id> table_;
};

std::unique_ptr<kvsift::page_table> make_two_level(std::uint32_t segment_pages) {
  kvsift::page_table_params p;
  p.requests = requests;
  p.layers = layers;
  p.heads = heads;
  p.pages_per_head = pages_per_head;
  p.segment_pages = segment_pages;
  // The pool holds what the mapped pages need (an engine sizes it to its working set).
  p.pool_segments = std::size_t{requests} * layers * heads *
                    ((mapped_per_head + segment_pages - 1) / segment_pages);
  auto t = std::make_unique<kvsift::page_table>(p);
  std::uint32_t phys = 0;
  for (std::uint32_t r = 0; r < requests; ++r)
    for (std::uint32_t l = 0; l < layers; ++l)
      for (std::uint32_t h = 0; h < heads; ++h)
        for (std::uint32_t g = 0; g < mapped_per_head; ++g) t->map({r, l, h, g}, phys++);
  return t;
}

struct lookup_fixture {
  std::unique_ptr<kvsift::page_table> two_level = make_two_level(128);
  flat_page_table flat{requests, layers, heads, pages_per_head};
  std::vector<kvsift::page_key> keys;
  lookup_fixture() {
    std::uint32_t phys = 0;
    for (std::uint32_t r = 0; r < requests; ++r)
      for (std::uint32_t l = 0; l < layers; ++l)
        for (std::uint32_t h = 0; h < heads; ++h)
          for (std::uint32_t g = 0; g < mapped_per_head; ++g) flat.map({r, l, h, g}, phys++);
    std::mt19937 rng(1);
    keys.resize(1 << 20);
    for (auto& k : keys) {
      k = {static_cast<std::uint32_t>(rng() % requests), static_cast<std::uint32_t>(rng() % layers),
           static_cast<std::uint32_t>(rng() % heads),
           static_cast<std::uint32_t>(rng() % mapped_per_head)};
    }
  }
};

const lookup_fixture& fixture() {
  static const lookup_fixture f;
  return f;
}

void bm_page_table_metadata(benchmark::State& state) {
  const auto segment = static_cast<std::uint32_t>(state.range(0));
  std::unique_ptr<kvsift::page_table> t;
  for (auto _ : state) t = make_two_level(segment);
  const double flat = static_cast<double>(fixture().flat.metadata_bytes());
  const double two = static_cast<double>(t->metadata_bytes());
  state.counters["flat_MiB"] = flat / (1 << 20);
  state.counters["two_level_MiB"] = two / (1 << 20);
  state.counters["ratio"] = flat / two;
}
BENCHMARK(bm_page_table_metadata)
    ->Arg(64)
    ->Arg(128)
    ->Arg(256)
    ->Arg(512)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

template <class F>
void run_lookups(benchmark::State& state, F&& lookup) {
  const auto& keys = fixture().keys;
  for (auto _ : state) {
    std::uint64_t sum = 0;
    for (const auto& k : keys) sum += lookup(k);
    benchmark::DoNotOptimize(sum);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * keys.size()));
}

void bm_flat_lookup(benchmark::State& state) {
  const auto& t = fixture().flat;
  run_lookups(state, [&t](kvsift::page_key k) { return t.lookup(k); });
}
void bm_two_level_lookup(benchmark::State& state) {
  const auto& t = *fixture().two_level;
  run_lookups(state, [&t](kvsift::page_key k) { return t.lookup(k); });
}
void bm_flat_lookup_view(benchmark::State& state) {
  const auto& t = fixture().flat;
  run_lookups(state, [&t](kvsift::page_key k) { return t.lookup_unchecked(k); });
}
void bm_two_level_lookup_view(benchmark::State& state) {
  const kvsift::page_table_ref v = fixture().two_level->ref();
  run_lookups(state, [v](kvsift::page_key k) { return v.lookup(k); });
}
// Batches of 256 keys (one step's pages of a head): validate all, then look up.
template <class Table>
void run_batches(benchmark::State& state, const Table& t) {
  const auto& keys = fixture().keys;
  std::vector<kvsift::page_id> out(256);
  for (auto _ : state) {
    std::uint64_t sum = 0;
    for (std::size_t b = 0; b + 256 <= keys.size(); b += 256) {
      t.lookup(std::span<const kvsift::page_key>(keys.data() + b, 256), out);
      for (const auto p : out) sum += p;
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * keys.size()));
}
void bm_flat_lookup_batch(benchmark::State& state) { run_batches(state, fixture().flat); }
void bm_two_level_lookup_batch(benchmark::State& state) {
  run_batches(state, *fixture().two_level);
}
BENCHMARK(bm_flat_lookup_batch);
BENCHMARK(bm_two_level_lookup_batch);
BENCHMARK(bm_flat_lookup);
BENCHMARK(bm_two_level_lookup);
BENCHMARK(bm_flat_lookup_view);
BENCHMARK(bm_two_level_lookup_view);

}  // namespace
