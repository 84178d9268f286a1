// Fuzz target (a): kvsift::load_graph from arbitrary bytes, then beam / filtered / DIPR searches
// over whatever loads. A loaded graph must be safe to search: every neighbour id in range, the
// entry point valid (the loader's promise), so ASan must stay silent during the searches.
//
// Input: byte 0 selects the mode; the rest is a graph file. Mode bit 0 clear: the harness
// appends the file's FNV-1a checksum, so mutations get past the checksum and reach the header,
// degree and adjacency checks (otherwise nearly every input stops at "checksum mismatch").
// The store is sized from the header's rows/dims when small, so loads can succeed.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "fuzz_support.hpp"
#include "kvsift/core/vector_store.hpp"
#include "kvsift/index/graph_io.hpp"
#include "kvsift/io/detail/binary_io.hpp"
#include "kvsift/search/beam_search.hpp"
#include "kvsift/search/dipr_search.hpp"
#include "kvsift/search/predicate.hpp"

namespace {

template <class T>
T read_at(const std::uint8_t* p, std::size_t size, std::size_t off, T fallback) {
  if (off + sizeof(T) > size) return fallback;
  T v;
  std::memcpy(&v, p + off, sizeof(T));
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const bool raw = (data[0] & 1) != 0;
  const std::uint8_t* body = data + 1;
  const std::size_t body_size = size - 1;

  std::vector<std::uint8_t> file(body, body + body_size);
  if (!raw) {
    kvsift::detail::fnv1a64 sum;
    sum.update(file.data(), file.size());
    const std::uint64_t v = sum.value();
    const auto* b = reinterpret_cast<const std::uint8_t*>(&v);
    file.insert(file.end(), b, b + sizeof(v));
  }
  const auto path = kvsift_fuzz::scratch(".kvsgraph");
  kvsift_fuzz::write_file(path, file.data(), file.size());

  // Header: magic[8] version u32 type u32 rows u64 dims u64 (binary_io.hpp).
  auto rows = read_at<std::uint64_t>(body, body_size, 16, 8);
  auto dims = read_at<std::uint64_t>(body, body_size, 24, 4);
  if (rows == 0 || rows > 4096 || dims == 0 || dims > 16) rows = 8, dims = 4;
  std::vector<float> keys(rows * dims);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    keys[i] = static_cast<float>(static_cast<int>((i * 2654435761u) % 17) - 8);
  }
  using store_t = kvsift::view_store<float>;
  const store_t store(kvsift::matrix_view<const float>(keys.data(), rows, dims));

  kvsift_fuzz::expect_kvsift_errors_only([&] {
    const auto g = kvsift::load_graph<kvsift::inner_product>(path, store);
    std::vector<float> q(dims);
    for (std::size_t j = 0; j < dims; ++j) q[j] = static_cast<float>(j % 3) - 1.0f;
    kvsift::search_workspace ws;
    const std::size_t k = std::min<std::size_t>(5, rows);
    std::vector<kvsift::id_t> ids(k);
    std::vector<float> sc(k);
    (void)kvsift::beam_search(g, q, {k, 16}, ws, ids, sc);
    for (auto id : ids) {
      if (id != kvsift::invalid_id && id >= rows) std::abort();  // out-of-range result
    }
    (void)kvsift::beam_search(g, q, {k, 16}, ws, ids, sc, kvsift::id_below{rows / 2});
    kvsift::dipr_result r;
    kvsift::dipr_search(g, q, {.beta = 3.0f, .l0 = 8}, ws, r);
    for (auto id : r.ids) {
      if (id >= rows) std::abort();
    }
  });
  return 0;
}
