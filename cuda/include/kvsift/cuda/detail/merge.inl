#pragma once
// Kernels and host dispatch behind <kvsift/cuda/merge.cuh> (internal).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <kvsift/core/error.hpp>
#include <kvsift/cuda/detail/dependent_launch.cuh>
#include <kvsift/cuda/detail/device_buffer.cuh>
#include <kvsift/cuda/detail/fast_divider.cuh>
#include <kvsift/cuda/detail/vec.cuh>
#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda::detail {

/// States of one (position, head): row j is at o + j * o_stride, lse[j * lse_stride].
template <class T>
struct strided_states {
  const T* o;
  const float* lse;
  std::int64_t o_stride;
  std::int64_t lse_stride;
  std::int64_t n;
  __device__ const T* o_at(std::int64_t j) const { return o + j * o_stride; }
  __device__ float lse_at(std::int64_t j) const { return lse[j * lse_stride]; }
};

struct device_indptr {
  const std::int64_t* p;
  __device__ std::int64_t operator()(std::int64_t i) const { return p[i]; }
};

struct fixed_indptr {
  std::int64_t count;
  __device__ std::int64_t operator()(std::int64_t i) const { return i * count; }
};

/// [num_states][num_heads][head_dim] addressed through an indptr: position p owns rows
/// indptr(p) .. indptr(p + 1). `Indptr` is a device pointer or a fixed stride.
/// `range_of` is split from `at` so that a kernel can fetch a row's range ahead of its states.
template <class T, class Indptr>
struct indptr_source {
  /// A row's states are found by a load (the indptr): such merges run merge_indptr_kernel,
  /// which fetches ranges ahead; the flat kernel cannot hide that load, and measured slower.
  static constexpr bool dependent_range = !std::is_same_v<Indptr, fixed_indptr>;
  struct range {
    std::int64_t begin = 0;
    std::int64_t end = 0;
  };
  const T* o;
  const float* lse;
  Indptr indptr;
  int num_heads;
  int head_dim;
  __device__ range range_of(std::int64_t p) const { return {indptr(p), indptr(p + 1)}; }
  __device__ strided_states<T> at(std::int64_t p, int h, range r) const {
    (void)p;
    const std::int64_t row = r.begin * num_heads + h;
    return {o + row * head_dim, lse + row, std::int64_t{num_heads} * head_dim, num_heads,
            r.end - r.begin};
  }
};

/// Two states held in separate arrays of identical layout.
template <class T>
struct pair_states {
  const T* a;
  const T* b;
  float lse_a;
  float lse_b;
  static constexpr std::int64_t n = 2;
  __device__ const T* o_at(std::int64_t j) const { return j == 0 ? a : b; }
  __device__ float lse_at(std::int64_t j) const { return j == 0 ? lse_a : lse_b; }
};

template <class T>
struct pair_source {
  static constexpr bool dependent_range = false;
  struct range {};
  const T* v_a;
  const float* s_a;
  const T* v_b;
  const float* s_b;
  int num_heads;
  int head_dim;
  __device__ range range_of(std::int64_t) const { return {}; }
  __device__ pair_states<T> at(std::int64_t p, int h, range) const {
    const std::int64_t row = p * num_heads + h;
    return {v_a + row * head_dim, v_b + row * head_dim, s_a[row], s_b[row]};
  }
};

/// States merged per loop trip; their loads are all issued before the first one is used.
inline constexpr int merge_chunk = 2;

inline constexpr int merge_max_threads = 512;

/// Merges one chunk of loaded states (lse l[c], raw 16-byte vector raw[c]; an empty or padding
/// state has l = -inf) into a row's running max m, sum s and accumulator acc.
template <class T>
__device__ __forceinline__ void merge_loaded(const float (&l)[merge_chunk],
                                             const uint4 (&raw)[merge_chunk], float& m, float& s,
                                             float (&acc)[vec_size_v<T>]) {
  constexpr int vec = vec_size_v<T>;
  float m_new = m;
#pragma unroll
  for (int c = 0; c < merge_chunk; ++c) m_new = nan_max(m_new, l[c]);
  if (m_new == neg_inf()) return;       // only empty states so far
  const float alpha = expf(m - m_new);  // 0 while m is still -inf
  s *= alpha;
#pragma unroll
  for (int i = 0; i < vec; ++i) acc[i] *= alpha;
#pragma unroll
  for (int c = 0; c < merge_chunk; ++c) {
    const float w = expf(l[c] - m_new);  // 0 for empty and padding states
    s += w;
    float x[vec];
    widen_vec<T>(raw[c], x);
#pragma unroll
    for (int i = 0; i < vec; ++i) acc[i] = fmaf(w, x[i], acc[i]);
  }
  m = m_new;
}

