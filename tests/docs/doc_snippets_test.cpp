// The C++ snippets shown in README.md and docs/*.md, compiled and run here. Each snippet is the
// region between `// example-begin NAME` and `// example-end NAME`; the doc marks its copy with
// `<!-- example: NAME -->` on the line before the code block, and tests/docs/check_snippets.py
// (CTest: kvsift_doc_snippets) fails when the two differ. Edit the region here, then paste it
// into the doc. The checks around each region make sure the snippet also does what the doc says.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "../attention/attention_reference.hpp"
#include "kvsift/kvsift.hpp"
#include "kvsift/testing/ood_generator.hpp"

namespace {

std::size_t overlap(std::span<const kvsift::id_t> a, std::span<const kvsift::id_t> b) {
  const std::set<kvsift::id_t> sa(a.begin(), a.end());
  std::size_t n = 0;
  for (kvsift::id_t id : b) n += sa.count(id);
  return n;
}

}  // namespace

TEST_CASE("README: build a RoarGraph, then top-k, DIPR and prefix-filtered search", "[docs]") {
  kvsift::testing::ood_params gen;
  gen.keys = 4000;
  gen.queries = 520;
  gen.dim = 32;
  const auto data = kvsift::testing::make_ood(gen);
  const auto keys = data.key_view();
  const auto prefill_q = data.query_view().row_range(0, 500);
  const auto q = data.query_view().row_span(510);
  // The best score in a static window of the last 64 tokens, as the GPU would report it.
  float window_best = -std::numeric_limits<float>::infinity();
  for (std::size_t t = keys.rows() - 64; t < keys.rows(); ++t) {
    float s = 0;
    for (std::size_t j = 0; j < keys.cols(); ++j) s += q[j] * keys.row(t)[j];
    window_best = std::max(window_best, s);
  }
  const kvsift::id_t p = 2000;

  // example-begin readme-cpp
  // keys: n x d attention keys of one KV head (the engine's memory, borrowed, f32/f16/bf16);
  // prefill_q: m x d queries of the heads that read it (sample_gqa_queries for a GQA group).
  kvsift::view_store<float> store(keys);
  auto index = kvsift::roargraph_builder<>({.nq = 100, .M = 35, .L = 500}).build(store, prefill_q);

  kvsift::search_workspace ws;  // one per thread; search params are per call
  std::vector<kvsift::id_t> ids(100);
  std::vector<float> scores(100);
  kvsift::beam_search(index, q, {.k = 100, .L = 300}, ws, std::span(ids), std::span(scores));

  kvsift::dipr_result r;  // every key with q.k >= best - beta, best including the window's
  kvsift::dipr_search(index, q, {.beta = 2.0f, .l0 = 100, .seed_score = window_best}, ws, r);

  // Partial prefix reuse: only the first p tokens are valid (ACORN 2-hop filtered walk).
  kvsift::beam_search(index, q, {.k = 100, .L = 300}, ws, std::span(ids), std::span(scores),
                      kvsift::id_below{p});
  // example-end readme-cpp

  // What the comments promise, against the exact answers of a flat scan.
  const kvsift::flat_index<kvsift::view_store<float>> flat(store);
  std::vector<kvsift::id_t> exact(100), all_ids(100);
  std::vector<float> exact_scores(100), all_scores(100);
  kvsift::beam_search(index, q, {.k = 100, .L = 300}, ws, std::span(all_ids),
                      std::span(all_scores));
  flat.topk(q, 100, ws, std::span(exact), std::span(exact_scores));
  CHECK(overlap(exact, all_ids) >= 90);

  kvsift::dipr_result exact_r;
  flat.dipr(q, {.beta = 2.0f, .seed_score = window_best}, ws, exact_r);
  REQUIRE(!exact_r.ids.empty());
  CHECK(r.best_score == exact_r.best_score);
  CHECK(overlap(exact_r.ids, r.ids) >= exact_r.ids.size() * 9 / 10);

  flat.topk(q, 100, ws, std::span(exact), std::span(exact_scores), kvsift::id_below{p});
  for (kvsift::id_t id : ids) CHECK(id < p);
  CHECK(overlap(exact, ids) >= 90);
}

TEST_CASE("docs/attention.md: CPU sparse attention merged with a FlashInfer window state",
          "[docs]") {
  std::mt19937 rng(5);
  const std::size_t kv_heads = 2, query_heads = 6, n = 700, d = 64, w = 128;
  const kvsift_test::kv_data<kvsift::half> data(kv_heads, n, d, rng);
  const kvsift::matrix_view<const kvsift::half> k_head0(data.k.data(), n, d);
  const kvsift::matrix_view<const kvsift::half> v_head0(data.v.data(), n, d);
  const std::size_t head_stride = n * d;
  const std::size_t query_head = 4;
  const auto q = kvsift_test::random_values<float>(d, rng, 1.5f);
  // Retrieved tokens: every third token before the window.
  std::vector<kvsift::id_t> ids;
  for (std::size_t t = 0; t < n - w; t += 3) ids.push_back(static_cast<kvsift::id_t>(t));
  // The window's state as FlashInfer returns it: o and a base-2 LSE.
  const auto gpu = kvsift::dense_attention(q, 1, n - w, n, data.view());
  const std::vector<float> o_from_gpu = gpu.o;
  const float lse2_from_flashinfer = kvsift::lse_to_base2(gpu.lse);

  // example-begin attention-merge
  kvsift::kv_view<kvsift::half> kv(k_head0, v_head0, kv_heads, head_stride);
  const std::size_t h = kvsift::gqa_kv_head(query_head, query_heads, kv_heads);
  auto retrieved = kvsift::sparse_attention(q, h, ids, kv);  // CPU
  kvsift::partial_state window{o_from_gpu, kvsift::lse_from_base2(lse2_from_flashinfer)};
  auto out = kvsift::merge(window, retrieved);  // == attention over both sets
  // example-end attention-merge

  REQUIRE(h == 1);
  std::vector<kvsift::id_t> both = ids;
  for (std::size_t t = n - w; t < n; ++t) both.push_back(static_cast<kvsift::id_t>(t));
  const auto ref = kvsift_test::reference_attention(q, h, both, kv, 1.0 / std::sqrt(double(d)));
  kvsift_test::check_close(out, ref, 1e-5);
}
