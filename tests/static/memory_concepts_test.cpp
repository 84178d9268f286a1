// Positive and negative cases of the memory module's concepts: ReplacementPolicy and
// SparseAlgorithm (a separate file from concepts_test.cpp so the module's checks travel with it).
#include <catch2/catch.hpp>

#include <span>
#include <vector>

#include "kvsift/decode/graph_token_retrieval.hpp"
#include "kvsift/decode/sparse_algorithm.hpp"
#include "kvsift/memory/belady.hpp"
#include "kvsift/memory/bucketed_lru.hpp"
#include "kvsift/memory/exact_lru.hpp"
#include "kvsift/memory/offload.hpp"

namespace {

struct mutable_input_policy {  // step must accept a read-only selection
  void step(std::span<kvsift::id_t>, kvsift::replacement_step&) {}
  std::size_t capacity() const { return 0; }
  std::size_t keys() const { return 0; }
  std::size_t resident() const { return 0; }
  kvsift::id_t slot_of(kvsift::id_t) const { return 0; }
};
struct no_slot_of_policy {
  void step(std::span<const kvsift::id_t>, kvsift::replacement_step&) {}
  std::size_t capacity() const { return 0; }
  std::size_t keys() const { return 0; }
  std::size_t resident() const { return 0; }
};

struct index_without_partitions {};
struct algorithm_without_partitions {
  using index_type = index_without_partitions;
  index_type index(kvsift::matrix_view<const float>) const { return {}; }
  void select(const index_type&, std::span<const float>, std::size_t, kvsift::search_workspace&,
              std::vector<kvsift::id_t>&) const {}
};
struct index_with_partitions {
  kvsift::partitioning parts;
  const kvsift::partitioning& partitions() const { return parts; }
};
struct mutating_select_algorithm {  // select must be const (concurrent decode steps)
  using index_type = index_with_partitions;
  index_type index(kvsift::matrix_view<const float>) const { return {}; }
  void select(const index_type&, std::span<const float>, std::size_t, kvsift::search_workspace&,
              std::vector<kvsift::id_t>&) {}
};
struct minimal_algorithm {
  using index_type = index_with_partitions;
  index_type index(kvsift::matrix_view<const float>) const { return {}; }
  void select(const index_type&, std::span<const float>, std::size_t, kvsift::search_workspace&,
              std::vector<kvsift::id_t>&) const {}
};

}  // namespace

static_assert(kvsift::ReplacementPolicy<kvsift::bucketed_lru<2>>);
static_assert(kvsift::ReplacementPolicy<kvsift::bucketed_lru<256>>);
static_assert(kvsift::ReplacementPolicy<kvsift::exact_lru>);
static_assert(kvsift::ReplacementPolicy<kvsift::belady>);
static_assert(!kvsift::ReplacementPolicy<mutable_input_policy>);
static_assert(!kvsift::ReplacementPolicy<no_slot_of_policy>);
static_assert(!kvsift::valid_bucket_count<0> && !kvsift::valid_bucket_count<257>);

static_assert(kvsift::SparseAlgorithm<kvsift::graph_token_retrieval>);
static_assert(kvsift::SparseAlgorithm<minimal_algorithm>);
static_assert(!kvsift::SparseAlgorithm<algorithm_without_partitions>);
static_assert(!kvsift::SparseAlgorithm<mutating_select_algorithm>);

TEST_CASE("memory concepts accept the library's models and reject near misses", "[static]") {
  CHECK(kvsift::ReplacementPolicy<kvsift::exact_lru>);
  CHECK_FALSE(kvsift::ReplacementPolicy<mutable_input_policy>);
  CHECK(kvsift::SparseAlgorithm<minimal_algorithm>);
  CHECK_FALSE(kvsift::SparseAlgorithm<mutating_select_algorithm>);
}
