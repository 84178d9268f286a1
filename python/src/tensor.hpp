#pragma once
// Array intake of the Python module: any NumPy array or DLPack producer (torch, JAX, CuPy on the
// host, ...) becomes a `tensor`, a borrowed description of its memory (pointer, element kind,
// shape, byte strides) plus the object that keeps that memory alive. Nothing is copied here;
// the checks that decide whether kvsift can read a layout live with the functions that read it.
//
// Why two paths: NumPy arrays are read through NumPy's own array API, because NumPy < 2 refuses
// to export read-only arrays over DLPack (every np.broadcast_to result, every memory map opened
// read-only) and no NumPy version exports ml_dtypes.bfloat16 or a non-native byte order, so the
// DLPack route could not even say what is wrong with them. Everything else goes through
// `__dlpack__`, consumed as the spec says (capsule renamed to "used_*", deleter called when the
// last kvsift reference goes).

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "dlpack.hpp"
#include "kvsift/core/error.hpp"

namespace kvsift_python {

namespace py = pybind11;

/// Where a tensor came from: decides which fix an error message names.
enum class origin { numpy, dlpack };

/// A borrowed n-d array. `kind` follows NumPy's dtype.kind letters ('f' float, 'i' int, 'u'
/// unsigned, 'b' bool) plus 'E' for bfloat16 (NumPy's dtype.char of ml_dtypes.bfloat16) and
/// '?' for anything kvsift never reads.
struct tensor {
  py::object owner;  ///< the ndarray, or a capsule owning the DLPack export
  const std::byte* data = nullptr;
  char kind = '?';
  std::size_t itemsize = 0;
  bool native_order = true;
  origin from = origin::numpy;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  ///< in bytes, as NumPy reports them
  std::string dl_dtype;               ///< the dtype's name for a DLPack tensor (NumPy: empty)
  int cuda_device = -1;               ///< the CUDA device of a device tensor (host: -1)

