#pragma once
// Helpers shared by the CUDA tests: exception messages, an owning device buffer, element
// conversions, an RNG.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <kvsift/cuda/detail/device_buffer.cuh>
#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda_test {

/// The message of the exception `f` throws, or "(no exception)".
inline std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

inline bool contains(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}

/// Owning device allocation of n elements (cudaMalloc: 256-byte aligned).
template <class T>
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t n) : n_(n) {
    KVSIFT_CUDA_CHECK(cudaGetDevice(&device_));
    if (n > 0) KVSIFT_CUDA_CHECK(cudaMalloc(&p_, n * sizeof(T)));
  }
  explicit device_buffer(const std::vector<T>& host) : device_buffer(host.size()) { upload(host); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  device_buffer(device_buffer&& other) noexcept
      : p_(other.p_), n_(other.n_), device_(other.device_) {
    other.p_ = nullptr;
    other.n_ = 0;
  }
  device_buffer& operator=(device_buffer&& other) noexcept {
    if (this != &other) {
      release();
      p_ = other.p_;
      n_ = other.n_;
      device_ = other.device_;
      other.p_ = nullptr;
      other.n_ = 0;
    }
    return *this;
  }
  ~device_buffer() { release(); }
  void upload(const std::vector<T>& host) {
    if (!host.empty()) {
      KVSIFT_CUDA_CHECK(
          cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
  }
  [[nodiscard]] std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ > 0) {
      KVSIFT_CUDA_CHECK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    }
    return host;
  }
  [[nodiscard]] T* get() const { return p_; }
  [[nodiscard]] std::size_t size() const { return n_; }

 private:
  /// Frees on the device it was allocated on (with two GPUs, memory of the other device is
  /// not always freed from here), leaving the current device as it was.
  void release() noexcept {
    if (p_ == nullptr) return;
    const kvsift::cuda::detail::quiet_device_guard on(device_);
    cudaFree(p_);
    p_ = nullptr;
  }

  T* p_ = nullptr;
  std::size_t n_ = 0;
  int device_ = 0;
};

template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(x);
  } else {
    return __float2bfloat16_rn(x);
  }
}

template <class T>
float to_float(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(x);
  } else {
    return __bfloat162float(x);
  }
}

template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>) {
    return "f32";
  } else if constexpr (std::is_same_v<T, __half>) {
    return "f16";
  } else {
    return "bf16";
  }
}

/// Tolerance for one output element stored as T (values of magnitude <= 1).
template <class T>
double output_tolerance() {
  if constexpr (std::is_same_v<T, float>) {
    return 1e-5;
  } else if constexpr (std::is_same_v<T, __half>) {
    return 1e-3;
  } else {
    return 8e-3;
  }
}

inline std::mt19937_64& rng() {
  static std::mt19937_64 gen(20261123);
  return gen;
}

inline float uniform(float lo, float hi) {
  return std::uniform_real_distribution<float>(lo, hi)(rng());
}

inline int uniform_int(int lo, int hi) {  // inclusive
  return std::uniform_int_distribution<int>(lo, hi)(rng());
}

/// Calls `check(stream)` with a stream created on device 1 while device 0 is current (wrappers
/// must reject it). Constructing one needs two GPUs: on one, says so and returns false.
template <class F>
bool with_foreign_stream(F&& check) {
  int devices = 0;
  KVSIFT_CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (devices < 2) {
    std::printf("  (one device: the foreign-stream check is not exercised)\n");
    return false;
  }
  cudaStream_t other = nullptr;
  KVSIFT_CUDA_CHECK(cudaSetDevice(1));
  KVSIFT_CUDA_CHECK(cudaStreamCreate(&other));
  KVSIFT_CUDA_CHECK(cudaSetDevice(0));
  check(other);
  KVSIFT_CUDA_CHECK(cudaStreamDestroy(other));
  return true;
}

/// Row i of a graph of n nodes that every walk can cross: the ring edge i -> i + 1 first, then
/// up to width - 1 distinct random neighbours other than i (drawn from rng()), the rest of the
/// row left as it was (invalid_id padding).
template <class Id>
void fill_ring_row(Id* row, int i, int n, int width) {
  row[0] = static_cast<Id>((i + 1) % n);
  for (int j = 1; j < width && j < n - 1; ++j) {
    Id v;
    do {
      v = static_cast<Id>(uniform_int(0, n - 1));
    } while (v == static_cast<Id>(i) || std::find(row, row + j, v) != row + j);
    row[j] = v;
  }
}

