// The batched LSE merge kernels against a double-precision host reference.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include <kvsift/cuda/merge.cuh>

#include "cuda_test.cuh"
#include "test_util.cuh"

namespace {

using namespace kvsift::cuda_test;
constexpr float inf = std::numeric_limits<float>::infinity();

/// Random lse of one state: mostly moderate, sometimes empty, sometimes extreme.
float random_lse(int regime) {
  const int r = uniform_int(0, 9);
  if (r == 0) return -inf;                               // empty state
  if (regime == 1) return 1e4f + uniform(-4.0f, 4.0f);   // all huge, close together
  if (regime == 2) return -1e4f + uniform(-4.0f, 4.0f);  // all tiny, close together
  if (r == 1) return uniform_int(0, 1) ? 1e4f : -1e4f;   // extreme next to moderate ones
  return uniform(-6.0f, 6.0f);
}

struct reference_state {
  std::vector<double> o;
  double lse;
};

/// Double-precision merge of states given as (o as float, lse).
reference_state reference_merge(const std::vector<const float*>& os, const std::vector<float>& lses,
                                int d) {
  reference_state r{std::vector<double>(d, 0.0), -std::numeric_limits<double>::infinity()};
  double m = -std::numeric_limits<double>::infinity();
  for (float l : lses) m = std::max(m, static_cast<double>(l));
  if (m == -std::numeric_limits<double>::infinity()) return r;
  double s = 0.0;
  for (std::size_t j = 0; j < lses.size(); ++j) {
    const double w = std::exp(static_cast<double>(lses[j]) - m);
    s += w;
    for (int i = 0; i < d; ++i) r.o[i] += w * os[j][i];
  }
  for (int i = 0; i < d; ++i) r.o[i] /= s;
  r.lse = m + std::log(s);
  return r;
}

double lse_tolerance(double ref) { return 1e-5 + 4e-7 * std::fabs(ref); }

/// Compares one output state; returns the number of mismatching values (prints the first).
template <class T>
int compare_state(const reference_state& ref, const T* o, float lse, int d, const char* ctx) {
  int bad = 0;
  if (std::isinf(ref.lse)) {
    bad += !(lse == -inf);
  } else {
    bad += !(std::fabs(lse - ref.lse) <= lse_tolerance(ref.lse));
  }
  for (int i = 0; i < d; ++i) {
    const float x = to_float(o[i]);
    bad += !(std::fabs(x - ref.o[i]) <= output_tolerance<T>());
  }
  if (bad > 0) {
    std::printf("  %s: lse %.9g vs %.9g, o[0] %.7g vs %.7g\n", ctx, lse, ref.lse, to_float(o[0]),
                ref.o[0]);
  }
  return bad;
}

template <class T>
void check_merge_states(int num_pos, int num_heads, int d, int regime,
                        const kvsift::cuda::merge_policy& policy = {}) {
  std::vector<std::int64_t> indptr(num_pos + 1, 0);
  for (int p = 0; p < num_pos; ++p) indptr[p + 1] = indptr[p] + uniform_int(0, 8);
  const std::int64_t num_states = indptr[num_pos];
  std::vector<T> o(static_cast<std::size_t>(num_states) * num_heads * d);
  std::vector<float> o_f(o.size());
  std::vector<float> lse(static_cast<std::size_t>(num_states) * num_heads);
  for (std::size_t r = 0; r < lse.size(); ++r) {
    lse[r] = random_lse(regime);
    for (int i = 0; i < d; ++i) {
      const float x = std::isinf(lse[r]) ? 0.0f : uniform(-1.0f, 1.0f);
      o[r * d + i] = from_float<T>(x);
      o_f[r * d + i] = to_float(o[r * d + i]);
    }
  }
  device_buffer<T> d_o(o);
  device_buffer<float> d_lse(lse);
  device_buffer<std::int64_t> d_indptr(indptr);
  device_buffer<T> d_out(static_cast<std::size_t>(num_pos) * num_heads * d);
  device_buffer<float> d_out_lse(static_cast<std::size_t>(num_pos) * num_heads);
  kvsift::cuda::merge_states<T>(d_o.get(), d_lse.get(), num_states, d_indptr.get(), num_pos,
                                num_heads, d, d_out.get(), d_out_lse.get(), nullptr, policy);
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  const auto out = d_out.download();
  const auto out_lse = d_out_lse.download();
  int bad = 0;
  for (int p = 0; p < num_pos; ++p) {
    for (int h = 0; h < num_heads; ++h) {
      std::vector<const float*> os;
      std::vector<float> ls;
      for (std::int64_t j = indptr[p]; j < indptr[p + 1]; ++j) {
        os.push_back(&o_f[(j * num_heads + h) * d]);
        ls.push_back(lse[j * num_heads + h]);
      }
      const auto ref = reference_merge(os, ls, d);
      const std::size_t row = static_cast<std::size_t>(p) * num_heads + h;
      char ctx[128];
      std::snprintf(ctx, sizeof ctx, "%s d=%d regime=%d pos=%d head=%d n=%zu", type_name<T>(), d,
                    regime, p, h, ls.size());
      if (bad < 5) bad += compare_state(ref, &out[row * d], out_lse[row], d, ctx);
    }
  }
  CHECK(bad == 0);
}

template <class T>
void check_merge_pair(int num_rows, int num_heads, int d, bool in_place) {
  const std::size_t n = static_cast<std::size_t>(num_rows) * num_heads;
  std::vector<T> a(n * d), b(n * d);
  std::vector<float> a_f(n * d), b_f(n * d), la(n), lb(n);
  for (std::size_t r = 0; r < n; ++r) {
    const int regime = static_cast<int>(r % 3);
    la[r] = random_lse(regime);
    lb[r] = random_lse(regime);
    if (r % 11 == 0) la[r] = lb[r] = -inf;  // empty with empty
    for (int i = 0; i < d; ++i) {
      a[r * d + i] = from_float<T>(std::isinf(la[r]) ? 0.0f : uniform(-1.0f, 1.0f));
      b[r * d + i] = from_float<T>(std::isinf(lb[r]) ? 0.0f : uniform(-1.0f, 1.0f));
      a_f[r * d + i] = to_float(a[r * d + i]);
      b_f[r * d + i] = to_float(b[r * d + i]);
    }
  }
  device_buffer<T> d_a(a), d_b(b), d_out(n * d);
  device_buffer<float> d_la(la), d_lb(lb), d_lout(n);
  if (in_place) {
    kvsift::cuda::merge_state_in_place<T>(d_a.get(), d_la.get(), d_b.get(), d_lb.get(), num_rows,
                                          num_heads, d, nullptr);
  } else {
    kvsift::cuda::merge_state<T>(d_a.get(), d_la.get(), d_b.get(), d_lb.get(), d_out.get(),
                                 d_lout.get(), num_rows, num_heads, d, nullptr);
  }
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  const auto out = in_place ? d_a.download() : d_out.download();
  const auto out_lse = in_place ? d_la.download() : d_lout.download();
  int bad = 0;
  for (std::size_t r = 0; r < n && bad < 5; ++r) {
    const auto ref = reference_merge({&a_f[r * d], &b_f[r * d]}, {la[r], lb[r]}, d);
    char ctx[128];
    std::snprintf(ctx, sizeof ctx, "%s d=%d in_place=%d row=%zu", type_name<T>(), d, int(in_place),
                  r);
    bad += compare_state(ref, &out[r * d], out_lse[r], d, ctx);
  }
  CHECK(bad == 0);
}

template <class T>
void merge_states_suite() {
  constexpr int vec = 16 / sizeof(T);
  for (int d : {64, 128, 256, 3 * vec}) {
    for (int regime = 0; regime < 3; ++regime) check_merge_states<T>(57, 3, d, regime);
  }
  check_merge_states<T>(1, 1, 128, 0);
  check_merge_states<T>(2000, 8, 128, 0);  // many blocks
  check_merge_states<T>(10000, 4, 64, 0);  // more vectors than resident threads: grid stride
  // Other block sizes (the grid is the device's resident blocks at that size).
  check_merge_states<T>(3000, 5, 128, 0, {.threads_per_block = 96});
  check_merge_states<T>(3000, 5, 128, 0, {.threads_per_block = 512});
}

template <class T>
void merge_pair_suite() {
  constexpr int vec = 16 / sizeof(T);
  for (int d : {64, 128, 256, 5 * vec}) {
    check_merge_pair<T>(129, 5, d, false);
    check_merge_pair<T>(129, 5, d, true);
  }
  check_merge_pair<T>(40000, 1, 64, false);  // many blocks
  check_merge_pair<T>(40000, 1, 64, true);
}

}  // namespace

