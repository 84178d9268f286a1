#pragma once
// kvsift-bench's given ground truth: a big-ann .ibin file (--gt) or an ann-benchmarks HDF5
// file's `neighbors` (--hdf5), used instead of recomputing the exact answers. Both only list the
// best K ids per query, so they serve top-k recall for k <= K, not DIPR (which needs every
// key's score) and not a --filter-prefix (the file's answers are unfiltered).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/kvsift.hpp"

namespace kvsift_bench {

/// The best `cols` ids of `rows` queries, best first, and their distances when the file has them.
struct ground_truth {
  std::vector<std::uint32_t> ids;  ///< rows x cols
  std::vector<float> distances;    ///< rows x cols, or empty
  std::size_t rows = 0, cols = 0;
};

/// Throws dimension_mismatch naming `what` unless `rows` = `want_rows` (the evaluation queries)
/// and `cols` >= `want_cols` (the largest --k): recall at k needs k true neighbours per query.
inline void require_gt_shape(const std::string& what, std::size_t rows, std::size_t cols,
                             std::size_t want_rows, std::size_t want_cols) {
  kvsift::detail::require<kvsift::dimension_mismatch>(
      rows == want_rows && cols >= want_cols, what, ": expected ", want_rows,
      " rows (evaluation queries) x at least ", want_cols, " columns (max --k), got ", rows, " x ",
      cols);
}

/// Throws out_of_range naming `what` unless every id is < `keys` (an id past the keys would
/// count as a miss forever, or index past the end of a key list).
inline void require_gt_ids(const std::string& what, const std::vector<std::uint32_t>& ids,
                           std::size_t keys) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    kvsift::detail::require<kvsift::out_of_range>(ids[i] < keys, what, ": expected ids < ", keys,
                                                  " (the keys), got ", ids[i], " at entry ", i);
  }
}

/// Reads --gt: big-ann ground truth, uint32 m, uint32 K, m*K uint32 ids, then optionally m*K f32
/// distances (the layout --save-gt writes; an ids-only .ibin is accepted too). The shape is
/// checked against the run (`want_rows` evaluation queries, `want_cols` = max k) from the
/// header, before anything sized by it is allocated. O(file size).
/// @throw io_error (missing, short or wrongly sized file), dimension_mismatch (shape),
///        out_of_range (an id >= `keys`).
inline ground_truth read_big_ann_gt(const std::string& path, std::size_t want_rows,
                                    std::size_t want_cols, std::size_t keys) {
  const std::string what = "--gt '" + path + "'";
  std::ifstream f(path, std::ios::binary);
  if (!f) throw kvsift::io_error(what + ": cannot open");
  std::uint32_t hdr[2] = {0, 0};
  if (!f.read(reinterpret_cast<char*>(hdr), sizeof hdr)) {
    throw kvsift::io_error(what + ": shorter than its 8-byte header");
  }
  ground_truth gt;
  gt.rows = hdr[0];
  gt.cols = hdr[1];
  require_gt_shape(what, gt.rows, gt.cols, want_rows, want_cols);
  const std::size_t count = kvsift::checked_mul(gt.rows, gt.cols, "--gt entries");
  const std::size_t ids_bytes = kvsift::checked_mul(count, 4, "--gt bytes");
  const std::size_t size = std::filesystem::file_size(path);
  const bool with_distances = size == 8 + 2 * ids_bytes;
  kvsift::detail::require<kvsift::io_error>(size == 8 + ids_bytes || with_distances, what,
                                            ": expected ", 8 + ids_bytes, " bytes (ids) or ",
                                            8 + 2 * ids_bytes, " bytes (ids and distances) for ",
                                            gt.rows, " x ", gt.cols, ", got ", size, " bytes");
  gt.ids.resize(count);
  f.read(reinterpret_cast<char*>(gt.ids.data()), static_cast<std::streamsize>(ids_bytes));
  if (with_distances) {
    gt.distances.resize(count);
    f.read(reinterpret_cast<char*>(gt.distances.data()), static_cast<std::streamsize>(ids_bytes));
  }
  if (!f) throw kvsift::io_error(what + ": read failed");
  require_gt_ids(what, gt.ids, keys);
  return gt;
}

/// The exact-answer lists of the evaluation queries from a given ground truth, rows
/// [first, first + count): ids best first, key = -distance (or 0 when the file has none; only
/// the ids count for top-k recall).
inline std::vector<std::vector<kvsift::scored_id>> exact_from_gt(const ground_truth& gt,
                                                                 std::size_t first,
                                                                 std::size_t count) {
  std::vector<std::vector<kvsift::scored_id>> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    auto& r = out[i];
    r.reserve(gt.cols);
    for (std::size_t j = 0; j < gt.cols; ++j) {
      const std::size_t at = (first + i) * gt.cols + j;
      r.push_back(
          {gt.distances.empty() ? 0.0f : -gt.distances[at], static_cast<kvsift::id_t>(gt.ids[at])});
    }
  }
  return out;
}

}  // namespace kvsift_bench
