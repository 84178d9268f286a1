#pragma once
// Timing helpers shared by the CUDA benchmarks (plain mains, CUDA events).

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include <kvsift/cuda/detail/device_buffer.cuh>
#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda_bench {

/// Wall-clock seconds since `t0` (host-side phases: data generation, whole builds).
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// `count` elements of T in device memory (cudaMalloc'd, at least one), freed at scope exit.
template <class T>
struct dev {
  T* p = nullptr;
  int device = 0;  // freed there: with two GPUs, the other's memory is not always freed from here
  explicit dev(std::size_t count) {
    KVSIFT_CUDA_CHECK(cudaGetDevice(&device));
    KVSIFT_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(count, 1) * sizeof(T)));
  }
  ~dev() {
    const kvsift::cuda::detail::quiet_device_guard on(device);
    cudaFree(p);
  }
  dev(const dev&) = delete;
  dev& operator=(const dev&) = delete;
};

/// One "--name value" command-line option and how it sets its field.
struct option_spec {
  const char* name;
  std::function<void(const char*)> set;
};

/// An option that sets a std::size_t field (decimal).
inline option_spec size_option(const char* name, std::size_t& field) {
  return {name, [&field](const char* v) { field = std::strtoull(v, nullptr, 10); }};
}

/// An option that sets a double field.
inline option_spec double_option(const char* name, double& field) {
  return {name, [&field](const char* v) { field = std::strtod(v, nullptr); }};
}

/// An option that sets a std::string field (the value as given).
inline option_spec string_option(const char* name, std::string& field) {
  return {name, [&field](const char* v) { field = v; }};
}

/// The comma-separated items of `s`, in order (empty items kept: "a,,b" gives three).
inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= s.size()) {
    const std::size_t c = s.find(',', at);
    out.push_back(s.substr(at, c == std::string::npos ? std::string::npos : c - at));
    if (c == std::string::npos) break;
    at = c + 1;
  }
  return out;
}

/// Parses "--name value" pairs; an unknown option or a missing value exits with status 2.
inline void parse_options(int argc, char** argv, std::initializer_list<option_spec> specs) {
  for (int i = 1; i < argc; i += 2) {
    const option_spec* match = nullptr;
    for (const auto& spec : specs) {
      if (std::strcmp(argv[i], spec.name) == 0) match = &spec;
    }
    if (match == nullptr || i + 1 >= argc) {
      std::fprintf(stderr, "%s option %s\n", match ? "missing value for" : "unknown", argv[i]);
      std::exit(2);
    }
    match->set(argv[i + 1]);
  }
}

/// How a timed call's L2 is made cold. `dirty`: the flush buffer is overwritten (a memset),
/// which leaves the L2 full of modified lines that the timed call then writes back to DRAM
/// while it reads: a read-only kernel pays for the flush's writes (at a decode step's 161 MB of
/// sparse attention, 8 us of 55; bench/results/h200_sparse_attention_clean_flush.txt). `clean`:
/// the buffer is read, which evicts the same lines and leaves only unmodified ones, as a kernel
/// preceded by reads (a decode step's search) finds the L2.
enum class l2_flush { dirty, clean };

/// Reads `n` 16-byte vectors; stores nothing unless an impossible value turns up, so the loads
/// cannot be dropped. (A template, so that two benchmark objects may both include this header.)
template <int = 0>
__global__ void read_for_flush(const uint4* __restrict__ p, std::size_t n, uint4* sink) {
  uint4 a = make_uint4(0u, 0u, 0u, 0u);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const uint4 x = p[i];
    a.x ^= x.x;
    a.y ^= x.y;
    a.z ^= x.z;
    a.w ^= x.w;
  }
  if (a.x == 0x9e3779b9u && a.y == 0x7f4a7c15u && a.z == 0x85ebca6bu && sink != nullptr) *sink = a;
}

/// Makes the L2 cold as `kind` says, `bytes` of `buffer` (at least twice the L2), on `stream`.
/// `call` numbers the flushes, so that a dirty flush writes new values each time.
inline void flush_l2(void* buffer, std::size_t bytes, l2_flush kind, int call,
                     cudaStream_t stream) {
  if (kind == l2_flush::dirty) {
    KVSIFT_CUDA_CHECK(cudaMemsetAsync(buffer, call & 0xff, bytes, stream));
    return;
  }
  int device = 0;
  int sms = 0;
  KVSIFT_CUDA_CHECK(cudaGetDevice(&device));
  KVSIFT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  read_for_flush<>
      <<<sms * 8, 256, 0, stream>>>(static_cast<const uint4*>(buffer), bytes / 16, nullptr);
  KVSIFT_CUDA_CHECK(cudaGetLastError());
}

