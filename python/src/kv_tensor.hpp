#pragma once
// K/V tensors of the Python module as kvsift::kv_view: shared by the attention functions
// (attention.cpp) and the plan executor (planner.cpp).
#include <algorithm>
#include <cstddef>
#include <utility>

#include "common.hpp"
#include "kvsift/attention/sparse_attention.hpp"

namespace kvsift_python {

/// K/V tensors as a kv_view: (tokens, dim) for one KV head, or (tokens, kv_heads, dim) in any
/// layout whose innermost axis is contiguous (e.g. a slice of a preallocated cache).
template <class T>
kvsift::kv_view<T> kv_of(const tensor& k, const tensor& v) {
  require<kvsift::dimension_mismatch>(
      k.ndim() == v.ndim() && (k.ndim() == 2 || k.ndim() == 3),
      "keys/values: expected both 2-D (tokens x dim) or both 3-D (tokens x kv_heads x dim), got ",
      k.ndim(), "-D keys and ", v.ndim(), "-D values");
  for (std::size_t ax = 0; ax < k.shape.size(); ++ax) {
    require<kvsift::dimension_mismatch>(k.shape[ax] == v.shape[ax],
                                        "keys/values: expected equal shapes, got ", k.shape[ax],
                                        " and ", v.shape[ax], " on axis ", ax);
  }
  if (k.ndim() == 2) return kvsift::kv_view<T>(matrix_of<T>(k, "keys"), matrix_of<T>(v, "values"));
  auto head_matrix = [](const tensor& a, const char* what) {
    const auto n = static_cast<std::size_t>(a.shape[0]);
    const auto d = static_cast<std::size_t>(a.shape[2]);
    if (n > 0 && d > 0 && a.shape[1] > 0) require_aligned(a, what);
    require(d <= 1 || stride_elems(a, 2, what) == 1, what,
            ": expected a contiguous last axis, got stride ", a.strides[2], " (pass ",
            kvsift_python::layout_fix(a), "; kvsift does not copy silently)");
    // The strides are passed through unchanged: kvsift must read exactly the elements numpy
    // would. Replacing a stride (a broadcast's 0 by d, as this once did) reads past the buffer.
    const std::size_t rs = n <= 1
                               ? std::max<std::size_t>(d * static_cast<std::size_t>(a.shape[1]), 1)
                               : stride_elems(a, 0, what);
    require(n <= 1 || rs >= d, what, ": expected a token stride >= ", d,
            " elements (rows must not overlap), got ", rs, " (pass ", kvsift_python::layout_fix(a),
            "; kvsift does not copy silently)");
    const std::size_t hs = a.shape[1] <= 1 ? d : stride_elems(a, 1, what);
    return std::pair(kvsift::matrix_view<const T>(reinterpret_cast<const T*>(a.data), n, d,
                                                  std::max<std::size_t>({rs, d, 1})),
                     hs);
  };
  const auto [km, khs] = head_matrix(k, "keys");
  const auto [vm, vhs] = head_matrix(v, "values");
  require(khs == vhs, "keys/values: expected the same head stride, got ", khs, " and ", vhs,
          " elements");
  return kvsift::kv_view<T>(km, vm, static_cast<std::size_t>(k.shape[1]), khs);
}

/// Calls `fn(kv_view<T>)` for the K/V element type (f32, f16, bf16); the tensors stay alive for
/// the call. The GIL is the caller's business (fn may build Python results).
template <class Fn>
decltype(auto) visit_kv(const py::handle& keys_h, const py::handle& values_h, Fn&& fn) {
  const tensor k = tensor_of(keys_h, "keys");
  const tensor v = tensor_of(values_h, "values");
  require_dtype(k, dtypes::stored, "keys");
  require_dtype(v, dtypes::stored, "values");
  if (k.kind != v.kind || k.itemsize != v.itemsize) {
    fail<kvsift::invalid_argument>("values: expected the dtype of keys (",
                                   kvsift_python::dtype_name(k), "), got ",
                                   kvsift_python::dtype_name(v));
  }
  if (k.is_f32()) return fn(kv_of<float>(k, v));
  if (k.is_f16()) return fn(kv_of<kvsift::half>(k, v));
  return fn(kv_of<kvsift::bfloat16>(k, v));
}

/// One partial state from `fn(kv, state)`, computed with the GIL released.
}  // namespace kvsift_python
