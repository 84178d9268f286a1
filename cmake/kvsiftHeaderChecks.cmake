# Header hygiene tests, registered with ctest when kvsift's tests are built.
#
# kvsift_layering: tools/check_layering.py fails if a header includes a layer it must not
# (docs/architecture.md) or a CUDA header reaches Eigen.
#
# kvsift_compile_time: tools/compile_time.py compiles a one-line program including
# <kvsift/kvsift.hpp> with the host compiler at -O2 and reports CPU seconds and peak memory.
# Timings on a shared machine are noisy, so it never fails: over target (2 s) it is reported
# as skipped, with the figures in its output (ctest -R kvsift_compile_time -V). Every public
# header alone: run tools/compile_time.py by hand.
find_package(Python3 3.9 COMPONENTS Interpreter)
if(NOT Python3_Interpreter_FOUND)
  message(STATUS "kvsift: no Python 3.9+; the layering and compile-time checks are not registered")
  return()
endif()

add_test(NAME kvsift_layering COMMAND Python3::Interpreter
                                      "${PROJECT_SOURCE_DIR}/tools/check_layering.py")

add_test(NAME kvsift_compile_time
         COMMAND Python3::Interpreter "${PROJECT_SOURCE_DIR}/tools/compile_time.py"
                 --cxx "${CMAKE_CXX_COMPILER}" kvsift/kvsift.hpp)
set_tests_properties(kvsift_compile_time PROPERTIES SKIP_REGULAR_EXPRESSION "over target"
                                                    LABELS compile_time)