TEST_CASE("merge_states_f32", "[cuda][merge]") { merge_states_suite<float>(); }
TEST_CASE("merge_states_f16", "[cuda][merge]") { merge_states_suite<__half>(); }
TEST_CASE("merge_states_bf16", "[cuda][merge]") { merge_states_suite<__nv_bfloat16>(); }
TEST_CASE("merge_state_pair_f32", "[cuda][merge]") { merge_pair_suite<float>(); }
TEST_CASE("merge_state_pair_f16", "[cuda][merge]") { merge_pair_suite<__half>(); }
TEST_CASE("merge_state_pair_bf16", "[cuda][merge]") { merge_pair_suite<__nv_bfloat16>(); }

TEST_CASE("merge_empty_with_empty_is_empty_not_nan", "[cuda][merge]") {
  constexpr int d = 128;
  std::vector<__half> zeros(2 * d, __float2half_rn(0.0f));
  std::vector<float> lse(2, -inf);
  std::vector<std::int64_t> indptr = {0, 2};
  device_buffer<__half> d_o(zeros), d_out(d);
  device_buffer<float> d_lse(lse), d_out_lse(1);
  device_buffer<std::int64_t> d_indptr(indptr);
  kvsift::cuda::merge_states<__half>(d_o.get(), d_lse.get(), 2, d_indptr.get(), 1, 1, d,
                                     d_out.get(), d_out_lse.get(), nullptr);
  const auto out = d_out.download();
  const auto out_lse = d_out_lse.download();
  CHECK(out_lse[0] == -inf);
  bool all_zero = true;
  for (auto x : out) all_zero = all_zero && __half2float(x) == 0.0f;
  CHECK(all_zero);
}

