// The GPU kNN engine against the CPU engine (the exact oracle of <kvsift/index/knn.hpp>).
//
// How ids are compared exactly: the GPU GEMM and the CPU's Eigen GEMM add the d products in
// different orders, so for general floats their scores may differ in the last bits and the
// orders of near-ties may differ. The equality tests therefore use small integer-valued
// vectors: every product and partial sum is an integer below 2^24, exact in f32 in any order
// and exactly representable in f16 and bf16, so both engines see identical scores and the ids
// must match exactly, tie rule included (integer data has many exact ties). The graph test
// uses real-valued data and compares recall, not ids.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

// Same nvcc diagnostic as in knn.cuh (host headers instantiating matrix_view<const T>).
#pragma nv_diagnostic push
#pragma nv_diag_suppress 554
#include <kvsift/core/dense_matrix.hpp>
#include <kvsift/core/vector_store.hpp>
#include <kvsift/cuda/knn.cuh>
#include <kvsift/index/roargraph_builder.hpp>
#include <kvsift/search/beam_search.hpp>
#include <kvsift/testing/ood_generator.hpp>
#pragma nv_diagnostic pop

#include "cuda_test.cuh"
#include "test_util.cuh"

namespace {

using namespace kvsift::cuda_test;
using kvsift::bfloat16;
using kvsift::half;
using kvsift::id_t;
using kvsift::matrix_view;

/// v as element type T (kvsift::convert over a one-column view).
template <class T>
std::vector<T> convert(const std::vector<float>& v) {
  const auto m = kvsift::convert<T>(matrix_view<const float>(v.data(), v.size(), 1));
  return {m.data(), m.data() + m.size()};
}

template <class T>
const char* name_of() {
  return kvsift::to_string(kvsift::element_type_of<T>()).data();  // a literal: NUL-terminated
}

/// Counts rows whose ids or scores differ; prints the first mismatch.
int count_mismatched_rows(const kvsift::knn_result& got, const kvsift::knn_result& want) {
  if (got.rows != want.rows || got.k != want.k) {
    std::printf("  shape %zu x %zu, expected %zu x %zu\n", got.rows, got.k, want.rows, want.k);
    return static_cast<int>(want.rows) + 1;
  }
  int bad = 0;
  for (std::size_t i = 0; i < want.rows; ++i) {
    for (std::size_t j = 0; j < want.k; ++j) {
      const std::size_t at = i * want.k + j;
      if (got.ids[at] != want.ids[at] || got.scores[at] != want.scores[at]) {
        if (bad == 0) {
          std::printf("  row %zu rank %zu: got id %u score %g, expected id %u score %g\n", i, j,
                      got.ids[at], got.scores[at], want.ids[at], want.scores[at]);
        }
        ++bad;
        break;
      }
    }
  }
  return bad;
}

template <class T>
void engine_matches_cpu(std::size_t m, std::size_t n, std::size_t d, int range,
                        const std::vector<std::size_t>& ks, kvsift::cuda::knn_policy policy) {
  const auto qf = integer_matrix(m, d, range);
  const auto kf = integer_matrix(n, d, range);
  const auto keys = convert<T>(kf);
  const matrix_view<const float> q(qf.data(), m, d);
  const matrix_view<const T> kv(keys.data(), n, d);
  const kvsift::cpu_knn_engine cpu(kvsift::cpu_knn_params{.threads = 2});
  const kvsift::cuda::knn_engine gpu({.device = 0, .policy = policy});
  for (const std::size_t k : ks) {
    const auto want = cpu.search(q, kv, k);
    const auto got = gpu.search(q, kv, k);
    const int bad = count_mismatched_rows(got, want);
    if (bad != 0) {
      std::printf("  %s m=%zu n=%zu d=%zu k=%zu: %d rows differ\n", name_of<T>(), m, n, d, k, bad);
    }
    CHECK(bad == 0);
  }
}

}  // namespace

// k in {1, 10, 100, 1000}; n = 2500 and m = 300 are not multiples of the tiles (768 x 128), so
// partial tiles in both directions are exercised, and several key tiles are merged per row.
TEST_CASE("knn_engine_matches_cpu_f32", "[cuda][knn]") {
  engine_matches_cpu<float>(300, 2500, 24, 3, {1, 10, 100, 1000}, {128, 768});
}
TEST_CASE("knn_engine_matches_cpu_f16", "[cuda][knn]") {
  engine_matches_cpu<kvsift::half>(300, 2500, 24, 3, {1, 10, 100, 1000}, {128, 768});
}
TEST_CASE("knn_engine_matches_cpu_bf16", "[cuda][knn]") {
  engine_matches_cpu<kvsift::bfloat16>(300, 2500, 24, 3, {1, 10, 100, 1000}, {128, 768});
}