/// Merges vector v[u] of each of U rows (`states[u]`, skipped where !live[u]) into the running
/// max m, sum s and accumulator acc of that row. Every state's loads of all U rows are issued
/// before any is reduced, as raw 16-byte vectors widened only when used: widening each right
/// after its load kept the f16 pair merge at 80% of the copy bandwidth, its loads serialised
/// behind the conversions (f32, which needs none, reached 102%). bad[u] records an lse that is
/// NaN or +inf (the row is then not merged: the CPU merge throws for it). Padding (a row with
/// fewer states than the longest) enters as an empty state, so every row's result is the one a
/// merge of that row alone computes, operation for operation.
template <class T, int U, class States>
__device__ __forceinline__ void merge_vectors(const States (&states)[U], const bool (&live)[U],
                                              const int (&v)[U], float (&m)[U], float (&s)[U],
                                              float (&acc)[U][vec_size_v<T>], bool (&bad)[U]) {
  constexpr int vec = vec_size_v<T>;
  std::int64_t n_max = 0;
#pragma unroll
  for (int u = 0; u < U; ++u) n_max = live[u] && states[u].n > n_max ? states[u].n : n_max;
  for (std::int64_t j0 = 0; j0 < n_max; j0 += merge_chunk) {
    float l[U][merge_chunk];
    uint4 raw[U][merge_chunk];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int c = 0; c < merge_chunk; ++c) {
        if (live[u] && j0 + c < states[u].n) {
          l[u][c] = states[u].lse_at(j0 + c);
          bad[u] |= isnan(l[u][c]) || l[u][c] == -neg_inf();
          raw[u][c] = *reinterpret_cast<const uint4*>(states[u].o_at(j0 + c) + v[u] * vec);
        } else {
          l[u][c] = neg_inf();
          raw[u][c] = make_uint4(0u, 0u, 0u, 0u);  // widens to +0: an empty state
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) merge_loaded<T>(l[u], raw[u], m[u], s[u], acc[u]);
  }
}

/// The merged vector of a row (m, s, acc from merge_vectors): an invalid row (bad) becomes NaN
/// with Propagate, else the empty state's zeros.
template <class T, bool Propagate>
__device__ __forceinline__ void store_merged(T* out, float m, float s,
                                             const float (&acc)[vec_size_v<T>], bool bad) {
  constexpr int vec = vec_size_v<T>;
  float o[vec];
  const float inv = m == neg_inf() || bad ? 0.0f : 1.0f / s;
#pragma unroll
  for (int i = 0; i < vec; ++i) o[i] = bad ? (Propagate ? nanf("") : 0.0f) : acc[i] * inv;
  store_vec(out, o);
}

/// The merged lse of a row; an invalid row is reported in `status` (bit 0) and becomes the
/// empty state (NaN with Propagate). merge_kernel writes its own (in place it must leave an
/// invalid row as it was): routing its stores through this and store_merged cost 2.5 points
/// of copy bandwidth (69.2 / 69.0% -> 66.9 / 66.3%, one H200 command), measured when it still
/// served the indptr merge; the in-place merge was not measured that way.
template <bool Propagate>
__device__ __forceinline__ void store_merged_lse(float* out, float m, float s, bool bad,
                                                 int* status) {
  if (bad && Propagate) {
    *out = nanf("");
  } else if (bad) {
    if (status != nullptr) atomicOr(status, 1);
    *out = neg_inf();
  } else {
    *out = m == neg_inf() ? m : m + logf(s);
  }
}