  [[nodiscard]] std::int64_t ndim() const { return static_cast<std::int64_t>(shape.size()); }
  [[nodiscard]] bool is_f32() const { return kind == 'f' && itemsize == 4 && native_order; }
  [[nodiscard]] bool is_f16() const { return kind == 'f' && itemsize == 2 && native_order; }
  [[nodiscard]] bool is_bf16() const { return kind == 'E' && itemsize == 2; }
};

/// The dtype's name as its framework spells it (numpy: str(dtype), e.g. ">f2"). Error paths only:
/// for a NumPy array it is a Python call.
inline std::string dtype_name(const tensor& t) {
  if (t.from == origin::dlpack) return t.dl_dtype;
  return std::string(py::str(t.owner.attr("dtype")));
}

/// The conversion to name in a message about a wrong dtype.
inline std::string dtype_fix(const tensor& t, const char* target) {
  if (t.from == origin::numpy) return std::string("x.astype(numpy.") + target + ")";
  return std::string("x.to(torch.") + target + ") in PyTorch";
}

/// The conversion to name in a message about a layout kvsift cannot read in place.
inline const char* layout_fix(const tensor& t) {
  return t.from == origin::numpy ? "numpy.ascontiguousarray(x)" : "x.contiguous() in PyTorch";
}

namespace detail {

inline std::string device_name(const dlpack::DLDevice& d) {
  switch (d.device_type) {
    case dlpack::kDLCUDA:
      return "cuda:" + std::to_string(d.device_id);
    case dlpack::kDLCUDAManaged:
      return "cuda managed:" + std::to_string(d.device_id);
    case dlpack::kDLROCM:
      return "rocm:" + std::to_string(d.device_id);
    default:
      return "DLPack device type " + std::to_string(d.device_type) + ":" +
             std::to_string(d.device_id);
  }
}

inline std::string dl_dtype_name(const dlpack::DLDataType& t) {
  std::string base;
  switch (t.code) {
    case dlpack::kDLFloat:
      base = "float";
      break;
    case dlpack::kDLBfloat:
      base = "bfloat";
      break;
    case dlpack::kDLInt:
      base = "int";
      break;
    case dlpack::kDLUInt:
      base = "uint";
      break;
    case dlpack::kDLBool:
      return "bool";
    case dlpack::kDLComplex:
      base = "complex";
      break;
    default:
      base = "DLPack type code " + std::to_string(t.code) + " bits ";
  }
  std::string name = base + std::to_string(t.bits);
  if (t.lanes != 1) name += "x" + std::to_string(t.lanes);
  return name;
}

/// Describes a DLTensor; `owner` already owns the export (released on any throw below).
/// `cuda`: the caller is a CUDA function and wants device memory (kDLCUDA); otherwise host
/// memory is required.
inline tensor from_dltensor(const dlpack::DLTensor& dl, py::object owner, const char* what,
                            bool cuda = false) {
  if (cuda && dl.device.device_type != dlpack::kDLCUDA) {
    kvsift::detail::fail<kvsift::invalid_argument>(
        what, ": expected a tensor in CUDA device memory, got one on ",
        dl.device.device_type == dlpack::kDLCPU ? std::string("cpu") : device_name(dl.device),
        " (kvsift.cuda functions read device memory; move it with x.cuda(), kvsift does not "
        "copy silently)");
  }
  // Pinned host memory (kDLCUDAHost) is ordinary host memory to the CPU code.
  if (!cuda && dl.device.device_type != dlpack::kDLCPU &&
      dl.device.device_type != dlpack::kDLCUDAHost) {
    kvsift::detail::fail<kvsift::invalid_argument>(
        what, ": expected a tensor in host memory (device cpu), got one on ",
        device_name(dl.device),
        " (the CPU functions read host memory; move it with x.cpu(), kvsift does not copy "
        "silently)");
  }
  tensor t;
  t.owner = std::move(owner);
  t.from = origin::dlpack;
  if (cuda) t.cuda_device = dl.device.device_id;
  t.dl_dtype = dl_dtype_name(dl.dtype);
  t.itemsize = dl.dtype.bits / 8;
  const bool whole_bytes = dl.dtype.bits % 8 == 0 && dl.dtype.lanes == 1 && t.itemsize > 0;
  switch (whole_bytes ? dl.dtype.code : 255) {
    case dlpack::kDLFloat:
      t.kind = 'f';
      break;
    case dlpack::kDLBfloat:
      t.kind = 'E';
      break;
    case dlpack::kDLInt:
      t.kind = 'i';
      break;
    case dlpack::kDLUInt:
      t.kind = 'u';
      break;
    case dlpack::kDLBool:
      t.kind = 'b';
      break;
    default:
      t.kind = '?';
  }
  kvsift::detail::require(dl.ndim >= 0, what, ": DLPack tensor with ndim ", dl.ndim);
  t.data = static_cast<const std::byte*>(dl.data) + dl.byte_offset;
  t.shape.assign(dl.shape, dl.shape + dl.ndim);
  t.strides.resize(t.shape.size());
  // Null strides mean compact row-major (DLPack < 1.2 allows it; torch never sends null).
  std::int64_t compact = static_cast<std::int64_t>(t.itemsize);
  for (std::int64_t ax = t.ndim() - 1; ax >= 0; --ax) {
    const auto a = static_cast<std::size_t>(ax);
    if (dl.strides == nullptr) {
      t.strides[a] = compact;
      compact *= std::max<std::int64_t>(t.shape[a], 1);
      continue;
    }
    const std::int64_t s = dl.strides[a];
    const auto limit = std::numeric_limits<std::int64_t>::max() /
                       static_cast<std::int64_t>(std::max<std::size_t>(t.itemsize, 1));
    kvsift::detail::require(s <= limit && s >= -limit, what, ": stride ", s, " elements on axis ",
                            ax, " overflows a byte offset");
    t.strides[a] = s * static_cast<std::int64_t>(t.itemsize);
  }
  return t;
}

template <class Managed>
py::object own_export(py::handle capsule, const char* name, const char* used_name,
                      Managed*& managed) {
  managed = static_cast<Managed*>(PyCapsule_GetPointer(capsule.ptr(), name));
  if (managed == nullptr) throw py::error_already_set();
  // Owned before the rename: if making the owner fails, the producer's capsule still frees it.
  py::capsule owner(managed, [](void* p) {
    auto* m = static_cast<Managed*>(p);
    if (m->deleter != nullptr) m->deleter(m);
  });
  if (PyCapsule_SetName(capsule.ptr(), used_name) != 0) throw py::error_already_set();
  return owner;
}

/// Consumes a DLPack capsule ("dltensor_versioned" or "dltensor") as the spec says: renamed to
/// "used_*", its deleter called when the last kvsift reference goes.
inline tensor from_capsule(const py::object& cap, const char* what, bool cuda) {
  if (PyCapsule_IsValid(cap.ptr(), "dltensor_versioned") != 0) {
    dlpack::DLManagedTensorVersioned* m = nullptr;
    py::object owner = own_export(cap, "dltensor_versioned", "used_dltensor_versioned", m);
    kvsift::detail::require(m->version.major == 1, what, ": expected a DLPack 1.x export, got ",
                            m->version.major, ".", m->version.minor);
    kvsift::detail::require((m->flags & dlpack::flag_is_copied) == 0, what,
                            ": the DLPack producer copied the tensor (flag IS_COPIED); kvsift "
                            "reads the caller's memory and does not accept a silent copy");
    return from_dltensor(m->dl_tensor, std::move(owner), what, cuda);
  }
  if (PyCapsule_IsValid(cap.ptr(), "dltensor") != 0) {
    dlpack::DLManagedTensor* m = nullptr;
    py::object owner = own_export(cap, "dltensor", "used_dltensor", m);
    return from_dltensor(m->dl_tensor, std::move(owner), what, cuda);
  }
  kvsift::detail::fail<kvsift::invalid_argument>(
      what,
      ": __dlpack__() returned no unused DLPack capsule (\"dltensor\" or "
      "\"dltensor_versioned\")");
}

/// Consumes `h.__dlpack__()`. Asks for a versioned export without copies (DLPack 1.0 producers
/// then raise BufferError rather than copy); a producer predating those keywords raises
/// TypeError and is asked again without them.
/// `stream` (CUDA only): the consumer stream, passed to the producer as the DLPack protocol
/// asks, so a producer working on another stream makes that stream wait before we read. The
/// protocol spells the legacy default stream (handle 0) as 1 and refuses 0 (ambiguous).
inline tensor from_dlpack(const py::handle& h, const char* what, bool cuda = false,
                          std::intptr_t stream = 0) {
  if (cuda && stream == 0) stream = 1;
  // An already exported capsule (torch.utils.dlpack.to_dlpack(t), which kvsift.cuda passes for
  // torch tensors: the Python-level __dlpack__ method costs ~15 us per tensor, the C export ~1 us)
  // is consumed as it is; its device is checked from the DLTensor below.
  if (PyCapsule_CheckExact(h.ptr()) != 0)
    return from_capsule(py::reinterpret_borrow<py::object>(h), what, cuda);
  // Device first: exporting a CUDA tensor with stream=None may synchronise its stream, which a
  // call that then refuses the tensor has no business doing.
  if (py::hasattr(h, "__dlpack_device__")) {
    const auto dev = h.attr("__dlpack_device__")().cast<std::pair<int, int>>();
    from_dltensor(dlpack::DLTensor{nullptr, {dev.first, dev.second}, 0, {}, nullptr, nullptr, 0},
                  py::none(), what, cuda);
  }
  py::object cap;
  try {
    if (cuda) {
      cap = h.attr("__dlpack__")(py::arg("stream") = stream,
                                 py::arg("max_version") = py::make_tuple(1, 0),
                                 py::arg("copy") = false);
    } else {
      cap = h.attr("__dlpack__")(py::arg("max_version") = py::make_tuple(1, 0),
                                 py::arg("copy") = false);
    }
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    cap = cuda ? h.attr("__dlpack__")(py::arg("stream") = stream) : h.attr("__dlpack__")();
  }
  return from_capsule(cap, what, cuda);
}

inline tensor from_numpy(py::array a) {
  tensor t;
  t.data = static_cast<const std::byte*>(a.data());
  const py::dtype dt = a.dtype();
  t.kind = dt.kind();
  t.itemsize = static_cast<std::size_t>(a.itemsize());
  // ml_dtypes.bfloat16 is a NumPy user dtype (kind 'V'): recognised by name, Python call only
  // for kind 'V'.
  if (t.kind == 'V' && t.itemsize == 2 && std::string(py::str(dt.attr("name"))) == "bfloat16") {
    t.kind = 'E';
  }
  // Byte order matters only to the kinds kvsift reads (one Python call for them).
  if (t.itemsize > 1 && (t.kind == 'f' || t.kind == 'i' || t.kind == 'u' || t.kind == 'E')) {
    t.native_order = dt.attr("isnative").cast<bool>();
  }
  t.shape.assign(a.shape(), a.shape() + a.ndim());
  t.strides.assign(a.strides(), a.strides() + a.ndim());
  t.owner = std::move(a);
  return t;
}

}  // namespace detail

/// Any NumPy array or DLPack producer as a borrowed tensor; anything else is rejected naming
/// both accepted forms. O(ndim) plus one `__dlpack__` call for a non-NumPy producer.
/// @throw kvsift::invalid_argument for other objects and non-host DLPack tensors; a producer's
///        own error (e.g. torch refusing a tensor that requires grad) propagates.
inline tensor tensor_of(const py::handle& h, const char* what) {
  if (py::isinstance<py::array>(h)) return detail::from_numpy(py::reinterpret_borrow<py::array>(h));
  if (py::hasattr(h, "__dlpack__")) return detail::from_dlpack(h, what);
  kvsift::detail::fail<kvsift::invalid_argument>(
      what, ": expected a numpy.ndarray or a DLPack tensor (torch.Tensor, ...), got ",
      std::string(py::str(py::type::of(h).attr("__name__"))));
}

}  // namespace kvsift_python
