// Hit ratio of the bucketed LRU against exact LRU (the baseline) and Belady (the offline bound),
// all replayed in the same run on the same traces:
//   real   - exact top-32 selections of SmolLM2-135M decode queries over their causal prefix
//            (real Q/K dumps: layers 0, 5, 15, 29 x 3 KV heads, 8192 tokens; a KV head's step
//            accesses the union of its 3 query heads' selections, as 16-token pages), the
//            last 1024 positions as decode steps; dumps from bench/data/dump_qk.py, directory
//            from $KVSIFT_DUMP_DIR (default bench/data/dump; skipped when absent)
//   bursty - synthetic: a hot set of 48 pages stable for 10-40 steps, sometimes revisited,
//            plus 16 random pages per step
// 512 logical pages per head; the argument is the GPU pages per head. Counters are hit ratios (hits
// / accesses) summed over all heads, and gap_pp = (exact - bucketed) in percentage points (target
// <= 1).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <vector>

#include "kvsift/core/error.hpp"
#include "kvsift/core/parallel_for.hpp"
#include "kvsift/core/vector_store.hpp"
#include "kvsift/index/flat_index.hpp"
#include "kvsift/io/vector_io.hpp"
#include "kvsift/memory/belady.hpp"
#include "kvsift/memory/bucketed_lru.hpp"
#include "kvsift/memory/exact_lru.hpp"

