#pragma once
// Synthetic GQA groups shared by the CUDA benchmarks: several query heads over one key set.

#include <cstddef>
#include <cstdint>

#pragma nv_diagnostic push
#pragma nv_diag_suppress 554
#include <kvsift/testing/ood_generator.hpp>
#pragma nv_diagnostic pop

namespace kvsift::cuda_bench {

/// Query head h of a GQA group over one key set: same seed and key parameters (so the same
/// keys and topics), different topic strength and query mean per head.
inline kvsift::testing::ood_data make_head(std::size_t n, std::size_t m, std::size_t d,
                                           std::size_t h, std::uint64_t seed) {
  const float scale[] = {2.0f, 1.5f, 2.5f, 3.0f};
  const float offset[] = {4.0f, 3.0f, 5.0f, 4.5f};
  return kvsift::testing::make_ood({.keys = n,
                                    .queries = m,
                                    .dim = d,
                                    .topics = 1024,
                                    .query_offset = offset[h % 4],
                                    .topic_scale = scale[h % 4],
                                    .seed = seed});
}

}  // namespace kvsift::cuda_bench
