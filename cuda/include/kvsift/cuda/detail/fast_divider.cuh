#pragma once
// Division by a divisor fixed at launch, as one multiply-high and a shift (internal).
//
// A kernel that maps a flat thread index to (row, vector) or (position, head) divides by
// runtime sizes once per 16-byte vector. A 64-bit division is a software routine of about a
// hundred instructions on the GPU, and a 32-bit one about twenty; for memory-bound kernels that
// move 16 bytes per division those instructions are a visible share of the time (the merge
// kernels: bench/results/h200_merge_fast_div.txt). The round-up method (Granlund & Montgomery,
// as CUTLASS's FastDivmod): for d in [1, 2^31) and p = 31 + ceil(log2 d), m = ceil(2^p / d)
// fits in 32 bits and n / d = (n * m) >> p for every n in [0, 2^31).

#include <cuda_runtime.h>

#include <cstdint>

#include <kvsift/core/error.hpp>

namespace kvsift::cuda::detail {

/// Largest dividend (exclusive) `fast_divider` is exact for.
inline constexpr std::int64_t fast_divider_limit = std::int64_t{1} << 31;

class fast_divider {
 public:
  fast_divider() = default;
  /// @throw invalid_argument unless 1 <= d < 2^31
  explicit fast_divider(std::int64_t d) : d_(static_cast<std::uint32_t>(d)) {
    kvsift::detail::require(d >= 1 && d < fast_divider_limit,
                            "fast_divider: expected a divisor in [1, 2^31), got ", d);
    if (d == 1) return;  // mul_ = 0 marks it: n / 1 = n
    int log2_ceil = 0;
    while ((std::uint64_t{1} << log2_ceil) < static_cast<std::uint64_t>(d)) ++log2_ceil;
    const int p = 31 + log2_ceil;
    mul_ = static_cast<std::uint32_t>(((std::uint64_t{1} << p) + d_ - 1) / d_);
    shift_ = static_cast<std::uint32_t>(p - 32);
  }
  /// n / d for n in [0, 2^31); `n` is not checked (the launch guarantees the range).
  [[nodiscard]] __host__ __device__ std::uint32_t div(std::uint32_t n) const {
#ifdef __CUDA_ARCH__
    return mul_ == 0 ? n : __umulhi(n, mul_) >> shift_;
#else
    return mul_ == 0 ? n : static_cast<std::uint32_t>((std::uint64_t{n} * mul_ >> 32) >> shift_);
#endif
  }
  [[nodiscard]] __host__ __device__ std::uint32_t divisor() const { return d_; }

 private:
  std::uint32_t d_ = 1;
  std::uint32_t mul_ = 0;
  std::uint32_t shift_ = 0;
};

}  // namespace kvsift::cuda::detail