// Wider integer range (few ties), default tiles (one tile each way), a single query, and k = n.
TEST_CASE("knn_engine_matches_cpu_edge_shapes", "[cuda][knn]") {
  engine_matches_cpu<float>(1, 3000, 64, 40, {1, 10, 100, 1000}, {});
  engine_matches_cpu<kvsift::half>(1, 1000, 16, 8, {1, 1000}, {});
  engine_matches_cpu<kvsift::bfloat16>(37, 517, 8, 1, {1, 517}, {5, 64});  // mostly ties
  engine_matches_cpu<float>(64, 3000, 128, 40, {1024}, {16, 1000});
}

// The fused kernel (knn_policy::fused, the default): 16-bit elements, d in {64, 128, 256},
// k <= 128. m = 300 is not a multiple of its 128 queries per block nor n = 2500 of its 64 keys
// per chunk; range 2 makes ties everywhere (the id rule decides), range 40 few. k = 129 takes the
// tiled path in the same call sequence.
TEST_CASE("knn_fused_matches_cpu", "[cuda][knn]") {
  const kvsift::cuda::knn_policy any{.fused_min_queries = 1};  // the fused kernel for few queries
  for (const std::size_t d : {64, 128, 256}) {
    engine_matches_cpu<kvsift::half>(300, 2500, d, 2, {1, 10, 100, 128, 129}, any);
    engine_matches_cpu<kvsift::bfloat16>(300, 2500, d, 2, {1, 100, 128}, any);
  }
  engine_matches_cpu<kvsift::half>(129, 4100, 128, 40, {1, 64, 100}, any);
  // Few queries, many keys: the keys are split into slices (10 at k = 100, 19 at k = 10), each
  // with its own running top-k, merged by the final sort.
  engine_matches_cpu<kvsift::half>(37, 20000, 128, 3, {1, 10, 100, 128}, any);
  engine_matches_cpu<kvsift::bfloat16>(37, 20000, 64, 3, {100}, any);
  engine_matches_cpu<kvsift::half>(5, 100, 64, 3, {100}, any);  // k = n: every key, 2 chunks
  engine_matches_cpu<kvsift::half>(3, 70, 128, 3, {64}, any);   // k between one and two chunks
  // A workspace for 440 queries' running results and buffers: 600 queries take two launches of
  // the fused kernel (384 + 216 queries).
  engine_matches_cpu<kvsift::half>(600, 1000, 64, 3, {100}, {256, 1024, true, 1});
}

namespace {

/// knn() through the device entry point with the given policy, over rows at the given pitches
/// (elements; 0: d); ids and scores downloaded. With policy.fused the shapes must take the fused
/// kernel (checked, so that a test meant for it cannot pass on the tiled path).
template <class T>
kvsift::knn_result device_knn(const std::vector<T>& q, const std::vector<T>& keys, std::size_t d,
                              int k, kvsift::cuda::knn_policy policy, std::size_t q_stride = 0,
                              std::size_t k_stride = 0) {
  q_stride = q_stride == 0 ? d : q_stride;
  k_stride = k_stride == 0 ? d : k_stride;
  const std::size_t m = q.size() / q_stride, n = keys.size() / k_stride;
  device_buffer<T> dq(q), dk(keys);
  device_buffer<float> ds(m * k);
  device_buffer<id_t> di(m * k);
  const std::size_t bytes = kvsift::cuda::knn_workspace_size(m, n, k, policy);
  device_buffer<char> ws(bytes);
  const matrix_view<const T> qv(dq.get(), m, d, q_stride), kv(dk.get(), n, d, k_stride);
  if (policy.fused) {
    REQUIRE(kvsift::cuda::detail::fused_knn_applies(qv, kv, k, policy, 0));
    int sms = 0;
    KVSIFT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    REQUIRE(kvsift::cuda::detail::plan_fused_knn(m, n, k, bytes, 2 * sms).rows > 0);
  }
  cublasHandle_t h = nullptr;
  REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  kvsift::cuda::knn(qv, kv, k, ds.get(), di.get(), ws.get(), bytes, h, nullptr, policy);
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  cublasDestroy(h);
  return {m, static_cast<std::size_t>(k), di.download(), ds.download()};
}

}  // namespace

