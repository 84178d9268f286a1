# kvsift._kvsift_torch: included by CMakeLists.txt when KVSIFT_PY_TORCH is ON (needs
# KVSIFT_PY_CUDA: it calls the same nvcc-compiled kernels). A Python extension module on
# torch's C++ API, built against the torch found by the build's Python (headers, its bundled
# pybind11 and libraries from the installed wheel, with the pybind11 ABI macros torch was built
# with, as torch.utils.cpp_extension does; torch's own CMake package is not used: it wants a CUDA
# toolkit matching the wheel's, and cuDNN). kvsift.cuda imports it after torch, so torch's
# libraries are already in the process and need no rpath.
if(NOT KVSIFT_PY_CUDA)
  message(FATAL_ERROR "KVSIFT_PY_TORCH needs KVSIFT_PY_CUDA=ON")
endif()
execute_process(
  COMMAND
    "${Python_EXECUTABLE}" -c
    "import os, torch, torch.utils.cpp_extension as e
try:
    inc = e.include_paths(device_type='cuda')
except TypeError:
    inc = e.include_paths(cuda=True)
print(','.join(inc)); print(os.path.join(os.path.dirname(torch.__file__), 'lib'))
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
abi = [(k, getattr(torch._C, '_PYBIND11_' + k, None)) for k in ('COMPILER_TYPE', 'STDLIB', 'BUILD_ABI')]
print(','.join('PYBIND11_%s=\"%s\"' % (k, v) for k, v in abi if v is not None) or 'KVSIFT_NO_PYBIND_ABI')"
  OUTPUT_VARIABLE kvsift_torch_info
  RESULT_VARIABLE kvsift_torch_found
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT kvsift_torch_found EQUAL 0)
  message(FATAL_ERROR "KVSIFT_PY_TORCH: ${Python_EXECUTABLE} cannot import torch")
endif()
string(REPLACE "\n" ";" kvsift_torch_info "${kvsift_torch_info}")
list(GET kvsift_torch_info 0 kvsift_torch_includes)
list(GET kvsift_torch_info 1 kvsift_torch_libdir)
list(GET kvsift_torch_info 2 kvsift_torch_abi)
list(GET kvsift_torch_info 3 kvsift_torch_pybind_abi)
string(REPLACE "," ";" kvsift_torch_includes "${kvsift_torch_includes}")
string(REPLACE "," ";" kvsift_torch_pybind_abi "${kvsift_torch_pybind_abi}")

Python_add_library(kvsift_torch MODULE WITH_SOABI src/torch/torch_module.cpp)
# C++17, the standard torch's headers and libraries were built with (torch.__config__.show()).
set_target_properties(
  kvsift_torch PROPERTIES OUTPUT_NAME _kvsift_torch LIBRARY_OUTPUT_DIRECTORY "${kvsift_package_dir}"
                          CXX_VISIBILITY_PRESET hidden CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON)
target_include_directories(kvsift_torch SYSTEM PRIVATE ${kvsift_torch_includes})
target_compile_definitions(
  kvsift_torch PRIVATE _GLIBCXX_USE_CXX11_ABI=${kvsift_torch_abi} TORCH_API_INCLUDE_EXTENSION_H
                       ${kvsift_torch_pybind_abi})
target_link_directories(kvsift_torch PRIVATE "${kvsift_torch_libdir}")
# The kernels' archive by file, not by target: kvsift::cuda's usage requirements (C++20) must
# not reach this C++17 target; the module needs only cuda_ops.hpp's plain declarations.
add_dependencies(kvsift_torch kvsift_python_cuda_ops)
target_link_libraries(kvsift_torch PRIVATE $<TARGET_FILE:kvsift_python_cuda_ops> c10 c10_cuda
                                           torch_cpu torch_cuda torch_python CUDA::cudart)
install(TARGETS kvsift_torch LIBRARY DESTINATION kvsift COMPONENT python)
message(STATUS "kvsift torch module: torch headers ${kvsift_torch_includes}, ${kvsift_torch_pybind_abi}")
