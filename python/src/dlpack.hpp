#pragma once
// The DLPack ABI (https://dmlc.github.io/dlpack/latest/c_api.html), our own definitions of the
// structs a consumer reads: the spec fixes their layout (it is an ABI, stable since 0.x for the
// unversioned and since 1.0 for the versioned capsule), so a ~40-line copy is all kvsift needs
// instead of a dependency on dlpack.h. Only what the CPU module reads is declared.

#include <cstdint>

namespace kvsift_python::dlpack {

/// DLDeviceType values the module names in its messages (the spec's enum has more).
enum device_type : std::int32_t {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLROCM = 10,
  kDLCUDAManaged = 13,
};

struct DLDevice {
  std::int32_t device_type;  // a device_type value (a C enum: int-sized)
  std::int32_t device_id;
};

/// DLDataTypeCode values.
enum type_code : std::uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLOpaqueHandle = 3,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
};

struct DLDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  ///< in elements; null means compact row-major
  std::uint64_t byte_offset;
};

/// Capsule "dltensor" (DLPack < 1.0, still what NumPy < 2 and older PyTorch export).
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

struct DLPackVersion {
  std::uint32_t major;
  std::uint32_t minor;
};

/// Capsule "dltensor_versioned" (DLPack >= 1.0).
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  std::uint64_t flags;
  DLTensor dl_tensor;
};

inline constexpr std::uint64_t flag_read_only = std::uint64_t{1} << 0;
inline constexpr std::uint64_t flag_is_copied = std::uint64_t{1} << 1;

static_assert(sizeof(DLDevice) == 8 && sizeof(DLDataType) == 4);
static_assert(sizeof(DLTensor) == 48, "DLTensor layout differs from the DLPack ABI");

}  // namespace kvsift_python::dlpack