/// The in-place merge (the out-of-place merges are merge_flat_kernel and merge_indptr_kernel
/// below; this kernel also takes them, which is how those were measured against it: it served
/// the indptr merge at 69% of the copy bandwidth, h200_merge_indptr_pipeline.txt).
/// One block row (threadIdx.y) per (position, head); threadIdx.x walks the 16-byte vectors of
/// the row. A block strides over tiles of blockDim.y rows (one tile per block as launched). The
/// next row's state range is fetched ahead, a no-op for the pair sources this kernel now takes
/// (their range is empty; it served indptr sources before merge_indptr_kernel). Every thread
/// recomputes the running max and sum from the (cached) lse values, so no reduction is needed;
/// the in-place merge must wait for the whole row to have read its lse before overwriting it.
/// (512, 2) caps registers at 64 so that 32 warps per SM keep enough loads in flight.
template <class T, bool InPlace, bool Propagate, class Source>
__global__ void __launch_bounds__(merge_max_threads, 2)
    merge_kernel(Source src, std::int64_t p0, T* out_o, float* out_lse, std::int64_t num_rows,
                 fast_divider heads, int head_dim, int* status) {
  constexpr int vec = vec_size_v<T>;
  using range = typename Source::range;
  const int vecs = head_dim / vec;
  const std::int64_t tiles = (num_rows + blockDim.y - 1) / blockDim.y;
  const std::int64_t row_step = static_cast<std::int64_t>(gridDim.x) * blockDim.y;
  std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  // Rows of one launch are < 2^31 (launch_merge splits larger merges), so a row's position is
  // one multiply-high away (fast_divider); p0 is the launch's first position.
  const auto pos_of = [&](std::int64_t rw) {
    return static_cast<std::int64_t>(heads.div(static_cast<std::uint32_t>(rw)));
  };
  range r{};
  if (row < num_rows) r = src.range_of(p0 + pos_of(row));
  for (std::int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const std::int64_t next_row = row + row_step;
    range next_r{};
    if (next_row < num_rows) next_r = src.range_of(p0 + pos_of(next_row));
    const bool active = row < num_rows;
    float m = neg_inf();
    float s = 0.0f;
    // An lse that is NaN or +inf makes the row invalid (the CPU merge throws for it): the row
    // is not merged. Every thread of the row reads every lse, so all agree on `bad` without a
    // reduction; thread x = 0 always runs the loop below (vecs >= 1) and reports it.
    bool bad = false;
    if (active) {
      const std::int64_t p = pos_of(row);
      const int h = static_cast<int>(row - p * heads.divisor());
      const auto states = src.at(p0 + p, h, r);
      for (int v = threadIdx.x; v < vecs; v += blockDim.x) {
        float acc[vec] = {};
        m = neg_inf();
        s = 0.0f;
        for (std::int64_t j0 = 0; j0 < states.n; j0 += merge_chunk) {
          float l[merge_chunk];
          float x[merge_chunk][vec];
#pragma unroll
          for (int c = 0; c < merge_chunk; ++c) {
            if (j0 + c < states.n) {
              l[c] = states.lse_at(j0 + c);
              bad |= isnan(l[c]) || l[c] == -neg_inf();
              load_vec(states.o_at(j0 + c) + v * vec, x[c]);
            } else {
              l[c] = neg_inf();
#pragma unroll
              for (int i = 0; i < vec; ++i) x[c][i] = 0.0f;
            }
          }
          float m_new = m;
#pragma unroll
          for (int c = 0; c < merge_chunk; ++c) m_new = nan_max(m_new, l[c]);
          if (m_new == neg_inf()) continue;     // only empty states so far
          const float alpha = expf(m - m_new);  // 0 while m is still -inf
          s *= alpha;
#pragma unroll
          for (int i = 0; i < vec; ++i) acc[i] *= alpha;
#pragma unroll
          for (int c = 0; c < merge_chunk; ++c) {
            const float w = expf(l[c] - m_new);  // 0 for empty and padding states
            s += w;
#pragma unroll
            for (int i = 0; i < vec; ++i) acc[i] = fmaf(w, x[c][i], acc[i]);
          }
          m = m_new;
        }
        float o[vec];
        const float inv = m == neg_inf() || bad ? 0.0f : 1.0f / s;
#pragma unroll
        for (int i = 0; i < vec; ++i) o[i] = bad ? (Propagate ? nanf("") : 0.0f) : acc[i] * inv;
        // Invalid rows: out of place they become the empty state; in place they are left as
        // they were (the CPU merge_into leaves its accumulator unchanged when it throws).
        if (!(InPlace && bad && !Propagate)) store_vec(out_o + row * head_dim + v * vec, o);
      }
    }
    if constexpr (InPlace) __syncthreads();
    if (active && threadIdx.x == 0) {
      if (bad && Propagate) {
        out_lse[row] = nanf("");
      } else if (bad) {
        if (status != nullptr) atomicOr(status, 1);
        if constexpr (!InPlace) out_lse[row] = neg_inf();
      } else {
        out_lse[row] = m == neg_inf() ? m : m + logf(s);
      }
    }
    row = next_row;
    r = next_r;
  }
}

