// kvsift._cpu: which x86-64 instruction-set extensions this CPU *and operating system* support,
// so that kvsift/__init__.py can pick the fastest build of the extension (_kvsift,
// _kvsift_avx2, _kvsift_avx512) before importing any of them. Built for the baseline ISA and
// with the plain Python C API (no pybind11: it must not register anything the extension
// registers, and it compiles in a fraction of a second).
//
// CPUID says what the CPU has; XGETBV says whether the operating system saves the wider
// registers (a kernel may disable AVX-512): a feature is reported only with both, which
// /proc/cpuinfo parsing would get right only on Linux. <cpuid.h> rather than
// __builtin_cpu_supports, whose feature names differ between GCC and Clang (Clang 14 has no
// "f16c").
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace {

PyObject* features(PyObject*, PyObject*) {
  PyObject* out = PyDict_New();
  if (out == nullptr) return nullptr;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  unsigned c1 = 0, d1 = 0, b7 = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) != 0) {
    c1 = c;
    d1 = d;
  }
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) != 0) b7 = b;
  unsigned long long xcr0 = 0;
  if ((c1 & (1u << 27)) != 0) {  // OSXSAVE: XGETBV is usable
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<unsigned long long>(hi) << 32) | lo;
  }
  const bool os_avx = (xcr0 & 0x6) == 0x6;       // XMM and YMM state
  const bool os_avx512 = (xcr0 & 0xe6) == 0xe6;  // plus opmask, ZMM_Hi256, Hi16_ZMM
  auto bit = [](unsigned r, int i) { return ((r >> i) & 1u) != 0; };
  // Only what the variants are compiled for (python/CMakeLists.txt) is listed.
  const struct {
    const char* name;
    bool has;
  } f[] = {
      {"sse2", bit(d1, 26)},
      {"avx", os_avx && bit(c1, 28)},
      {"fma", os_avx && bit(c1, 12)},
      {"f16c", os_avx && bit(c1, 29)},
      {"avx2", os_avx && bit(b7, 5)},
      {"avx512f", os_avx512 && bit(b7, 16)},
      {"avx512dq", os_avx512 && bit(b7, 17)},
      {"avx512bw", os_avx512 && bit(b7, 30)},
      {"avx512vl", os_avx512 && bit(b7, 31)},
  };
  for (const auto& e : f) {
    if (PyDict_SetItemString(out, e.name, e.has ? Py_True : Py_False) != 0) {
      Py_DECREF(out);
      return nullptr;
    }
  }
#endif
  return out;
}

PyMethodDef methods[] = {
    {"features", features, METH_NOARGS,
     "features() -> dict: x86-64 extensions usable here (CPU and OS), e.g. {'avx2': True, ...}; "
     "empty on other architectures."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT,
                      "_cpu",
                      "Instruction-set extensions of the running CPU (kvsift's ISA dispatch).",
                      -1,
                      methods,
                      nullptr,
                      nullptr,
                      nullptr,
                      nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__cpu() { return PyModule_Create(&module); }
