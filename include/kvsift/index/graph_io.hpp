#pragma once
// Saving and loading graph indexes. The file holds the graph only (the vectors stay with the
// engine): header (magic "KVSGRAPH", version 2, element type, n, dim), the metric's name
// (16 bytes, zero-padded), a 64-bit fingerprint of the keys, max degree, the entry points
// (count, then ids), the padded n x max_degree adjacency, and a trailing checksum. The same
// bytes go to a file (save_graph / load_graph) or any binary stream (write_graph /
// read_graph). Loading checks every field against
// the store it is attached to, so an index saved for other keys or another metric is rejected.

#include <array>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"
#include "kvsift/core/metric.hpp"
#include "kvsift/core/vector_store.hpp"
#include "kvsift/index/graph_index.hpp"
#include "kvsift/io/detail/binary_io.hpp"
#include "kvsift/io/file_path.hpp"

namespace kvsift {

namespace detail {
inline constexpr auto graph_magic = make_magic("KVSGRAPH");
/// Version 2 added the metric and the key fingerprint; version 1 files are refused (they
/// cannot be checked against the keys, which is the failure this version exists to prevent).
inline constexpr std::uint32_t graph_version = 2;
inline constexpr std::size_t metric_name_bytes = 16;
/// Keys hashed in full up to this many bytes; larger key sets are sampled.
inline constexpr std::uint64_t fingerprint_full_bytes = std::uint64_t{16} << 20;
inline constexpr std::size_t fingerprint_sample_rows = 4096;

template <Metric M>
constexpr std::array<char, metric_name_bytes> metric_tag() {
  static_assert(M::name.size() <= metric_name_bytes, "metric name too long for the graph file");
  std::array<char, metric_name_bytes> t{};
  for (std::size_t i = 0; i < M::name.size(); ++i) t[i] = M::name[i];
  return t;
}

inline std::string tag_string(const std::array<char, metric_name_bytes>& t) {
  std::size_t len = 0;
  while (len < t.size() && t[len] != '\0') ++len;
  return printable_bytes({t.data(), len});
}

inline std::string hex64(std::uint64_t x) { return concat("0x", hex{x}); }
}  // namespace detail

/// A 64-bit fingerprint of the vectors of `store`: FNV-1a over n, d, the element type and the
/// bytes of the rows (padding excluded). Every row is hashed when the keys take at most 16 MiB;
/// beyond that, 4096 evenly spaced rows (first and last included), so the cost stays O(d)
/// per sampled row however long the context: it tells apart key sets of the same shape (other
/// heads, layers or requests), which is what load_graph needs, without the cost of hashing
/// gigabytes at every load. It is not an integrity check of every element.
/// Complexity: O(min(n, 4096) * d) for large sets, O(n * d) below 16 MiB. Thread safety:
/// reads the store only.
template <VectorStore Store>
[[nodiscard]] std::uint64_t key_fingerprint(const Store& store) {
  using T = typename Store::value_type;
  const std::uint64_t n = store.size(), d = store.dim();
  detail::fnv1a64 h;
  h.update(&n, sizeof(n));
  h.update(&d, sizeof(d));
  const auto type = static_cast<std::uint32_t>(element_type_of<T>());
  h.update(&type, sizeof(type));
  if (n == 0 || d == 0) return h.value();
  const std::size_t row_bytes = static_cast<std::size_t>(d) * sizeof(T);
  const bool full = n <= detail::fingerprint_full_bytes / row_bytes;
  const std::size_t rows = full ? static_cast<std::size_t>(n) : detail::fingerprint_sample_rows;
  for (std::size_t j = 0; j < rows; ++j) {
    // Evenly spaced, first and last included; j * (n - 1) < 2^12 * 2^32 cannot overflow.
    const std::size_t i =
        full ? j : static_cast<std::size_t>(j * (n - 1) / (detail::fingerprint_sample_rows - 1));
    h.update(store.row(i), row_bytes);
  }
  return h.value();
}

/// Writes `g` in the graph file format (see the top of this header) to `out`, a binary stream:
/// the same bytes save_graph puts in a file, for callers that keep the graph in memory (a
/// pickle, a network message). The format records the metric M and key_fingerprint(g.store()),
/// which read_graph checks. O(n * max_degree) plus the fingerprint. Thread safety: reads g only;
/// safe concurrently with other const use of g.
/// @throw io_error if the stream fails.
template <VectorStore Store, Metric M>
void write_graph(const graph_index<Store, M>& g, std::ostream& out) {
  const std::uint64_t fingerprint = key_fingerprint(g.store());
  detail::binary_writer w(out);
  detail::write_header(w, {detail::graph_magic, detail::graph_version,
                           element_type_of<typename Store::value_type>(), g.size(), g.dim()});
  w.write_pod(detail::metric_tag<M>());
  w.write_pod(fingerprint);
  w.write_pod(static_cast<std::uint64_t>(g.max_degree()));
  w.write_pod(static_cast<std::uint32_t>(g.entry_points().size()));
  w.write_array(g.entry_points().data(), g.entry_points().size());
  w.write_array(g.adjacency().data(), g.adjacency().size());
  w.write_checksum();
}

/// Writes `g` to `path` atomically (a failed write leaves no partial file), as write_graph.
/// O(n * max_degree) plus the fingerprint. Thread safety: reads g only; safe concurrently with
/// other const use of g.
/// @throw io_error if the file cannot be written.
template <VectorStore Store, Metric M>
void save_graph(const graph_index<Store, M>& g, const file_path& path) {
  detail::atomic_write(path, [&](std::ostream& out) { write_graph(g, out); });
}

/// Reads a graph written by write_graph (or save_graph) from `in`, which must hold exactly
/// `size` bytes from its current position, and attaches it to `store`, with every check of
/// load_graph. `source` names the data in error messages (load_graph passes the quoted path).
/// O(n * max_degree) plus the fingerprint. Thread safety: reads `in`, which no other thread may
/// use meanwhile.
/// @throw as load_graph (io_error for truncated, corrupted or trailing bytes; invalid_argument
///        for a graph of other keys, shape, element type or metric).
template <Metric M = inner_product, VectorStore Store>
graph_index<Store, M> read_graph(std::istream& in, std::uint64_t size, Store store,
                                 std::string_view source = "graph data") {
  detail::binary_reader r(in, size);
  const auto h = detail::read_header(r, detail::graph_magic, detail::graph_version);
  detail::require<io_error>(h.version >= 2, source, ": graph file version ", h.version,
                            " records no metric or key fingerprint, expected version ",
                            detail::graph_version, "; rebuild the index and save it again");
  const auto metric = r.read_pod<std::array<char, detail::metric_name_bytes>>("metric");
  const auto fingerprint = r.read_pod<std::uint64_t>("key fingerprint");
  const auto max_degree = r.read_pod<std::uint64_t>("max degree");
  const auto entry_count = r.read_pod<std::uint32_t>("entry point count");
  detail::require<io_error>(entry_count <= max_entry_points, "corrupted graph file: ", entry_count,
                            " entry points, at most ", max_entry_points);
  auto entries = r.read_vector<id_t>(entry_count, "entry points");
  detail::require<io_error>(max_degree > 0 && max_degree <= max_graph_degree,
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
  detail::require(metric == detail::metric_tag<M>(), "load_graph: file built with metric '",
                  detail::tag_string(metric), "', loading as '", M::name, "'");
  const std::uint64_t actual = key_fingerprint(store);
  detail::require(fingerprint == actual, "load_graph: file built over keys with fingerprint ",
                  detail::hex64(fingerprint), ", the store's keys have fingerprint ",
                  detail::hex64(actual), " (same shape, other keys)");
  return graph_index<Store, M>(std::move(store), static_cast<std::size_t>(max_degree),
                               std::move(adjacency), std::move(entries));
}

/// Reads a graph saved by save_graph and attaches it to `store`, checking that the file was
/// built with metric M over these very keys (same fingerprint), not merely keys of the same
/// shape. O(n * max_degree) plus the fingerprint (see key_fingerprint).
/// Format versions: 2 (current). Version 1 files (no metric, no fingerprint) are refused with
/// an io_error asking for a rebuild, since nothing in them can show they fit the keys.
/// @throw io_error for a missing, truncated or corrupted file (bad magic, version, checksum,
///        trailing bytes) or a version 1 file; invalid_argument (dimension_mismatch /
///        out_of_range) if the file's element type, size or dimension differ from the store's,
///        its metric is not M or its key fingerprint differs from the store's (both values
///        named), or its adjacency is invalid.
template <Metric M = inner_product, VectorStore Store>
graph_index<Store, M> load_graph(const file_path& path, Store store) {
  auto file = detail::open_input_file(path);
  return read_graph<M>(file.stream, file.size, std::move(store),
                       detail::concat("'", path.string(), "'"));
}

}  // namespace kvsift
