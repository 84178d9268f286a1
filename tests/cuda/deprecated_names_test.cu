// Names kept for one release after the `*_ref` rename (device handles are `*_ref`, STYLE.md)
// still name the same types. Using them warns by design; this file silences the warning
// (kvsift_cuda_tests is built with --Werror=all-warnings) to check that the aliases are exact.
// Nothing runs: the checks are compile-time.

#include <cuda_fp16.h>

#include <type_traits>

#include <kvsift/cuda/graph_search.cuh>
#include <kvsift/cuda/page_gather.cuh>
#include <kvsift/cuda/paged_kv_view.cuh>  // the former header still provides both names

// The host compiler is the one that warns (nvcc 13's front end does not, checked by removing
// these pragmas: g++ then fails the build on the three declarations below).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

static_assert(std::is_same_v<kvsift::cuda::device_graph<float>, kvsift::cuda::graph_ref<float>>);
static_assert(
    std::is_same_v<kvsift::cuda::paged_kv_view<__half>, kvsift::cuda::paged_kv_ref<__half>>);
static_assert(std::is_same_v<kvsift::cuda::page_pools, kvsift::cuda::page_pools_ref>);

// Declarations of the kind user code has: the static_asserts alone never reach the host
// compiler, so without these the pragmas would silence nothing.
namespace {
[[maybe_unused]] constexpr kvsift::cuda::device_graph<float> old_graph{};
[[maybe_unused]] constexpr kvsift::cuda::paged_kv_view<float> old_kv{};
[[maybe_unused]] constexpr kvsift::cuda::page_pools old_pools{};
}  // namespace

#pragma GCC diagnostic pop
