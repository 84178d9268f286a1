#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include "kvsift/core/element.hpp"
#include "kvsift/core/metric.hpp"
#include "kvsift/core/vector_store.hpp"
#include "kvsift/index/block_index.hpp"
#include "kvsift/index/graph_index.hpp"
#include "kvsift/index/knn.hpp"
#include "kvsift/search/graph.hpp"
#include "kvsift/search/predicate.hpp"

namespace {

struct no_score_metric {
  static constexpr std::string_view name = "x";
  static constexpr bool higher_is_better = true;
};
struct f32_only_metric {
  static constexpr std::string_view name = "x";
  static constexpr bool higher_is_better = true;
  static float score(const float*, const float*, std::size_t) { return 0; }
};
struct double_metric {
  static constexpr std::string_view name = "x";
  static constexpr bool higher_is_better = true;
  template <class T>
  static double score(const float*, const T*, std::size_t) {
    return 0;
  }
};

struct mutable_row_store {
  using value_type = float;
  std::size_t size() const { return 0; }
  std::size_t dim() const { return 0; }
  float* row(std::size_t) const { return nullptr; }
};
struct int_store {
  using value_type = int;
  std::size_t size() const { return 0; }
  std::size_t dim() const { return 0; }
  const int* row(std::size_t) const { return nullptr; }
};
struct good_store {
  using value_type = kvsift::half;
  std::size_t size() const { return 0; }
  std::size_t dim() const { return 0; }
  const kvsift::half* row(std::size_t) const { return nullptr; }
};
struct good_matrix_store : good_store {
  kvsift::matrix_view<const kvsift::half> view() const { return {}; }
};
struct wrong_view_store : good_store {
  kvsift::matrix_view<const float> view() const { return {}; }
};

struct f32_only_engine {
  kvsift::knn_result search(kvsift::matrix_view<const float>, kvsift::matrix_view<const float>,
                            std::size_t) const {
    return {};
  }
};
struct any_engine {
  template <class T>
  kvsift::knn_result search(kvsift::matrix_view<const float>, kvsift::matrix_view<const T>,
                            std::size_t) const {
    return {};
  }
};

struct lambda_like_pred {
  bool operator()(kvsift::id_t id) const { return id % 2 == 0; }
};
struct non_const_pred {
  bool operator()(kvsift::id_t) { return true; }
};
struct non_copyable_pred {
  non_copyable_pred() = default;
  non_copyable_pred(const non_copyable_pred&) = delete;
  bool operator()(kvsift::id_t) const { return true; }
};
struct void_pred {
  void operator()(kvsift::id_t) const {}
};

// A block summary that forgets to say whether its upper score is a bound.
struct unflagged_representative {
  static constexpr std::string_view name = "x";
  static constexpr bool needs_queries = false;
  void reset(std::size_t) {}
  void append(kvsift::matrix_view<const float>, kvsift::matrix_view<const float>, std::size_t,
              std::size_t) {}
  kvsift::block_bounds bounds(const float*, std::size_t) const { return {}; }
  std::size_t floats_per_block() const { return 0; }
};
struct float_bounds_representative {
  static constexpr std::string_view name = "x";
  static constexpr bool upper_is_bound = true;
  static constexpr bool needs_queries = false;
  void reset(std::size_t) {}
  void append(kvsift::matrix_view<const float>, kvsift::matrix_view<const float>, std::size_t,
              std::size_t) {}
  float bounds(const float*, std::size_t) const { return 0; }
  std::size_t floats_per_block() const { return 0; }
};

// Graph models: one entry point, several entry points, and what each must not lack.
struct one_entry_graph {
  using metric_type = kvsift::l2;
  std::size_t size() const { return 0; }
  std::size_t dim() const { return 0; }
  kvsift::id_t entry_point() const { return kvsift::invalid_id; }
  std::span<const kvsift::id_t> neighbors(kvsift::id_t) const { return {}; }
  float score(const float*, kvsift::id_t) const { return 0; }
};
struct many_entries_graph {
  using metric_type = kvsift::inner_product;
  std::size_t size() const { return 0; }
  std::size_t dim() const { return 0; }
  std::span<const kvsift::id_t> entry_points() const { return {}; }
  std::span<const kvsift::id_t> neighbors(kvsift::id_t) const { return {}; }
  float score(const float*, kvsift::id_t) const { return 0; }
};
struct no_entry_graph {
  using metric_type = kvsift::l2;
  std::size_t size() const { return 0; }
  std::size_t dim() const { return 0; }
  std::span<const kvsift::id_t> neighbors(kvsift::id_t) const { return {}; }
  float score(const float*, kvsift::id_t) const { return 0; }
};
struct no_metric_graph {
  std::size_t size() const { return 0; }
  std::size_t dim() const { return 0; }
  kvsift::id_t entry_point() const { return kvsift::invalid_id; }
  std::span<const kvsift::id_t> neighbors(kvsift::id_t) const { return {}; }
  float score(const float*, kvsift::id_t) const { return 0; }
};
struct bad_metric_graph : one_entry_graph {
  using metric_type = no_score_metric;
};
// Neighbours as 64-bit ids: the walk's visited set and pools hold 32-bit ids.
struct wide_ids_graph {
  using metric_type = kvsift::l2;
  std::size_t size() const { return 0; }
  std::size_t dim() const { return 0; }
  kvsift::id_t entry_point() const { return kvsift::invalid_id; }
  std::span<const std::uint64_t> neighbors(kvsift::id_t) const { return {}; }
  float score(const float*, kvsift::id_t) const { return 0; }
};
// Scoring through a non-const member: searches share one const graph across threads.
struct mutable_score_graph {
  using metric_type = kvsift::l2;
  std::size_t size() const { return 0; }
  std::size_t dim() const { return 0; }
  kvsift::id_t entry_point() const { return kvsift::invalid_id; }
  std::span<const kvsift::id_t> neighbors(kvsift::id_t) const { return {}; }
  float score(const float*, kvsift::id_t) { return 0; }
};

}  // namespace

