#include "kvsift/attention/sparse_attention.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "../test_support.hpp"
#include "attention_reference.hpp"
#include "kvsift/attention/merge.hpp"

namespace {

using kvsift::id_t;
using kvsift_test::check_close;
using kvsift_test::kv_data;
using kvsift_test::reference_attention;

constexpr float neg_inf = -std::numeric_limits<float>::infinity();

std::vector<id_t> iota_ids(std::size_t n) {
  std::vector<id_t> ids(n);
  std::iota(ids.begin(), ids.end(), id_t{0});
  return ids;
}

/// Splits a shuffled 0..n-1 into `parts` non-empty-or-empty random pieces.
std::vector<std::vector<id_t>> random_partition(std::size_t n, std::size_t parts,
                                                std::mt19937& rng) {
  auto ids = iota_ids(n);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::vector<id_t>> out(parts);
  for (id_t t : ids) out[rng() % parts].push_back(t);
  return out;
}

template <class T>
void check_partitions(double tol) {
  std::mt19937 rng(11);
  for (std::size_t d : {64u, 128u, 80u}) {
    for (std::size_t n : {1u, 37u, 300u}) {
      const kv_data<T> data(2, n, d, rng);
      const auto kv = data.view();
      const auto q = kvsift_test::random_values<float>(d, rng, 1.5f);
      const std::size_t h = rng() % 2;
      const auto all = iota_ids(n);
      const auto ref = reference_attention<kvsift::kv_view<T>>(q, h, all, kv, 1.0 / std::sqrt(d));
      check_close(kvsift::dense_attention(q, h, 0, n, kv), ref, tol);
      for (std::size_t parts = 1; parts <= 8; ++parts) {
        INFO("d " << d << " n " << n << " parts " << parts);
        auto pieces = random_partition(n, parts, rng);
        std::vector<kvsift::partial_state> states;
        for (const auto& p : pieces) states.push_back(kvsift::sparse_attention(q, h, p, kv));
        check_close(kvsift::merge_n(states), ref, tol);
        std::shuffle(states.begin(), states.end(), rng);  // pairwise, random order
        kvsift::partial_state acc(d);
        for (const auto& s : states) kvsift::merge_into(acc, s);
        check_close(acc, ref, tol);
      }
    }
  }
}

}  // namespace

TEST_CASE("random partitions merged in random order equal full attention (f32)",
          "[attention][sparse_attention]") {
  check_partitions<float>(1e-5);
}

TEST_CASE("random partitions merged in random order equal full attention (f16, bf16)",
          "[attention][sparse_attention]") {
  // The reference reads the rounded 16-bit values, so the tolerance is f32 accumulation only.
  check_partitions<kvsift::half>(1e-5);
  check_partitions<kvsift::bfloat16>(1e-5);
}

TEST_CASE("merge(window, retrieved) equals dense attention over the context",
          "[attention][sparse_attention]") {
  std::mt19937 rng(12);
  const std::size_t n = 500;
  const std::size_t d = 128;
  const std::size_t window = 64;
  const kv_data<kvsift::half> data(1, n, d, rng);
  const auto kv = data.view();
  const auto q = kvsift_test::random_values<float>(d, rng);
  const auto win = kvsift::dense_attention(q, 0, n - window, n, kv);
  auto retrieved = iota_ids(n - window);
  std::shuffle(retrieved.begin(), retrieved.end(), rng);
  const auto ret = kvsift::sparse_attention(q, 0, retrieved, kv);
  const auto full = kvsift::dense_attention(q, 0, 0, n, kv);
  check_close(kvsift::merge(win, ret), full, 1e-5);
  check_close(kvsift::merge(ret, win), full, 1e-5);
}