/// Milliseconds of the work f() enqueues on `s`: CUDA events recorded around it (made and
/// destroyed outside the timed interval); waits for it.
template <class F>
float event_ms(cudaStream_t s, F&& f) {
  cudaEvent_t a, b;
  KVSIFT_CUDA_CHECK(cudaEventCreate(&a));
  KVSIFT_CUDA_CHECK(cudaEventCreate(&b));
  KVSIFT_CUDA_CHECK(cudaEventRecord(a, s));
  f();
  KVSIFT_CUDA_CHECK(cudaEventRecord(b, s));
  KVSIFT_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  KVSIFT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  KVSIFT_CUDA_CHECK(cudaEventDestroy(a));
  KVSIFT_CUDA_CHECK(cudaEventDestroy(b));
  return ms;
}

/// Median milliseconds of `runs` timed calls of f(stream) after `warmup` untimed ones. When
/// `flush` is non-null, `flush_bytes` of it are flushed (`kind`, outside the events) before
/// each timed call so that the call starts with a cold L2.
template <class F>
float median_ms(F&& f, cudaStream_t stream, int warmup = 5, int runs = 30, void* flush = nullptr,
                std::size_t flush_bytes = 0, l2_flush kind = l2_flush::dirty) {
  cudaEvent_t start, stop;
  KVSIFT_CUDA_CHECK(cudaEventCreate(&start));
  KVSIFT_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) f(stream);
  std::vector<float> ms(runs);
  for (int i = 0; i < runs; ++i) {
    if (flush != nullptr) flush_l2(flush, flush_bytes, kind, i, stream);
    KVSIFT_CUDA_CHECK(cudaEventRecord(start, stream));
    f(stream);
    KVSIFT_CUDA_CHECK(cudaEventRecord(stop, stream));
    KVSIFT_CUDA_CHECK(cudaEventSynchronize(stop));
    KVSIFT_CUDA_CHECK(cudaEventElapsedTime(&ms[i], start, stop));
  }
  KVSIFT_CUDA_CHECK(cudaEventDestroy(start));
  KVSIFT_CUDA_CHECK(cudaEventDestroy(stop));
  std::nth_element(ms.begin(), ms.begin() + runs / 2, ms.end());
  return ms[runs / 2];
}

/// Mean milliseconds per call over `calls` back-to-back calls (launch overhead amortised, as in
/// a stream of kernels or a CUDA graph); median of 20 such batches.
template <class F>
float back_to_back_ms(F&& f, cudaStream_t stream, int calls = 100) {
  return median_ms(
             [&](cudaStream_t s) {
               for (int i = 0; i < calls; ++i) f(s);
             },
             stream, 2, 20) /
         static_cast<float>(calls);
}

/// Device-to-device cudaMemcpy bandwidth in GB/s, counting bytes read + written (2 x size).
inline double copy_bandwidth_gbps(std::size_t bytes, cudaStream_t stream) {
  void* a = nullptr;
  void* b = nullptr;
  KVSIFT_CUDA_CHECK(cudaMalloc(&a, bytes));
  KVSIFT_CUDA_CHECK(cudaMalloc(&b, bytes));
  KVSIFT_CUDA_CHECK(cudaMemset(a, 1, bytes));
  const float ms = median_ms(
      [&](cudaStream_t s) {
        KVSIFT_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
      },
      stream);
  KVSIFT_CUDA_CHECK(cudaFree(a));
  KVSIFT_CUDA_CHECK(cudaFree(b));
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

/// What every CUDA benchmark starts from: the device it runs on, a stream, and the
/// device-to-device copy bandwidth measured now, the baseline its figures are compared with.
struct bench_setup {
  cudaStream_t stream = nullptr;
  double copy_gbps = 0;
};

/// Prints the device and the copy baseline (512 MiB, bytes read + written). Returns false when
/// there is no CUDA device.
inline bool start_bench(bench_setup& out) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device\n");
    return false;
  }
  cudaDeviceProp prop{};
  KVSIFT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  KVSIFT_CUDA_CHECK(cudaStreamCreate(&out.stream));
  out.copy_gbps = copy_bandwidth_gbps(std::size_t{512} << 20, out.stream);
  std::printf("cudaMemcpy D2D 512 MiB: %.1f GB/s (read + written)\n", out.copy_gbps);
  return true;
}

}  // namespace kvsift::cuda_bench
