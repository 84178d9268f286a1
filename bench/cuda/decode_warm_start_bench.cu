// GPU decode search on real attention data, decoding step after step: each step's search seeded
// with the previous step's results of the same (request, query head) (`decode_queries::seeds`),
// and the pool's expansion limited to its best entries (`decode_search_params::expand_limit`),
// against cold searches (the graph's entry points only) at every pool size, in one run.
//
// Data (one KV head of one layer, e.g. from bench/data/dump_qk.py): --keys (n x d), --train
// (training queries of the build), --eval F1,F2,... one file per query head of the group, each
// holding that head's queries at consecutive positions (row t = position t of the tail held out
// from training). .fbin or .npy (f32 or f16). Request r decodes rows [r * steps, (r + 1) * steps)
// of every eval file: one launch per step serves requests x heads queries over the one graph
// (built here, GPU kNN, GQA-shared: all heads' training queries). Keys are stored f16 (as a KV
// cache holds them); the oracle is the exact top-100 over the same f16 keys.
//
// Reports per setting: recall@100 against the exact top-100, vectors scored per query, and the
// mean time per launch over the steps (CUDA events around each launch; a first pass untimed).
//
// Usage: kvsift-cuda-decode_warm_start_bench --keys K --train T --eval E1[,E2...]
//            [--requests 16] [--steps 60]

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.cuh"

#pragma nv_diagnostic push
#pragma nv_diag_suppress 554
#include <kvsift/cuda/decode_search.cuh>
#include <kvsift/cuda/knn.cuh>
#include <kvsift/index/flat_index.hpp>
#include <kvsift/index/roargraph_builder.hpp>
#include <kvsift/io/vector_io.hpp>
#pragma nv_diagnostic pop

namespace {

using kvsift::id_t;
using kvsift::matrix_view;
namespace kc = kvsift::cuda;
using kvsift::cuda_bench::dev;

}  // namespace

