// Sparse decode attention over head-wise pages against a double-precision host reference.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <optional>
#include <vector>

#include <kvsift/cuda/sparse_attention.cuh>

#include "cuda_test.cuh"
#include "test_util.cuh"

namespace {

using namespace kvsift::cuda_test;
using kvsift::cuda::paged_kv_ref;
using kvsift::cuda::sparse_attention_params;
constexpr float inf = std::numeric_limits<float>::infinity();

/// A random paged K/V layout: every KV head owns ctx tokens spread over shuffled pages.
template <class T>
struct paged_fixture {
  int num_kv_heads, d, page_size, ctx, max_pages, num_pages;
  std::vector<T> k, v;
  std::vector<float> k_f, v_f;  // rounded values, as the kernel sees them
  std::vector<std::int32_t> table;
  device_buffer<T> d_k, d_v;
  device_buffer<std::int32_t> d_table;

  paged_fixture(int kv_heads, int dim, int page, int context)
      : num_kv_heads(kv_heads), d(dim), page_size(page), ctx(context) {
    max_pages = (ctx + page_size - 1) / page_size;
    num_pages = num_kv_heads * max_pages + 3;  // a few pages belong to nobody
    const std::size_t elems = static_cast<std::size_t>(num_pages) * page_size * d;
    k.resize(elems);
    v.resize(elems);
    k_f.resize(elems);
    v_f.resize(elems);
    for (std::size_t i = 0; i < elems; ++i) {
      k[i] = from_float<T>(uniform(-1.0f, 1.0f));
      v[i] = from_float<T>(uniform(-1.0f, 1.0f));
      k_f[i] = to_float(k[i]);
      v_f[i] = to_float(v[i]);
    }
    std::vector<std::int32_t> perm(num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
    table.assign(perm.begin(), perm.begin() + static_cast<std::ptrdiff_t>(kv_heads) * max_pages);
    d_k = device_buffer<T>(k);
    d_v = device_buffer<T>(v);
    d_table = device_buffer<std::int32_t>(table);
  }

  [[nodiscard]] paged_kv_ref<T> ref() const {
    return {d_k.get(), d_v.get(), num_pages, page_size, d, d_table.get(), num_kv_heads, max_pages};
  }
  [[nodiscard]] std::size_t row(int kv_head, int token) const {
    const int phys = table[static_cast<std::size_t>(kv_head) * max_pages + token / page_size];
    return (static_cast<std::size_t>(phys) * page_size + token % page_size) * d;
  }
};

struct reference_state {
  std::vector<double> o;
  double lse;
};

template <class T>
reference_state reference_attention(const paged_fixture<T>& f, const float* q, int kv_head,
                                    const std::int32_t* ids, std::size_t n, double scale) {
  reference_state r{std::vector<double>(f.d, 0.0), -std::numeric_limits<double>::infinity()};
  if (n == 0) return r;
  std::vector<double> logit(n);
  double m = -std::numeric_limits<double>::infinity();
  for (std::size_t j = 0; j < n; ++j) {
    const float* key = &f.k_f[f.row(kv_head, ids[j])];
    double dot = 0.0;
    for (int i = 0; i < f.d; ++i) dot += static_cast<double>(q[i]) * key[i];
    logit[j] = scale * dot;
    m = std::max(m, logit[j]);
  }
  double s = 0.0;
  for (std::size_t j = 0; j < n; ++j) {
    const double w = std::exp(logit[j] - m);
    s += w;
    const float* val = &f.v_f[f.row(kv_head, ids[j])];
    for (int i = 0; i < f.d; ++i) r.o[i] += w * val[i];
  }
  for (int i = 0; i < f.d; ++i) r.o[i] /= s;
  r.lse = m + std::log(s);
  return r;
}

/// Runs sparse attention for random token lists and compares every head with the reference.
template <class T>
void check_sparse_attention(int num_qo_heads, int num_kv_heads, int d, int ctx, int page_size,
                            int num_splits, std::optional<float> scale = std::nullopt) {
  paged_fixture<T> f(num_kv_heads, d, page_size, ctx);
  const int group = num_qo_heads / num_kv_heads;
  std::vector<float> q(static_cast<std::size_t>(num_qo_heads) * d);
  for (auto& x : q) x = uniform(-1.5f, 1.5f);
  std::vector<std::int64_t> indptr(num_qo_heads + 1, 0);
  std::vector<std::int32_t> ids;
  for (int h = 0; h < num_qo_heads; ++h) {
    int n = 0;
    switch (h % 5) {
      case 0:
        n = 0;
        break;  // empty list
      case 1:
        n = 1;
        break;  // single token
      case 2:
        n = ctx;
        break;  // every token
      default:
        n = uniform_int(2, ctx);
        break;
    }
    std::vector<std::int32_t> all(ctx);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng());
    all.resize(n);
    if (h % 2 == 0) std::sort(all.begin(), all.end());
    ids.insert(ids.end(), all.begin(), all.end());
    indptr[h + 1] = static_cast<std::int64_t>(ids.size());
  }
  device_buffer<float> d_q(q), d_o(q.size()), d_lse(num_qo_heads);
  device_buffer<std::int64_t> d_indptr(indptr);
  device_buffer<std::int32_t> d_ids(ids);
  sparse_attention_params params;
  params.scale = scale;
  params.num_splits = num_splits;
  const std::size_t ws = kvsift::cuda::sparse_attention_workspace_size(num_qo_heads, d, params);
  device_buffer<unsigned char> d_ws(ws);
  kvsift::cuda::sparse_attention<T>(d_q.get(), num_qo_heads, d, f.ref(), d_indptr.get(),
                                    d_ids.get(), d_o.get(), d_lse.get(), d_ws.get(), ws, nullptr,
                                    params);
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  const auto o = d_o.download();
  const auto lse = d_lse.download();
  const double sc = scale.value_or(1.0f / std::sqrt(static_cast<float>(d)));
  int bad = 0;
  for (int h = 0; h < num_qo_heads && bad == 0; ++h) {
    const auto ref = reference_attention(f, &q[static_cast<std::size_t>(h) * d], h / group,
                                         ids.data() + indptr[h],
                                         static_cast<std::size_t>(indptr[h + 1] - indptr[h]), sc);
    if (std::isinf(ref.lse)) {
      bad += !(lse[h] == -inf);
    } else {
      bad += !(std::fabs(lse[h] - ref.lse) <= 1e-4 * (1.0 + std::fabs(ref.lse)));
    }
    for (int i = 0; i < d; ++i) {
      bad += !(std::fabs(o[static_cast<std::size_t>(h) * d + i] - ref.o[i]) <= 2e-5);
    }
    if (bad > 0) {
      std::printf(
          "  %s qo=%d kv=%d d=%d ctx=%d page=%d splits=%d head=%d n=%lld: lse %.8g vs "
          "%.8g, o[0] %.7g vs %.7g\n",
          type_name<T>(), num_qo_heads, num_kv_heads, d, ctx, page_size, num_splits, h,
          static_cast<long long>(indptr[h + 1] - indptr[h]), lse[h], ref.lse,
          o[static_cast<std::size_t>(h) * d], ref.o[0]);
    }
  }
  CHECK(bad == 0);
}

template <class T>
void sparse_attention_suite() {
  for (int d : {64, 128, 256}) {
    check_sparse_attention<T>(8, 8, d, 200, 16, 0);    // GQA 1, automatic splits
    check_sparse_attention<T>(16, 4, d, 300, 32, 0);   // GQA 4
    check_sparse_attention<T>(28, 4, d, 150, 8, 0);    // GQA 7
    check_sparse_attention<T>(28, 4, d, 150, 8, 1);    // no split: kernel writes the output
    check_sparse_attention<T>(12, 3, d, 1500, 64, 3);  // long lists, few splits
    check_sparse_attention<T>(6, 2, d, 2600, 16, 1);   // > one offset tile per block
  }
  check_sparse_attention<T>(4, 1, 128, 100, 16, 2, 0.3f);  // explicit scale
}

}  // namespace

