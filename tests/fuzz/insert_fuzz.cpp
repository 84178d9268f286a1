// Fuzz target (d): kvsift::insertable_graph driven by operations decoded from the input: key
// inserts, decode queries added with given or searched lists, and searches, interleaved. The
// insert rule keeps a graph, the training queries' kNN lists (heaps), their best entries and the
// key -> query lists consistent with each other across all of them; this checks what must hold
// after every operation, on integer-valued vectors (exact scores):
//   - every row holds distinct ids below size(), at most max_degree of them, never its own;
//   - every kNN list holds distinct ids below size(), best first, each with its exact score;
//   - a search returns distinct ids below size(), best first;
//   - with exact list upkeep (every training query scored, every list offered the key), each
//     list after an insert is the best nq of its entries before and the new keys (rank key,
//     then lower id), as the build's exact kNN would give;
//   - an operation that throws (NaN/Inf keys or queries, ids out of range or twice in a row,
//     pool 0) leaves size, training queries, graph and lists exactly as they were.
// Byte 0 picks the metric and the insert parameters, bytes 1-5 the shape and the vectors'
// seed, the rest the operations. A violation calls std::abort (a crash to libFuzzer).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <set>
#include <vector>

#include "fuzz_support.hpp"
#include "kvsift/core/dense_matrix.hpp"
#include "kvsift/core/metric.hpp"
#include "kvsift/core/topk.hpp"
#include "kvsift/index/insertable_graph.hpp"
#include "kvsift/index/roargraph_builder.hpp"
#include "kvsift/search/beam_search.hpp"
#include "kvsift/search/search_workspace.hpp"

namespace {

using kvsift::id_t;
using kvsift::invalid_id;

/// Reads bytes off the input; past the end it returns 0 and done() turns true.
class input {
 public:
  input(const std::uint8_t* d, std::size_t n) : d_(d), n_(n) {}
  [[nodiscard]] bool done() const noexcept { return i_ >= n_; }
  std::uint8_t byte() { return i_ < n_ ? d_[i_++] : 0; }

 private:
  const std::uint8_t* d_;
  std::size_t n_, i_ = 0;
};

void require(bool ok) {
  if (!ok) std::abort();
}

/// Small integers (exact products and sums in f32) from a seeded generator, so that short
/// inputs reach deep states; the input's bytes go to the operations.
class vectors {
 public:
  explicit vectors(std::uint32_t seed) : s_(seed * 2654435761u + 1) {}
  float next() {
    s_ = s_ * 1664525u + 1013904223u;
    return static_cast<float>(static_cast<int>((s_ >> 24) % 9) - 4);
  }
  kvsift::dense_matrix<float> rows(std::size_t n, std::size_t d) {
    kvsift::dense_matrix<float> m(n, d);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < d; ++j) m(i, j) = next();
    return m;
  }

 private:
  std::uint32_t s_;
};

/// Everything an operation may change, to check "unchanged on a throw".
template <class G>
struct state {
  std::size_t size = 0, queries = 0;
  std::vector<id_t> rows;
  kvsift::knn_result knn;
  explicit state(const G& g) : size(g.size()), queries(g.training_queries().rows()) {
    for (std::size_t i = 0; i < size; ++i) {
      const auto r = g.neighbors(static_cast<id_t>(i));
      rows.push_back(static_cast<id_t>(r.size()));
      rows.insert(rows.end(), r.begin(), r.end());
    }
    knn = g.query_knn();
  }
  bool operator==(const state& o) const {
    return size == o.size && queries == o.queries && rows == o.rows && knn.ids == o.knn.ids &&
           knn.scores == o.knn.scores;
  }
};

template <class M, class G>
void check_invariants(const G& g) {
  const std::size_t n = g.size();
  for (std::size_t i = 0; i < n; ++i) {
    const auto r = g.neighbors(static_cast<id_t>(i));
    require(r.size() <= g.max_degree());
    std::set<id_t> seen;
    for (const id_t y : r) require(y < n && y != i && seen.insert(y).second);
  }
  const auto q = g.training_queries();
  const auto knn = g.query_knn();
  require(knn.rows == q.rows());
  for (std::size_t i = 0; i < knn.rows; ++i) {
    std::set<id_t> seen;
    float last = std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < knn.k; ++j) {
      const id_t y = knn.ids[i * knn.k + j];
      if (y == invalid_id) continue;
      require(y < n && seen.insert(y).second);
      const float s = g.score(q.row(i), y);
      require(s == knn.scores[i * knn.k + j]);
      // Best first by the metric's rank key (inner product: larger; l2: smaller).
      const float key = kvsift::to_key<M>(s);
      require(key <= last);
      last = key;
    }
  }
}

