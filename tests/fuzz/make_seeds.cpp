// Writes the seed corpora of the fuzz targets from files the library itself writes:
//   make_seeds DIR  ->  DIR/graph_load/*, DIR/vector_io/*, DIR/memory/*
// Each seed is byte 0 = the target's mode/selector byte, then the file. Generated at build/run
// time (tests/fuzz/run.sh, CI) so no binaries are committed.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kvsift/index/graph_io.hpp"
#include "kvsift/index/roargraph_builder.hpp"
#include "kvsift/io/vector_io.hpp"
#include "kvsift/testing/ood_generator.hpp"

namespace fs = std::filesystem;

namespace {

std::vector<char> slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void seed(const fs::path& dir, const std::string& name, char mode, const std::vector<char>& body) {
  fs::create_directories(dir);
  std::ofstream f(dir / name, std::ios::binary);
  f.put(mode);
  f.write(body.data(), static_cast<std::streamsize>(body.size()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  const fs::path tmp = out / "tmp";
  fs::create_directories(tmp);

  // Graphs over 8 x 4 keys (the harness's default store) and 64 x 8 keys.
  for (const auto [n, d] : {std::pair<std::size_t, std::size_t>{8, 4}, {64, 8}}) {
    const auto data = kvsift::testing::make_ood({.keys = n, .queries = 40, .dim = d, .seed = 5});
    const kvsift::view_store<float> store(data.key_view());
    kvsift::roargraph_params p;
    p.nq = 4;
    p.M = 4;
    p.L = 8;
    p.threads = 1;
    const auto g = kvsift::roargraph_builder<>(p).build(store, data.query_view());
    const fs::path f = tmp / "g.kvsgraph";
    kvsift::save_graph(g, f);
    auto bytes = slurp(f);
    const std::string tag = std::to_string(n) + "x" + std::to_string(d);
    seed(out / "graph_load", "raw_" + tag, 1, bytes);
    bytes.resize(bytes.size() - 8);  // mode 0: the harness appends the checksum
    seed(out / "graph_load", "body_" + tag, 0, bytes);

    kvsift::write_fbin(tmp / "v.fbin", data.key_view());
    seed(out / "vector_io", "fbin_" + tag, 0, slurp(tmp / "v.fbin"));
    kvsift::write_npy(tmp / "v.npy", data.key_view());
    const auto npy = slurp(tmp / "v.npy");
    seed(out / "vector_io", "npy_" + tag, 2, npy);
    // The header dictionary alone (after magic, version and the 2-byte length).
    seed(out / "vector_io", "npyhdr_" + tag, 3,
         std::vector<char>(npy.begin() + 10, npy.begin() + 10 +
                                                 (static_cast<unsigned char>(npy[8]) |
                                                  (static_cast<unsigned char>(npy[9]) << 8))));
    kvsift::id_matrix ids;
    ids.rows = n;
    ids.cols = 2;
    ids.data.resize(n * 2);
    for (std::size_t i = 0; i < ids.data.size(); ++i)
      ids.data[i] = static_cast<std::uint32_t>(i % n);
    kvsift::write_ibin(tmp / "v.ibin", ids);
    seed(out / "vector_io", "ibin_" + tag, 1, slurp(tmp / "v.ibin"));
  }
  // Memory-structure op streams: a few fixed patterns (the harness decodes any bytes).
  std::vector<char> ops;
  for (int i = 0; i < 256; ++i) ops.push_back(static_cast<char>((i * 37) ^ (i >> 2)));
  seed(out / "memory", "mixed", 0, ops);
  seed(out / "memory", "zeros", 1, std::vector<char>(64, 0));
  fs::remove_all(tmp);
  std::printf("seeds written to %s\n", out.c_str());
  return 0;
}