// Orders and values that stress the fused kernel, against the tiled path on the same data (130
// queries over 4000 keys run as 2 blocks x 3 key slices):
// - scores rising with the id: every key beats every threshold, the buffers fill each chunk;
// - scores falling with the id: nothing survives after the first chunks;
// - NaN keys among rising ones (NaN scores rank as -inf, ties by id, in both paths);
// - every real score negative and n = 1000 not a multiple of the 64-key chunk: the last chunk's
//   zero-filled rows (score 0) must never be taken for keys;
// - fewer finite keys than k: the rest of each row is NaN keys by id, with score -inf, which
//   only enter while a row's threshold is -inf.
TEST_CASE("knn_fused_adversarial_orders_equal_tiled", "[cuda][knn]") {
  const std::size_t m = 130, d = 64;
  const int k = 100;
  std::vector<float> qf(m * d, 0.0f);
  for (std::size_t i = 0; i < m; ++i) qf[i * d] = static_cast<float>(1 + i % 3);
  const auto keys_of = [&](std::size_t n, auto value) {
    std::vector<float> v(n * d, 0.0f);
    for (std::size_t j = 0; j < n; ++j) v[j * d] = value(j);
    return v;
  };
  const std::size_t n = 4000;
  const auto rising = keys_of(n, [](std::size_t j) { return static_cast<float>(j / 8); });
  const auto falling = keys_of(n, [&](std::size_t j) { return static_cast<float>((n - j) / 8); });
  auto with_nan = rising;
  for (std::size_t j = 0; j < n; j += 3) with_nan[j * d + 1] = std::nanf("");
  const auto negative =
      keys_of(1000, [](std::size_t j) { return -1.0f - static_cast<float>(j % 5); });
  const auto mostly_nan =
      keys_of(600, [](std::size_t j) { return j % 8 == 0 ? 1.0f : std::nanf(""); });  // 75 finite
  kvsift::cuda::knn_policy tiled{};
  tiled.fused = false;
  const auto q16 = convert<kvsift::half>(qf);
  for (const std::vector<float>* keys : std::initializer_list<const std::vector<float>*>{
           &rising, &falling, &with_nan, &negative, &mostly_nan}) {
    const auto k16 = convert<kvsift::half>(*keys);
    const auto fused = device_knn(q16, k16, d, k, {.fused_min_queries = 1});
    CHECK(count_mismatched_rows(fused, device_knn(q16, k16, d, k, tiled)) == 0);
    if (keys == &mostly_nan) {
      CHECK(fused.ids[0] == 0);
      CHECK(fused.ids[75] == 1);  // the first NaN key, after the 75 finite ones
      CHECK(std::isinf(fused.scores[75]));
    }
    if (keys == &negative) CHECK(*std::max_element(fused.ids.begin(), fused.ids.end()) < 1000);
  }
}

namespace {

/// knn() over f16 views at row pitches other than d against the CPU engine on the same
/// (integer) data: every id and score equal.
void strided_knn_matches_cpu(std::size_t m, std::size_t n, std::size_t d, std::size_t q_stride,
                             std::size_t k_stride, int k, kvsift::cuda::knn_policy policy) {
  const auto qf = integer_matrix(m, q_stride, 3);
  const auto kf = integer_matrix(n, k_stride, 3);
  const auto k16 = convert<kvsift::half>(kf);
  const auto got = device_knn(convert<kvsift::half>(qf), k16, d, k, policy, q_stride, k_stride);
  const auto want = kvsift::cpu_knn_engine({.threads = 2})
                        .search(matrix_view<const float>(qf.data(), m, d, q_stride),
                                matrix_view<const kvsift::half>(k16.data(), n, d, k_stride), k);
  CHECK(count_mismatched_rows(got, want) == 0);
}

}  // namespace

// The tiled path with strided views (d = 20 is not the fused kernel's).
TEST_CASE("knn_device_views_with_stride", "[cuda][knn]") {
  strided_knn_matches_cpu(50, 700, 20, 24, 24, 17, {16, 256, false});
}

// The fused kernel with row pitches other than d (keys 136, queries 160 halves): the TMA map's
// row stride and the query fragments' pitch. m = 300 and n = 2500 leave partial blocks and a
// partial last stage.
TEST_CASE("knn_fused_with_row_pitch", "[cuda][knn]") {
  strided_knn_matches_cpu(300, 2500, 128, 160, 136, 100, {.fused_min_queries = 1});
}