// An lse of NaN or +inf is an invalid state: the public merges skip and report it like the CPU
// merge rejects it (merge_invalid_lse_test.cu). Only sparse_attention's internal split merge
// propagates NaN (sparse_attention_nan_query_gives_nan_for_that_head_only).

TEST_CASE("merge_bad_input_throws", "[cuda][merge]") {
  using kvsift::cuda::merge_state;
  using kvsift::cuda::merge_states;
  device_buffer<__half> o(64);
  device_buffer<float> l(8);
  device_buffer<std::int64_t> ip(2);
  // head_dim not a multiple of 8 for a 16-bit type
  CHECK_THROWS_AS(
      merge_states<__half>(o.get(), l.get(), 1, ip.get(), 1, 1, 12, o.get(), l.get(), nullptr),
      kvsift::dimension_mismatch);
  CHECK_THROWS_AS(
      merge_states<float>(nullptr, nullptr, 1, nullptr, 1, 1, 0, nullptr, nullptr, nullptr),
      kvsift::invalid_argument);
  // null pointers with nonzero sizes
  CHECK_THROWS_AS(
      merge_states<__half>(nullptr, l.get(), 1, ip.get(), 1, 1, 64, o.get(), l.get(), nullptr),
      kvsift::invalid_argument);
  CHECK_THROWS_AS(
      merge_states<__half>(o.get(), l.get(), 1, nullptr, 1, 1, 64, o.get(), l.get(), nullptr),
      kvsift::invalid_argument);
  CHECK_THROWS_AS(
      merge_state<__half>(o.get(), l.get(), nullptr, l.get(), o.get(), l.get(), 1, 1, 64, nullptr),
      kvsift::invalid_argument);
  CHECK_THROWS_AS(
      merge_states<__half>(o.get(), l.get(), 1, ip.get(), -1, 1, 64, o.get(), l.get(), nullptr),
      kvsift::invalid_argument);
  // misaligned
  CHECK_THROWS_AS(merge_state<__half>(o.get() + 1, l.get(), o.get(), l.get(), o.get(), l.get(), 1,
                                      1, 8, nullptr),
                  kvsift::invalid_argument);
  // num_pos == 0: nothing to do, nulls fine
  merge_states<float>(nullptr, nullptr, 0, nullptr, 0, 4, 128, nullptr, nullptr, nullptr);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK_THROWS_AS(KVSIFT_CUDA_CHECK(cudaErrorInvalidValue), kvsift::cuda_error);
}