TEST_CASE("sparse_attention_f32", "[cuda][sparse_attention]") { sparse_attention_suite<float>(); }
TEST_CASE("sparse_attention_f16", "[cuda][sparse_attention]") { sparse_attention_suite<__half>(); }
TEST_CASE("sparse_attention_bf16", "[cuda][sparse_attention]") {
  sparse_attention_suite<__nv_bfloat16>();
}

// Every split count from 2 to 16 against the reference, with lists shorter than the split count
// (splits with no token leave empty states to the merge) and empty lists among them.
TEST_CASE("sparse_attention_every_split_count", "[cuda][sparse_attention]") {
  for (const int splits : {2, 3, 4, 5, 7, 8, 9, 16}) {
    check_sparse_attention<__half>(16, 4, 128, 300, 16, splits);
    check_sparse_attention<float>(10, 5, 64, 12, 4, splits);
    check_sparse_attention<__nv_bfloat16>(4, 2, 256, 700, 32, splits);
  }
}

TEST_CASE("sparse_attention_status_flags_bad_ids_and_skips_them", "[cuda][sparse_attention]") {
  paged_fixture<__half> f(2, 64, 16, 40);  // max_pages = 3 -> valid ids < 48
  std::vector<float> q(2 * 64, 0.25f);
  std::vector<std::int64_t> indptr = {0, 3, 5};
  std::vector<std::int32_t> ids = {5, 48, 7, -1, 9};  // 48 and -1 are out of range
  device_buffer<float> d_q(q), d_o(q.size()), d_lse(2);
  device_buffer<std::int64_t> d_indptr(indptr);
  device_buffer<std::int32_t> d_ids(ids);
  device_buffer<int> d_status(std::vector<int>{0});
  sparse_attention_params params;
  params.num_splits = 1;
  params.status = d_status.get();
  kvsift::cuda::sparse_attention<__half>(d_q.get(), 2, 64, f.ref(), d_indptr.get(), d_ids.get(),
                                         d_o.get(), d_lse.get(), nullptr, 0, nullptr, params);
  CHECK(d_status.download()[0] == 1);
  const auto o = d_o.download();
  const auto lse = d_lse.download();
  const std::int32_t valid0[] = {5, 7};
  const std::int32_t valid1[] = {9};
  const auto r0 = reference_attention(f, q.data(), 0, valid0, 2, 1.0 / 8.0);
  const auto r1 = reference_attention(f, q.data() + 64, 1, valid1, 1, 1.0 / 8.0);
  CHECK_NEAR(lse[0], r0.lse, 1e-4);
  CHECK_NEAR(lse[1], r1.lse, 1e-4);
  CHECK_NEAR(o[3], r0.o[3], 2e-5);
  CHECK_NEAR(o[64 + 3], r1.o[3], 2e-5);
}

