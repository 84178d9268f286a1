// kvsift._kvsift_torch: kvsift's CUDA merge for torch tensors without the generic DLPack route,
// as a Python function taking at::Tensor (kvsift._kvsift_torch.merge_state, what
// kvsift.cuda.merge_state calls for torch tensors) and as a PyTorch custom operator
// (torch.ops.kvsift.merge_state, for torch.compile and TorchScript users), both registered when
// the module is imported. Built only with KVSIFT_PY_TORCH=ON, against the torch that imports it.
//
// Why: a small merge (one decode step's [1, 32, 128] states) takes about 4 us from C++; through
// kvsift._kvsift_cuda it took 18-19 us, most of it the two output allocations from Python
// (torch.empty_like, 3.4 us), the six DLPack exports and their intake (3.9 us) and the Python
// wrapper. Here the outputs are allocated and the stream read in C++, and the tensors arrive as
// at::Tensor through torch's own pybind11 caster. The custom operator alone costs 1.2-1.6x more
// from Python than this function: the dispatcher's boxed call from Python is the difference
// (bench/results/h200_python_merge_torch.txt).
//
// The checks and their messages are kvsift.cuda's (ValueError, naming the fix), so a caller sees
// the same errors on every route.
#include <ATen/core/Tensor.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/utils/pybind.h>  // torch's pybind11 with its at::Tensor caster
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <string>
#include <tuple>

#include "../cuda/cuda_ops.hpp"

namespace {

namespace ops = kvsift_python::cuda_ops;

/// A CUDA tensor on the current device, compact row-major, as `what`.
void require_device_tensor(const at::Tensor& t, const char* what, int device) {
  TORCH_CHECK_VALUE(t.is_cuda(), what, ": expected a tensor in CUDA device memory, got one on ",
                    t.device(), " (move it with x.cuda())");
  TORCH_CHECK_VALUE(t.get_device() == device, what, ": tensor is on cuda:", t.get_device(),
                    " but the current device is cuda:", device, " (call torch.cuda.set_device(",
                    t.get_device(), ") or move the tensor there)");
  TORCH_CHECK_VALUE(t.is_contiguous(), what,
                    ": expected a contiguous row-major tensor; make it contiguous with "
                    "x.contiguous()");
}

ops::dtype value_type(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return ops::dtype::f32;
    case at::kHalf:
      return ops::dtype::f16;
    case at::kBFloat16:
      return ops::dtype::bf16;
    default:
      TORCH_CHECK_VALUE(false, what, ": expected float32, float16 or bfloat16, got ",
                        t.scalar_type());
  }
}

/// A shape as kvsift.cuda's messages write it: (2, 4, 64).
std::string shape_str(at::IntArrayRef shape) {
  std::string r = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    r += (i != 0 ? ", " : "") + std::to_string(shape[i]);
  }
  return r + (shape.size() == 1 ? ",)" : ")");
}

/// The [seq, heads] float32 lse of the [seq, heads, dim] state `v`.
void require_lse(const at::Tensor& s, const at::Tensor& v, const char* what) {
  TORCH_CHECK_VALUE(s.scalar_type() == at::kFloat, what, ": expected float32, got ",
                    s.scalar_type(), " (convert with x.to(torch.float32))");
  TORCH_CHECK_VALUE(s.dim() == 2 && s.size(0) == v.size(0) && s.size(1) == v.size(1), what,
                    ": expected shape ", shape_str(v.sizes().slice(0, 2)), ", got ",
                    shape_str(s.sizes()));
}

/// A new contiguous tensor of `like`'s shape, dtype and device from the CUDA caching allocator
/// directly (at::empty_like goes through the dispatcher: about 1 us more per output).
at::Tensor empty_cuda_like(const at::Tensor& like) {
  return at::Tensor(at::detail::empty_cuda(like.sizes(), like.scalar_type(), like.device(),
                                           at::MemoryFormat::Contiguous));
}

int as_int(std::int64_t v, const char* what) {
  TORCH_CHECK_VALUE(v >= 0 && v <= std::numeric_limits<int>::max(), what, ": ", v,
                    " does not fit the kernel's int range");
  return static_cast<int>(v);
}

/// A value tensor like v_a: on `device`, v_a's dtype and shape (v_b, v_out).
void require_like_v_a(const at::Tensor& x, const at::Tensor& v_a, const char* what, int device) {
  require_device_tensor(x, what, device);
  TORCH_CHECK_VALUE(x.scalar_type() == v_a.scalar_type(), "merge_state: ", what,
                    " must have v_a's dtype ", v_a.scalar_type(), ", got ", x.scalar_type());
  TORCH_CHECK_VALUE(x.sizes() == v_a.sizes(), what, ": expected shape ", shape_str(v_a.sizes()),
                    ", got ", shape_str(x.sizes()));
}