TEST_CASE("knn_engine_rejects_bad_input", "[cuda][knn]") {
  const std::size_t n = 40, d = 8;
  auto qf = integer_matrix(5, d, 3);
  auto kf = integer_matrix(n, d, 3);
  const matrix_view<const float> q(qf.data(), 5, d), kv(kf.data(), n, d);
  const kvsift::cuda::knn_engine gpu;
  CHECK_THROWS_AS(gpu.search(q, kv, 0), kvsift::invalid_argument);
  // k > n pads (the KnnEngine contract; knn_engine_pads_k_beyond_n_like_cpu checks the values).
  CHECK(gpu.search(q, kv, n + 1).ids.size() == 5 * (n + 1));
  std::vector<float> big(2000 * d, 1.0f);
  const matrix_view<const float> bigv(big.data(), 2000, d);
  CHECK(contains(message_of([&] { (void)gpu.search(q, bigv, 1025); }), "expected k <= 1024"));
  CHECK_THROWS_AS(gpu.search(matrix_view<const float>(qf.data(), 0, d), kv, 1),
                  kvsift::invalid_argument);
  CHECK_THROWS_AS(gpu.search(matrix_view<const float>(qf.data(), 4, d - 1), kv, 1),
                  kvsift::dimension_mismatch);
  CHECK_THROWS_AS(gpu.search(q, matrix_view<const float>(kf.data(), 0, d), 1),
                  kvsift::invalid_argument);
  qf[3] = std::numeric_limits<float>::quiet_NaN();
  CHECK(contains(message_of([&] { (void)gpu.search(q, kv, 1); }), "knn_engine: queries"));
  CHECK_THROWS_AS(gpu.search(q, kv, 1), kvsift::non_finite_value);
  qf[3] = 0;
  kf[17] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_AS(gpu.search(q, kv, 1), kvsift::non_finite_value);
  kf[17] = 0;
  const auto k16 = convert<kvsift::half>(kf);
  CHECK(gpu.search(q, matrix_view<const kvsift::half>(k16.data(), n, d), 3).ids.size() == 15);
}

// The KnnEngine contract: k > n returns the n keys best first, then invalid_id with score
// -inf, exactly as cpu_knn_engine (integer data: scores exact, so equality is bit for bit).
// k = 1500 > max_knn_k is fine too when n <= 1024: only min(k, n) reaches the kernels.
TEST_CASE("knn_engine_pads_k_beyond_n_like_cpu", "[cuda][knn]") {
  const std::size_t m = 7, d = 16;
  const kvsift::cpu_knn_engine cpu(kvsift::cpu_knn_params{.threads = 2});
  const kvsift::cuda::knn_engine gpu;
  for (const std::size_t n : {1, 5, 40, 300}) {
    const auto qf = integer_matrix(m, d, 3);
    const auto kf = integer_matrix(n, d, 3);
    const matrix_view<const float> q(qf.data(), m, d), kv(kf.data(), n, d);
    const auto k16 = convert<kvsift::half>(kf);
    const matrix_view<const kvsift::half> kh(k16.data(), n, d);
    for (const std::size_t k : {n, n + 1, 2 * n + 3, std::size_t{1500}}) {
      const auto got = gpu.search(q, kv, k);
      CHECK(count_mismatched_rows(got, cpu.search(q, kv, k)) == 0);
      CHECK(count_mismatched_rows(gpu.search(q, kh, k), cpu.search(q, kh, k)) == 0);
      // The padding itself, independent of the CPU engine.
      for (std::size_t i = 0; i < m; ++i) {
        for (std::size_t j = n; j < k; ++j) {
          CHECK(got.ids[i * k + j] == kvsift::invalid_id);
          CHECK(got.scores[i * k + j] == -std::numeric_limits<float>::infinity());
        }
        for (std::size_t j = 0; j < std::min(k, n); ++j) CHECK(got.ids[i * k + j] < n);
      }
    }
  }
  // Beyond the kernel limit with enough keys, still an error naming the limit.
  std::vector<float> big(2000 * d, 1.0f);
  const auto qf = integer_matrix(m, d, 3);
  CHECK(contains(message_of([&] {
                   (void)gpu.search(matrix_view<const float>(qf.data(), m, d),
                                    matrix_view<const float>(big.data(), 2000, d), 1025);
                 }),
                 "expected k <= 1024"));
}

