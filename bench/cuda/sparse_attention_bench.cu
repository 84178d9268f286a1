// Benchmark of sparse decode attention (kvsift/cuda/sparse_attention.cuh), CUDA events, H100.
//
// Build and run from the repository root:
// clang-format off
//   nvcc -arch=sm_90 -std=c++20 -O3 -I include -I cuda/include bench/cuda/sparse_attention_bench.cu -o sparse_attention_bench
//   ./sparse_attention_bench
// clang-format on
//
// 32 query heads (32 and 8 KV heads), head dim 128, 2048 random distinct tokens selected per
// head out of a 32768-token context in 16-token head-wise pages scattered over the pool; then
// the batch cases (512 and 2048 query heads, GQA 4, 616 and 2048 tokens per head) and batch 1
// (32 heads, 616 tokens), each over a sweep of split counts.
// Reports GB/s of K/V read (selected tokens x head_dim x 2 x element size) next to cudaMemcpy
// device-to-device bandwidth (read + written) from the same run. L2 is flushed before every
// timed call, outside the events, two ways: a 256 MiB memset ("cold", which leaves the L2 full
// of modified lines that the timed kernel writes back while it reads) and a 256 MiB read
// ("clean", an L2 of unmodified lines, as after a decode step's search); a warm-L2 number is
// printed as well. For each case, two references timed the same ways: a device-to-device copy of
// the same number of bytes, and `gather_rows`, a kernel that reads the same K/V rows (offsets
// resolved beforehand) and does no arithmetic: the floor for this access pattern.
// `--case QO,SEL` runs only the batch cases of QO query heads and SEL tokens per head (e.g. for
// a profiler: `--case 512,616`); `--context N` draws the selections from N tokens per KV head
// instead of 32768 (the pool, and so the pages the reads touch, scales with it).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <numeric>
#include <random>
#include <string_view>
#include <vector>

#include <kvsift/cuda/sparse_attention.cuh>

#include "bench_util.cuh"