/// Attention in double of one query q [d] over n tokens of token-major k, v ([n][d]), logits
/// times `scale`: (o [d], lse).
inline std::pair<std::vector<double>, double> full_attention_one(const float* q, const float* k,
                                                                 const float* v, int n, int d,
                                                                 double scale) {
  std::vector<double> s(static_cast<std::size_t>(n));
  double mx = -1e300;
  for (int t = 0; t < n; ++t) {
    double acc = 0;
    for (int j = 0; j < d; ++j) acc += double(q[j]) * k[static_cast<std::size_t>(t) * d + j];
    s[t] = acc * scale;
    mx = std::max(mx, s[t]);
  }
  double z = 0;
  for (int t = 0; t < n; ++t) z += std::exp(s[t] - mx);
  std::vector<double> o(static_cast<std::size_t>(d));
  for (int j = 0; j < d; ++j) {
    double acc = 0;
    for (int t = 0; t < n; ++t)
      acc += std::exp(s[t] - mx) / z * v[static_cast<std::size_t>(t) * d + j];
    o[j] = acc;
  }
  return {std::move(o), mx + std::log(z)};
}

/// rows x d integers in [-range, range], as f32 (exact in f32, f16 and bf16 for small ranges,
/// and so are their dot products and squared distances for small d).
inline std::vector<float> integer_matrix(std::size_t rows, std::size_t d, int range) {
  std::vector<float> v(rows * d);
  for (auto& x : v) x = static_cast<float>(uniform_int(-range, range));
  return v;
}

/// Pinned host bytes (device-accessible), freed on scope exit.
struct pinned_bytes {
  void* p = nullptr;
  explicit pinned_bytes(std::size_t n) { KVSIFT_CUDA_CHECK(cudaMallocHost(&p, n)); }
  pinned_bytes(const pinned_bytes&) = delete;
  pinned_bytes& operator=(const pinned_bytes&) = delete;
  ~pinned_bytes() { cudaFreeHost(p); }
  [[nodiscard]] unsigned char* bytes() const { return static_cast<unsigned char*>(p); }
};

/// Pinned host floats (device-accessible), freed on scope exit.
struct pinned_floats {
  float* p = nullptr;
  explicit pinned_floats(std::size_t n) {
    KVSIFT_CUDA_CHECK(cudaMallocHost(&p, n * sizeof(float)));
  }
  pinned_floats(const pinned_floats&) = delete;
  pinned_floats& operator=(const pinned_floats&) = delete;
  ~pinned_floats() { cudaFreeHost(p); }
};

/// The k best of `tokens` keys of head g (token-major host keys [head][tokens][d]) for query q,
/// by exact inner product, ties to the lower id.
inline std::vector<std::int32_t> exact_topk(const std::vector<float>& keys, int g, int tokens,
                                            int d, const float* q, int k) {
  std::vector<std::pair<double, std::int32_t>> s(static_cast<std::size_t>(tokens));
  for (int t = 0; t < tokens; ++t) {
    const float* key = &keys[(static_cast<std::size_t>(g) * tokens + t) * d];
    double dot = 0;
    for (int i = 0; i < d; ++i) dot += static_cast<double>(q[i]) * key[i];
    s[static_cast<std::size_t>(t)] = {-dot, t};
  }
  std::partial_sort(s.begin(), s.begin() + k, s.end());
  std::vector<std::int32_t> ids(static_cast<std::size_t>(k));
  for (int i = 0; i < k; ++i)
    ids[static_cast<std::size_t>(i)] = s[static_cast<std::size_t>(i)].second;
  return ids;
}

/// Attention in double of query head h (q [heads][d]; KV head h / group) over its tokens
/// ids[indptr[h] .. indptr[h + 1]) of token-major K/V ([kv_head][tokens][d]): (o [heads][d],
/// lse [heads]); an empty list gives o = 0, lse = -inf.
inline std::pair<std::vector<double>, std::vector<double>> attention_reference(
    const std::vector<float>& q, const float* k, const float* v, int tokens, int d, int group,
    const std::vector<std::int64_t>& indptr, const std::vector<std::int32_t>& ids, double scale) {
  const std::size_t heads = indptr.size() - 1;
  std::vector<double> o(heads * d, 0.0), lse(heads, -std::numeric_limits<double>::infinity());
  for (std::size_t h = 0; h < heads; ++h) {
    const std::size_t g = h / static_cast<std::size_t>(group);
    const float* qh = &q[h * d];
    auto row = [&](const float* base, std::int32_t t) {
      return base + (g * static_cast<std::size_t>(tokens) + static_cast<std::size_t>(t)) * d;
    };
    std::vector<double> logit;
    double m = -std::numeric_limits<double>::infinity();
    for (auto i = indptr[h]; i < indptr[h + 1]; ++i) {
      double dot = 0;
      for (int j = 0; j < d; ++j) dot += static_cast<double>(qh[j]) * row(k, ids[i])[j];
      logit.push_back(scale * dot);
      m = std::max(m, logit.back());
    }
    if (logit.empty()) continue;
    double sum = 0;
    for (std::size_t i = 0; i < logit.size(); ++i) {
      const double w = std::exp(logit[i] - m);
      sum += w;
      const float* val = row(v, ids[indptr[h] + static_cast<std::int64_t>(i)]);
      for (int j = 0; j < d; ++j) o[h * d + j] += w * val[j];
    }
    for (int j = 0; j < d; ++j) o[h * d + j] /= sum;
    lse[h] = m + std::log(sum);
  }
  return {o, lse};
}

}  // namespace kvsift::cuda_test
