#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../test_support.hpp"
#include "kvsift/index/graph_io.hpp"
#include "kvsift/index/roargraph_builder.hpp"
#include "kvsift/testing/ood_generator.hpp"

using namespace kvsift;
using Catch::Matchers::Contains;

namespace {

struct temp_file {
  std::filesystem::path path;
  explicit temp_file(const std::string& name)
      : path(std::filesystem::temp_directory_path() /
             (name + "_" + std::to_string(std::random_device{}()) + ".kvsg")) {}
  ~temp_file() { std::filesystem::remove(path); }
};

// 600 OOD keys of dimension 16 and the RoarGraph built over them, for the file tests.
struct small_graph {
  testing::ood_data data = testing::make_ood({.keys = 600, .queries = 80, .dim = 16});
  view_store<float> store{data.key_view()};
  graph_index<view_store<float>> g = roargraph_builder<>({.nq = 20, .M = 8, .L = 40, .threads = 1})
                                         .build(store, data.query_view());
};

std::vector<char> slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void spit(const std::filesystem::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

TEST_CASE("graph index save/load round trip and corruption", "[index][io]") {
  const small_graph sg;
  const auto& [data, store, g] = sg;
  temp_file f("kvsift_graph");
  save_graph(g, f.path);

  SECTION("round trip restores adjacency and entry point") {
    const auto h = load_graph(f.path, store);
    CHECK(h.entry_point() == g.entry_point());
    CHECK(h.max_degree() == g.max_degree());
    CHECK(std::equal(h.adjacency().begin(), h.adjacency().end(), g.adjacency().begin(),
                     g.adjacency().end()));
  }
  SECTION("a store of another size or dimension is rejected") {
    view_store<float> fewer(data.key_view().row_range(0, 100));
    CHECK_THROWS_WITH(load_graph(f.path, fewer), Contains("600 x 16") && Contains("100 x 16"));
  }
  SECTION("a store of another element type is rejected") {
    owning_store<half> halves(std::vector<half>(600 * 16), 16);
    CHECK_THROWS_WITH(load_graph(f.path, halves), Contains("f32") && Contains("f16"));
  }
  SECTION("every truncation is an io_error") {
    const auto bytes = slurp(f.path);
    for (std::size_t cut : {std::size_t{0}, std::size_t{5}, std::size_t{31}, std::size_t{40},
                            bytes.size() / 2, bytes.size() - 1}) {
      spit(f.path, std::vector<char>(bytes.begin(), bytes.begin() + static_cast<long>(cut)));
      CHECK_THROWS_AS(load_graph(f.path, store), io_error);
    }
  }
  SECTION("a flipped payload byte fails the checksum") {
    auto bytes = slurp(f.path);
    bytes[bytes.size() / 2] ^= 0x5a;
    spit(f.path, bytes);
    CHECK_THROWS_WITH(load_graph(f.path, store), Contains("checksum mismatch"));
  }
  SECTION("a missing file names the path") {
    std::filesystem::remove(f.path);
    CHECK_THROWS_WITH(load_graph(f.path, store), Contains(f.path.string()));
  }
}

TEST_CASE("write_graph / read_graph: the file format through any stream", "[index][io]") {
  const small_graph sg;
  const auto& [data, store, g] = sg;
  std::ostringstream out(std::ios::binary);
  write_graph(g, out);
  const std::string bytes = out.str();
  temp_file f("kvsift_graph_stream");
  save_graph(g, f.path);
  // The stream carries exactly the bytes of the file (one format, two transports).
  const auto file = slurp(f.path);
  REQUIRE(std::string(file.begin(), file.end()) == bytes);

  SECTION("round trip") {
    std::istringstream in(bytes, std::ios::binary);
    const auto h = read_graph(in, bytes.size(), store);
    CHECK(std::ranges::equal(h.entry_points(), g.entry_points()));
    CHECK(h.max_degree() == g.max_degree());
    CHECK(std::equal(h.adjacency().begin(), h.adjacency().end(), g.adjacency().begin(),
                     g.adjacency().end()));
  }
  SECTION("every truncation is an io_error") {
    for (std::size_t len :
         {std::size_t{0}, std::size_t{7}, std::size_t{40}, bytes.size() / 2, bytes.size() - 1}) {
      std::istringstream in(bytes.substr(0, len), std::ios::binary);
      CHECK_THROWS_AS(read_graph(in, len, store), io_error);
    }
  }
  SECTION("a size beyond the stream's bytes is truncation, not a read past the end") {
    std::istringstream in(bytes.substr(0, bytes.size() - 8), std::ios::binary);
    CHECK_THROWS_WITH(read_graph(in, bytes.size(), store), Contains("truncated"));
  }
  SECTION("trailing bytes are rejected") {
    const std::string longer = bytes + "x";
    std::istringstream in(longer, std::ios::binary);
    CHECK_THROWS_WITH(read_graph(in, longer.size(), store), Contains("unread"));
  }
  SECTION("a flipped byte fails the checksum") {
    std::string bad = bytes;
    bad[bad.size() / 2] = static_cast<char>(bad[bad.size() / 2] ^ 0x10);
    std::istringstream in(bad, std::ios::binary);
    CHECK_THROWS_AS(read_graph(in, bad.size(), store), io_error);
  }
  SECTION("the source name is used in the version-1 message") {
    std::ostringstream v1(std::ios::binary);
    detail::binary_writer w(v1);
    detail::write_header(w, {detail::graph_magic, 1, element_type::f32, 600, 16});
    w.write_checksum();
    std::istringstream in(v1.str(), std::ios::binary);
    CHECK_THROWS_WITH(read_graph(in, v1.str().size(), store, "pickled index"),
                      Contains("pickled index: graph file version 1"));
  }
}

// Regression: a graph file used to be accepted for any keys of the same shape, and for any
// metric. Version 2 records the metric and a key fingerprint and checks both on load.
TEST_CASE("load_graph rejects other keys of the same shape, another metric, version 1",
          "[index][io][rel]") {
  const small_graph sg;
  const auto& [data, store, g] = sg;
  temp_file f("kvsift_graph_fp");
  save_graph(g, f.path);
  CHECK_NOTHROW(load_graph(f.path, store));

  SECTION("keys of the same shape that differ in one element") {
    std::vector<float> other(data.key_view().data(), data.key_view().data() + 600 * 16);
    other[417 * 16 + 3] += 1.0f;
    view_store<float> changed(matrix_view<const float>(other.data(), 600, 16));
    const auto want = key_fingerprint(store), got = key_fingerprint(changed);
    REQUIRE(want != got);
    const auto msg =
        kvsift_test::message_of<invalid_argument>([&] { (void)load_graph(f.path, changed); });
    CHECK_THAT(msg, Contains("fingerprint") && Contains(detail::hex64(want)) &&
                        Contains(detail::hex64(got)));
  }
  SECTION("another metric") {
    const auto msg =
        kvsift_test::message_of<invalid_argument>([&] { (void)load_graph<l2>(f.path, store); });
    CHECK_THAT(msg, Contains("'inner_product'") && Contains("'l2'"));
  }
  SECTION("a version 1 file (no metric, no fingerprint) is refused, naming the version") {
    {
      std::ofstream out(f.path, std::ios::binary | std::ios::trunc);
      detail::binary_writer w(out);
      detail::write_header(w, {detail::graph_magic, 1, element_type::f32, 600, 16});
      w.write_pod(static_cast<std::uint64_t>(g.max_degree()));
      w.write_pod(static_cast<std::uint32_t>(g.entry_point()));
      w.write_array(g.adjacency().data(), g.adjacency().size());
      w.write_checksum();
    }
    const auto msg = kvsift_test::message_of<io_error>([&] { (void)load_graph(f.path, store); });
    CHECK_THAT(
        msg, Contains("version 1") && Contains("expected version 2") && Contains(f.path.string()));
  }
}

TEST_CASE("key_fingerprint hashes every row of small sets and samples large ones",
          "[index][io][rel]") {
  // 20 MiB of keys: above the 16 MiB full-hash limit, so 4096 evenly spaced rows are hashed.
  const std::size_t n = 40960, d = 128;
  std::vector<float> keys(n * d);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<float>(i % 1009);
  const view_store<float> s(matrix_view<const float>(keys.data(), n, d));
  const auto base = key_fingerprint(s);
  keys[(n - 1) * d] += 1;  // the last row is always sampled
  CHECK(key_fingerprint(s) != base);
  keys[(n - 1) * d] -= 1;
  CHECK(key_fingerprint(s) == base);
  keys[5 * d] += 1;  // row 5 lies between samples 0 and 10: a documented blind spot
  CHECK(key_fingerprint(s) == base);
  keys[5 * d] -= 1;
  // The shape is hashed too: the first rows of the same memory differ from the whole.
  CHECK(key_fingerprint(view_store<float>(matrix_view<const float>(keys.data(), 100, d))) !=
        key_fingerprint(view_store<float>(matrix_view<const float>(keys.data(), 101, d))));
  // Small sets: every row counts.
  std::vector<float> small(50 * 8, 1.0f);
  const view_store<float> ss(matrix_view<const float>(small.data(), 50, 8));
  const auto sb = key_fingerprint(ss);
  small[23 * 8 + 5] = 2.0f;
  CHECK(key_fingerprint(ss) != sb);
}
