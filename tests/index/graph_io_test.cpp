#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

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
  testing::ood_params p;
  p.keys = 600;
  p.queries = 80;
  p.dim = 16;
  const auto data = testing::make_ood(p);
  view_store<float> store(data.key_view());
  const auto g = roargraph_builder<>({.nq = 20, .M = 8, .L = 40, .threads = 1})
                     .build(store, data.query_view());
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
