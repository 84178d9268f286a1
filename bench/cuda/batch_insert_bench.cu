// The GPU batched insert (`kvsift::cuda::batch_insert`) on a real dump, next to the CPU
// insert (`insertable_graph`, one thread) and a full rebuild, in one run.
//
// Data: one KV head of one layer with positional queries (row t = the query at position t, as
// bench/data/dump_qk.py writes them): --keys K (n x d), --queries Q (n x d). The index is built
// on the first (1 - F) of the keys from the queries of those positions; the remaining keys are
// inserted one by one in order (one launch per key on the GPU, as a decode step inserts each
// generated token's key). The rebuild uses every key and the queries of the first 95% of the
// positions; the evaluation queries are the last 5%, scored against the exact top-100 over all
// keys. Keys and queries are f32 on both sides, so the GPU and the CPU apply the same rule to
// the same values and differ only in the summation order of the distances.
//
// The GPU state holds `G` copies of the graph (one launch inserts the key into every copy), for
// each G of --graphs: the time per launch is what a decode step with G (request, KV head)
// graphs pays; the time per launch / G is the amortised time per key. Recall is measured on
// copy 0 of the first G.
//
// Usage: kvsift-cuda-batch_insert_bench --keys K --queries Q [--fraction 0.2]
//            [--graphs 1,8,64] [--expand-widths 1,8] [--holders 128] [--candidates 512] [--threads
//            16]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.cuh"

#pragma nv_diagnostic push
#pragma nv_diag_suppress 554
#include <kvsift/cuda/batch_insert.cuh>
#include <kvsift/index/flat_index.hpp>
#include <kvsift/index/insertable_graph.hpp>
#include <kvsift/index/roargraph_builder.hpp>
#include <kvsift/io/vector_io.hpp>
#include <kvsift/search/beam_search.hpp>
#pragma nv_diagnostic pop

namespace {

using kvsift::id_t;
using kvsift::matrix_view;
namespace kc = kvsift::cuda;
using kvsift::cuda_bench::dev;

constexpr std::size_t K = 100;

template <class T>
void upload(T* dst, const std::vector<T>& src) {
  KVSIFT_CUDA_CHECK(cudaMemcpy(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice));
}

/// recall@100 of `g` over the evaluation queries at pool L (one thread).
template <class G>
double recall(const G& g, matrix_view<const float> q, const kvsift::knn_result& exact,
              std::size_t L) {
  kvsift::search_workspace ws;
  std::vector<id_t> ids(K);
  std::vector<float> sc(K);
  std::size_t hit = 0;
  for (std::size_t i = 0; i < q.rows(); ++i) {
    (void)kvsift::beam_search(g, std::span<const float>(q.row(i), q.cols()), {K, L}, ws,
                              std::span<id_t>(ids), std::span<float>(sc));
    const auto want = exact.row_ids(i);
    for (const id_t id : ids) hit += std::find(want.begin(), want.end(), id) != want.end() ? 1 : 0;
  }
  return static_cast<double>(hit) / static_cast<double>(q.rows() * K);
}

}  // namespace

