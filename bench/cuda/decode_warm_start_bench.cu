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
// With --dipr-betas B1,B2,... (attention logits; raw q.k = B / --scale) it also runs cold DIPR
// launches on the same queries, each expand width of --dipr-widths and hop cap of --dipr-hops
// (0 = none), and reports per setting: set recall against the exact DIPR set over all keys
// (`exact_dipr`, f16 keys), results and exact set size per query, the share of searches capped,
// vectors scored per query and ms per launch; and, per (hops, beta), the CPU's `dipr_search`
// over the same graph (the walk the GPU's expand width 1 equals id for id on exact data).
//
// Usage: kvsift-cuda-decode_warm_start_bench --keys K --train T --eval E1[,E2...]
//            [--requests 16] [--steps 60] [--topk 0|1]
//            [--dipr-betas B,.. --scale S --dipr-l0 100 --dipr-widths 1,8 --dipr-hops 0,..]

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.cuh"

#pragma nv_diagnostic push
#pragma nv_diag_suppress 554
#include <kvsift/cuda/decode_search.cuh>
#include <kvsift/cuda/decode_step.cuh>
#include <kvsift/cuda/knn.cuh>
#include <kvsift/cuda/sparse_attention.cuh>
#include <kvsift/index/flat_index.hpp>
#include <kvsift/index/roargraph_builder.hpp>
#include <kvsift/io/vector_io.hpp>
#include <kvsift/search/dipr_search.hpp>
#pragma nv_diagnostic pop

namespace {

using kvsift::id_t;
using kvsift::matrix_view;
namespace kc = kvsift::cuda;
using kvsift::cuda_bench::dev;

}  // namespace

