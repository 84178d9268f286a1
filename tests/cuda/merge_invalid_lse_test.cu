// The CUDA merges follow the CPU merge's contract for invalid lse values (NaN or +inf, which
// kvsift::merge rejects with non_finite_value): such a (position, head) is not merged and never
// yields NaN. Out of place it becomes the empty state (o = 0, lse = -inf); in place it is left
// unchanged (the CPU merge_into leaves its accumulator unchanged); the optional status word gets
// 1 ORed in. Valid rows next to invalid ones must still equal a double-precision reference.

#include <cuda_fp16.h>

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
constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();

bool is_invalid(float lse) { return std::isnan(lse) || lse == inf; }

/// Double-precision merge of valid states (the reference).
void reference(const std::vector<const float*>& os, const std::vector<float>& ls, int d,
               std::vector<double>& o, double& lse) {
  o.assign(d, 0.0);
  double m = -inf;
  for (float l : ls) m = std::max(m, static_cast<double>(l));
  lse = -inf;
  if (m == -inf) return;
  double s = 0;
  for (std::size_t j = 0; j < ls.size(); ++j) {
    const double w = std::exp(static_cast<double>(ls[j]) - m);
    s += w;
    for (int i = 0; i < d; ++i) o[i] += w * os[j][i];
  }
  for (int i = 0; i < d; ++i) o[i] /= s;
  lse = m + std::log(s);
}

/// Random states, a few of them with an invalid lse; returns the merged rows' validity.
template <class T>
void check_merge_states_invalid(bool with_status, bool plant_invalid) {
  const int num_pos = 64, num_heads = 3, d = 64;
  std::vector<std::int64_t> indptr(num_pos + 1, 0);
  for (int p = 0; p < num_pos; ++p) indptr[p + 1] = indptr[p] + uniform_int(0, 5);
  const std::int64_t num_states = indptr[num_pos];
  std::vector<T> o(static_cast<std::size_t>(num_states) * num_heads * d);
  std::vector<float> o_f(o.size()), lse(static_cast<std::size_t>(num_states) * num_heads);
  for (std::size_t r = 0; r < lse.size(); ++r) {
    lse[r] = uniform_int(0, 6) == 0 ? -inf : uniform(-5.0f, 5.0f);
    if (plant_invalid && r % 9 == 4) lse[r] = r % 2 ? nan_f : inf;
    for (int i = 0; i < d; ++i) {
      o[r * d + i] = from_float<T>(uniform(-1.0f, 1.0f));
      o_f[r * d + i] = to_float(o[r * d + i]);
    }
  }
  device_buffer<T> d_o(o), d_out(static_cast<std::size_t>(num_pos) * num_heads * d);
  device_buffer<float> d_lse(lse), d_out_lse(static_cast<std::size_t>(num_pos) * num_heads);
  device_buffer<std::int64_t> d_indptr(indptr);
  device_buffer<int> d_status(std::vector<int>{0});
  kvsift::cuda::merge_states<T>(d_o.get(), d_lse.get(), num_states, d_indptr.get(), num_pos,
                                num_heads, d, d_out.get(), d_out_lse.get(), nullptr, {},
                                with_status ? d_status.get() : nullptr);
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  const auto out = d_out.download();
  const auto out_lse = d_out_lse.download();
  int bad = 0, invalid_rows = 0;
  std::vector<double> ro;
  double rl = 0;
  for (int p = 0; p < num_pos; ++p) {
    for (int h = 0; h < num_heads; ++h) {
      const std::size_t row = static_cast<std::size_t>(p) * num_heads + h;
      std::vector<const float*> os;
      std::vector<float> ls;
      bool invalid = false;
      for (std::int64_t j = indptr[p]; j < indptr[p + 1]; ++j) {
        os.push_back(&o_f[(j * num_heads + h) * d]);
        ls.push_back(lse[j * num_heads + h]);
        invalid |= is_invalid(ls.back());
      }
      invalid_rows += invalid;
      if (invalid) {
        ro.assign(d, 0.0);
        rl = -inf;  // the empty state
      } else {
        reference(os, ls, d, ro, rl);
      }
      int row_bad = std::isnan(out_lse[row]) ? 1 : 0;
      if (std::isinf(rl)) {
        row_bad += out_lse[row] != -inf;
      } else {
        row_bad += !(std::fabs(out_lse[row] - rl) <= 1e-5 + 4e-7 * std::fabs(rl));
      }
      for (int i = 0; i < d; ++i) {
        const float x = to_float(out[row * d + i]);
        row_bad += std::isnan(x) || !(std::fabs(x - ro[i]) <= output_tolerance<T>());
      }
      if (row_bad && bad < 3) {
        std::printf("  %s pos %d head %d invalid=%d: lse %g (want %g), o[0] %g (want %g)\n",
                    type_name<T>(), p, h, int(invalid), out_lse[row], rl, to_float(out[row * d]),
                    ro[0]);
      }
      bad += row_bad != 0;
    }
  }
  CHECK(bad == 0);
  CHECK((!plant_invalid || invalid_rows > 0));  // the test planted some
  if (with_status) {
    const int status = d_status.download()[0];
    CHECK(status == (invalid_rows > 0 ? 1 : 0));
  }
}