TEST_CASE("paged source equals strided source", "[attention][sparse_attention]") {
  std::mt19937 rng(13);
  const std::size_t heads = 3, n = 203, d = 64, page = 16;
  const kv_data<kvsift::bfloat16> data(heads, n, d, rng);
  const std::size_t pages_per_head = (n + page - 1) / page;
  const std::size_t pool_pages = heads * pages_per_head + 5;  // spare pages in the pool
  std::vector<std::uint32_t> physical(pool_pages);
  std::iota(physical.begin(), physical.end(), 0u);
  std::shuffle(physical.begin(), physical.end(), rng);
  std::vector<std::uint32_t> table(heads * pages_per_head);
  std::vector<kvsift::bfloat16> kpool(pool_pages * page * d), vpool(kpool.size());
  for (std::size_t h = 0; h < heads; ++h) {
    for (std::size_t p = 0; p < pages_per_head; ++p) {
      const std::uint32_t phys = physical[h * pages_per_head + p];
      table[h * pages_per_head + p] = phys;
      for (std::size_t r = 0; r < page && p * page + r < n; ++r) {
        const std::size_t src = (h * n + p * page + r) * d;
        std::copy_n(&data.k[src], d, &kpool[(phys * page + r) * d]);
        std::copy_n(&data.v[src], d, &vpool[(phys * page + r) * d]);
      }
    }
  }
  const kvsift::paged_kv<kvsift::bfloat16> paged(
      kpool, vpool, table, {.kv_heads = heads, .tokens = n, .head_dim = d, .page_size = page});
  CHECK(paged.pages_per_head() == pages_per_head);
  const auto strided = data.view();
  auto ids = iota_ids(n);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(120);
  for (std::size_t h = 0; h < heads; ++h) {
    const auto q = kvsift_test::random_values<float>(d, rng);
    const auto a = kvsift::sparse_attention(q, h, ids, paged);
    const auto b = kvsift::sparse_attention(q, h, ids, strided);
    CHECK(a.o == b.o);  // same rows, same order: bitwise equal
    CHECK(a.lse == b.lse);
    check_close(kvsift::dense_attention(q, h, 0, n, paged),
                kvsift::dense_attention(q, h, 0, n, strided), 0);
  }
  using Catch::Matchers::Contains;
  auto bad_table = table;
  bad_table[4] = static_cast<std::uint32_t>(pool_pages);
  const kvsift::paged_kv_shape shape{
      .kv_heads = heads, .tokens = n, .head_dim = d, .page_size = page};
  REQUIRE_THROWS_AS(kvsift::paged_kv<kvsift::bfloat16>(kpool, vpool, bad_table, shape),
                    kvsift::out_of_range);
  REQUIRE_THROWS_WITH(
      kvsift::paged_kv<kvsift::bfloat16>(kpool, vpool, std::span(table).first(5), shape),
      Contains("expected a page table of 39 entries, got 5"));
}

TEST_CASE("token-major layout and GQA mapping read the right KV head",
          "[attention][sparse_attention]") {
  std::mt19937 rng(14);
  const std::size_t kv_heads = 2, q_heads = 8, n = 90, d = 64;
  // [token][head][dim] layout, as many engines store a step's K.
  const auto k = kvsift_test::random_values<float>(n * kv_heads * d, rng);
  const auto v = kvsift_test::random_values<float>(n * kv_heads * d, rng);
  const kvsift::kv_view<float> kv(kvsift::matrix_view<const float>(k.data(), n, d, kv_heads * d),
                                  kvsift::matrix_view<const float>(v.data(), n, d, kv_heads * d),
                                  kv_heads, d);
  CHECK(kvsift::gqa_kv_head(0, q_heads, kv_heads) == 0);
  CHECK(kvsift::gqa_kv_head(3, q_heads, kv_heads) == 0);
  CHECK(kvsift::gqa_kv_head(4, q_heads, kv_heads) == 1);
  CHECK(kvsift::gqa_kv_head(7, q_heads, kv_heads) == 1);
  CHECK(kvsift::gqa_kv_head(5, 32, 32) == 5);  // MHA
  CHECK(kvsift::gqa_kv_head(31, 32, 1) == 0);  // MQA
  const auto ids = iota_ids(n);
  for (std::size_t qh = 0; qh < q_heads; ++qh) {
    const auto q = kvsift_test::random_values<float>(d, rng);
    const std::size_t h = kvsift::gqa_kv_head(qh, q_heads, kv_heads);
    const auto got = kvsift::sparse_attention(q, h, ids, kv);
    // Reference from a copy of just that head's rows.
    std::vector<float> kh, vh;
    for (std::size_t t = 0; t < n; ++t) {
      kh.insert(kh.end(), &k[(t * kv_heads + h) * d], &k[(t * kv_heads + h) * d] + d);
      vh.insert(vh.end(), &v[(t * kv_heads + h) * d], &v[(t * kv_heads + h) * d] + d);
    }
    const kvsift::kv_view<float> one(kvsift::matrix_view<const float>(kh.data(), n, d),
                                     kvsift::matrix_view<const float>(vh.data(), n, d));
    check_close(got, reference_attention(q, 0, ids, one, 1.0 / std::sqrt(double(d))), 1e-5);
  }
  using Catch::Matchers::Contains;
  REQUIRE_THROWS_WITH(kvsift::gqa_kv_head(0, 12, 5),
                      Contains("query_heads (12) to be a multiple of kv_heads, got kv_heads = 5"));
  REQUIRE_THROWS_AS(kvsift::gqa_kv_head(0, 12, 0), kvsift::invalid_argument);
  REQUIRE_THROWS_AS(kvsift::gqa_kv_head(12, 12, 4), kvsift::out_of_range);
}

