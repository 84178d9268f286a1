#pragma once
// Saving and loading graph indexes. The file holds the graph only (the vectors stay with the
// engine): header (magic "KVSGRAPH", version, element type, n, dim), max degree, entry point,
// the padded n x max_degree adjacency, and a trailing checksum. Loading checks every field
// against the store it is attached to, so an index saved for other keys is rejected.

#include <cstdint>
#include <filesystem>
#include <vector>

#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/index/detail/binary_io.hpp"
#include "kvsift/index/graph_index.hpp"

namespace kvsift {

namespace detail {
inline constexpr auto graph_magic = make_magic("KVSGRAPH");
inline constexpr std::uint32_t graph_version = 1;
}  // namespace detail

/// Writes `g` to `path` atomically (a failed write leaves no partial file). O(n * max_degree).
/// Thread safety: reads g only; safe concurrently with other const use of g.
/// @throw io_error if the file cannot be written.
template <VectorStore Store, Metric M>
void save_graph(const graph_index<Store, M>& g, const std::filesystem::path& path) {
  detail::atomic_write(path, [&](std::ostream& out) {
    detail::binary_writer w(out);
    detail::write_header(w, {detail::graph_magic, detail::graph_version,
                             element_type_of<typename Store::value_type>(), g.size(), g.dim()});
    w.write_pod(static_cast<std::uint64_t>(g.max_degree()));
    w.write_pod(static_cast<std::uint32_t>(g.entry_point()));
    w.write_array(g.adjacency().data(), g.adjacency().size());
    w.write_checksum();
  });
}

/// Reads a graph saved by save_graph and attaches it to `store`. O(n * max_degree).
/// @throw io_error for a missing, truncated or corrupted file (bad magic, version, checksum,
///        trailing bytes); invalid_argument (dimension_mismatch / out_of_range) if the file's
///        element type, size or dimension differ from the store's, or its adjacency is invalid.
template <Metric M = inner_product, VectorStore Store>
graph_index<Store, M> load_graph(const std::filesystem::path& path, Store store) {
  auto file = detail::open_input_file(path);
  detail::binary_reader r(file.stream, file.size);
  const auto h = detail::read_header(r, detail::graph_magic, detail::graph_version);
  const auto max_degree = r.read_pod<std::uint64_t>("max degree");
  const auto entry = r.read_pod<std::uint32_t>("entry point");
  detail::require<io_error>(max_degree > 0 && max_degree < (1u << 20),
                            "corrupted graph file: max degree ", max_degree);
  detail::require<io_error>(h.rows == 0 || max_degree <= r.remaining() / h.rows / sizeof(id_t),
                            "truncated adjacency: expected ", h.rows, " x ", max_degree, " ids, ",
                            r.remaining(), " bytes remain");
  auto adjacency = r.read_vector<id_t>(static_cast<std::size_t>(h.rows * max_degree), "adjacency");
  r.verify_checksum();
  r.require_end("graph file");
  const auto expected = element_type_of<typename Store::value_type>();
  detail::require(h.type == expected, "load_graph: file built over ", to_string(h.type),
                  " vectors, store holds ", to_string(expected));
  detail::require<dimension_mismatch>(h.rows == store.size() && h.dims == store.dim(),
                                      "load_graph: file is for ", h.rows, " x ", h.dims,
                                      " vectors, store holds ", store.size(), " x ", store.dim());
  return graph_index<Store, M>(std::move(store), static_cast<std::size_t>(max_degree),
                               std::move(adjacency), entry);
}

}  // namespace kvsift