namespace {

__global__ void divide_kernel(kvsift::cuda::detail::fast_divider by, const std::uint32_t* n,
                              std::uint32_t* q, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) q[i] = by.div(n[i]);
}

}  // namespace

// The merge kernels index a launch's vectors by multiply-high and shift (fast_divider): every
// quotient must be the integer division's, on the device and on the host, for divisors up to
// 2^31 - 1 and dividends up to 2^31 - 1 (small ones, multiples and their neighbours, random).
TEST_CASE("fast_divider_equals_integer_division", "[cuda][merge]") {
  using kvsift::cuda::detail::fast_divider;
  std::vector<std::int64_t> divisors;
  for (std::int64_t d = 1; d <= 300; ++d) divisors.push_back(d);
  for (std::int64_t d : {511, 512, 513, 1000, 4095, 65536, 65537, 1000003, 1 << 30, (1 << 30) + 1,
                         2147483646, 2147483647}) {
    divisors.push_back(d);
  }
  for (int i = 0; i < 40; ++i) divisors.push_back(uniform_int(2, 2147483647));
  int wrong = 0;
  for (const std::int64_t d : divisors) {
    std::vector<std::uint32_t> n;
    for (std::uint32_t x = 0; x < 2048; ++x) n.push_back(x);
    for (std::uint32_t x : {2147483647u, 2147483646u, 1073741824u, 1073741823u}) n.push_back(x);
    for (int i = 0; i < 512; ++i) {
      const std::int64_t k = uniform_int(0, static_cast<int>(2147483647 / d));
      for (std::int64_t x : {k * d - 1, k * d, k * d + 1, k * d + d - 1}) {
        if (x >= 0 && x < 2147483648LL) n.push_back(static_cast<std::uint32_t>(x));
      }
      n.push_back(static_cast<std::uint32_t>(uniform_int(0, 2147483647)));
    }
    const fast_divider by(d);
    device_buffer<std::uint32_t> d_n(n), d_q(n.size());
    const int count = static_cast<int>(n.size());
    divide_kernel<<<(count + 255) / 256, 256>>>(by, d_n.get(), d_q.get(), count);
    KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
    const auto q = d_q.download();
    for (std::size_t i = 0; i < n.size(); ++i) {
      const auto expected = static_cast<std::uint32_t>(n[i] / d);
      if ((q[i] != expected || by.div(n[i]) != expected) && wrong++ < 5) {
        std::printf("fast_divider(%lld): %u / d = %u (device) / %u (host), expected %u\n",
                    static_cast<long long>(d), n[i], q[i], by.div(n[i]), expected);
      }
    }
  }
  CHECK(wrong == 0);
  CHECK_THROWS_AS(fast_divider(0), kvsift::invalid_argument);
  CHECK_THROWS_AS(fast_divider(std::int64_t{1} << 31), kvsift::invalid_argument);
}