int main(int argc, char** argv) {
  std::string keys_path, queries_path, graphs_list = "1,8,64", widths_list = "1";
  double fraction = 0.2;
  std::size_t holders = 128, candidates = 512, threads = 16;
  using namespace kvsift::cuda_bench;
  parse_options(argc, argv,
                {string_option("--keys", keys_path), string_option("--queries", queries_path),
                 double_option("--fraction", fraction), string_option("--graphs", graphs_list),
                 string_option("--expand-widths", widths_list), size_option("--holders", holders),
                 size_option("--candidates", candidates), size_option("--threads", threads)});
  if (keys_path.empty() || queries_path.empty() || !(fraction > 0 && fraction < 0.5)) {
    std::fprintf(stderr,
                 "usage: %s --keys K --queries Q [--fraction F in (0, 0.5)] [--graphs 1,8,64] "
                 "[--expand-widths 1,8] [--holders H] [--candidates C] [--threads T]\n",
                 argv[0]);
    return 2;
  }
  const auto numbers = [](const std::string& list) {
    std::vector<std::size_t> out;
    const std::vector<std::string> items = split_list(list);
    for (std::size_t i = 0; i < items.size(); ++i) {
      // A trailing comma (or an empty list) ends the list; an empty item inside it is an error.
      if (!(items[i].empty() && i + 1 == items.size())) out.push_back(std::stoul(items[i]));
    }
    return out;
  };
  const std::vector<std::size_t> graph_counts = numbers(graphs_list), widths = numbers(widths_list);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bench_setup setup;
  if (!start_bench(setup)) return 0;
  cudaStream_t stream = setup.stream;

  const auto keys = kvsift::read_vectors(kvsift::file_path(keys_path));
  const auto queries = kvsift::read_vectors(kvsift::file_path(queries_path));
  const std::size_t n = keys.rows(), d = keys.cols();
  const auto base = static_cast<std::size_t>((1.0 - fraction) * static_cast<double>(n));
  const auto train_n = static_cast<std::size_t>(0.95 * static_cast<double>(n));
  if (queries.rows() < n || queries.cols() != d) {
    std::fprintf(stderr, "expected >= %zu positional queries of dim %zu, got %zu x %zu\n", n, d,
                 queries.rows(), queries.cols());
    return 2;
  }
  const matrix_view<const float> all = keys.cview();
  const matrix_view<const float> eval = queries.cview().row_range(train_n, n - train_n);
  std::printf("data: %zu keys x %zu, built on %zu, inserting %zu; %zu evaluation queries\n", n, d,
              base, n - base, eval.rows());

  const kvsift::flat_index<kvsift::view_store<float>> flat{kvsift::view_store<float>(all)};
  const auto exact = kvsift::exact_topk(flat, eval, K, threads);
  kvsift::roargraph_params bp;
  bp.threads = threads;
  const kvsift::roargraph_builder<> builder(bp);

  auto t0 = std::chrono::steady_clock::now();
  const auto rebuild =
      builder.build(kvsift::view_store<float>(all), queries.cview().row_range(0, train_n));
  const double rebuild_s = seconds_since(t0);
  const matrix_view<const float> prefix = all.row_range(0, base);
  const matrix_view<const float> train = queries.cview().row_range(0, base);
  const auto knn = builder.training_knn(prefix, train);
  const auto built = builder.build_from_knn(kvsift::view_store<float>(prefix), knn);
  const std::size_t R = built.max_degree(), m = train.rows();

  // CPU: one thread, one key at a time.
  kvsift::graph_insert_params ip;
  ip.query_candidates = candidates;
  ip.holder_capacity = holders;
  kvsift::insertable_graph<float> cpu(built, train, knn, ip);
  std::vector<double> us;
  for (std::size_t i = base; i < n; ++i) {
    t0 = std::chrono::steady_clock::now();
    cpu.insert(all.row_range(i, 1));
    us.push_back(seconds_since(t0) * 1e6);
  }
  double cpu_mean = 0;
  for (const double u : us) cpu_mean += u / static_cast<double>(us.size());
  std::sort(us.begin(), us.end());
  const double cpu_p50 = us[us.size() / 2];

  // GPU: G copies of the prefix's graph and insert state.
  const kc::insert_lists lists =
      kc::make_insert_lists(knn.ids, knn.scores, m, knn.k, n, static_cast<int>(holders));
  kc::batch_insert_params gp;
  gp.query_candidates = static_cast<int>(candidates);
  std::printf("\n%6s %8s %14s %16s %12s\n", "width", "graphs", "ms per launch", "us per key",
              "vs CPU");
  std::vector<double> gpu_r100(widths.size()), gpu_r200(widths.size()), same_rows(widths.size());
  for (std::size_t wi = 0; wi < widths.size(); ++wi) {
    for (std::size_t gi = 0; gi < graph_counts.size(); ++gi) {
      const std::size_t G = graph_counts[gi];
      gp.expand_width = static_cast<int>(widths[wi]);
      dev<float> kd(G * n * d), qd(G * m * d), kk(G * m * knn.k), wk(G * m), bk(G * m);
      dev<id_t> adj(G * n * R), ent(G * built.entry_points().size()), ki(G * m * knn.k), bi(G * m),
          hd(G * n * holders);
      dev<std::uint32_t> sz(G), hc(G * n), lo(G * n), status(1);
      dev<std::int64_t> off(G + 1), qoff(G + 1);
      std::vector<id_t> a(n * R, kvsift::invalid_id);
      std::copy(built.adjacency().begin(), built.adjacency().end(), a.begin());
      const std::vector<float> kv(all.data(), all.data() + n * d),
          qv(train.data(), train.data() + m * d);
      const std::vector<id_t> ev(built.entry_points().begin(), built.entry_points().end());
      std::vector<std::int64_t> o, qo;
      for (std::size_t g = 0; g <= G; ++g) {
        o.push_back(static_cast<std::int64_t>(g * n));
        qo.push_back(static_cast<std::int64_t>(g * m));
      }
      for (std::size_t g = 0; g < G; ++g) {
        upload(kd.p + g * n * d, kv);
        upload(qd.p + g * m * d, qv);
        upload(adj.p + g * n * R, a);
        upload(ent.p + g * ev.size(), ev);
        upload(ki.p + g * m * knn.k, lists.knn_ids);
        upload(kk.p + g * m * knn.k, lists.knn_keys);
        upload(wk.p + g * m, lists.worst_key);
        upload(bk.p + g * m, lists.best_key);
        upload(bi.p + g * m, lists.best_id);
        upload(hd.p + g * n * holders, lists.holders);
        upload(hc.p + g * n, lists.holder_counts);
        upload(lo.p + g * n, lists.layouts);
      }
      upload(sz.p, std::vector<std::uint32_t>(G, static_cast<std::uint32_t>(base)));
      upload(off.p, o);
      upload(qoff.p, qo);
      KVSIFT_CUDA_CHECK(cudaMemset(status.p, 0, 4));
      kc::graph_set_ref set{adj.p,
                            off.p,
                            ent.p,
                            static_cast<int>(G),
                            static_cast<int>(R),
                            static_cast<int>(ev.size()),
                            static_cast<std::int64_t>(n),
                            sz.p};
      kc::batch_insert_state_ref st{adj.p,
                                    sz.p,
                                    qd.p,
                                    static_cast<std::int64_t>(d),
                                    qoff.p,
                                    static_cast<std::int64_t>(m),
                                    static_cast<int>(knn.k),
                                    ki.p,
                                    kk.p,
                                    wk.p,
                                    bi.p,
                                    bk.p,
                                    hd.p,
                                    hc.p,
                                    static_cast<int>(holders)};
      st.layouts = lo.p;
      const std::size_t bytes = kc::batch_insert_workspace_size(set, static_cast<int>(d), st, gp);
      dev<unsigned char> ws(bytes);
      const kc::dense_keys_ref<float> keys_ref{kd.p, static_cast<std::int64_t>(d),
                                               static_cast<int>(d)};
      cudaEvent_t e0, e1;
      KVSIFT_CUDA_CHECK(cudaEventCreate(&e0));
      KVSIFT_CUDA_CHECK(cudaEventCreate(&e1));
      KVSIFT_CUDA_CHECK(cudaEventRecord(e0, stream));
      for (std::size_t i = base; i < n; ++i) {
        kc::batch_insert(set, keys_ref, st, gp, ws.p, bytes, stream, status.p);
      }
      KVSIFT_CUDA_CHECK(cudaEventRecord(e1, stream));
      KVSIFT_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      KVSIFT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      const double per_launch = ms / static_cast<double>(n - base);
      std::uint32_t st_word = 0, size0 = 0;
      KVSIFT_CUDA_CHECK(cudaMemcpy(&st_word, status.p, 4, cudaMemcpyDeviceToHost));
      KVSIFT_CUDA_CHECK(cudaMemcpy(&size0, sz.p, 4, cudaMemcpyDeviceToHost));
      std::printf("%6zu %8zu %14.3f %16.2f %11.1fx%s\n", widths[wi], G, per_launch,
                  per_launch * 1e3 / static_cast<double>(G),
                  cpu_mean / (per_launch * 1e3 / static_cast<double>(G)),
                  st_word != 0 || size0 != n ? "  (status set or sizes short!)" : "");
      if (gi == 0) {
        std::vector<id_t> got(n * R);
        KVSIFT_CUDA_CHECK(
            cudaMemcpy(got.data(), adj.p, got.size() * sizeof(id_t), cudaMemcpyDeviceToHost));
        std::size_t same = 0;
        for (std::size_t r = 0; r < n; ++r) {
          const auto nb = cpu.neighbors(static_cast<id_t>(r));
          same += std::equal(nb.begin(), nb.end(), got.begin() + r * R) &&
                          (nb.size() == R || got[r * R + nb.size()] == kvsift::invalid_id)
                      ? 1
                      : 0;
        }
        same_rows[wi] = static_cast<double>(same) / static_cast<double>(n);
        const kvsift::graph_index<kvsift::view_store<float>> gg(kvsift::view_store<float>(all), R,
                                                                std::move(got), ev);
        gpu_r100[wi] = recall(gg, eval, exact, 100);
        gpu_r200[wi] = recall(gg, eval, exact, 200);
      }
      KVSIFT_CUDA_CHECK(cudaEventDestroy(e0));
      KVSIFT_CUDA_CHECK(cudaEventDestroy(e1));
    }
  }
  std::printf("\nCPU insert (one thread): mean %.1f us per key, p50 %.1f\n", cpu_mean, cpu_p50);
  std::printf("\nrecall@100 at pool 100 / 200 (holders %zu, candidates %zu):\n", holders,
              candidates);
  std::printf("  rebuild (%.1f s on %zu threads)  %.4f / %.4f\n", rebuild_s, threads,
              recall(rebuild, eval, exact, 100), recall(rebuild, eval, exact, 200));
  std::printf("  CPU insert                       %.4f / %.4f\n", recall(cpu, eval, exact, 100),
              recall(cpu, eval, exact, 200));
  for (std::size_t wi = 0; wi < widths.size(); ++wi) {
    std::printf(
        "  GPU batch_insert, expand_width %2zu %.4f / %.4f (rows equal to the CPU's: %.4f)\n",
        widths[wi], gpu_r100[wi], gpu_r200[wi], same_rows[wi]);
  }
  return 0;
}