/// Vectors per thread of the out-of-place merge when the merge fills the device (its vectors
/// are loaded, every state of each, before any is reduced); a merge smaller than one full wave
/// of the device takes one vector per thread instead, for twice the threads.
inline constexpr int merge_flat_vectors = 2;

/// The out-of-place merge over a flat index of 16-byte vectors: vector i is vector
/// i % vecs of row i / vecs; thread t handles vectors t + u * (threads in the grid) for u < U,
/// its loads of all in flight together (merge_vectors), consecutive threads on consecutive
/// vectors of a row. One trip per thread, no grid-stride loop: the blocks are short and the
/// scheduler keeps every SM full. Measured on an H200 against merge_kernel (a block row per
/// (position, head)), pair merges of 32768 x 32 x 128: f16 80% -> 91% of the copy bandwidth,
/// bf16 80% -> 90%, f32 84% -> 102% (bench/results/h200_merge_flat.txt, which also has the
/// variants: one vector per thread, four, a grid-stride loop, streaming loads; all slower).
/// (512, 2) caps registers at 64: +0.5 point for bf16 pairs (h200_merge_indptr_rows.txt).
template <class T, bool Propagate, int U, class Source>
__global__ void __launch_bounds__(merge_max_threads, 2)
    merge_flat_kernel(Source src, std::int64_t p0, T* out_o, float* out_lse, std::int64_t num_rows,
                      fast_divider heads, fast_divider vecs, int head_dim, int* status) {
  constexpr int vec = vec_size_v<T>;
  // Vectors of one launch are < 2^31 (launch_merge splits larger merges): the index maps to
  // (row, vector) and (position, head) by 32-bit multiply-highs (fast_divider), not 64-bit
  // divisions; p0 is the launch's first position.
  const std::int64_t total = num_rows * vecs.divisor();
  // Launched as a dependent of the kernel that made the states (sparse_attention's splits),
  // this is where it waits for them; otherwise a no-op.
  wait_for_prior_grid();
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  bool live[U];
  std::int64_t row[U];
  int v[U];
  decltype(src.at(0, 0, typename Source::range{})) states[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const std::int64_t i = first + u * stride;
    live[u] = i < total;
    const std::uint32_t r32 = live[u] ? vecs.div(static_cast<std::uint32_t>(i)) : 0u;
    row[u] = r32;
    v[u] = static_cast<int>(i - row[u] * vecs.divisor());
    if (live[u]) {
      const std::uint32_t p = heads.div(r32);
      states[u] = src.at(p0 + p, static_cast<int>(r32 - p * heads.divisor()), src.range_of(p0 + p));
    }
  }
  float m[U], s[U], acc[U][vec];
  bool bad[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    m[u] = neg_inf();
    s[u] = 0.0f;
    bad[u] = false;
#pragma unroll
    for (int i = 0; i < vec; ++i) acc[u][i] = 0.0f;
  }
  merge_vectors<T>(states, live, v, m, s, acc, bad);
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (!live[u]) continue;
    store_merged<T, Propagate>(out_o + row[u] * head_dim + v[u] * vec, m[u], s[u], acc[u], bad[u]);
    // The row's first vector writes its lse.
    if (v[u] == 0) store_merged_lse<Propagate>(out_lse + row[u], m[u], s[u], bad[u], status);
  }
}