int main(int argc, char** argv) {
  std::string keys_path, train_path, eval_paths;
  std::string dipr_betas, dipr_widths = "1,8", dipr_hops = "0", values_path;
  std::size_t requests = 16, steps = 60, topk = 1, dipr_l0 = 100, context = 0, dipr_set = 1;
  double scale = 1.0;
  using kvsift::cuda_bench::size_option;
  using kvsift::cuda_bench::string_option;
  kvsift::cuda_bench::parse_options(
      argc, argv,
      {string_option("--keys", keys_path), string_option("--train", train_path),
       string_option("--eval", eval_paths), size_option("--requests", requests),
       size_option("--steps", steps), size_option("--topk", topk),
       string_option("--dipr-betas", dipr_betas),
       kvsift::cuda_bench::double_option("--scale", scale), size_option("--dipr-l0", dipr_l0),
       string_option("--dipr-widths", dipr_widths), string_option("--dipr-hops", dipr_hops),
       string_option("--values", values_path), size_option("--context", context),
       size_option("--dipr-sets", dipr_set)});
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
  auto time_ms = [&](auto&& launch) { return kvsift::cuda_bench::event_ms(stream, launch); };

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

  if (topk != 0)
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
        const float ms = time_ms(
            [&] { kc::decode_search(set, keys, qs, std::int64_t(m), p, out, ws.p, wb, stream); });
        if (pass == 1) total_ms += ms;
      }
    }
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
    if (topk == 0) break;
    for (const int L : {100, 128, 160, 200}) run(false, L, 0, expand);
    for (const int limit : {40, 60, 80}) run(false, 100, limit, expand);
    for (const int limit : {30, 40, 50, 60, 70, 80, 0}) run(true, 100, limit, expand);
  }

  std::vector<double> betas_for_step;
  for (const auto& b : kvsift::cuda_bench::split_list(dipr_betas))
    if (!b.empty()) betas_for_step.push_back(std::stod(b));
  // 4. DIPR (cold: the graph's entry points, no window seed), GPU and CPU, against the exact
  // DIPR set of every query over all keys.
  if (!dipr_betas.empty() && dipr_set != 0) {
    std::vector<double> betas;
    std::vector<int> widths, hop_caps;
    for (const auto& b : kvsift::cuda_bench::split_list(dipr_betas)) betas.push_back(std::stod(b));
    for (const auto& w : kvsift::cuda_bench::split_list(dipr_widths))
      widths.push_back(std::stoi(w));
    for (const auto& h : kvsift::cuda_bench::split_list(dipr_hops))
      hop_caps.push_back(std::stoi(h));
    const std::size_t nq = steps * m;
    const matrix_view<const float> all_q(q.data(), nq, d);
    const std::size_t threads = std::thread::hardware_concurrency();
    std::printf(
        "\nDIPR, cold, l0 %zu, beta in logits (raw q.k = beta / %g); set recall against the "
        "exact DIPR set over all %zu keys\n",
        dipr_l0, scale, n);
    std::printf("%-4s %6s %5s %6s %10s %9s %9s %7s %13s %10s\n", "walk", "beta", "hops", "width",
                "set recall", "results", "exact", "capped", "scored/query", "ms/launch");
    for (const double beta : betas) {
      kvsift::dipr_params ep;
      ep.beta = static_cast<float>(beta / scale);
      // Sorted exact sets (the flat scan ignores l0 and the caps).
      auto exact_sets = kvsift::exact_dipr(flat, all_q, ep, threads);
      double exact_mean = 0;
      for (auto& e : exact_sets) {
        std::sort(e.ids.begin(), e.ids.end());
        exact_mean += double(e.ids.size());
      }
      exact_mean /= double(nq);
      const auto set_recall = [&](std::size_t i, const id_t* got, std::size_t count) {
        const auto& w = exact_sets[i].ids;
        std::size_t hit = 0;
        for (std::size_t j = 0; j < count; ++j)
          hit += std::binary_search(w.begin(), w.end(), got[j]);
        return w.empty() ? 1.0 : double(hit) / double(w.size());
      };
      for (const int hops : hop_caps) {
        // The CPU walk over the same graph and keys.
        {
          kvsift::dipr_params cp = ep;
          cp.l0 = dipr_l0;
          cp.max_hops = std::size_t(hops);
          std::vector<kvsift::search_workspace> ws(threads);
          std::vector<double> rec(nq), res(nq), cap(nq), sc(nq);
          kvsift::parallel_for(nq, threads, [&](std::size_t i, std::size_t t) {
            kvsift::dipr_result r;
            kvsift::dipr_search(index, all_q.row_span(i), cp, ws[t], r);
            rec[i] = set_recall(i, r.ids.data(), r.ids.size());
            res[i] = double(r.ids.size());
            cap[i] = r.capped ? 1.0 : 0.0;
            sc[i] = double(r.stats.distance_computations);
          });
          const auto mean = [&](const std::vector<double>& v) {
            double a = 0;
            for (const double x : v) a += x;
            return a / double(v.size());
          };
          std::printf("%-4s %6g %5d %6s %10.4f %9.1f %9.1f %7.3f %13.0f %10s\n", "cpu", beta, hops,
                      "-", mean(rec), mean(res), exact_mean, mean(cap), mean(sc), "-");
        }
        for (const int width : widths) {
          kc::decode_search_params p;
          p.mode = kc::decode_search_mode::dipr;
          p.beta = static_cast<float>(beta / scale);
          p.l0 = int(dipr_l0);
          p.expand_width = width;
          p.max_hops = hops;
          const int cap = kc::decode_search_capacity(p);
          const std::size_t wb = kc::decode_search_workspace_size(set, std::int64_t(m), p);
          dev<char> ws(wb);
          dev<id_t> dres(m * std::size_t(cap));
          dev<std::uint32_t> dcap(m);
          double total_ms = 0, rec = 0, res = 0, capped = 0, sc = 0;
          std::vector<id_t> got(m * std::size_t(cap));
          std::vector<std::uint32_t> counts(m), caps(m), scored(m);
          for (int pass = 0; pass < 2; ++pass) {  // pass 0 warms up, pass 1 is timed and scored
            for (std::size_t t = 0; t < steps; ++t) {
              const kc::decode_queries qs{dq.p + t * m * d, std::int64_t(d), dgraph.p};
              kc::decode_search_outputs out{dres.p,  nullptr,   dcounts.p,
                                            nullptr, dscored.p, dstatus.p};
              out.capped = dcap.p;
              const float ms = time_ms([&] {
                kc::decode_search(set, keys, qs, std::int64_t(m), p, out, ws.p, wb, stream);
              });
              if (pass == 0) continue;
              total_ms += ms;
              KVSIFT_CUDA_CHECK(
                  cudaMemcpy(got.data(), dres.p, got.size() * 4, cudaMemcpyDeviceToHost));
              KVSIFT_CUDA_CHECK(
                  cudaMemcpy(counts.data(), dcounts.p, m * 4, cudaMemcpyDeviceToHost));
              KVSIFT_CUDA_CHECK(cudaMemcpy(caps.data(), dcap.p, m * 4, cudaMemcpyDeviceToHost));
              KVSIFT_CUDA_CHECK(
                  cudaMemcpy(scored.data(), dscored.p, m * 4, cudaMemcpyDeviceToHost));
              for (std::size_t i = 0; i < m; ++i) {
                const std::size_t c = std::min<std::size_t>(counts[i], std::size_t(cap));
                rec += set_recall(t * m + i, got.data() + i * std::size_t(cap), c);
                res += double(c);
                capped += caps[i];
                sc += scored[i];
              }
            }
          }
          std::printf("%-4s %6g %5d %6d %10.4f %9.1f %9.1f %7.3f %13.0f %10.4f\n", "gpu", beta,
                      hops, width, rec / double(nq), res / double(nq), exact_mean,
                      capped / double(nq), sc / double(nq), total_ms / double(steps));
        }
      }
    }
  }
  // 5. The decode step (kc::decode_step) on real keys and values: every eval query attends the
  // first `context` tokens (the prefix before the held-out positions), through a graph built on
  // them; each request holds its own copy of that prefix (pages and graph), as a batch of
  // requests holds distinct caches, so no request's reads hit another's in the L2. Reference:
  // the same kernel with a window covering every token (full attention). Quality per query
  // head: relative L2 distance of the output to full attention's, and the softmax mass of the
  // attended tokens, exp(lse - lse_full).
  if (!values_path.empty()) {
    const auto vals32 = kvsift::read_vectors(kvsift::file_path(values_path));
    const std::size_t P = context == 0 ? n : std::min(context, n);
    if (vals32.rows() < P || vals32.cols() != d) {
      std::fprintf(stderr, "--values has %zu x %zu rows, need >= %zu x %zu\n", vals32.rows(),
                   vals32.cols(), P, d);
      return 2;
    }
    const kvsift::view_store<float> prefix(matrix_view<const float>(kf.data(), P, d));
    const auto pindex = kvsift::roargraph_builder<kvsift::inner_product, kc::knn_engine>(bp).build(
        prefix, train.view());
    const std::size_t R = requests, pw = pindex.max_degree(), page = 16;
    const std::size_t pages_per_head = (P + page - 1) / page, pages = R * pages_per_head;
    std::vector<__half> kp(pages * page * d, __float2half(0.0f)), vp(kp.size(), __float2half(0.0f));
    for (std::size_t r = 0; r < R; ++r) {
      for (std::size_t t = 0; t < P; ++t) {
        const std::size_t row = (r * pages_per_head + t / page) * page + t % page;
        for (std::size_t j = 0; j < d; ++j) {
          kp[row * d + j] = __float2half(static_cast<float>(k16[t * d + j]));
          vp[row * d + j] = __float2half(vals32.view().row(t)[j]);
        }
      }
    }
    std::vector<std::int32_t> table(pages);
    for (std::size_t i = 0; i < pages; ++i) table[i] = std::int32_t(i);
    std::vector<id_t> padj(R * P * pw), pent(R * kvsift::max_entry_points, kvsift::invalid_id);
    std::vector<std::int64_t> poff(R + 1);
    for (std::size_t r = 0; r < R; ++r) {
      std::copy_n(pindex.adjacency().data(), P * pw, padj.begin() + r * P * pw);
      std::copy(pindex.entry_points().begin(), pindex.entry_points().end(),
                pent.begin() + r * kvsift::max_entry_points);
      poff[r + 1] = std::int64_t((r + 1) * P);
    }
    dev<__half> dkp(kp.size()), dvp(vp.size());
    dev<std::int32_t> dtable(pages);
    dev<id_t> dpadj(padj.size()), dpent(pent.size());
    dev<std::int64_t> dpoff(R + 1);
    KVSIFT_CUDA_CHECK(cudaMemcpy(dkp.p, kp.data(), kp.size() * 2, cudaMemcpyHostToDevice));
    KVSIFT_CUDA_CHECK(cudaMemcpy(dvp.p, vp.data(), vp.size() * 2, cudaMemcpyHostToDevice));
    KVSIFT_CUDA_CHECK(cudaMemcpy(dtable.p, table.data(), pages * 4, cudaMemcpyHostToDevice));
    KVSIFT_CUDA_CHECK(cudaMemcpy(dpadj.p, padj.data(), padj.size() * 4, cudaMemcpyHostToDevice));
    KVSIFT_CUDA_CHECK(cudaMemcpy(dpent.p, pent.data(), pent.size() * 4, cudaMemcpyHostToDevice));
    KVSIFT_CUDA_CHECK(cudaMemcpy(dpoff.p, poff.data(), poff.size() * 8, cudaMemcpyHostToDevice));
    const kc::graph_set_ref pset{
        dpadj.p, dpoff.p, dpent.p, int(R), int(pw), int(kvsift::max_entry_points), std::int64_t(P)};
    const kc::paged_kv_ref<__half> kv{dkp.p,    dvp.p,  std::int64_t(pages), int(page), int(d),
                                      dtable.p, int(R), int(pages_per_head)};
    const float attn_scale = static_cast<float>(scale);
    dev<float> o_full(steps * m * d), lse_full(steps * m), o(m * d), lse(m);
    std::printf(
        "\ndecode step on real keys and values: %zu requests x %zu query heads (GQA %zu), "
        "each attending its own copy of the first %zu tokens (graph built on them: width "
        "%zu), %zu steps, logit scale %g\n",
        R, H, H, P, pw, steps, scale);
    std::printf("%-28s %9s %10s %9s %8s %10s %10s %9s\n", "setting", "tokens", "rel. error", "mass",
                "capped", "ms/step", "x full", "set rec.");
    // Full attention: kvsift's sparse_attention with every token of the prefix listed.
    double full_ms = 0;
    {
      std::vector<std::int64_t> indptr(m + 1);
      for (std::size_t i = 0; i <= m; ++i) indptr[i] = std::int64_t(i * P);
      std::vector<std::int32_t> all(m * P);
      for (std::size_t i = 0; i < m * P; ++i) all[i] = std::int32_t(i % P);
      dev<std::int64_t> dind(m + 1);
      dev<std::int32_t> dall(m * P);
      KVSIFT_CUDA_CHECK(cudaMemcpy(dind.p, indptr.data(), (m + 1) * 8, cudaMemcpyHostToDevice));
      KVSIFT_CUDA_CHECK(cudaMemcpy(dall.p, all.data(), all.size() * 4, cudaMemcpyHostToDevice));
      kc::sparse_attention_params ap;
      ap.scale = attn_scale;
      const std::size_t awb = kc::sparse_attention_workspace_size(int(m), int(d), ap);
      dev<char> aws(awb);
      for (int pass = 0; pass < 2; ++pass) {
        for (std::size_t t = 0; t < steps; ++t) {
          const float ms = time_ms([&] {
            kc::sparse_attention(dq.p + t * m * d, int(m), int(d), kv, dind.p, dall.p,
                                 o_full.p + t * m * d, lse_full.p + t * m, aws.p, awb, stream, ap);
          });
          if (pass == 1) full_ms += ms / double(steps);
        }
      }
      std::printf("%-28s %9zu %10s %9s %8s %10.4f %10s\n", "full attention", P, "0", "1", "-",
                  full_ms, "1.00");
    }
    // The exact DIPR selection of a step's middle tokens, per (step, query) [t * m + i], ids
    // ascending: flat_index::dipr over [sink, P - window) on the f16-rounded keys the GPU reads,
    // seeded (when `seeded`) with the query's best raw score over the sinks and the window, as
    // seed_from_window measures the range.
    auto exact_selection = [&](const kc::decode_step_params& p, bool seeded) {
      const std::size_t lo = std::size_t(p.sink), hi = P - std::min(P, std::size_t(p.window));
      std::vector<std::vector<id_t>> sets(steps * m);
      std::vector<kvsift::search_workspace> ws(std::max(1u, std::thread::hardware_concurrency()));
      kvsift::parallel_for(steps * m, ws.size(), [&](std::size_t e, std::size_t w) {
        const float* qv = q.data() + e * d;
        kvsift::dipr_params dp;
        dp.beta = p.search.beta;
        if (seeded) {
          float best = -std::numeric_limits<float>::infinity();
          const auto see = [&](std::size_t j) {
            best = std::max(best, kvsift::inner_product::score(qv, kf.data() + j * d, d));
          };
          for (std::size_t j = 0; j < lo; ++j) see(j);
          for (std::size_t j = hi; j < P; ++j) see(j);
          dp.seed_score = best;
        }
        kvsift::dipr_result r;
        flat.dipr(std::span<const float>(qv, d), dp, ws[w], r, kvsift::id_range{lo, hi});
        sets[e] = std::move(r.ids);
        std::sort(sets[e].begin(), sets[e].end());
      });
      return sets;
    };
    // Runs `p` for every step (pass 0 untimed) and reports it; `warm` keeps the carry between
    // steps (the previous step's retrieval as seeds), else it is reset before every step. The
    // carry also returns each head's retrieved ids (their count), and `capped` which DIPR
    // searches were capped. With `exact` (DIPR) the set recall of the retrieved middle tokens
    // against it.
    auto step = [&](const char* name, kc::decode_step_params p, bool warm,
                    const std::vector<std::vector<id_t>>* exact = nullptr) {
      p.scale = attn_scale;
      const int cap = kc::decode_search_capacity(p.search);
      const std::size_t wb = kc::decode_step_workspace_size(pset, int(m), int(d), p);
      dev<char> ws(wb);
      dev<id_t> carry(m * std::size_t(cap));
      dev<std::uint32_t> dcapped(m);
      std::vector<std::uint32_t> flags(m);
      std::vector<id_t> got(m * std::size_t(cap));
      std::vector<float> ho(m * d), hl(m), fo(m * d), fl(m);
      double total_ms = 0, err = 0, mass = 0, tokens = 0, capped = 0, hit = 0, want = 0;
      const std::size_t win = std::min<std::size_t>(P, std::size_t(p.sink + p.window));
      for (int pass = 0; pass < 2; ++pass) {
        KVSIFT_CUDA_CHECK(cudaMemset(carry.p, 0xff, got.size() * 4));
        for (std::size_t t = 0; t < steps; ++t) {
          if (!warm) KVSIFT_CUDA_CHECK(cudaMemset(carry.p, 0xff, got.size() * 4));
          const float ms = time_ms([&] {
            kc::decode_step(pset, kv, dq.p + t * m * d, int(m), int(d), o.p, lse.p, ws.p, wb,
                            stream, p, dstatus.p, carry.p, dcapped.p);
          });
          if (pass == 0) continue;
          total_ms += ms;
          KVSIFT_CUDA_CHECK(cudaMemcpy(ho.data(), o.p, ho.size() * 4, cudaMemcpyDeviceToHost));
          KVSIFT_CUDA_CHECK(cudaMemcpy(hl.data(), lse.p, hl.size() * 4, cudaMemcpyDeviceToHost));
          KVSIFT_CUDA_CHECK(
              cudaMemcpy(fo.data(), o_full.p + t * m * d, fo.size() * 4, cudaMemcpyDeviceToHost));
          KVSIFT_CUDA_CHECK(
              cudaMemcpy(fl.data(), lse_full.p + t * m, fl.size() * 4, cudaMemcpyDeviceToHost));
          KVSIFT_CUDA_CHECK(
              cudaMemcpy(got.data(), carry.p, got.size() * 4, cudaMemcpyDeviceToHost));
          KVSIFT_CUDA_CHECK(cudaMemcpy(flags.data(), dcapped.p, m * 4, cudaMemcpyDeviceToHost));
          for (std::size_t i = 0; i < m; ++i) {
            double num = 0, den = 0;
            for (std::size_t j = 0; j < d; ++j) {
              const double x = double(ho[i * d + j]) - double(fo[i * d + j]);
              num += x * x;
              den += double(fo[i * d + j]) * fo[i * d + j];
            }
            err += std::sqrt(num / den);
            mass += std::exp(double(hl[i]) - double(fl[i]));
            std::size_t c = 0;
            for (int j = 0; j < cap; ++j) {
              const id_t v = got[i * std::size_t(cap) + j];
              if (v == kvsift::invalid_id) continue;
              ++c;
              if (exact != nullptr) {
                const auto& x = (*exact)[t * m + i];
                hit += std::binary_search(x.begin(), x.end(), v) ? 1 : 0;
              }
            }
            if (exact != nullptr) want += double((*exact)[t * m + i].size());
            const bool was_capped = flags[i] != 0u;
            capped += was_capped;
            tokens += was_capped && p.dense_when_capped ? double(P) : double(c + win);
          }
        }
      }
      const double ms = total_ms / double(steps), q_n = double(steps * m);
      char recall[16] = "-";
      if (exact != nullptr)
        std::snprintf(recall, sizeof recall, "%.4f", want > 0 ? hit / want : 1.0);
      std::printf("%-28s %9.1f %10.4f %9.4f %8.3f %10.4f %10.2f %9s\n", name, tokens / q_n,
                  err / q_n, mass / q_n, capped / q_n, ms, full_ms / ms, recall);
    };
    char name[64];
    for (const int k : {100, 1024}) {
      for (const bool warm : {false, true}) {
        for (const bool sinks : {false, true}) {
          kc::decode_step_params ps;
          ps.search.k = k;
          ps.search.L = k == 100 ? 128 : 1024;
          ps.search.expand_width = 16;
          ps.search.walk_through = false;
          if (sinks) ps.search.entry_prefix = ps.sink;  // also enter at the sinks
          if (warm) ps.search.expand_limit = k == 100 ? 70 : 700;
          std::snprintf(name, sizeof name, "window + top-%d%s%s", k, warm ? " warm" : "",
                        sinks ? " sinks" : "");
          step(name, ps, warm);
        }
      }
    }
    for (const double beta : betas_for_step) {
      kc::decode_step_params sel;  // the step's sink, window and beta: what the sets depend on
      sel.search.beta = static_cast<float>(beta / scale);
      const std::vector<std::vector<id_t>> exact[2] = {exact_selection(sel, false),
                                                       exact_selection(sel, true)};
      // (seeded, walk-through, entering at the sinks): the step as before, seeded, seeded
      // without the walk-through, and that entering the walk at the sinks too.
      struct variant {
        bool seeded, through, sinks;
      };
      for (const auto& [seeded, through, sinks] :
           {variant{false, true, false}, variant{true, true, false}, variant{true, false, false},
            variant{true, false, true}}) {
        for (const bool dense : {false, true}) {
          kc::decode_step_params ps;
          ps.search.mode = kc::decode_search_mode::dipr;
          ps.search.beta = static_cast<float>(beta / scale);
          ps.search.l0 = int(dipr_l0);
          ps.search.expand_width = 8;
          ps.search.walk_through = through;
          if (sinks) ps.search.entry_prefix = ps.sink;
          ps.dense_when_capped = dense;
          ps.seed_from_window = seeded;
          std::snprintf(name, sizeof name, "DIPR %g%s%s%s%s", beta, seeded ? " seeded" : "",
                        through ? "" : " no-wt", sinks ? " sinks" : "", dense ? " dense" : "");
          step(name, ps, false, &exact[seeded ? 1 : 0]);
        }
      }
    }
  }

  std::uint32_t status = 0;
  KVSIFT_CUDA_CHECK(cudaMemcpy(&status, dstatus.p, 4, cudaMemcpyDeviceToHost));
  std::printf("status word: %u (0 = no device-side error)\n", status);
  return 0;
}