template <class T>
void check_merge_pair_invalid(bool in_place) {
  const int num_rows = 300, num_heads = 2, d = 64;
  const std::size_t n = static_cast<std::size_t>(num_rows) * num_heads;
  std::vector<T> a(n * d), b(n * d);
  std::vector<float> a_f(n * d), b_f(n * d), la(n), lb(n);
  for (std::size_t r = 0; r < n; ++r) {
    la[r] = uniform(-5.0f, 5.0f);
    lb[r] = uniform(-5.0f, 5.0f);
    switch (r % 7) {
      case 1:
        la[r] = nan_f;
        break;
      case 2:
        lb[r] = inf;
        break;
      case 3:
        la[r] = inf;
        lb[r] = -inf;
        break;  // +inf next to an empty state: still invalid
      case 4:
        la[r] = -inf;
        break;  // empty: valid
      default:
        break;
    }
    for (int i = 0; i < d; ++i) {
      a[r * d + i] = from_float<T>(uniform(-1.0f, 1.0f));
      b[r * d + i] = from_float<T>(uniform(-1.0f, 1.0f));
      a_f[r * d + i] = to_float(a[r * d + i]);
      b_f[r * d + i] = to_float(b[r * d + i]);
    }
  }
  device_buffer<T> d_a(a), d_b(b), d_out(n * d);
  device_buffer<float> d_la(la), d_lb(lb), d_lout(n);
  device_buffer<int> d_status(std::vector<int>{0});
  if (in_place) {
    kvsift::cuda::merge_state_in_place<T>(d_a.get(), d_la.get(), d_b.get(), d_lb.get(), num_rows,
                                          num_heads, d, nullptr, {}, d_status.get());
  } else {
    kvsift::cuda::merge_state<T>(d_a.get(), d_la.get(), d_b.get(), d_lb.get(), d_out.get(),
                                 d_lout.get(), num_rows, num_heads, d, nullptr, {}, d_status.get());
  }
  KVSIFT_CUDA_CHECK(cudaDeviceSynchronize());
  const auto out = in_place ? d_a.download() : d_out.download();
  const auto out_lse = in_place ? d_la.download() : d_lout.download();
  int bad = 0;
  std::vector<double> ro;
  double rl = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const bool invalid = is_invalid(la[r]) || is_invalid(lb[r]);
    int row_bad = 0;
    if (invalid && in_place) {
      // Unchanged, bit for bit (the lse may be NaN: compare the bytes).
      row_bad += std::memcmp(&out_lse[r], &la[r], sizeof(float)) != 0;
      row_bad += std::memcmp(&out[r * d], &a[r * d], d * sizeof(T)) != 0;
    } else {
      if (invalid) {
        ro.assign(d, 0.0);
        rl = -inf;
      } else {
        reference({&a_f[r * d], &b_f[r * d]}, {la[r], lb[r]}, d, ro, rl);
      }
      row_bad += std::isnan(out_lse[r]);
      row_bad += std::isinf(rl) ? out_lse[r] != -inf
                                : !(std::fabs(out_lse[r] - rl) <= 1e-5 + 4e-7 * std::fabs(rl));
      for (int i = 0; i < d; ++i) {
        const float x = to_float(out[r * d + i]);
        row_bad += std::isnan(x) || !(std::fabs(x - ro[i]) <= output_tolerance<T>());
      }
    }
    if (row_bad && bad < 3) {
      std::printf("  %s in_place=%d row %zu (lse %g, %g): got lse %g\n", type_name<T>(),
                  int(in_place), r, la[r], lb[r], out_lse[r]);
    }
    bad += row_bad != 0;
  }
  CHECK(bad == 0);
  CHECK(d_status.download()[0] == 1);
}

}  // namespace

TEST_CASE("merge_states_invalid_lse_is_skipped_and_reported_f32", "[cuda][merge_invalid_lse]") {
  check_merge_states_invalid<float>(true, true);
  check_merge_states_invalid<float>(false, true);  // no status word: still no NaN out
  check_merge_states_invalid<float>(true, false);  // all valid: status stays 0
}
TEST_CASE("merge_states_invalid_lse_is_skipped_and_reported_f16", "[cuda][merge_invalid_lse]") {
  check_merge_states_invalid<__half>(true, true);
  check_merge_states_invalid<__half>(true, false);
}
TEST_CASE("merge_state_invalid_lse_out_of_place_f32", "[cuda][merge_invalid_lse]") {
  check_merge_pair_invalid<float>(false);
}
TEST_CASE("merge_state_invalid_lse_in_place_unchanged_f32", "[cuda][merge_invalid_lse]") {
  check_merge_pair_invalid<float>(true);
}
TEST_CASE("merge_state_invalid_lse_in_place_unchanged_f16", "[cuda][merge_invalid_lse]") {
  check_merge_pair_invalid<__half>(true);
}