TEST_CASE("empty, single-token, masked and biased cases", "[attention][sparse_attention]") {
  std::mt19937 rng(15);
  const std::size_t n = 50, d = 64;
  const kv_data<float> data(1, n, d, rng);
  const auto kv = data.view();
  const auto q = kvsift_test::random_values<float>(d, rng);

  const auto empty = kvsift::sparse_attention(q, 0, {}, kv);
  CHECK(empty.is_empty());
  CHECK(empty.o == std::vector<float>(d, 0.0f));
  CHECK(kvsift::dense_attention(q, 0, 7, 7, kv).is_empty());

  const std::vector<id_t> one = {17};
  const auto single = kvsift::sparse_attention(q, 0, one, kv);
  for (std::size_t j = 0; j < d; ++j) CHECK(single.o[j] == Approx(data.v[17 * d + j]));
  double dot = 0;
  for (std::size_t j = 0; j < d; ++j) dot += double(q[j]) * data.k[17 * d + j];
  CHECK(single.lse == Approx(dot / 8.0).epsilon(1e-5));

  const auto ids = iota_ids(n);
  const std::vector<float> all_masked(n, neg_inf);
  const auto masked = kvsift::sparse_attention(q, 0, ids, kv, {.bias = all_masked});
  CHECK(masked.is_empty());
  CHECK(masked.o == std::vector<float>(d, 0.0f));

  // Partial mask + bias + explicit scale == reference with the same bias.
  std::vector<float> bias(n);
  std::normal_distribution<float> dist;
  for (std::size_t i = 0; i < n; ++i) bias[i] = i % 3 == 0 ? neg_inf : dist(rng);
  const kvsift::attention_params params{.scale = 0.3f, .bias = bias};
  check_close(kvsift::sparse_attention(q, 0, ids, kv, params),
              reference_attention(q, 0, ids, kv, 0.3, bias), 1e-5);
  check_close(kvsift::dense_attention(q, 0, 0, n, kv, params),
              reference_attention(q, 0, ids, kv, 0.3, bias), 1e-5);
  // Masking a whole 64-token block in the middle of a longer list.
  const kv_data<float> big(1, 200, d, rng);
  std::vector<float> bias2(200, 0.0f);
  std::fill(bias2.begin() + 64, bias2.begin() + 128, neg_inf);
  const auto ids2 = iota_ids(200);
  check_close(kvsift::sparse_attention(q, 0, ids2, big.view(), {.bias = bias2}),
              reference_attention(q, 0, ids2, big.view(), 0.125, bias2), 1e-5);
}

