#pragma once
// kvsift-bench --hdf5: an ann-benchmarks dataset file (datasets `train` = the keys, `test` = the
// queries, `neighbors` = the ground-truth ids, optionally `distances`; file attribute `distance`
// = euclidean | angular), read with the HDF5 C library when kvsift-bench was built with it
// (KVSIFT_BENCH_HDF5, CMake's find_package(HDF5 COMPONENTS C)).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvsift/core/checked_size.hpp"
#include "kvsift/kvsift.hpp"
#include "kvsift_bench/ground_truth.hpp"

#ifdef KVSIFT_BENCH_HDF5
#include <hdf5.h>
#endif

namespace kvsift_bench {

/// Whether this kvsift-bench can read --hdf5 files.
#ifdef KVSIFT_BENCH_HDF5
inline constexpr bool has_hdf5 = true;
#else
inline constexpr bool has_hdf5 = false;
#endif

/// An ann-benchmarks file: keys (train), queries (test), their ground truth (neighbors, rows =
/// queries) and the metric name as the file states it.
struct ann_dataset {
  kvsift::dense_matrix<float> train, test;
  ground_truth neighbors;
  std::string distance;
};

#ifdef KVSIFT_BENCH_HDF5
namespace detail {

/// An HDF5 id closed by its close function at scope exit (every id the reader opens, so an
/// exception on a bad file leaks nothing).
class h5_id {
 public:
  h5_id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  h5_id(const h5_id&) = delete;
  h5_id& operator=(const h5_id&) = delete;
  ~h5_id() {
    if (id_ >= 0) close_(id_);
  }
  [[nodiscard]] hid_t get() const noexcept { return id_; }
  [[nodiscard]] bool ok() const noexcept { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

/// Rows and columns of the 2-d dataset `name`, checked to be indexable (32-bit ids) and their
/// product to fit, before anything is allocated.
inline std::pair<std::size_t, std::size_t> h5_shape(hid_t ds, const std::string& what) {
  const h5_id space(H5Dget_space(ds), H5Sclose);
  kvsift::detail::require<kvsift::io_error>(space.ok(), what, ": cannot read its dataspace");
  const int rank = H5Sget_simple_extent_ndims(space.get());
  kvsift::detail::require<kvsift::dimension_mismatch>(rank == 2, what,
                                                      ": expected a 2-d dataset, got rank ", rank);
  hsize_t dims[2] = {0, 0};
  H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  kvsift::detail::require<kvsift::out_of_range>(
      dims[0] <= kvsift::max_index_size && dims[1] <= kvsift::max_index_size, what,
      ": expected at most ", kvsift::max_index_size, " rows and columns, got ", dims[0], " x ",
      dims[1]);
  const auto rows = static_cast<std::size_t>(dims[0]), cols = static_cast<std::size_t>(dims[1]);
  (void)kvsift::checked_mul(rows, cols, sizeof(double), what);
  return {rows, cols};
}

/// Reads 2-d dataset `name` converted to `mem_type` (HDF5 converts f64 / i32 / i64 on read).
template <class T>
std::vector<T> h5_read(hid_t file, const std::string& path, const char* name, hid_t mem_type,
                       std::size_t& rows, std::size_t& cols) {
  const std::string what = "--hdf5 '" + path + "': dataset '" + name + "'";
  kvsift::detail::require<kvsift::io_error>(H5Lexists(file, name, H5P_DEFAULT) > 0, what,
                                            ": missing (ann-benchmarks files have train, test "
                                            "and neighbors)");
  const h5_id ds(H5Dopen2(file, name, H5P_DEFAULT), H5Dclose);
  kvsift::detail::require<kvsift::io_error>(ds.ok(), what, ": cannot open");
  std::tie(rows, cols) = h5_shape(ds.get(), what);
  std::vector<T> out(rows * cols);
  kvsift::detail::require<kvsift::io_error>(
      out.empty() || H5Dread(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) >= 0,
      what, ": read failed (not a numeric dataset?)");
  return out;
}

/// The file's string attribute `name` (fixed-length or variable-length, as h5py writes it).
inline std::string h5_string_attribute(hid_t file, const std::string& path, const char* name) {
  const std::string what = "--hdf5 '" + path + "': attribute '" + name + "'";
  kvsift::detail::require<kvsift::io_error>(H5Aexists(file, name) > 0, what,
                                            ": missing (euclidean or angular expected)");
  const h5_id attr(H5Aopen(file, name, H5P_DEFAULT), H5Aclose);
  const h5_id type(H5Aget_type(attr.get()), H5Tclose);
  kvsift::detail::require<kvsift::io_error>(
      attr.ok() && type.ok() && H5Tget_class(type.get()) == H5T_STRING, what, ": not a string");
  if (H5Tis_variable_str(type.get()) > 0) {
    // Read in the file's character set: HDF5 refuses to convert between ASCII and UTF-8.
    const h5_id mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    char* s = nullptr;
    kvsift::detail::require<kvsift::io_error>(H5Aread(attr.get(), mem.get(), &s) >= 0 && s, what,
                                              ": read failed");
    std::string out(s);
    H5free_memory(s);
    return out;
  }
  std::string out(H5Tget_size(type.get()), '\0');
  kvsift::detail::require<kvsift::io_error>(H5Aread(attr.get(), type.get(), out.data()) >= 0, what,
                                            ": read failed");
  return out.substr(0, out.find('\0'));
}

}  // namespace detail
#endif

/// Reads an ann-benchmarks file. Checks: train and test of the same dimension, neighbors with
/// one row per test query, ids < train rows, distances (if present) of neighbors' shape.
/// O(file size). Thread safety: not safe concurrently (the HDF5 library is built serial).
/// @throw io_error (missing file / dataset / attribute, or built without HDF5),
///        dimension_mismatch, out_of_range.
inline ann_dataset read_ann_hdf5(const std::string& path) {
#ifdef KVSIFT_BENCH_HDF5
  using detail::h5_id;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // our messages, not HDF5's stack dump
  const std::string what = "--hdf5 '" + path + "'";
  const h5_id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  kvsift::detail::require<kvsift::io_error>(file.ok(), what,
                                            ": cannot open (missing, or not an HDF5 file)");
  ann_dataset d;
  d.distance = detail::h5_string_attribute(file.get(), path, "distance");
  std::size_t rows = 0, cols = 0, qrows = 0, qcols = 0;
  auto keys = detail::h5_read<float>(file.get(), path, "train", H5T_NATIVE_FLOAT, rows, cols);
  auto queries = detail::h5_read<float>(file.get(), path, "test", H5T_NATIVE_FLOAT, qrows, qcols);
  kvsift::detail::require<kvsift::dimension_mismatch>(
      cols == qcols, what, ": expected test of dimension ", cols, " (as train), got ", qcols);
  d.train = kvsift::dense_matrix<float>(rows, cols, std::move(keys));
  d.test = kvsift::dense_matrix<float>(qrows, qcols, std::move(queries));
  std::size_t nrows = 0, ncols = 0;
  const auto ids =
      detail::h5_read<std::int64_t>(file.get(), path, "neighbors", H5T_NATIVE_INT64, nrows, ncols);
  kvsift::detail::require<kvsift::dimension_mismatch>(nrows == qrows, what,
                                                      ": expected neighbors of ", qrows,
                                                      " rows (one per test query), got ", nrows);
  d.neighbors.rows = nrows;
  d.neighbors.cols = ncols;
  d.neighbors.ids.resize(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    kvsift::detail::require<kvsift::out_of_range>(
        ids[i] >= 0 && static_cast<std::uint64_t>(ids[i]) < rows, what,
        ": neighbors: expected ids in [0, ", rows, ") (the train rows), got ", ids[i], " at entry ",
        i);
    d.neighbors.ids[i] = static_cast<std::uint32_t>(ids[i]);
  }
  if (H5Lexists(file.get(), "distances", H5P_DEFAULT) > 0) {
    std::size_t drows = 0, dcols = 0;
    d.neighbors.distances =
        detail::h5_read<float>(file.get(), path, "distances", H5T_NATIVE_FLOAT, drows, dcols);
    kvsift::detail::require<kvsift::dimension_mismatch>(
        drows == nrows && dcols == ncols, what, ": expected distances of ", nrows, " x ", ncols,
        " (as neighbors), got ", drows, " x ", dcols);
  }
  return d;
#else
  throw kvsift::io_error("--hdf5 '" + path +
                         "': this kvsift-bench was built without HDF5 (install libhdf5-dev and "
                         "re-run CMake)");
#endif
}

}  // namespace kvsift_bench