TEST_CASE("sparse_attention_nan_query_gives_nan_for_that_head_only", "[cuda][sparse_attention]") {
  paged_fixture<float> f(1, 128, 16, 64);
  std::vector<float> q(2 * 128, 0.1f);
  q[5] = std::numeric_limits<float>::quiet_NaN();  // head 0
  std::vector<std::int64_t> indptr = {0, 10, 20};
  std::vector<std::int32_t> ids(20);
  std::iota(ids.begin(), ids.end(), 0);
  device_buffer<float> d_q(q), d_o(q.size()), d_lse(2);
  device_buffer<std::int64_t> d_indptr(indptr);
  device_buffer<std::int32_t> d_ids(ids);
  sparse_attention_params params;
  params.num_splits = 4;
  const std::size_t ws = kvsift::cuda::sparse_attention_workspace_size(2, 128, params);
  device_buffer<unsigned char> d_ws(ws);
  kvsift::cuda::sparse_attention<float>(d_q.get(), 2, 128, f.ref(), d_indptr.get(), d_ids.get(),
                                        d_o.get(), d_lse.get(), d_ws.get(), ws, nullptr, params);
  const auto lse = d_lse.download();
  CHECK(std::isnan(lse[0]));
  CHECK(std::isfinite(lse[1]));
}

TEST_CASE("sparse_attention_bad_input_throws", "[cuda][sparse_attention]") {
  using kvsift::cuda::sparse_attention;
  paged_fixture<__half> f(4, 128, 16, 32);
  device_buffer<float> q(6 * 128), o(6 * 128), lse(6);
  device_buffer<std::int64_t> indptr(std::vector<std::int64_t>(7, 0));
  device_buffer<std::int32_t> ids(1);
  sparse_attention_params one;
  one.num_splits = 1;
  auto call = [&](int heads, int dim, paged_kv_ref<__half> kv, const sparse_attention_params& p,
                  void* ws, std::size_t ws_bytes, const float* qp) {
    sparse_attention<__half>(qp, heads, dim, kv, indptr.get(), ids.get(), o.get(), lse.get(), ws,
                             ws_bytes, nullptr, p);
  };
  // q head_dim != K/V head_dim
  CHECK_THROWS_AS(call(4, 64, f.ref(), one, nullptr, 0, q.get()), kvsift::dimension_mismatch);
  // unsupported head_dim
  auto kv96 = f.ref();
  kv96.head_dim = 96;
  CHECK_THROWS_AS(call(4, 96, kv96, one, nullptr, 0, q.get()), kvsift::dimension_mismatch);
  // GQA ratio that does not divide: 6 query heads over 4 KV heads
  CHECK_THROWS_AS(call(6, 128, f.ref(), one, nullptr, 0, q.get()), kvsift::invalid_argument);
  // null q
  CHECK_THROWS_AS(call(4, 128, f.ref(), one, nullptr, 0, nullptr), kvsift::invalid_argument);
  // workspace too small for 4 splits
  sparse_attention_params four;
  four.num_splits = 4;
  CHECK(kvsift::cuda::sparse_attention_workspace_size(4, 128, four) > 0);
  CHECK_THROWS_AS(call(4, 128, f.ref(), four, nullptr, 0, q.get()), kvsift::invalid_argument);
  // bad page geometry, bad scale, negative split count
  auto kv0 = f.ref();
  kv0.page_size = 0;
  CHECK_THROWS_AS(call(4, 128, kv0, one, nullptr, 0, q.get()), kvsift::invalid_argument);
  sparse_attention_params nan_scale = one;
  nan_scale.scale = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_AS(call(4, 128, f.ref(), nan_scale, nullptr, 0, q.get()), kvsift::invalid_argument);
  sparse_attention_params negative;
  negative.num_splits = -1;
  CHECK_THROWS_AS(kvsift::cuda::sparse_attention_workspace_size(4, 128, negative),
                  kvsift::invalid_argument);
  // zero heads: nothing to do
  call(0, 128, f.ref(), one, nullptr, 0, nullptr);
  CHECK(cudaGetLastError() == cudaSuccess);
}