TEST_CASE("extreme logits give finite o and the right lse", "[attention][sparse_attention]") {
  // Logits are multiples of 100 near +-1e4, exact in f32, so the reference is exact too.
  const std::size_t n = 150, d = 64;
  for (float sign : {1.0f, -1.0f}) {
    std::mt19937 rng(16);
    std::vector<float> k(n * d, 0.0f);
    auto v = kvsift_test::random_values<float>(n * d, rng);
    for (std::size_t t = 0; t < n; ++t) k[t * d] = sign * static_cast<float>(90 + rng() % 21);
    std::vector<float> q(d, 0.0f);
    q[0] = 100.0f;
    const kvsift::kv_view<float> kv(kvsift::matrix_view<const float>(k.data(), n, d),
                                    kvsift::matrix_view<const float>(v.data(), n, d));
    const auto ids = iota_ids(n);
    const auto got = kvsift::sparse_attention(q, 0, ids, kv, {.scale = 1.0f});
    for (float x : got.o) REQUIRE(std::isfinite(x));
    check_close(got, reference_attention(q, 0, ids, kv, 1.0), 1e-6);
    // Split and merged, too. Each part's lse is an f32 near 1e4 (ulp ~1e-3), so the merge
    // weights carry up to |lse| * 2^-24 ~ 6e-4 relative error: inherent in an f32 lse, not the
    // merge. The result must still be finite and within that bound.
    const std::vector<id_t> a(ids.begin(), ids.begin() + 70), b(ids.begin() + 70, ids.end());
    const auto merged = kvsift::merge(kvsift::sparse_attention(q, 0, a, kv, {.scale = 1.0f}),
                                      kvsift::sparse_attention(q, 0, b, kv, {.scale = 1.0f}));
    check_close(merged, got, 2e-3);
  }
}

TEST_CASE("non-finite K masks the token; NaN in q is rejected", "[attention][sparse_attention]") {
  std::mt19937 rng(17);
  const std::size_t n = 40, d = 64;
  kv_data<float> data(1, n, d, rng);
  data.k[5 * d + 3] = std::numeric_limits<float>::quiet_NaN();
  data.k[9 * d] = std::numeric_limits<float>::infinity();
  const auto q = kvsift_test::random_values<float>(d, rng);
  const auto ids = iota_ids(n);
  std::vector<id_t> clean;
  for (id_t t : ids) {
    if (t != 5 && t != 9) clean.push_back(t);
  }
  check_close(kvsift::sparse_attention(q, 0, ids, data.view()),
              reference_attention(q, 0, clean, data.view(), 0.125), 1e-5);
  auto bad_q = q;
  bad_q[7] = std::numeric_limits<float>::quiet_NaN();
  using Catch::Matchers::Contains;
  REQUIRE_THROWS_AS(kvsift::sparse_attention(bad_q, 0, ids, data.view()), kvsift::non_finite_value);
  REQUIRE_THROWS_WITH(kvsift::dense_attention(bad_q, 0, 0, n, data.view()),
                      Contains("expected a finite query, got nan at element 7"));
}

