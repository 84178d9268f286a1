#pragma once
// Token-level graph retrieval (RetrievalAttention / AlayaDB style) as a SparseAlgorithm: a
// partition is one token, stored in token order and packed page_tokens to a page; `index`
// builds a RoarGraph over the prompt's keys from training queries, `select` runs top-k beam
// search and returns the token ids.
//
// A class template over the step-1 kNN engine, so that a GPU engine can build the graph, and so
// that including this header instantiates no build: the non-template class it replaces made every
// translation unit instantiate the whole RoarGraph build (and Eigen's GEMM) whether it used it or
// not. `graph_token_retrieval` names the CPU one, as before.

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvsift/core/dense_matrix.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/metric.hpp"
#include "kvsift/core/vector_store.hpp"
#include "kvsift/decode/sparse_algorithm.hpp"
#include "kvsift/index/graph_index.hpp"
#include "kvsift/index/knn.hpp"
#include "kvsift/index/roargraph_builder.hpp"
#include "kvsift/search/beam_search.hpp"

namespace kvsift {

/// Thread safety: const members safe concurrently (select with one workspace per thread), when
/// the engine's `search` is (the CPU and CUDA engines' are).
template <KnnEngine Engine = cpu_knn_engine>
class basic_graph_token_retrieval {
 public:
  struct index_type {
    graph_index<owning_store<float>, inner_product> graph;
    partitioning parts;
    [[nodiscard]] const partitioning& partitions() const noexcept { return parts; }
  };

  /// Copies the training queries (e.g. the prompt's own queries of the heads sharing this KV
  /// head). `beam` is the search pool L (raised to the budget when smaller).
  /// @throw invalid_argument for no training queries or beam == 0.
  explicit basic_graph_token_retrieval(matrix_view<const float> train_queries,
                                       roargraph_params params = {}, std::size_t beam = 100)
      : basic_graph_token_retrieval(train_queries, params, beam, Engine{}) {}

  /// As above, building with `engine` (e.g. kvsift::cuda::knn_engine).
  basic_graph_token_retrieval(matrix_view<const float> train_queries, roargraph_params params,
                              std::size_t beam, Engine engine)
      : train_(train_queries.rows(), train_queries.cols()),
        params_(params),
        beam_(beam),
        engine_(std::move(engine)) {
    detail::require(train_queries.rows() > 0,
                    "graph_token_retrieval: expected training queries, got 0");
    detail::require(beam > 0, "graph_token_retrieval: beam must be > 0, got 0");
    for (std::size_t i = 0; i < train_queries.rows(); ++i) {
      std::copy_n(train_queries.row(i), train_queries.cols(), train_.row(i));
    }
  }

  /// Builds the graph. O(RoarGraph build). @throw as roargraph_builder::build.
  [[nodiscard]] index_type index(matrix_view<const float> keys) const {
    index_type idx{make_builder().build(owning_store<float>(keys), train_.view()), {}};
    idx.parts.tokens.resize(keys.rows());
    std::iota(idx.parts.tokens.begin(), idx.parts.tokens.end(), id_t{0});
    idx.parts.offsets.resize(keys.rows() + 1);
    std::iota(idx.parts.offsets.begin(), idx.parts.offsets.end(), std::size_t{0});
    idx.parts.packed = true;
    return idx;
  }

  /// Up to `budget` token ids (= partition ids), best first. O(beam search).
  /// @throw invalid_argument if budget == 0; dimension_mismatch for a wrong query length.
  void select(const index_type& idx, std::span<const float> q, std::size_t budget,
              search_workspace& ws, std::vector<id_t>& out) const {
    detail::require(budget > 0, "graph_token_retrieval::select: budget must be > 0, got 0");
    out.resize(budget);
    std::vector<float> scores(budget);  // small next to the search itself
    const auto st = beam_search(idx.graph, q, {budget, std::max(budget, beam_)}, ws,
                                std::span<id_t>(out), std::span<float>(scores));
    out.resize(st.count);
  }

 private:
  // The CPU engine takes its thread count from params.threads, as roargraph_builder's
  // one-argument constructor arranges; any other engine is used as given.
  [[nodiscard]] roargraph_builder<inner_product, Engine> make_builder() const {
    if constexpr (std::is_same_v<Engine, cpu_knn_engine>) {
      return roargraph_builder<inner_product, Engine>(params_);
    } else {
      return roargraph_builder<inner_product, Engine>(params_, engine_);
    }
  }

  dense_matrix<float> train_;
  roargraph_params params_;
  std::size_t beam_;
  Engine engine_;
};

/// Token-level graph retrieval with the CPU kNN engine.
using graph_token_retrieval = basic_graph_token_retrieval<>;

static_assert(SparseAlgorithm<graph_token_retrieval>);

}  // namespace kvsift
