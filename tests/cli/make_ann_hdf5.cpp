// Writes a small ann-benchmarks-layout HDF5 file for kvsift-bench's --hdf5 tests, with the HDF5
// C API (no committed binary, no h5py): `make_ann_hdf5 OUT DISTANCE NCOLS [FLAG...]`.
//   train     2000 x 16 f32 keys, their norms spread over [0.5, 2] (so angular ranks differently
//             from the raw inner product: a reader that forgets to normalise loses recall)
//   test      50 x 16 f32 queries
//   neighbors 50 x NCOLS i32, the exact best ids by DISTANCE (euclidean: smallest L2; angular:
//             largest cosine; anything else: euclidean ids, for the unsupported-metric test)
//   distances 50 x NCOLS f32
//   attribute distance = DISTANCE, fixed-length string, or variable-length (as h5py writes it)
//             with `vlen`.
// Flags that break the file for the error tests: `bad-id` (neighbors[0][0] = 2000, past the
// keys), `bad-dim` (test of dimension 15), `no-attr` (no distance attribute), `no-neighbors`,
// `bad-distances` (distances one column short of neighbors).
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr std::size_t n = 2000, nq = 50, dim = 16;

void write_dataset(hid_t file, const char* name, hid_t file_type, hid_t mem_type, std::size_t rows,
                   std::size_t cols, const void* data) {
  const hsize_t dims[2] = {rows, cols};
  const hid_t space = H5Screate_simple(2, dims, nullptr);
  const hid_t ds = H5Dcreate2(file, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (ds < 0 || H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
    std::fprintf(stderr, "make_ann_hdf5: cannot write %s\n", name);
    std::exit(1);
  }
  H5Dclose(ds);
  H5Sclose(space);
}

void write_distance(hid_t file, const std::string& distance, bool vlen) {
  const hid_t type = H5Tcopy(H5T_C_S1);
  const hid_t space = H5Screate(H5S_SCALAR);
  if (vlen) {
    H5Tset_size(type, H5T_VARIABLE);
    H5Tset_cset(type, H5T_CSET_UTF8);
  } else {
    H5Tset_size(type, distance.size());
  }
  const hid_t attr = H5Acreate2(file, "distance", type, space, H5P_DEFAULT, H5P_DEFAULT);
  const char* s = distance.c_str();
  const herr_t r = vlen ? H5Awrite(attr, type, &s) : H5Awrite(attr, type, s);
  if (attr < 0 || r < 0) {
    std::fprintf(stderr, "make_ann_hdf5: cannot write the distance attribute\n");
    std::exit(1);
  }
  H5Aclose(attr);
  H5Sclose(space);
  H5Tclose(type);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: make_ann_hdf5 OUT DISTANCE NCOLS [vlen]\n");
    return 2;
  }
  const std::string out = argv[1], distance = argv[2];
  const auto ncols = static_cast<std::size_t>(std::atoi(argv[3]));
  auto flag = [&](const char* f) {
    for (int i = 4; i < argc; ++i)
      if (std::string(argv[i]) == f) return true;
    return false;
  };
  const bool vlen = flag("vlen");
  if (ncols == 0 || ncols > n) return 2;

  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> norm(0.5f, 2.0f);
  std::vector<float> keys(n * dim), queries(nq * dim);
  for (std::size_t i = 0; i < n; ++i) {
    double s = 0;
    for (std::size_t j = 0; j < dim; ++j) s += std::pow(keys[i * dim + j] = normal(rng), 2);
    const auto scale = static_cast<float>(norm(rng) / std::sqrt(s));
    for (std::size_t j = 0; j < dim; ++j) keys[i * dim + j] *= scale;
  }
  for (auto& x : queries) x = normal(rng);

  // Exact neighbours: distance per key, ascending, ties by lower id.
  std::vector<int> ids(nq * ncols);
  std::vector<float> dists(nq * ncols);
  for (std::size_t q = 0; q < nq; ++q) {
    const float* qv = &queries[q * dim];
    double qn = 0;
    for (std::size_t j = 0; j < dim; ++j) qn += double{qv[j]} * qv[j];
    std::vector<double> d(n);
    for (std::size_t i = 0; i < n; ++i) {
      const float* kv = &keys[i * dim];
      double l2 = 0, dot = 0, kn = 0;
      for (std::size_t j = 0; j < dim; ++j) {
        l2 += std::pow(double{qv[j]} - kv[j], 2);
        dot += double{qv[j]} * kv[j];
        kn += double{kv[j]} * kv[j];
      }
      d[i] = distance == "angular" ? 1.0 - dot / std::sqrt(qn * kn) : std::sqrt(l2);
    }
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return d[a] < d[b]; });
    for (std::size_t c = 0; c < ncols; ++c) {
      ids[q * ncols + c] = order[c];
      dists[q * ncols + c] = static_cast<float>(d[order[c]]);
    }
  }

  const hid_t file = H5Fcreate(out.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file < 0) {
    std::fprintf(stderr, "make_ann_hdf5: cannot create %s\n", out.c_str());
    return 1;
  }
  if (!flag("no-attr")) write_distance(file, distance, vlen);
  if (flag("bad-id")) ids[0] = static_cast<int>(n);
  write_dataset(file, "train", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, n, dim, keys.data());
  // bad-dim: the first nq * 15 values as a 50 x 15 matrix.
  write_dataset(file, "test", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, nq, flag("bad-dim") ? dim - 1 : dim,
                queries.data());
  if (!flag("no-neighbors")) {
    write_dataset(file, "neighbors", H5T_STD_I32LE, H5T_NATIVE_INT, nq, ncols, ids.data());
  }
  write_dataset(file, "distances", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, nq,
                flag("bad-distances") ? ncols - 1 : ncols, dists.data());
  H5Fclose(file);
  return 0;
}