TEST_CASE("bad input throws with expected and actual values", "[attention][sparse_attention]") {
  std::mt19937 rng(18);
  const std::size_t n = 30, d = 64;
  const kv_data<kvsift::half> data(2, n, d, rng);
  const auto kv = data.view();
  const auto q = kvsift_test::random_values<float>(d, rng);
  const auto ids = iota_ids(n);
  using Catch::Matchers::Contains;

  const auto q_short = kvsift_test::random_values<float>(d - 1, rng);
  REQUIRE_THROWS_AS(kvsift::sparse_attention(q_short, 0, ids, kv), kvsift::dimension_mismatch);
  REQUIRE_THROWS_WITH(kvsift::sparse_attention(q_short, 0, ids, kv),
                      Contains("expected dimension 64, got 63"));
  REQUIRE_THROWS_WITH(kvsift::sparse_attention(q, 2, ids, kv),
                      Contains("expected kv_head < 2, got 2"));
  REQUIRE_THROWS_AS(kvsift::sparse_attention(q, 2, ids, kv), kvsift::out_of_range);
  const std::vector<id_t> bad_ids = {1, 2, 30, 4};
  REQUIRE_THROWS_AS(kvsift::sparse_attention(q, 0, bad_ids, kv), kvsift::out_of_range);
  REQUIRE_THROWS_WITH(kvsift::sparse_attention(q, 0, bad_ids, kv),
                      Contains("expected token ids < 30, got 30 at position 2"));
  const std::vector<float> bias(n - 1, 0.0f);
  REQUIRE_THROWS_AS(kvsift::sparse_attention(q, 0, ids, kv, {.bias = bias}),
                    kvsift::dimension_mismatch);
  REQUIRE_THROWS_WITH(kvsift::sparse_attention(q, 0, ids, kv, {.bias = bias}),
                      Contains("expected 30 bias values (one per token), got 29"));
  std::vector<float> nan_bias(n, 0.0f);
  nan_bias[3] = std::numeric_limits<float>::quiet_NaN();
  REQUIRE_THROWS_WITH(kvsift::sparse_attention(q, 0, ids, kv, {.bias = nan_bias}),
                      Contains("expected bias finite or -inf, got nan at position 3"));
  nan_bias[3] = std::numeric_limits<float>::infinity();
  REQUIRE_THROWS_AS(kvsift::sparse_attention(q, 0, ids, kv, {.bias = nan_bias}),
                    kvsift::non_finite_value);
  REQUIRE_THROWS_AS(
      kvsift::sparse_attention(q, 0, ids, kv, {.scale = std::numeric_limits<float>::infinity()}),
      kvsift::non_finite_value);
  REQUIRE_THROWS_WITH(kvsift::dense_attention(q, 0, 5, 31, kv),
                      Contains("expected a range within [0, 30), got [5, 31)"));
  REQUIRE_THROWS_AS(kvsift::dense_attention(q, 0, 6, 5, kv), kvsift::out_of_range);

  // Validation happens before the output is touched.
  kvsift::partial_state out(d);
  out.lse = 1.25f;
  REQUIRE_THROWS(kvsift::sparse_attention(q, 0, bad_ids, kv, {}, out));
  CHECK(out.lse == 1.25f);

  // Mismatched K and V shapes.
  const std::vector<float> k(10 * 64), v(10 * 32);
  REQUIRE_THROWS_WITH(kvsift::kv_view<float>(kvsift::matrix_view<const float>(k.data(), 10, 64),
                                             kvsift::matrix_view<const float>(v.data(), 10, 32)),
                      Contains("expected dimension 64, got 32"));
  REQUIRE_THROWS_AS(kvsift::kv_view<float>(kvsift::matrix_view<const float>(k.data(), 10, 64),
                                           kvsift::matrix_view<const float>(v.data(), 5, 64)),
                    kvsift::dimension_mismatch);
}

TEST_CASE("KvSource concept accepts the models and rejects non-sources",
          "[attention][sparse_attention]") {
  struct no_value {
    using value_type = float;
    std::size_t tokens() const { return 0; }
    std::size_t kv_heads() const { return 0; }
    std::size_t head_dim() const { return 0; }
    const float* key(std::size_t, kvsift::id_t) const { return nullptr; }
  };
  struct wrong_type {
    using value_type = double;
    std::size_t tokens() const { return 0; }
    std::size_t kv_heads() const { return 0; }
    std::size_t head_dim() const { return 0; }
    const double* key(std::size_t, kvsift::id_t) const { return nullptr; }
    const double* value(std::size_t, kvsift::id_t) const { return nullptr; }
  };
  STATIC_REQUIRE(kvsift::KvSource<kvsift::kv_view<float>>);
  STATIC_REQUIRE(kvsift::KvSource<kvsift::paged_kv<kvsift::half>>);
  STATIC_REQUIRE_FALSE(kvsift::KvSource<no_value>);
  STATIC_REQUIRE_FALSE(kvsift::KvSource<wrong_type>);
}