/// The merge through a device indptr: merge_flat_kernel's flat (row, vector) items, in a
/// grid-stride loop that keeps two items of each thread in flight. A row's states are found
/// through a load (indptr[p], indptr[p + 1]), so an item costs two dependent round trips; the
/// loop fetches the range of the item after next and the first chunk of the next item's states
/// while the current one is reduced. (merge_kernel, one item per trip with the next range
/// prefetched, had 32 bytes per thread in flight and reached 69% of the copy bandwidth where
/// the flat pair merge, with 64, reached 94%: h200_merge_indptr_pipeline.txt.)
template <class T, bool Propagate>
__global__ void __launch_bounds__(merge_max_threads, 2)
    merge_indptr_kernel(const T* __restrict__ o, const float* __restrict__ lse,
                        const std::int64_t* __restrict__ indptr, std::int64_t p0, T* out_o,
                        float* out_lse, std::uint32_t total, fast_divider heads, fast_divider vecs,
                        int* status) {
  constexpr int vec = vec_size_v<T>;
  const int head_dim = static_cast<int>(vecs.divisor()) * vec;
  // State j of a row whose first state is row index b (= begin * heads + h) is o row
  // b + j * heads, lse b + j * heads.
  const std::int64_t state_stride = heads.divisor();
  struct range {
    std::int64_t begin = 0;
    std::int64_t end = 0;
  };
  // Chunk j0 of a row's states (first state at row index base, n states), vector v; states
  // past n enter as empty ones.
  const auto load_chunk = [&](std::int64_t base, std::int64_t n, std::int64_t j0, int v,
                              float(&l)[merge_chunk], uint4(&raw)[merge_chunk]) {
#pragma unroll
    for (int c = 0; c < merge_chunk; ++c) {
      if (j0 + c < n) {
        const std::int64_t b = base + (j0 + c) * state_stride;
        l[c] = lse[b];
        raw[c] = *reinterpret_cast<const uint4*>(o + b * head_dim + v * vec);
      } else {
        l[c] = neg_inf();
        raw[c] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  };
  // An item's first chunk, loaded one trip ahead: base row index, count, lse and raw vectors.
  struct pending {
    std::int64_t base = 0;
    std::int64_t n = 0;
    float l[merge_chunk];
    uint4 raw[merge_chunk];
  };
  const auto range_of = [&](std::uint32_t i) {
    range r;
    if (i < total) {
      const std::uint32_t p = heads.div(vecs.div(i));
      r = {indptr[p0 + p], indptr[p0 + p + 1]};
    }
    return r;
  };
  const auto load = [&](std::uint32_t i, range r) {
    pending f;
    const std::uint32_t row = vecs.div(i);
    const std::uint32_t p = heads.div(row);
    f.base = r.begin * state_stride + (row - p * heads.divisor());
    f.n = i < total ? r.end - r.begin : 0;
    load_chunk(f.base, f.n, 0, static_cast<int>(i - row * vecs.divisor()), f.l, f.raw);
    return f;
  };
  const std::uint32_t stride = gridDim.x * blockDim.x;
  std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  pending cur = load(i, range_of(i));
  range next_range = range_of(i + stride);
  for (; i < total; i += stride) {
    const pending next = load(i + stride, next_range);
    next_range = range_of(i + 2 * stride);
    const std::uint32_t row = vecs.div(i);
    const int v = static_cast<int>(i - row * vecs.divisor());
    float m = neg_inf(), s = 0.0f, acc[vec] = {};
    // An lse that is NaN or +inf makes the row invalid (the CPU merge throws for it).
    bool bad = false;
    const auto merge_in = [&](const float(&l)[merge_chunk], const uint4(&raw)[merge_chunk]) {
#pragma unroll
      for (int c = 0; c < merge_chunk; ++c) bad |= isnan(l[c]) || l[c] == -neg_inf();
      merge_loaded<T>(l, raw, m, s, acc);
    };
    merge_in(cur.l, cur.raw);
    // Rows with more states than one chunk load the rest here, a chunk per round trip.
    for (std::int64_t j0 = merge_chunk; j0 < cur.n; j0 += merge_chunk) {
      float l[merge_chunk];
      uint4 raw[merge_chunk];
      load_chunk(cur.base, cur.n, j0, v, l, raw);
      merge_in(l, raw);
    }
    store_merged<T, Propagate>(out_o + static_cast<std::int64_t>(row) * head_dim + v * vec, m, s,
                               acc, bad);
    // The row's first vector writes its lse.
    if (v == 0) store_merged_lse<Propagate>(out_lse + row, m, s, bad, status);
    cur = next;
  }
}

template <class T>
void validate_merge_shape(std::int64_t rows, int num_heads, int head_dim, const char* what) {
  static_assert(is_supported_element_v<T>, "element type must be float, __half or __nv_bfloat16");
  constexpr int vec = vec_size_v<T>;
  kvsift::detail::require(rows >= 0, what, ": number of rows/positions must be >= 0, got ", rows);
  kvsift::detail::require(num_heads > 0, what, ": num_heads must be > 0, got ", num_heads);
  kvsift::detail::require<kvsift::dimension_mismatch>(
      head_dim > 0 && head_dim % vec == 0, what, ": head_dim must be a positive multiple of ", vec,
      " for this element type (16-byte vectors), got ", head_dim);
}

inline void require_device_ptr(const void* p, bool needed, const char* what, const char* name) {
  kvsift::detail::require(!needed || p != nullptr, what, ": ", name,
                          " is null but the sizes are nonzero");
  kvsift::detail::require(!needed || is_aligned16(p), what, ": ", name, " must be 16-byte aligned");
}

/// Vectors (16 bytes each) of one merge launch, at most: the kernels index a launch's vectors
/// and rows in 32 bits (fast_divider), so a larger merge is split into launches of whole
/// positions (2^30 vectors = 16 GiB of output per launch).
inline constexpr std::int64_t merge_launch_vectors = std::int64_t{1} << 30;

/// Propagate: an invalid row's output is NaN (o and lse) instead of the empty state. Only for
/// states the library made itself (sparse_attention's splits), where NaN can only come from a
/// NaN query and must stay visible in that head's output, as it does without splits.
/// `max_vectors` (<= merge_launch_vectors) caps one launch, for the tests of the split.
/// `dependent`: the flat kernel is launched as a dependent of the kernel before it on the stream
/// (launch_dependent), which must have made the states; other kernels launch normally.
template <class T, bool InPlace, class Source, bool Propagate = false>
void launch_merge(const Source& src, T* out_o, float* out_lse, std::int64_t rows, int num_heads,
                  int head_dim, cudaStream_t stream, const merge_policy& policy, int* status,
                  const char* what, std::int64_t max_vectors = merge_launch_vectors,
                  bool dependent = false) {
  kvsift::detail::require(
      policy.threads_per_block >= 32 && policy.threads_per_block <= merge_max_threads, what,
      ": merge_policy.threads_per_block must be in [32, ", merge_max_threads, "], got ",
      policy.threads_per_block);
  const int vecs = head_dim / vec_size_v<T>;
  const std::int64_t position_vectors = std::int64_t{num_heads} * vecs;
  kvsift::detail::require(max_vectors >= 1 && max_vectors <= merge_launch_vectors, what,
                          ": expected 1 <= max_vectors <= ", merge_launch_vectors, ", got ",
                          max_vectors);
  kvsift::detail::require(position_vectors <= merge_launch_vectors, what,
                          ": one position's num_heads x head_dim = ", num_heads, " x ", head_dim,
                          " exceeds ", merge_launch_vectors, " 16-byte vectors");
  if (rows == 0) return;
  int device = 0;
  int sms = 0;
  KVSIFT_CUDA_CHECK(cudaGetDevice(&device));
  KVSIFT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const fast_divider by_heads(num_heads);
  const fast_divider by_vecs(vecs);
  const std::int64_t positions = rows / num_heads;
  const std::int64_t per_launch = std::max<std::int64_t>(1, max_vectors / position_vectors);
  for (std::int64_t p0 = 0; p0 < positions; p0 += per_launch) {
    const std::int64_t launch_rows = std::min(per_launch, positions - p0) * num_heads;
    T* const o = out_o + p0 * num_heads * head_dim;
    float* const lse = out_lse + p0 * num_heads;
    if constexpr (!InPlace && !Source::dependent_range) {
      const std::int64_t total = launch_rows * vecs;
      // Below one full wave (2048 threads per SM) the merge is latency-bound: one vector per
      // thread, for twice the threads. (With two, batch-1 sparse attention, whose split merge
      // is 32 heads x 17 splits, took 20.1 us against 17.7 us: h200_merge_flat.txt.)
      const bool wide = total >= static_cast<std::int64_t>(sms) * 2048;
      const std::int64_t per_block =
          static_cast<std::int64_t>(policy.threads_per_block) * (wide ? merge_flat_vectors : 1);
      const std::int64_t flat_blocks = (total + per_block - 1) / per_block;
      const auto launch = [&](auto kernel) {
        const dim3 grid(static_cast<unsigned>(flat_blocks));
        const dim3 block(static_cast<unsigned>(policy.threads_per_block));
        if (dependent && p0 == 0) {  // only the first launch follows the states' kernel
          launch_dependent(kernel, grid, block, stream, device, src, p0, o, lse, launch_rows,
                           by_heads, by_vecs, head_dim, status);
        } else {
          kernel<<<grid, block, 0, stream>>>(src, p0, o, lse, launch_rows, by_heads, by_vecs,
                                             head_dim, status);
        }
      };
      wide ? launch(merge_flat_kernel<T, Propagate, merge_flat_vectors, Source>)
           : launch(merge_flat_kernel<T, Propagate, 1, Source>);
    } else if constexpr (!InPlace) {
      // States found through a device indptr: the pipelined grid-stride kernel with as many
      // blocks as are resident at once (twice that, whose second wave starts behind the first,
      // measured 1 point of copy bandwidth slower: h200_merge_indptr_pipeline.txt).
      const std::int64_t total = launch_rows * vecs;
      const std::int64_t threads = policy.threads_per_block;
      int per_sm = 0;
      KVSIFT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, merge_indptr_kernel<T, Propagate>, static_cast<int>(threads), 0));
      const std::int64_t resident = static_cast<std::int64_t>(sms) * std::max(1, per_sm);
      const std::int64_t blocks = std::min((total + threads - 1) / threads, resident);
      merge_indptr_kernel<T, Propagate>
          <<<static_cast<unsigned>(blocks), static_cast<unsigned>(threads), 0, stream>>>(
              src.o, src.lse, src.indptr.p, p0, o, lse, static_cast<std::uint32_t>(total), by_heads,
              by_vecs, status);
    } else {
      // In place: a block row per (position, head), whose threads must all have read the
      // row's lse before it is overwritten (merge_kernel's barrier). One row tile per block:
      // the fixed-count merges measured faster that way than striding over tiles (97% vs 83%
      // of copy bandwidth on an H100; a partial second wave of long blocks leaves the tail idle).
      const int bx = std::min(vecs, 32);
      const int by = std::max(1, policy.threads_per_block / bx);
      const std::int64_t blocks = (launch_rows + by - 1) / by;
      merge_kernel<T, InPlace, Propagate>
          <<<static_cast<unsigned>(blocks), dim3(bx, by), 0, stream>>>(src, p0, o, lse, launch_rows,
                                                                       by_heads, head_dim, status);
    }
    KVSIFT_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace kvsift::cuda::detail

namespace kvsift::cuda {

template <class T>
void merge_states(const T* states_o, const float* states_lse, std::int64_t num_states,
                  const std::int64_t* indptr, std::int64_t num_pos, int num_heads, int head_dim,
                  T* out_o, float* out_lse, cudaStream_t stream, const merge_policy& policy,
                  int* status) {
  constexpr const char* what = "kvsift::cuda::merge_states";
  detail::validate_merge_shape<T>(num_pos, num_heads, head_dim, what);
  kvsift::detail::require(num_states >= 0, what, ": num_states must be >= 0, got ", num_states);
  if (num_pos == 0) return;
  detail::require_device_ptr(indptr, true, what, "indptr");
  detail::require_device_ptr(out_o, true, what, "out_o");
  kvsift::detail::require(out_lse != nullptr, what, ": out_lse is null");
  detail::require_device_ptr(states_o, num_states > 0, what, "states_o");
  kvsift::detail::require(num_states == 0 || states_lse != nullptr, what,
                          ": states_lse is null but num_states = ", num_states);
  const int device = detail::current_device();
  detail::require_stream_on(stream, device, what);
  detail::require_device_pointer(indptr, device, what, "indptr");
  detail::require_device_pointer(out_o, device, what, "out_o");
  detail::require_device_pointer(out_lse, device, what, "out_lse");
  if (num_states > 0) {
    detail::require_device_pointer(states_o, device, what, "states_o");
    detail::require_device_pointer(states_lse, device, what, "states_lse");
  }
  detail::require_optional_device_pointer(status, device, what, "status");
  const detail::indptr_source<T, detail::device_indptr> src{
      states_o, states_lse, detail::device_indptr{indptr}, num_heads, head_dim};
  detail::launch_merge<T, false>(src, out_o, out_lse, num_pos * num_heads, num_heads, head_dim,
                                 stream, policy, status, what);
}

namespace detail {

/// merge_state; with check_devices false the pointers and stream are taken to be the current
/// device's (for the library's own steps, which checked their inputs once).
template <class T>
void merge_pair(const T* v_a, const float* s_a, const T* v_b, const float* s_b, T* v_out,
                float* s_out, std::int64_t num_rows, int num_heads, int head_dim,
                cudaStream_t stream, const merge_policy& policy, int* status, bool check_devices) {
  constexpr const char* what = "kvsift::cuda::merge_state";
  validate_merge_shape<T>(num_rows, num_heads, head_dim, what);
  if (num_rows == 0) return;
  require_device_ptr(v_a, true, what, "v_a");
  require_device_ptr(v_b, true, what, "v_b");
  require_device_ptr(v_out, true, what, "v_out");
  kvsift::detail::require(s_a != nullptr && s_b != nullptr && s_out != nullptr, what,
                          ": s_a, s_b and s_out must be non-null");
  if (check_devices) {
    const int device = current_device();
    require_stream_on(stream, device, what);
    require_device_pointer(v_a, device, what, "v_a");
    require_device_pointer(s_a, device, what, "s_a");
    require_device_pointer(v_b, device, what, "v_b");
    require_device_pointer(s_b, device, what, "s_b");
    require_device_pointer(v_out, device, what, "v_out");
    require_device_pointer(s_out, device, what, "s_out");
    require_optional_device_pointer(status, device, what, "status");
  }
  const pair_source<T> src{v_a, s_a, v_b, s_b, num_heads, head_dim};
  launch_merge<T, false>(src, v_out, s_out, num_rows * num_heads, num_heads, head_dim, stream,
                         policy, status, what);
}

}  // namespace detail

template <class T>
void merge_state(const T* v_a, const float* s_a, const T* v_b, const float* s_b, T* v_out,
                 float* s_out, std::int64_t num_rows, int num_heads, int head_dim,
                 cudaStream_t stream, const merge_policy& policy, int* status) {
  detail::merge_pair(v_a, s_a, v_b, s_b, v_out, s_out, num_rows, num_heads, head_dim, stream,
                     policy, status, true);
}

template <class T>
void merge_state_in_place(T* v, float* s, const T* v_other, const float* s_other,
                          std::int64_t num_rows, int num_heads, int head_dim, cudaStream_t stream,
                          const merge_policy& policy, int* status) {
  constexpr const char* what = "kvsift::cuda::merge_state_in_place";
  detail::validate_merge_shape<T>(num_rows, num_heads, head_dim, what);
  if (num_rows == 0) return;
  detail::require_device_ptr(v, true, what, "v");
  detail::require_device_ptr(v_other, true, what, "v_other");
  kvsift::detail::require(s != nullptr && s_other != nullptr, what,
                          ": s and s_other must be non-null");
  const int device = detail::current_device();
  detail::require_stream_on(stream, device, what);
  detail::require_device_pointer(v, device, what, "v");
  detail::require_device_pointer(s, device, what, "s");
  detail::require_device_pointer(v_other, device, what, "v_other");
  detail::require_device_pointer(s_other, device, what, "s_other");
  detail::require_optional_device_pointer(status, device, what, "status");
  const detail::pair_source<T> src{v, s, v_other, s_other, num_heads, head_dim};
  detail::launch_merge<T, true>(src, v, s, num_rows * num_heads, num_heads, head_dim, stream,
                                policy, status, what);
}

}  // namespace kvsift::cuda
