// The headers kept at their old paths for one release still provide what they used to, and
// their deprecation warning can be silenced (this file is built with -Werror: without the
// define below each include would fail the build).
#define KVSIFT_NO_DEPRECATED_HEADER_WARNINGS
#include "kvsift/index/detail/binary_io.hpp"
#include "kvsift/index/vector_io.hpp"
#include "kvsift/memory/graph_token_retrieval.hpp"
#include "kvsift/memory/pipeline.hpp"

#include <catch2/catch.hpp>

#include <filesystem>
#include <type_traits>

static_assert(kvsift::SparseAlgorithm<kvsift::graph_token_retrieval>);
static_assert(std::is_class_v<kvsift::partitioning> && std::is_class_v<kvsift::offloaded_kv>);
static_assert(std::is_class_v<kvsift::basic_graph_token_retrieval<kvsift::cpu_knn_engine>>);
static_assert(std::is_invocable_r_v<kvsift::dense_matrix<float>, decltype(&kvsift::read_fbin),
                                    const std::filesystem::path&>);

TEST_CASE("deprecated header paths still provide their names", "[static]") {
  CHECK(kvsift::partitioning{}.partitions() == 0);
}