// Merges larger than 2^30 vectors are split into launches of whole positions (the kernels
// index a launch in 32 bits). The split is forced here with a small cap per launch: the
// results must equal one launch's bit for bit, for each kernel (indptr: merge_kernel with its
// prefetch; pair: the flat kernel, wide and narrow; in place: merge_kernel with its barrier).
TEST_CASE("merge_split_into_launches_equals_one_launch", "[cuda][merge]") {
  namespace kd = kvsift::cuda::detail;
  constexpr int pos = 1000, heads = 3, d = 40;  // f16: 5 vectors per row, 15 per position
  constexpr std::size_t rows = static_cast<std::size_t>(pos) * heads;
  std::vector<std::int64_t> indptr(pos + 1, 0);
  for (int p = 0; p < pos; ++p) indptr[p + 1] = indptr[p] + uniform_int(0, 4);
  const std::size_t states = static_cast<std::size_t>(indptr[pos]) * heads;
  std::vector<__half> o(std::max(states, 2 * rows) * d);
  std::vector<float> lse(std::max(states, 2 * rows));
  for (auto& x : o) x = __float2half_rn(uniform(-1.0f, 1.0f));
  for (auto& l : lse) l = random_lse(0);
  device_buffer<__half> d_o(o), d_out(rows * d), d_ref(rows * d);
  device_buffer<float> d_lse(lse), d_out_lse(rows), d_ref_lse(rows);
  device_buffer<std::int64_t> d_indptr(indptr);
  const kvsift::cuda::merge_policy policy{};
  const auto same = [&](const char* what) {
    KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
    const auto a = d_out.download(), b = d_ref.download();
    const auto la = d_out_lse.download(), lb = d_ref_lse.download();
    std::size_t diff = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      diff += std::memcmp(&a[i], &b[i], sizeof(__half)) != 0;
    }
    for (std::size_t i = 0; i < la.size(); ++i) diff += std::memcmp(&la[i], &lb[i], 4) != 0;
    INFO(what);
    CHECK(diff == 0);
  };
  const kd::indptr_source<__half, kd::device_indptr> var{
      d_o.get(), d_lse.get(), kd::device_indptr{d_indptr.get()}, heads, d};
  const kd::pair_source<__half> pair{d_o.get(),          d_lse.get(), d_o.get() + rows * d,
                                     d_lse.get() + rows, heads,       d};
  for (const std::int64_t cap : {15, 16, 15 * 7, 15 * 333, 15 * 999}) {
    kd::launch_merge<__half, false>(var, d_ref.get(), d_ref_lse.get(), rows, heads, d, nullptr,
                                    policy, nullptr, "test");
    kd::launch_merge<__half, false>(var, d_out.get(), d_out_lse.get(), rows, heads, d, nullptr,
                                    policy, nullptr, "test", cap);
    same("indptr");
    kd::launch_merge<__half, false>(pair, d_ref.get(), d_ref_lse.get(), rows, heads, d, nullptr,
                                    policy, nullptr, "test");
    kd::launch_merge<__half, false>(pair, d_out.get(), d_out_lse.get(), rows, heads, d, nullptr,
                                    policy, nullptr, "test", cap);
    same("pair");
    // In place: merge copies of the first half with the second half.
    KVSIFT_CUDA_CHECK(cudaMemcpy(d_ref.get(), d_o.get(), rows * d * 2, cudaMemcpyDeviceToDevice));
    KVSIFT_CUDA_CHECK(cudaMemcpy(d_out.get(), d_o.get(), rows * d * 2, cudaMemcpyDeviceToDevice));
    KVSIFT_CUDA_CHECK(cudaMemcpy(d_ref_lse.get(), d_lse.get(), rows * 4, cudaMemcpyDeviceToDevice));
    KVSIFT_CUDA_CHECK(cudaMemcpy(d_out_lse.get(), d_lse.get(), rows * 4, cudaMemcpyDeviceToDevice));
    const kd::pair_source<__half> ref_in{d_ref.get(),        d_ref_lse.get(), d_o.get() + rows * d,
                                         d_lse.get() + rows, heads,           d};
    const kd::pair_source<__half> out_in{d_out.get(),        d_out_lse.get(), d_o.get() + rows * d,
                                         d_lse.get() + rows, heads,           d};
    kd::launch_merge<__half, true>(ref_in, d_ref.get(), d_ref_lse.get(), rows, heads, d, nullptr,
                                   policy, nullptr, "test");
    kd::launch_merge<__half, true>(out_in, d_out.get(), d_out_lse.get(), rows, heads, d, nullptr,
                                   policy, nullptr, "test", cap);
    same("in place");
  }
  const auto capped = [&](std::int64_t cap) {
    kd::launch_merge<__half, false>(pair, d_out.get(), d_out_lse.get(), rows, heads, d, nullptr,
                                    policy, nullptr, "test", cap);
  };
  CHECK_THROWS_AS(capped(0), kvsift::invalid_argument);
  CHECK_THROWS_AS(capped(kd::merge_launch_vectors + 1), kvsift::invalid_argument);
}