// Graph
static_assert(kvsift::Graph<kvsift::graph_index<kvsift::view_store<float>, kvsift::l2>>);
static_assert(kvsift::Graph<kvsift::graph_index<kvsift::owning_store<kvsift::half>>>);
static_assert(kvsift::Graph<one_entry_graph>);
static_assert(kvsift::Graph<many_entries_graph>);
static_assert(!kvsift::Graph<no_entry_graph>);
static_assert(!kvsift::Graph<no_metric_graph>);
static_assert(!kvsift::Graph<bad_metric_graph>);
static_assert(!kvsift::Graph<wide_ids_graph>);
static_assert(!kvsift::Graph<mutable_score_graph>);
static_assert(!kvsift::Graph<int>);

// BlockRepresentative
static_assert(kvsift::BlockRepresentative<kvsift::minmax_representative>);
static_assert(kvsift::BlockRepresentative<kvsift::representative_keys>);
static_assert(!kvsift::BlockRepresentative<unflagged_representative>);
static_assert(!kvsift::BlockRepresentative<float_bounds_representative>);
static_assert(!kvsift::BlockRepresentative<int>);

// Element
static_assert(kvsift::Element<float>);
static_assert(kvsift::Element<const float>);
static_assert(kvsift::Element<kvsift::half>);
static_assert(kvsift::Element<const kvsift::bfloat16>);
static_assert(!kvsift::Element<int>);
static_assert(!kvsift::Element<double>);
static_assert(!kvsift::Element<std::uint16_t>);

// Metric
static_assert(kvsift::Metric<kvsift::inner_product>);
static_assert(kvsift::Metric<kvsift::l2>);
static_assert(!kvsift::Metric<no_score_metric>);
static_assert(!kvsift::Metric<f32_only_metric>);
static_assert(!kvsift::Metric<double_metric>);
static_assert(!kvsift::Metric<int>);

// VectorStore / MatrixStore
static_assert(kvsift::VectorStore<kvsift::view_store<float>>);
static_assert(kvsift::VectorStore<kvsift::owning_store<kvsift::half>>);
static_assert(kvsift::VectorStore<good_store>);
static_assert(!kvsift::VectorStore<mutable_row_store>);
static_assert(!kvsift::VectorStore<int_store>);
static_assert(!kvsift::VectorStore<int>);
static_assert(kvsift::MatrixStore<kvsift::view_store<kvsift::bfloat16>>);
static_assert(kvsift::MatrixStore<kvsift::owning_store<float>>);
static_assert(kvsift::MatrixStore<good_matrix_store>);
static_assert(!kvsift::MatrixStore<good_store>);
static_assert(!kvsift::MatrixStore<wrong_view_store>);

// KnnEngine
static_assert(kvsift::KnnEngine<kvsift::cpu_knn_engine>);
static_assert(kvsift::KnnEngine<any_engine>);
static_assert(!kvsift::KnnEngine<int>);

// Predicate
static_assert(kvsift::Predicate<kvsift::no_filter>);
static_assert(kvsift::Predicate<kvsift::id_below>);
static_assert(kvsift::Predicate<kvsift::id_allow_list>);
static_assert(kvsift::Predicate<lambda_like_pred>);
static_assert(!kvsift::Predicate<non_const_pred>);
static_assert(!kvsift::Predicate<non_copyable_pred>);
static_assert(!kvsift::Predicate<void_pred>);
static_assert(!kvsift::Predicate<int>);

TEST_CASE("concept checks compile", "[static]") {
  CHECK(lambda_like_pred{}(2));
  CHECK_FALSE(lambda_like_pred{}(3));
}

// matrix_view converts to its own const view only; an engine that accepts only f32 keys must
// not model KnnEngine through an accidental f16 -> f32 view conversion.
static_assert(std::is_convertible_v<kvsift::matrix_view<float>, kvsift::matrix_view<const float>>);
static_assert(!std::is_convertible_v<kvsift::matrix_view<const kvsift::half>,
                                     kvsift::matrix_view<const float>>);
static_assert(
    !std::is_convertible_v<kvsift::matrix_view<kvsift::half>, kvsift::matrix_view<const float>>);
static_assert(!kvsift::KnnEngine<f32_only_engine>);

TEST_CASE("matrix_view converts only to its own const view; f32-only engines are not KnnEngine",
          "[static]") {
  CHECK(std::is_convertible_v<kvsift::matrix_view<float>, kvsift::matrix_view<const float>>);
  CHECK_FALSE(std::is_convertible_v<kvsift::matrix_view<const kvsift::half>,
                                    kvsift::matrix_view<const float>>);
  CHECK_FALSE(
      std::is_convertible_v<kvsift::matrix_view<kvsift::half>, kvsift::matrix_view<const float>>);
  CHECK_FALSE(kvsift::KnnEngine<f32_only_engine>);
}
