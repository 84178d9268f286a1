"""A DLPack producer written with ctypes, so the tests control every field of the export:
versioned (DLPack 1.x) or legacy capsules, element strides (zero, none), the device, the flags,
bfloat16 (kDLBfloat) without torch or ml_dtypes, and whether the consumer calls the deleter."""

import ctypes

import numpy as np


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", DELETER), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

KDL_CPU, KDL_CUDA = 1, 2
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT = 0, 1, 2, 4
FLAG_READ_ONLY, FLAG_IS_COPIED = 1, 2

_CODES = {"f": KDL_FLOAT, "i": KDL_INT, "u": KDL_UINT}


def bf16_bits(a):
    """float32 -> bfloat16 bit patterns (uint16, truncation: exact for values with <= 8
    significant bits, which the tests use), and the float32 values they stand for."""
    bits = (np.ascontiguousarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32)


class Producer:
    """Exports `array` (a NumPy array the test keeps) over DLPack.

    strides: element strides to report (None: compact, no strides array); versioned: DLPack 1.x
    capsule, or the legacy one (and a __dlpack__ without the 1.0 keywords, as NumPy < 2 has);
    code/bits: the DLPack dtype (default from the array); device: (type, id); flags: 1.x flags.
    `deleted` counts deleter calls: the consumer must call it exactly once per export."""

    def __init__(self, array, *, strides="array", versioned=True, code=None, device=(KDL_CPU, 0),
                 flags=0, shape=None):
        self.array = array
        self.shape = tuple(array.shape) if shape is None else tuple(shape)
        if strides == "array":
            strides = tuple(s // array.itemsize for s in array.strides)
        self.strides = strides
        self.versioned = versioned
        self.code = _CODES[array.dtype.kind] if code is None else code
        self.bits = array.itemsize * 8
        self.device = device
        self.flags = flags
        self.deleted = 0
        self.exports = 0
        self._keep = []

    def __dlpack_device__(self):
        return self.device

    def _tensor(self):
        nd = len(self.shape)
        shape = (ctypes.c_int64 * max(nd, 1))(*self.shape)
        strides = None
        if self.strides is not None:
            strides = (ctypes.c_int64 * max(nd, 1))(*self.strides)
        t = DLTensor(self.array.ctypes.data, DLDevice(*self.device), nd,
                     DLDataType(self.code, self.bits, 1), shape,
                     ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64)) if strides else None, 0)
        return t, (shape, strides)

    def _deleter(self):
        def delete(_):
            self.deleted += 1
        return DELETER(delete)

    def __dlpack__(self, **kwargs):
        if not self.versioned and kwargs:
            raise TypeError("__dlpack__() got an unexpected keyword argument")  # NumPy < 2
        self.exports += 1
        t, arrays = self._tensor()
        deleter = self._deleter()
        if self.versioned:
            m = DLManagedTensorVersioned(DLPackVersion(1, 0), None, deleter, self.flags, t)
            name = b"dltensor_versioned"
        else:
            m = DLManagedTensor(t, None, deleter)
            name = b"dltensor"
        self._keep.append((m, arrays, deleter, name))
        return _new_capsule(ctypes.addressof(m), name, None)
