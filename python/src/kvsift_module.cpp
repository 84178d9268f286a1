// Python bindings of kvsift (pybind11): indexes built over NumPy arrays without copying them,
// top-k / DIPR / filtered search, sparse and dense attention into mergeable partial states.
//
// Memory: every array the C++ side reads is borrowed, never copied. An array is accepted when
// its layout is one kvsift's views can describe (innermost axis contiguous, other strides
// whole elements); anything else is rejected with a message saying how to fix it, so a large
// copy never happens silently. Indexes keep a reference to their key array, so the keys stay
// alive as long as the index does. Computation runs with the GIL released.
//
// The bindings live in one file per concern (bindings.hpp lists them): search.cpp (filters,
// results, searches), indexes.cpp (index objects), attention.cpp (attention and merges),
// planner.cpp (planner, GQA sampling); common.hpp holds the array checks they share.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "kvsift/core/detail/simd.hpp"
#include "kvsift/core/error.hpp"
#include "kvsift/core/ids.hpp"

// The same sources build the baseline module _kvsift and, on x86-64, the ISA variants
// _kvsift_avx2 / _kvsift_avx512 (python/CMakeLists.txt; kvsift/__init__.py imports one).
#ifndef KVSIFT_PYTHON_MODULE
#define KVSIFT_PYTHON_MODULE _kvsift
#endif

namespace py = pybind11;

PYBIND11_MODULE(KVSIFT_PYTHON_MODULE, m) {
  m.doc() =
      "kvsift: retrieval-based sparse attention (RoarGraph / flat indexes, top-k, DIPR and "
      "filtered search, sparse attention with log-sum-exp merge). Arrays are borrowed, never "
      "copied: keys must be float32 or float16 with contiguous rows, queries float32.";

  // pybind11 < 2.12 reads NumPy's dtype struct at the NumPy 1.x offsets; under NumPy 2 every
  // itemsize and stride check would then read garbage (a float32 of item size 0). Refuse to load.
  if (py::dtype::of<float>().itemsize() != 4) {
    throw py::import_error(
        "kvsift: this module was built with pybind11 < 2.12, which does not support the NumPy 2 "
        "found at run time; rebuild it with pybind11 >= 2.12 (pip install ./python does)");
  }

  // Exceptions: kvsift's error tiers become ValueError subclasses (matched most-derived first:
  // pybind11 tries the translators registered last first).
  auto& invalid =
      py::register_exception<kvsift::invalid_argument>(m, "InvalidArgument", PyExc_ValueError);
  py::register_exception<kvsift::dimension_mismatch>(m, "DimensionMismatch", invalid.ptr());
  py::register_exception<kvsift::out_of_range>(m, "OutOfRange", invalid.ptr());
  py::register_exception<kvsift::non_finite_value>(m, "NonFiniteValue", invalid.ptr());
  // File and stream errors (a missing, truncated or corrupted index file or pickle).
  py::register_exception<kvsift::io_error>(m, "IoError", PyExc_OSError);

#ifdef KVSIFT_PYTHON_VERSION
  m.attr("__version__") = KVSIFT_PYTHON_VERSION;
#endif
  m.attr("INVALID_ID") = py::int_(kvsift::invalid_id);
  // Lanes of the f32 vector the kernels were compiled with (4 SSE2/NEON, 8 AVX2, 16 AVX-512):
  // python/tests/test_isa.py checks that each variant really got its instruction set.
  m.attr("_simd_width") = py::int_(kvsift::detail::simd::width);
#ifdef KVSIFT_PYTHON_VARIANTS
  // The ISA variants built next to this module (";"-separated, empty when none): the tests
  // require each to exist and load where the CPU can run it.
  m.attr("_variants_built") = KVSIFT_PYTHON_VARIANTS;
#endif

  kvsift_python::bind_search(m);
  kvsift_python::bind_indexes(m);
  kvsift_python::bind_attention(m);
  kvsift_python::bind_planner(m);
  kvsift_python::bind_memory(m);
  kvsift_python::bind_testing(m);
  kvsift_python::bind_routing(m);
}