TEST_CASE("knn_device_entry_rejects_bad_input", "[cuda][knn]") {
  const std::size_t m = 4, n = 32, d = 8;
  device_buffer<float> dq(m * d), dk(n * d), ds(m * 8);
  device_buffer<id_t> di(m * 8);
  const std::size_t bytes = kvsift::cuda::knn_workspace_size(m, n, 8);
  device_buffer<char> ws(bytes);
  cublasHandle_t h = nullptr;
  CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  const matrix_view<const float> q(dq.get(), m, d), kv(dk.get(), n, d);
  auto call = [&](matrix_view<const float> queries_in, matrix_view<const float> keys_in, int k,
                  void* w, std::size_t wb, cudaStream_t s) {
    kvsift::cuda::knn(queries_in, keys_in, k, ds.get(), di.get(), w, wb, h, s);
  };
  CHECK_THROWS_AS(call(q, kv, 0, ws.get(), bytes, nullptr), kvsift::invalid_argument);
  CHECK_THROWS_AS(call(q, kv, 1025, ws.get(), bytes, nullptr), kvsift::invalid_argument);
  CHECK(contains(message_of([&] {
                   call(q, matrix_view<const float>(dk.get(), 7, d), 8, ws.get(), bytes, nullptr);
                 }),
                 "expected k <= n = 7"));
  CHECK_THROWS_AS(call(matrix_view<const float>(dq.get(), 0, d), kv, 8, ws.get(), bytes, nullptr),
                  kvsift::invalid_argument);
  CHECK_THROWS_AS(call(matrix_view<const float>(dq.get(), m, 4), kv, 8, ws.get(), bytes, nullptr),
                  kvsift::dimension_mismatch);
  CHECK(
      contains(message_of([&] { call(q, kv, 8, ws.get(), bytes - 1, nullptr); }), "is too small"));
  std::vector<float> host(m * d);
  CHECK(contains(message_of([&] {
                   call(matrix_view<const float>(host.data(), m, d), kv, 8, ws.get(), bytes,
                        nullptr);
                 }),
                 "must be device memory"));
  CHECK_THROWS_AS(call(q, kv, 8, nullptr, bytes, nullptr), kvsift::invalid_argument);
  CHECK_THROWS_AS(kvsift::cuda::knn_workspace_size(m, n, 8, {0, 16}), kvsift::invalid_argument);
  with_foreign_stream([&](cudaStream_t other) {
    CHECK(contains(message_of([&] { call(q, kv, 8, ws.get(), bytes, other); }),
                   "the stream belongs to device 1"));
  });
  cublasDestroy(h);
}

// A graph built with GPU kNN routes queries as well as one built with CPU kNN. Real-valued
// data, so a few near-tied kNN entries may differ between the GEMMs; recall must agree.
TEST_CASE("knn_engine_graph_recall_equals_cpu_built", "[cuda][knn]") {
  const auto data = kvsift::testing::make_ood({.keys = 4000, .queries = 600, .dim = 32});
  const auto train = data.query_view().row_range(0, 400);
  const auto eval = data.query_view().row_range(400, 200);
  kvsift::roargraph_params p;
  p.nq = 50;
  p.M = 16;
  p.L = 100;
  p.threads = 2;
  const auto keys = data.key_view();
  const kvsift::view_store<float> store(keys);
  const auto g_cpu = kvsift::roargraph_builder<>(p).build(store, train);
  const auto g_gpu =
      kvsift::roargraph_builder<kvsift::inner_product, kvsift::cuda::knn_engine>(p).build(store,
                                                                                          train);
  const std::size_t k = 10;
  const auto exact = kvsift::cpu_knn_engine({.threads = 2}).search(eval, keys, k);
  auto recall = [&](const auto& g) {
    kvsift::search_workspace ws;
    std::vector<id_t> ids(k);
    std::vector<float> scores(k);
    std::size_t hit = 0;
    for (std::size_t i = 0; i < eval.rows(); ++i) {
      const auto r =
          kvsift::beam_search(g, std::span<const float>(eval.row(i), eval.cols()), {k, 64}, ws,
                              std::span<id_t>(ids), std::span<float>(scores));
      for (std::size_t j = 0; j < r.count; ++j) {
        const auto row = exact.row_ids(i);
        hit += std::find(row.begin(), row.end(), ids[j]) != row.end();
      }
    }
    return static_cast<double>(hit) / static_cast<double>(eval.rows() * k);
  };
  const double r_cpu = recall(g_cpu), r_gpu = recall(g_gpu);
  std::printf("  recall@10 (L=64): cpu-built %.4f, gpu-built %.4f\n", r_cpu, r_gpu);
  CHECK(r_cpu > 0.8);
  CHECK_NEAR(r_gpu, r_cpu, 0.01);
  // And the step-1 results themselves agree on (nearly) all entries.
  const auto a = kvsift::cpu_knn_engine({.threads = 2}).search(train, keys, p.nq);
  const auto b = kvsift::cuda::knn_engine().search(train, keys, p.nq);
  std::size_t same = 0;
  for (std::size_t i = 0; i < a.ids.size(); ++i) same += a.ids[i] == b.ids[i];
  CHECK(static_cast<double>(same) >= 0.999 * static_cast<double>(a.ids.size()));
}