int main(int argc, char** argv) {
  std::string keys_path, train_path, eval_paths;
  std::size_t requests = 16, steps = 60;
  using kvsift::cuda_bench::string_option;
  kvsift::cuda_bench::parse_options(
      argc, argv,
      {string_option("--keys", keys_path), string_option("--train", train_path),
       string_option("--eval", eval_paths), kvsift::cuda_bench::size_option("--requests", requests),
       kvsift::cuda_bench::size_option("--steps", steps)});
  if (keys_path.empty() || train_path.empty() || eval_paths.empty()) {
    std::fprintf(stderr,
                 "usage: %s --keys K --train T --eval E1[,E2...] [--requests R] [--steps S]\n",
                 argv[0]);
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  kvsift::cuda_bench::bench_setup setup;
  if (!kvsift::cuda_bench::start_bench(setup)) return 0;
  cudaStream_t stream = setup.stream;

  // 1. Data: keys rounded to f16 (the index, the search and the oracle see the same values).
  const auto keys32 = kvsift::read_vectors(kvsift::file_path(keys_path));
  const auto train = kvsift::read_vectors(kvsift::file_path(train_path));
  std::vector<kvsift::dense_matrix<float>> evals;
  for (const auto& e : kvsift::cuda_bench::split_list(eval_paths))
    evals.push_back(kvsift::read_vectors(kvsift::file_path(e)));
  const std::size_t n = keys32.rows(), d = keys32.cols(), H = evals.size();
  for (const auto& e : evals) {
    if (e.cols() != d || e.rows() < requests * steps) {
      std::fprintf(stderr, "an eval file has %zu x %zu rows, need >= %zu x %zu\n", e.rows(),
                   e.cols(), requests * steps, d);
      return 2;
    }
  }
  std::vector<kvsift::half> k16(n * d);
  std::vector<float> kf(n * d);
  for (std::size_t i = 0; i < n * d; ++i) {
    k16[i] = kvsift::half(keys32.data()[i]);
    kf[i] = static_cast<float>(k16[i]);
  }
  const kvsift::view_store<float> store(matrix_view<const float>(kf.data(), n, d));
  kvsift::roargraph_params bp;
  bp.threads = std::thread::hardware_concurrency();
  const auto tb = std::chrono::steady_clock::now();
  const auto index = kvsift::roargraph_builder<kvsift::inner_product, kc::knn_engine>(bp).build(
      store, train.view());
  const std::size_t width = index.max_degree();
  std::printf(
      "keys %zu x %zu, %zu training queries, %zu heads x %zu requests x %zu steps; "
      "build %.1f s, width %zu, mean degree %.1f\n",
      n, d, train.rows(), H, requests, steps, kvsift::cuda_bench::seconds_since(tb), width,
      index.degrees().mean);

  // 2. Queries in launch order: step t holds (request r, head h) at row r * H + h, position
  // r * steps + t of head h's file; the exact top-100 of each (f16 keys, f32 queries).
  const int K = 100;
  const std::size_t m = requests * H;  // queries per launch
  std::vector<float> q(steps * m * d);
  for (std::size_t t = 0; t < steps; ++t) {
    for (std::size_t r = 0; r < requests; ++r) {
      for (std::size_t h = 0; h < H; ++h) {
        std::copy_n(evals[h].view().row(r * steps + t), d, q.begin() + ((t * m) + r * H + h) * d);
      }
    }
  }
  const kvsift::flat_index<kvsift::view_store<float>> flat(store);
  const auto exact = kvsift::exact_topk(flat, matrix_view<const float>(q.data(), steps * m, d), K,
                                        std::thread::hardware_concurrency());

  // 3. Device data.
  dev<__half> dkeys(n * d);
  dev<id_t> dadj(n * width), dent(kvsift::max_entry_points);
  std::vector<id_t> ent(kvsift::max_entry_points, kvsift::invalid_id);
  std::copy(index.entry_points().begin(), index.entry_points().end(), ent.begin());
  const std::int64_t off_h[2] = {0, std::int64_t(n)};
  dev<std::int64_t> doff(2);
  KVSIFT_CUDA_CHECK(cudaMemcpy(dkeys.p, k16.data(), n * d * 2, cudaMemcpyHostToDevice));
  KVSIFT_CUDA_CHECK(
      cudaMemcpy(dadj.p, index.adjacency().data(), n * width * 4, cudaMemcpyHostToDevice));
  KVSIFT_CUDA_CHECK(cudaMemcpy(dent.p, ent.data(), ent.size() * 4, cudaMemcpyHostToDevice));
  KVSIFT_CUDA_CHECK(cudaMemcpy(doff.p, off_h, sizeof off_h, cudaMemcpyHostToDevice));
  dev<float> dq(steps * m * d);
  KVSIFT_CUDA_CHECK(cudaMemcpy(dq.p, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
  dev<std::int32_t> dgraph(m);
  KVSIFT_CUDA_CHECK(cudaMemset(dgraph.p, 0, m * 4));
  const kc::graph_set_ref set{
      dadj.p, doff.p, dent.p, 1, int(width), int(kvsift::max_entry_points), std::int64_t(n)};
  const kc::dense_keys_ref<__half> keys{dkeys.p, std::int64_t(d), int(d)};
  // Results of every step (so that step t + 1 reads step t's ids as its seeds).
  dev<id_t> dids((steps + 1) * m * K);
  dev<std::uint32_t> dcounts(m), dscored(steps * m), dstatus(1);
  KVSIFT_CUDA_CHECK(cudaMemset(dstatus.p, 0, 4));

  std::printf("\n%-6s %5s %5s %6s %11s %13s %13s\n", "start", "L", "limit", "width", "recall@100",
              "scored/query", "ms/launch");
  auto run = [&](bool warm, int L, int limit, int expand) {
    kc::decode_search_params p;
    p.k = K;
    p.L = L;
    p.expand_limit = limit;
    p.expand_width = expand;
    const std::size_t wb = kc::decode_search_workspace_size(set, std::int64_t(m), p);
    dev<char> ws(wb);
    // Row block 0 of dids stays invalid_id: the first step's seeds (nothing decoded before).
    KVSIFT_CUDA_CHECK(cudaMemset(dids.p, 0xff, m * K * 4));
    cudaEvent_t a, b;
    KVSIFT_CUDA_CHECK(cudaEventCreate(&a));
    KVSIFT_CUDA_CHECK(cudaEventCreate(&b));
    double total_ms = 0;
    for (int pass = 0; pass < 2; ++pass) {  // pass 0 warms up, pass 1 is timed
      for (std::size_t t = 0; t < steps; ++t) {
        kc::decode_queries qs{dq.p + t * m * d, std::int64_t(d), dgraph.p};
        if (warm) {
          qs.seeds = dids.p + t * m * K;
          qs.seeds_ld = K;
        }
        const kc::decode_search_outputs out{dids.p + (t + 1) * m * K, nullptr,  dcounts.p, nullptr,
                                            dscored.p + t * m,        dstatus.p};
        KVSIFT_CUDA_CHECK(cudaEventRecord(a, stream));
        kc::decode_search(set, keys, qs, std::int64_t(m), p, out, ws.p, wb, stream);
        KVSIFT_CUDA_CHECK(cudaEventRecord(b, stream));
        KVSIFT_CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        KVSIFT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        if (pass == 1) total_ms += ms;
      }
    }
    KVSIFT_CUDA_CHECK(cudaEventDestroy(a));
    KVSIFT_CUDA_CHECK(cudaEventDestroy(b));
    std::vector<id_t> got((steps + 1) * m * K);
    std::vector<std::uint32_t> scored(steps * m);
    KVSIFT_CUDA_CHECK(cudaMemcpy(got.data(), dids.p, got.size() * 4, cudaMemcpyDeviceToHost));
    KVSIFT_CUDA_CHECK(
        cudaMemcpy(scored.data(), dscored.p, scored.size() * 4, cudaMemcpyDeviceToHost));
    std::size_t hit = 0;
    double sc = 0;
    for (std::size_t i = 0; i < steps * m; ++i) {
      const auto want = exact.row_ids(i);
      std::vector<id_t> w(want.begin(), want.end());
      std::sort(w.begin(), w.end());
      for (int j = 0; j < K; ++j)
        hit += std::binary_search(w.begin(), w.end(), got[(m + i) * K + j]);
      sc += scored[i];
    }
    std::printf("%-6s %5d %5d %6d %11.4f %13.0f %13.4f\n", warm ? "warm" : "cold", L, limit, expand,
                double(hit) / double(steps * m * K), sc / double(steps * m),
                total_ms / double(steps));
  };
  for (const int expand : {1, 8, 16}) {
    for (const int L : {100, 128, 160, 200}) run(false, L, 0, expand);
    for (const int limit : {40, 60, 80}) run(false, 100, limit, expand);
    for (const int limit : {30, 40, 50, 60, 70, 80, 0}) run(true, 100, limit, expand);
  }
  std::uint32_t status = 0;
  KVSIFT_CUDA_CHECK(cudaMemcpy(&status, dstatus.p, 4, cudaMemcpyDeviceToHost));
  std::printf("status word: %u (0 = no device-side error)\n", status);
  return 0;
}