namespace {

using kvsift::cuda_bench::l2_flush;
using kvsift::cuda_bench::median_ms;

constexpr int kDim = 128;
/// Tokens per KV head in the pool the selections are drawn from (`--context`).
int g_context = 32768;
constexpr int kPageSize = 16;

/// The reference gather: reads every selected token's K and V row, 16 bytes per thread and four
/// loads of each in flight, rows given as element offsets; XORs them and stores nothing (unless
/// an impossible value turns up) so that the loads stay.
template <class T>
__global__ void gather_rows(const T* __restrict__ k, const T* __restrict__ v,
                            const std::int64_t* __restrict__ offsets, std::int64_t rows,
                            uint4* sink) {
  constexpr int U = 4;
  constexpr int vecs = kDim * static_cast<int>(sizeof(T)) / 16;
  const std::int64_t items = rows * vecs;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  uint4 a = make_uint4(0u, 0u, 0u, 0u);
  for (std::int64_t i0 = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i0 < items; i0 += stride * U) {
    uint4 x[U];
    uint4 y[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::int64_t i = i0 + u * stride;
      x[u] = y[u] = make_uint4(0u, 0u, 0u, 0u);
      if (i < items) {
        const std::int64_t at = offsets[i / vecs] + (i % vecs) * (16 / sizeof(T));
        x[u] = *reinterpret_cast<const uint4*>(k + at);
        y[u] = *reinterpret_cast<const uint4*>(v + at);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      a.x ^= x[u].x ^ y[u].x;
      a.y ^= x[u].y ^ y[u].y;
      a.z ^= x[u].z ^ y[u].z;
      a.w ^= x[u].w ^ y[u].w;
    }
  }
  if (a.x == 0x9e3779b9u && a.y == 0x7f4a7c15u && a.z == 0x85ebca6bu) *sink = a;
}

/// One configuration: `qo_heads` query heads over `kv_heads` KV heads (GQA), `selected` random
/// distinct tokens per query head, every split count in `splits` (0 = the automatic choice).
template <class T>
void run_case(const char* type, int qo_heads, int kv_heads, int selected,
              std::initializer_list<int> split_counts, double copy_gbps, void* flush,
              std::size_t flush_bytes, cudaStream_t s) {
  std::mt19937_64 rng(7);
  const int max_pages = g_context / kPageSize;
  const std::int64_t num_pages = static_cast<std::int64_t>(kv_heads) * max_pages;
  const std::size_t pool = static_cast<std::size_t>(num_pages) * kPageSize * kDim;
  T* k = nullptr;
  T* v = nullptr;
  KVSIFT_CUDA_CHECK(cudaMalloc(&k, pool * sizeof(T)));
  KVSIFT_CUDA_CHECK(cudaMalloc(&v, pool * sizeof(T)));
  KVSIFT_CUDA_CHECK(cudaMemset(k, 0, pool * sizeof(T)));
  KVSIFT_CUDA_CHECK(cudaMemset(v, 0, pool * sizeof(T)));
  std::vector<std::int32_t> table(num_pages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<std::int64_t> indptr(qo_heads + 1);
  std::vector<std::int32_t> ids;
  std::vector<std::int32_t> all(g_context);
  std::vector<std::int64_t> offsets;  // each selected token's row, for the reference gather
  const int group = qo_heads / kv_heads;
  for (int h = 0; h < qo_heads; ++h) {
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::sort(all.begin(), all.begin() + selected);
    ids.insert(ids.end(), all.begin(), all.begin() + selected);
    indptr[h + 1] = static_cast<std::int64_t>(ids.size());
    for (int i = 0; i < selected; ++i) {
      const std::int32_t page =
          table[static_cast<std::size_t>(h / group) * max_pages + all[i] / kPageSize];
      offsets.push_back((std::int64_t{page} * kPageSize + all[i] % kPageSize) * kDim);
    }
  }
  std::vector<float> q(qo_heads * kDim, 0.01f);
  float *d_q, *d_o, *d_lse;
  std::int32_t *d_table, *d_ids;
  std::int64_t* d_indptr;
  KVSIFT_CUDA_CHECK(cudaMalloc(&d_q, q.size() * sizeof(float)));
  KVSIFT_CUDA_CHECK(cudaMalloc(&d_o, q.size() * sizeof(float)));
  KVSIFT_CUDA_CHECK(cudaMalloc(&d_lse, qo_heads * sizeof(float)));
  KVSIFT_CUDA_CHECK(cudaMalloc(&d_table, table.size() * sizeof(std::int32_t)));
  KVSIFT_CUDA_CHECK(cudaMalloc(&d_ids, ids.size() * sizeof(std::int32_t)));
  KVSIFT_CUDA_CHECK(cudaMalloc(&d_indptr, indptr.size() * sizeof(std::int64_t)));
  KVSIFT_CUDA_CHECK(cudaMemcpy(d_q, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
  KVSIFT_CUDA_CHECK(cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  KVSIFT_CUDA_CHECK(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  KVSIFT_CUDA_CHECK(cudaMemcpy(d_indptr, indptr.data(), indptr.size() * 8, cudaMemcpyHostToDevice));
  const kvsift::cuda::paged_kv_ref<T> kv{k,    v,       num_pages, kPageSize,
                                         kDim, d_table, kv_heads,  max_pages};
  const double kv_bytes = 2.0 * qo_heads * selected * kDim * sizeof(T);
  // Share of the copy's rate at which a call of `ms` milliseconds reads the K/V bytes.
  const auto pct = [&](float ms) { return 100.0 * kv_bytes / (ms * 1e-3) / 1e9 / copy_gbps; };
  {
    // The references: a copy of the same bytes (read kv_bytes / 2, written kv_bytes / 2) and
    // the same rows gathered without arithmetic, each timed after both flushes.
    kvsift::cuda_bench::dev<char> src(static_cast<std::size_t>(kv_bytes / 2));
    kvsift::cuda_bench::dev<char> dst(static_cast<std::size_t>(kv_bytes / 2));
    kvsift::cuda_bench::dev<std::int64_t> d_offsets(offsets.size());
    kvsift::cuda_bench::dev<uint4> sink(1);
    KVSIFT_CUDA_CHECK(
        cudaMemcpy(d_offsets.p, offsets.data(), offsets.size() * 8, cudaMemcpyHostToDevice));
    int sms = 0;
    KVSIFT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    auto copy = [&](cudaStream_t st) {
      KVSIFT_CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, static_cast<std::size_t>(kv_bytes / 2),
                                        cudaMemcpyDeviceToDevice, st));
    };
    auto gather = [&](cudaStream_t st) {
      gather_rows<T><<<sms * 16, 128, 0, st>>>(k, v, d_offsets.p,
                                               static_cast<std::int64_t>(offsets.size()), sink.p);
      KVSIFT_CUDA_CHECK(cudaGetLastError());
    };
    const float copy_cold = median_ms(copy, s, 5, 30, flush, flush_bytes);
    const float copy_clean = median_ms(copy, s, 5, 30, flush, flush_bytes, l2_flush::clean);
    const float gather_cold = median_ms(gather, s, 5, 30, flush, flush_bytes);
    const float gather_clean = median_ms(gather, s, 5, 30, flush, flush_bytes, l2_flush::clean);
    std::printf(
        "reference        %-4s qo=%d kv=%d d=%d sel=%d: copy of the same bytes cold %7.2f us "
        "(%5.1f%%) clean %7.2f us (%5.1f%%) | gather_rows cold %7.2f us (%5.1f%%) clean %7.2f us "
        "(%5.1f%%)\n",
        type, qo_heads, kv_heads, kDim, selected, copy_cold * 1e3, pct(copy_cold), copy_clean * 1e3,
        pct(copy_clean), gather_cold * 1e3, pct(gather_cold), gather_clean * 1e3,
        pct(gather_clean));
  }
  for (int splits : split_counts) {
    kvsift::cuda::sparse_attention_params params;
    params.num_splits = splits;
    const std::size_t ws = kvsift::cuda::sparse_attention_workspace_size(qo_heads, kDim, params);
    void* d_ws = nullptr;
    if (ws > 0) KVSIFT_CUDA_CHECK(cudaMalloc(&d_ws, ws));
    auto call = [&](cudaStream_t st) {
      kvsift::cuda::sparse_attention<T>(d_q, qo_heads, kDim, kv, d_indptr, d_ids, d_o, d_lse, d_ws,
                                        ws, st, params);
    };
    const float cold = median_ms(call, s, 5, 30, flush, flush_bytes);
    const float clean = median_ms(call, s, 5, 30, flush, flush_bytes, l2_flush::clean);
    const float warm = median_ms(call, s, 5, 30);
    const double gb = kv_bytes / (cold * 1e-3) / 1e9;
    const int resolved = kvsift::cuda::detail::resolve_num_splits(qo_heads, params, {}, "bench");
    std::printf(
        "sparse_attention %-4s qo=%d kv=%d d=%d sel=%d splits=%-4s(~%2d): cold %7.2f us "
        "%7.1f GB/s (%5.1f%% of copy) | clean %7.2f us (%5.1f%%) | warm L2 %7.2f us %7.1f GB/s\n",
        type, qo_heads, kv_heads, kDim, selected, splits == 0 ? "auto" : "set",
        splits == 0 ? resolved : splits, cold * 1e3, gb, pct(cold), clean * 1e3, pct(clean),
        warm * 1e3, kv_bytes / (warm * 1e-3) / 1e9);
    if (d_ws != nullptr) KVSIFT_CUDA_CHECK(cudaFree(d_ws));
  }
  KVSIFT_CUDA_CHECK(cudaFree(k));
  KVSIFT_CUDA_CHECK(cudaFree(v));
  KVSIFT_CUDA_CHECK(cudaFree(d_q));
  KVSIFT_CUDA_CHECK(cudaFree(d_o));
  KVSIFT_CUDA_CHECK(cudaFree(d_lse));
  KVSIFT_CUDA_CHECK(cudaFree(d_table));
  KVSIFT_CUDA_CHECK(cudaFree(d_ids));
  KVSIFT_CUDA_CHECK(cudaFree(d_indptr));
}

}  // namespace

int main(int argc, char** argv) {
  int only_qo = 0;
  int only_sel = 0;
  bool ok = true;
  for (int i = 1; i + 1 < argc && ok; i += 2) {
    const std::string_view opt = argv[i];
    if (opt == "--case") {
      ok = std::sscanf(argv[i + 1], "%d,%d", &only_qo, &only_sel) == 2 && only_qo > 0 &&
           only_sel > 0;
    } else if (opt == "--context") {
      ok = std::sscanf(argv[i + 1], "%d", &g_context) == 1 && g_context >= 2048 &&
           g_context % kPageSize == 0;
    } else {
      ok = false;
    }
  }
  if (!ok || argc % 2 == 0) {
    std::fprintf(stderr, "usage: %s [--case QO,SEL] [--context TOKENS (>= 2048, multiple of %d)]\n",
                 argv[0], kPageSize);
    return 2;
  }
  kvsift::cuda_bench::bench_setup b;
  if (!kvsift::cuda_bench::start_bench(b)) return 1;
  const cudaStream_t s = b.stream;
  const double copy_gbps = b.copy_gbps;
  const std::size_t flush_bytes = std::size_t{256} << 20;
  void* flush = nullptr;
  KVSIFT_CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
  const bool all = only_qo == 0;
  if (all) {
    run_case<__half>("f16", 32, 32, 2048, {0, 4, 8, 16, 32}, copy_gbps, flush, flush_bytes, s);
    run_case<__half>("f16", 32, 8, 2048, {0, 4, 8, 16, 32}, copy_gbps, flush, flush_bytes, s);
    run_case<__nv_bfloat16>("bf16", 32, 32, 2048, {0, 4, 8, 16, 32}, copy_gbps, flush, flush_bytes,
                            s);
    run_case<float>("f32", 32, 32, 2048, {0, 4, 8, 16, 32}, copy_gbps, flush, flush_bytes, s);
  }
  // At batch: 16 and 64 requests x 32 query heads (8 KV heads each), the retrieved tokens of a
  // decode step (top-100 + window 512 ~ 616) and a larger selection (2048).
  for (const int sel : {616, 2048}) {
    for (const int qo : {512, 2048}) {
      if (!all && (qo != only_qo || sel != only_sel)) continue;
      run_case<__half>("f16", qo, qo / 4, sel, {0, 1, 2, 3, 4, 6, 8, 16}, copy_gbps, flush,
                       flush_bytes, s);
    }
  }
  // Batch 1, the latency case: 32 query heads, a decode step's tokens.
  if (all || (only_qo == 32 && only_sel == 616)) {
    run_case<__half>("f16", 32, 8, 616, {0, 1, 2, 4, 8, 16}, copy_gbps, flush, flush_bytes, s);
  }
  KVSIFT_CUDA_CHECK(cudaFree(flush));
  KVSIFT_CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}