namespace {

using kvsift::id_t;
using trace_t = std::vector<std::vector<id_t>>;  // steps x distinct pages

constexpr std::size_t tokens = 8192, page_tokens = 16, pages = tokens / page_tokens;
constexpr std::size_t steps = 1024, top_k = 32;
constexpr std::size_t replay_capacity = 128;  // bm_replay

std::filesystem::path dump_dir() {
  const char* env = std::getenv("KVSIFT_DUMP_DIR");
  return env != nullptr ? env : "bench/data/dump";
}

// One trace per (layer, KV head). Empty when the dumps are missing.
const std::vector<trace_t>& real_traces() {
  static const std::vector<trace_t> traces = [] {
    std::vector<trace_t> out;
    const auto dir = dump_dir();
    if (!std::filesystem::exists(dir / "L29_q8.fbin")) return out;
    for (const int layer : {0, 5, 15, 29}) {
      for (int kv = 0; kv < 3; ++kv) {
        const auto keys =
            kvsift::read_fbin(dir / kvsift::detail::concat("L", layer, "_k", kv, ".fbin"));
        const kvsift::flat_index<kvsift::view_store<float>> flat(
            kvsift::view_store<float>(keys.cview()));
        trace_t trace(steps);
        for (int g = 0; g < 3; ++g) {  // GQA: query heads 3kv .. 3kv + 2 share KV head kv
          const auto q = kvsift::read_fbin(
              dir / kvsift::detail::concat("L", layer, "_q", 3 * kv + g, ".fbin"));
          std::vector<kvsift::search_workspace> ws(kvsift::default_thread_count());
          std::vector<std::vector<id_t>> ids(steps, std::vector<id_t>(top_k));
          kvsift::parallel_for(steps, ws.size(), [&](std::size_t s, std::size_t t) {
            const std::size_t pos = tokens - steps + s;
            std::vector<float> scores(top_k);
            flat.topk(q.cview().row_span(pos), top_k, ws[t], ids[s], scores,
                      kvsift::id_below{pos + 1});  // causal: keys up to the query itself
          });
          for (std::size_t s = 0; s < steps; ++s) {
            for (const id_t id : ids[s]) trace[s].push_back(static_cast<id_t>(id / page_tokens));
          }
        }
        for (auto& s : trace) {
          std::sort(s.begin(), s.end());
          s.erase(std::unique(s.begin(), s.end()), s.end());
        }
        out.push_back(std::move(trace));
      }
    }
    return out;
  }();
  return traces;
}

const std::vector<trace_t>& bursty_traces() {
  static const std::vector<trace_t> traces = [] {
    std::vector<trace_t> out;
    std::mt19937 rng(42);
    for (int head = 0; head < 12; ++head) {
      trace_t trace;
      std::vector<std::vector<id_t>> hot_sets;
      while (trace.size() < steps) {
        std::vector<id_t> hot;
        if (!hot_sets.empty() && rng() % 10 < 3) {
          hot = hot_sets[rng() % hot_sets.size()];  // a topic comes back
        } else {
          while (hot.size() < 48) hot.push_back(static_cast<id_t>(rng() % pages));
          hot_sets.push_back(hot);
        }
        const std::size_t burst = 10 + rng() % 31;
        for (std::size_t s = 0; s < burst && trace.size() < steps; ++s) {
          std::vector<id_t> step = hot;
          for (int i = 0; i < 16; ++i) step.push_back(static_cast<id_t>(rng() % pages));
          std::sort(step.begin(), step.end());
          step.erase(std::unique(step.begin(), step.end()), step.end());
          trace.push_back(std::move(step));
        }
      }
      out.push_back(std::move(trace));
    }
    return out;
  }();
  return traces;
}

template <class Policy>
std::size_t replay(Policy& p, const trace_t& trace) {
  kvsift::replacement_step st;
  std::size_t hits = 0;
  for (const auto& s : trace) {
    p.step(s, st);
    hits += st.hits;
  }
  return hits;
}

void hit_ratios(benchmark::State& state, const std::vector<trace_t>& traces) {
  if (traces.empty()) {
    state.SkipWithError("no Q/K dumps (set KVSIFT_DUMP_DIR; see bench/data/dump_qk.py)");
    return;
  }
  const auto capacity = static_cast<std::size_t>(state.range(0));
  std::size_t widest = 0;
  for (const auto& trace : traces)
    for (const auto& s : trace) widest = std::max(widest, s.size());
  if (widest > capacity) {
    state.SkipWithError("a step selects more pages than the GPU holds");
    return;
  }
  std::size_t accesses = 0, bucketed64 = 0, bucketed16 = 0, exact = 0, opt = 0;
  for (auto _ : state) {
    accesses = bucketed64 = bucketed16 = exact = opt = 0;
    for (const auto& trace : traces) {
      for (const auto& s : trace) accesses += s.size();
      kvsift::bucketed_lru<64> b64(capacity, pages);
      kvsift::bucketed_lru<16> b16(capacity, pages);
      kvsift::exact_lru e(capacity, pages);
      kvsift::belady b(capacity, pages, trace);
      bucketed64 += replay(b64, trace);
      bucketed16 += replay(b16, trace);
      exact += replay(e, trace);
      opt += replay(b, trace);
    }
  }
  const auto ratio = [&](std::size_t h) {
    return static_cast<double>(h) / static_cast<double>(accesses);
  };
  state.counters["bucketed64"] = ratio(bucketed64);
  state.counters["bucketed16"] = ratio(bucketed16);
  state.counters["exact_lru"] = ratio(exact);
  state.counters["belady"] = ratio(opt);
  state.counters["gap_pp"] = 100.0 * (ratio(exact) - ratio(bucketed64));
  state.counters["pages_per_step"] =
      static_cast<double>(accesses) / static_cast<double>(traces.size() * steps);
}

void bm_hit_ratio_real(benchmark::State& state) { hit_ratios(state, real_traces()); }
void bm_hit_ratio_bursty(benchmark::State& state) { hit_ratios(state, bursty_traces()); }
// Argument: GPU pages per head (of 512).
BENCHMARK(bm_hit_ratio_real)
    ->Arg(64)
    ->Arg(96)
    ->Arg(128)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(bm_hit_ratio_bursty)
    ->Arg(96)
    ->Arg(128)
    ->Arg(256)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

// Step cost on the CPU (the bucketed LRU's reason to exist is the GPU, but the reference
// should not be slower than exact LRU): one replay of the bursty traces per iteration.
template <class Policy>
void bm_replay(benchmark::State& state) {
  const auto& traces = bursty_traces();
  for (auto _ : state) {
    for (const auto& trace : traces) {
      Policy p(replay_capacity, pages);
      benchmark::DoNotOptimize(replay(p, trace));
    }
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * traces.size() * steps));
}
BENCHMARK(bm_replay<kvsift::bucketed_lru<64>>)->Unit(benchmark::kMillisecond);
BENCHMARK(bm_replay<kvsift::exact_lru>)->Unit(benchmark::kMillisecond);

}  // namespace