/// Checks the inputs of a merge on the current device `device`; returns the element type.
ops::dtype merge_inputs(const at::Tensor& v_a, const at::Tensor& s_a, const at::Tensor& v_b,
                        const at::Tensor& s_b, int device) {
  require_device_tensor(v_a, "v_a", device);
  require_device_tensor(s_a, "s_a", device);
  require_device_tensor(s_b, "s_b", device);
  TORCH_CHECK_VALUE(v_a.dim() == 3, "v_a: expected [seq, heads, dim], got ", v_a.dim(), " axes");
  const ops::dtype t = value_type(v_a, "v_a");
  require_like_v_a(v_b, v_a, "v_b", device);
  require_lse(s_a, v_a, "s_a");
  require_lse(s_b, v_a, "s_b");
  return t;
}

/// The merge into (v, s), checked, on the current stream.
void launch_merge(ops::dtype t, const at::Tensor& v_a, const at::Tensor& s_a, const at::Tensor& v_b,
                  const at::Tensor& s_b, const at::Tensor& v, const at::Tensor& s, int device) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  ops::merge_state(t, v_a.data_ptr(), s_a.data_ptr<float>(), v_b.data_ptr(), s_b.data_ptr<float>(),
                   v.data_ptr(), s.data_ptr<float>(), v_a.size(0), as_int(v_a.size(1), "heads"),
                   as_int(v_a.size(2), "dim"), reinterpret_cast<std::intptr_t>(stream), nullptr);
}

/// merge((v_a, s_a), (v_b, s_b)) into new tensors, natural-log lse, on the current stream.
std::tuple<at::Tensor, at::Tensor> merge_state(const at::Tensor& v_a, const at::Tensor& s_a,
                                               const at::Tensor& v_b, const at::Tensor& s_b) {
  const int device = c10::cuda::current_device();
  const ops::dtype t = merge_inputs(v_a, s_a, v_b, s_b, device);
  at::Tensor v = empty_cuda_like(v_a);
  at::Tensor s = empty_cuda_like(s_a);
  launch_merge(t, v_a, s_a, v_b, s_b, v, s, device);
  return {v, s};
}

/// The same into the caller's (v_out, s_out): no allocation (CUDA-graph friendly).
void merge_state_out(const at::Tensor& v_a, const at::Tensor& s_a, const at::Tensor& v_b,
                     const at::Tensor& s_b, const at::Tensor& v_out, const at::Tensor& s_out) {
  const int device = c10::cuda::current_device();
  const ops::dtype t = merge_inputs(v_a, s_a, v_b, s_b, device);
  require_like_v_a(v_out, v_a, "v_out", device);
  require_device_tensor(s_out, "s_out", device);
  require_lse(s_out, v_a, "s_out");
  launch_merge(t, v_a, s_a, v_b, s_b, v_out, s_out, device);
}

}  // namespace

TORCH_LIBRARY(kvsift, m) {
  m.def("merge_state(Tensor v_a, Tensor s_a, Tensor v_b, Tensor s_b) -> (Tensor, Tensor)");
}

// CPU too, so that host tensors reach the check above and its message instead of the
// dispatcher's "could not run with arguments from the CPU backend".
TORCH_LIBRARY_IMPL(kvsift, CUDA, m) { m.impl("merge_state", &merge_state); }
TORCH_LIBRARY_IMPL(kvsift, CPU, m) { m.impl("merge_state", &merge_state); }

PYBIND11_MODULE(_kvsift_torch, m) {
  m.doc() =
      "kvsift's CUDA merge on torch tensors through at::Tensor (and torch.ops.kvsift.merge_state, "
      "registered on import). Use kvsift.cuda.merge_state.";
  m.def("merge_state", &merge_state, pybind11::arg("v_a"), pybind11::arg("s_a"),
        pybind11::arg("v_b"), pybind11::arg("s_b"),
        "(v, s) = merge((v_a, s_a), (v_b, s_b)): [seq, heads, dim] float32/float16/bfloat16 "
        "states with [seq, heads] float32 natural-log lse, on the current stream; new outputs.");
  m.def("merge_state_out", &merge_state_out, pybind11::arg("v_a"), pybind11::arg("s_a"),
        pybind11::arg("v_b"), pybind11::arg("s_b"), pybind11::arg("v_out"), pybind11::arg("s_out"),
        "merge_state into the caller's (v_out, s_out); no allocation.");
}