TEST_CASE("branch-free f16 widening is exact for every bit pattern",
          "[attention][sparse_attention]") {
  int mismatches = 0;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float want = kvsift::half::to_float(static_cast<std::uint16_t>(h));
    const float got = kvsift::detail::half_to_float_branchless(static_cast<std::uint16_t>(h));
    const bool same = std::bit_cast<std::uint32_t>(want) == std::bit_cast<std::uint32_t>(got) ||
                      (std::isnan(want) && std::isnan(got));
    mismatches += same ? 0 : 1;
  }
  CHECK(mismatches == 0);
}

namespace {
// A K/V source that claims more tokens than ids can name, backed by one real row: the
// attention entry points must reject it before reading (old code cast 2^32 to id 0 and read
// row 0 as if it were token 2^32).
struct huge_kv {
  using value_type = float;
  const float* row = nullptr;
  std::size_t n = 0;
  [[nodiscard]] std::size_t tokens() const noexcept { return n; }
  [[nodiscard]] std::size_t kv_heads() const noexcept { return 1; }
  [[nodiscard]] std::size_t head_dim() const noexcept { return 2; }
  [[nodiscard]] const float* key(std::size_t, id_t) const noexcept { return row; }
  [[nodiscard]] const float* value(std::size_t, id_t) const noexcept { return row; }
};
}  // namespace

// Regression: page_size * head_dim wrapped to 0 (then divided by) and kv_heads * pages wrapped
// so an empty page table passed; item 20: more tokens than 32-bit ids can name.
TEST_CASE("paged_kv and kv_view reject overflow-sized shapes", "[attention][rel]") {
  using Catch::Matchers::Contains;
  using kvsift_test::message_of;
  const std::vector<float> pool(8, 1.0f);
  const std::span<const float> p(pool);
  const std::span<const std::uint32_t> no_table;
  constexpr std::size_t big = std::size_t{1} << 32;
  auto msg = message_of<kvsift::invalid_argument>([&] {
    (void)kvsift::paged_kv<float>(p, p, no_table,
                                  {.kv_heads = 1, .tokens = 4, .head_dim = big, .page_size = big});
  });
  CHECK_THAT(msg, Contains("page_size x head_dim") && Contains("4294967296 x 4294967296"));
  msg = message_of<kvsift::invalid_argument>([&] {
    (void)kvsift::paged_kv<float>(
        p, p, no_table,
        {.kv_heads = std::size_t{1} << 63, .tokens = 4, .head_dim = 2, .page_size = 2});
  });
  CHECK_THAT(msg, Contains("kv_heads x pages per head") && Contains("9223372036854775808 x 2"));
  msg = message_of<kvsift::out_of_range>([&] {
    (void)kvsift::paged_kv<float>(p, p, no_table,
                                  {.kv_heads = 1,
                                   .tokens = std::numeric_limits<std::size_t>::max(),
                                   .head_dim = 2,
                                   .page_size = 2});
  });
  CHECK_THAT(msg, Contains("tokens") && Contains("18446744073709551615"));
  // A strided view of 2^32 rows over 8 floats (stride 2: never read past row 3 unless a check
  // is missing).
  const kvsift::matrix_view<const float> rows(pool.data(), big, 2);
  msg = message_of<kvsift::out_of_range>([&] { (void)kvsift::kv_view<float>(rows, rows); });
  CHECK_THAT(msg, Contains("kv_view") && Contains("4294967296"));
  const kvsift::matrix_view<const float> flat(pool.data(), 4, 0);
  msg = message_of<kvsift::invalid_argument>([&] { (void)kvsift::kv_view<float>(flat, flat); });
  CHECK_THAT(msg, Contains("dimension > 0") && Contains("4 x 0"));

  const huge_kv kv{pool.data(), big + 2};
  const std::vector<float> q{1.0f, 1.0f};
  msg = message_of<kvsift::out_of_range>(
      [&] { (void)kvsift::dense_attention(q, 0, big, big + 1, kv); });
  CHECK_THAT(msg, Contains("dense_attention") && Contains("4294967298"));
  const std::vector<id_t> ids{0};
  msg = message_of<kvsift::out_of_range>([&] { (void)kvsift::sparse_attention(q, 0, ids, kv); });
  CHECK_THAT(msg, Contains("sparse_attention") && Contains("4294967298"));
}
