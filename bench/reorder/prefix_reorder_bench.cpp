// Prefix-sharing batch planning on a real table: the ISO 3166-2 subdivisions shipped by the
// Debian package iso-codes (/usr/share/iso-codes/json/iso_3166-2.json, ~5100 rows) joined with
// the official country names of iso_3166-1.json, i.e. the result of
//   SELECT s.code, s.name, s.type, s.parent, c.official_name AS country
//   FROM subdivisions s JOIN countries c ON c.alpha_2 = prefix(s.code)
// in file order. `country` is the repeated long column (a few hundred distinct values of
// several words over thousands of rows). Each row becomes one request "code: .. name: .. ..."
// (header words included); tokens are words split at whitespace and ASCII punctuation
// (split_words), not a real LLM tokenizer.
//
// Three tables from it: `join` (as above, file order, which happens to group rows by country),
// `join_shuffled` (the same rows in a fixed random order, as a query without ORDER BY returns
// them: row sorting matters there) and `projection` (SELECT s.type, c.official_name: many
// exact duplicate rows, so dedup matters).
//
// Reported per variant: estimated token hit rate under an LRU prefix cache (unlimited and
// 256 tokens) and its ratio to the original order, measured in the same run; the time is
// that of planning + tokenising + estimating. Skipped when iso-codes is not installed.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kvsift/reorder/prefix_reorder.hpp"
#include "kvsift/reorder/prefix_trie.hpp"

namespace {

constexpr const char* iso_dir = "/usr/share/iso-codes/json/";

// The iso-codes JSON files are arrays of flat objects with one "key": "value" pair per line;
// this reads exactly that layout (not general JSON).
std::vector<std::map<std::string, std::string>> read_flat_objects(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::map<std::string, std::string>> out;
  if (!f) return out;
  for (std::string line; std::getline(f, line);) {
    const auto k0 = line.find('"');
    if (line.find('{') != std::string::npos) out.emplace_back();
    if (k0 == std::string::npos || out.empty()) continue;
    const auto k1 = line.find('"', k0 + 1);
    const auto v0 = line.find('"', k1 + 1);
    const auto v1 = line.rfind('"');
    if (k1 == std::string::npos || v0 == std::string::npos || v1 <= v0) continue;
    out.back()[line.substr(k0 + 1, k1 - k0 - 1)] = line.substr(v0 + 1, v1 - v0 - 1);
  }
  return out;
}

struct table {
  std::vector<std::string> header{"code", "name", "type", "parent", "country"};
  kvsift::table_rows rows;
};

const std::optional<table>& join() {
  static const std::optional<table> t = []() -> std::optional<table> {
    std::map<std::string, std::string> country;
    for (auto& c : read_flat_objects(std::string(iso_dir) + "iso_3166-1.json")) {
      country[c["alpha_2"]] = c.count("official_name") ? c["official_name"] : c["name"];
    }
    table t;
    for (auto& s : read_flat_objects(std::string(iso_dir) + "iso_3166-2.json")) {
      if (!s.count("code")) continue;
      const std::string cc = s["code"].substr(0, s["code"].find('-'));
      t.rows.push_back({s["code"], s["name"], s["type"], s["parent"], country[cc]});
    }
    if (t.rows.size() < 1000) return std::nullopt;
    return t;
  }();
  return t;
}

std::optional<table> variant(int kind) {
  auto t = join();
  if (!t || kind == 0) return t;
  if (kind == 1) {
    std::mt19937 rng(42);
    std::shuffle(t->rows.begin(), t->rows.end(), rng);
    return t;
  }
  for (auto& r : t->rows) r = {r[2], r[4]};
  t->header = {"type", "country"};
  return t;
}

const std::optional<table>& table_of(int kind) {
  static const std::optional<table> tables[3] = {variant(0), variant(1), variant(2)};
  return tables[kind];
}

// Hit rate over the tokens of every original row: a collapsed duplicate is served from its
// representative's answer, so all its tokens count as hits (prefill avoided).
struct outcome {
  double hit_rate = 0;
  std::size_t requests = 0;
};

outcome run_variant(const table& t, kvsift::batch_plan_params p, std::size_t capacity) {
  const auto plan = kvsift::plan_batch(t.rows, p);
  kvsift::token_vocab vocab;
  const auto reqs = kvsift::request_tokens(t.rows, plan, vocab, t.header);
  const auto e = kvsift::estimate_hit_rate(reqs, capacity);
  std::size_t all = 0;
  for (std::size_t r = 0; r < t.rows.size(); ++r) all += reqs[plan.request_of_row[r]].size();
  return {1.0 - static_cast<double>(e.total_tokens - e.hit_tokens) / static_cast<double>(all),
          reqs.size()};
}

void BM_reorder(benchmark::State& state, kvsift::batch_plan_params p) {
  const auto& t = table_of(static_cast<int>(state.range(0)));
  if (!t) {
    state.SkipWithError("iso-codes not installed (/usr/share/iso-codes/json)");
    return;
  }
  const std::size_t capacity = state.range(1) == 0 ? kvsift::prefix_trie::unlimited
                                                   : static_cast<std::size_t>(state.range(1));
  const double baseline = run_variant(*t, {false, false, false}, capacity).hit_rate;
  outcome o;
  for (auto _ : state) {
    o = run_variant(*t, p, capacity);
    benchmark::DoNotOptimize(o);
  }
  state.counters["rows"] = static_cast<double>(t->rows.size());
  state.counters["requests"] = static_cast<double>(o.requests);
  state.counters["hit_rate"] = o.hit_rate;
  state.counters["vs_original"] = o.hit_rate / baseline;
}

}  // namespace

BENCHMARK_CAPTURE(BM_reorder, original, kvsift::batch_plan_params{false, false, false})
    ->ArgsProduct({{0, 1, 2}, {0, 256}})
    ->ArgNames({"table", "lru"})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_reorder, columns, kvsift::batch_plan_params{true, false, false})
    ->ArgsProduct({{0, 1, 2}, {0, 256}})
    ->ArgNames({"table", "lru"})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_reorder, columns_rows, kvsift::batch_plan_params{true, true, false})
    ->ArgsProduct({{0, 1, 2}, {0, 256}})
    ->ArgNames({"table", "lru"})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_reorder, columns_rows_dedup, kvsift::batch_plan_params{true, true, true})
    ->ArgsProduct({{0, 1, 2}, {0, 256}})
    ->ArgNames({"table", "lru"})
    ->Unit(benchmark::kMillisecond);
