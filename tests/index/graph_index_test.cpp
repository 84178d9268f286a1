// GCC 12 at -O2 flags the (never executed) 4-wide SIMD loads in detail::dot_f32 when it can see
// a 2-float query: a -Warray-bounds false positive, not an out-of-bounds read.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Warray-bounds"
#endif

#include "kvsift/index/graph_index.hpp"
#include "../test_support.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

namespace {

using kvsift::invalid_id;
using store = kvsift::view_store<float>;
using graph = kvsift::graph_index<store>;

using kvsift_test::message_of;

/// Four 2-d keys and their rows of width 3: degrees 3, 1, 0 (isolated) and 2.
std::vector<float> four_keys() { return {1, 0, 0, 1, 1, 1, 2, 0}; }
std::vector<kvsift::id_t> four_rows() {
  return {1,          2,          3,           //
          0,          invalid_id, invalid_id,  //
          invalid_id, invalid_id, invalid_id,  //
          3,          0,          invalid_id};
}

}  // namespace

using Catch::Matchers::Contains;

TEST_CASE("graph_index neighbors, degrees and scores", "[index][graph_index]") {
  const std::vector<float> data = four_keys();
  const store s(kvsift::matrix_view<const float>(data.data(), 4, 2));
  const std::vector<kvsift::id_t> adj = four_rows();
  const graph g(s, 3, adj, 2);
  CHECK(g.size() == 4);
  CHECK(g.dim() == 2);
  CHECK(g.max_degree() == 3);
  CHECK(g.entry_point() == 2);
  CHECK(g.neighbors(0).size() == 3);
  CHECK(g.neighbors(0)[2] == 3);
  REQUIRE(g.neighbors(1).size() == 1);
  CHECK(g.neighbors(1)[0] == 0);
  CHECK(g.neighbors(2).empty());
  REQUIRE(g.neighbors(3).size() == 2);
  CHECK(g.neighbors(3)[1] == 0);
  CHECK(g.adjacency().size() == 12);
  const auto d = g.degrees();
  CHECK(d.min == 0);
  CHECK(d.max == 3);
  CHECK(d.mean == Approx(1.5));
  CHECK(d.zero_degree == 1);
  const std::vector<float> qv = {3, 4};  // heap: GCC 12 -Warray-bounds misfires on a stack array
  const float* q = qv.data();
  CHECK(g.score(q, 3) == 6.0f);
  CHECK(g.score(q, 2) == 7.0f);
  const kvsift::graph_index<store, kvsift::l2> gl(s, 3, adj, 0);
  CHECK(gl.score(q, 3) == 17.0f);

  const kvsift::graph_index<kvsift::owning_store<float>> empty(kvsift::owning_store<float>{}, 4, {},
                                                               0);
  CHECK(empty.size() == 0);
  CHECK(empty.entry_point() == invalid_id);
  CHECK(empty.degrees().max == 0);
}

TEST_CASE("graph_index memory counts the structure and not the keys", "[index][graph_index]") {
  const std::vector<float> data = four_keys();
  const store s(kvsift::matrix_view<const float>(data.data(), 4, 2));
  const std::vector<kvsift::id_t> adj = four_rows();
  const graph g(s, 3, adj, std::vector<kvsift::id_t>{2, 0});
  const auto m = g.memory();
  CHECK(m.adjacency == 12 * 4);  // 4 rows x 3, padding included
  CHECK(m.degrees == 4 * 4);
  CHECK(m.entries == 2 * 4);
  CHECK(m.edges == 6);
  CHECK(m.total() == 48 + 16 + 8);
  CHECK(m.rows == 4);
  CHECK(m.compact() == 5 * 8 + 6 * 4);

  const kvsift::graph_index<kvsift::owning_store<float>> empty(kvsift::owning_store<float>{}, 4, {},
                                                               0);
  const auto e = empty.memory();
  CHECK(e.total() == 0);
  CHECK(e.edges == 0);
}

TEST_CASE("graph_index constructor validation", "[index][graph_index]") {
  std::vector<float> data(3 * 2, 1.0f);
  const store s(kvsift::matrix_view<const float>(data.data(), 3, 2));
  auto msg = message_of<kvsift::dimension_mismatch>([&] { graph g(s, 2, {1, 2, 0, 2, 0}, 0); });
  CHECK_THAT(msg, Contains("6") && Contains("got 5"));
  msg = message_of<kvsift::out_of_range>([&] { graph g(s, 2, {1, 2, 0, 3, 0, 1}, 0); });
  CHECK_THAT(msg, Contains("node 1") && Contains("got 3"));
  msg = message_of<kvsift::out_of_range>([&] { graph g(s, 2, {invalid_id, 2, 0, 1, 0, 1}, 0); });
  CHECK_THAT(msg, Contains("node 0") && Contains("padding") && Contains("got 2"));
  msg = message_of<kvsift::out_of_range>([&] { graph g(s, 2, {1, 2, 0, 2, 0, 1}, 3); });
  CHECK_THAT(msg, Contains("entry < 3") && Contains("got 3"));
  msg = message_of<kvsift::invalid_argument>([&] { graph g(s, 0, {}, 0); });
  CHECK_THAT(msg, Contains("max_degree") && Contains("0"));
  CHECK_NOTHROW(graph(s, 2, {1, invalid_id, invalid_id, invalid_id, 0, 1}, 2));
}

namespace {
// A store whose rows are never read: lets a test state an overflow-sized shape without the
// memory behind it (the checks must fire before any row or adjacency entry is touched).
struct shape_store {
  using value_type = float;
  std::size_t n = 0, d = 0;
  const float* data = nullptr;
  [[nodiscard]] std::size_t size() const noexcept { return n; }
  [[nodiscard]] std::size_t dim() const noexcept { return d; }
  [[nodiscard]] const float* row(std::size_t) const noexcept { return data; }
};
}  // namespace

// Regression: n * max_degree wrapped past the size check (2 x 2^63 = 0 = an empty adjacency)
// and the rows were then read from the empty array.
TEST_CASE("graph_index rejects overflow-sized shapes before reading", "[index][graph_index][rel]") {
  const float x[4] = {1, 2, 3, 4};
  using g_t = kvsift::graph_index<shape_store>;
  auto msg = message_of<kvsift::invalid_argument>([&] {
    (void)g_t(shape_store{2, 2, x}, std::size_t{1} << 63, {}, 0);
  });
  CHECK_THAT(msg, Contains("max_degree must be <= 1048575") && Contains("9223372036854775808"));
  // 2^32 nodes: positions up to 2^32 - 1 would alias invalid_id.
  msg = message_of<kvsift::out_of_range>([&] {
    (void)g_t(shape_store{std::size_t{1} << 32, 2, x}, 1, {}, 0);
  });
  CHECK_THAT(msg, Contains("graph_index") && Contains("4294967296"));
  msg = message_of<kvsift::invalid_argument>([&] {
    (void)g_t(shape_store{3, 0, nullptr}, 1, {invalid_id, invalid_id, invalid_id}, 0);
  });
  CHECK_THAT(msg, Contains("dimension > 0") && Contains("3 x 0"));
}