/// Exact upkeep: every list after inserting keys [first, size()) is the best nq of its entries
/// before (`before`, as query_knn() returned them) and the new keys.
template <class M, class G>
void check_exact_upkeep(const G& g, const kvsift::knn_result& before, std::size_t first) {
  const auto q = g.training_queries();
  const auto after = g.query_knn();
  require(after.rows == before.rows && after.k == before.k);
  for (std::size_t i = 0; i < before.rows; ++i) {
    std::vector<kvsift::scored_id> want;
    for (std::size_t j = 0; j < before.k; ++j) {
      const id_t y = before.ids[i * before.k + j];
      if (y != invalid_id) want.push_back({kvsift::to_key<M>(g.score(q.row(i), y)), y});
    }
    for (std::size_t y = first; y < g.size(); ++y) {
      const auto id = static_cast<id_t>(y);
      want.push_back({kvsift::to_key<M>(g.score(q.row(i), id)), id});
    }
    std::sort(want.begin(), want.end(), kvsift::ranks_before);
    want.resize(std::min(want.size(), before.k));
    for (std::size_t j = 0; j < before.k; ++j) {
      const id_t got = after.ids[i * after.k + j];
      require(got == (j < want.size() ? want[j].id : invalid_id));
    }
  }
}

/// Runs `op`; a documented error must leave the graph as it was.
template <class G, class Op>
void guarded(G& g, Op&& op) {
  const state<G> before(g);
  bool threw = false;
  kvsift_fuzz::expect_kvsift_errors_only([&] {
    try {
      op();
    } catch (...) {
      threw = true;
      throw;
    }
  });
  if (threw) require(state<G>(g) == before);
}

template <class M>
void run(input& in, std::uint8_t mode) {
  const std::size_t n = 8 + in.byte() % 40;
  const std::size_t d = 1 + in.byte() % 6;
  const std::size_t m = 2 + in.byte() % 24;
  const std::size_t nq = 2 + in.byte() % 6;
  vectors gen(in.byte());
  const auto keys = gen.rows(n, d);
  const auto train = gen.rows(m, d);
  kvsift::roargraph_params bp;
  bp.nq = nq;
  bp.M = 2 + mode % 3;
  bp.L = 16;
  bp.threads = 1;
  kvsift::graph_insert_params ip;
  ip.L = 4 + (mode >> 2) % 8;
  ip.query_candidates = (mode & 0x20) ? 0 : 3 + mode % 9;
  ip.holder_capacity = (mode & 0x40) ? 0 : 1 + (mode >> 3) % 4;
  ip.query_knn_lists = (mode & 0x80) ? 1 + mode % 3 : 0;
  kvsift::insertable_graph<float, M> g;
  try {
    g = kvsift::build_insertable(kvsift::roargraph_builder<M>(bp), keys.cview(), train.cview(), ip);
  } catch (const kvsift::invalid_argument&) {
    return;  // a shape the builder refuses: nothing to insert into
  }
  check_invariants<M>(g);
  kvsift::search_workspace ws;
  while (!in.done()) {
    const std::uint8_t op = in.byte();
    const std::uint8_t arg = in.byte();
    const std::size_t count = 1 + arg % 3;
    auto rows = gen.rows(count, d);
    // Bits of arg spoil one value of the batch: NaN, +Inf.
    if (arg & 0x40) rows(count - 1, arg % d) = (arg & 0x80) ? INFINITY : NAN;
    switch (op % 4) {
      case 0: {
        const bool exact = ip.query_candidates == 0 && ip.query_knn_lists == 0;
        const auto before = exact ? g.query_knn() : kvsift::knn_result{};
        const std::size_t first = g.size();
        guarded(g, [&] { (void)g.insert(rows.cview()); });
        if (exact) check_exact_upkeep<M>(g, before, first);
        break;
      }
      case 1: {
        // Given lists: ids from the input, some past size(), some repeated, some empty.
        kvsift::knn_result lists;
        lists.rows = count;
        lists.k = 1 + in.byte() % 5;
        for (std::size_t i = 0; i < lists.rows * lists.k; ++i) {
          const std::uint8_t b = in.byte();
          lists.ids.push_back(b == 255 ? invalid_id : static_cast<id_t>(b % (g.size() + 2)));
          lists.scores.push_back(0);
        }
        guarded(g, [&] { (void)g.add_queries(rows.cview(), lists); });
        break;
      }
      case 2:
        guarded(g, [&] { (void)g.add_queries(rows.cview(), in.byte() % 24); });
        break;
      default: {
        const std::size_t k = 1 + arg % 8, L = k + in.byte() % 16;
        std::vector<id_t> ids(k);
        std::vector<float> scores(k);
        kvsift_fuzz::expect_kvsift_errors_only([&] {
          const auto st = kvsift::beam_search(g, rows.cview().row_span(0), {k, L}, ws, ids, scores);
          require(st.count <= k);
          std::set<id_t> seen;
          for (std::size_t j = 0; j < st.count; ++j) {
            require(ids[j] < g.size() && seen.insert(ids[j]).second);
            require(j == 0 || kvsift::to_key<M>(scores[j]) <= kvsift::to_key<M>(scores[j - 1]));
          }
        });
      }
    }
    check_invariants<M>(g);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  input in(data, size);
  const std::uint8_t mode = in.byte();
  if (mode & 1) {
    run<kvsift::inner_product>(in, mode);
  } else {
    run<kvsift::l2>(in, mode);
  }
  return 0;
}
