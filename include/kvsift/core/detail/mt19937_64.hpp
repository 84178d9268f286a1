#pragma once
// The 64-bit Mersenne Twister, output for output equal to std::mt19937_64 (its algorithm and
// parameters are fixed by the C++ standard, [rand.predef]), without <random>: that header
// costs every includer ~0.4 s of compile time, and kvsift only ever draws raw 64-bit words from
// the engine (its seeded shuffles and samplings never used a std distribution, whose output
// the standard leaves to the implementation). tests/core/mt19937_64_test.cpp checks the
// equality against the standard engine.

#include <array>
#include <cstddef>
#include <cstdint>

namespace kvsift::detail {

class mt19937_64 {
 public:
  using result_type = std::uint64_t;

  explicit mt19937_64(std::uint64_t seed = 5489u) noexcept {
    state_[0] = seed;
    for (std::size_t i = 1; i < n; ++i) {
      state_[i] = 6364136223846793005ULL * (state_[i - 1] ^ (state_[i - 1] >> 62)) + i;
    }
    index_ = n;
  }

  static constexpr result_type min() noexcept { return 0; }
  static constexpr result_type max() noexcept { return ~result_type{0}; }

  result_type operator()() noexcept {
    if (index_ >= n) twist();
    std::uint64_t z = state_[index_++];
    z ^= (z >> 29) & 0x5555555555555555ULL;
    z ^= (z << 17) & 0x71D67FFFEDA60000ULL;
    z ^= (z << 37) & 0xFFF7EEE000000000ULL;
    z ^= z >> 43;
    return z;
  }

 private:
  static constexpr std::size_t n = 312, m = 156;
  static constexpr std::uint64_t upper = ~std::uint64_t{0} << 31, lower = ~upper;
  static constexpr std::uint64_t matrix_a = 0xB5026F5AA96619E9ULL;

  void twist() noexcept {
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t y = (state_[i] & upper) | (state_[(i + 1) % n] & lower);
      state_[i] = state_[(i + m) % n] ^ (y >> 1) ^ ((y & 1u) != 0 ? matrix_a : 0);
    }
    index_ = 0;
  }

  std::array<std::uint64_t, n> state_{};
  std::size_t index_ = n;
};

}  // namespace kvsift::detail
