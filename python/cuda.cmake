# kvsift._kvsift_cuda: included by CMakeLists.txt when KVSIFT_PY_CUDA is ON (the library's
# kvsift::cuda target exists then). The kernels are compiled by nvcc into a static library of
# their own (src/cuda/cuda_ops.cu, a pointer-level interface); the pybind11 module is plain C++
# on top, so pybind11's host-compiler flags (LTO, visibility) never reach nvcc.
# CUDA is enabled inside the library's subdirectory only; targets here need it in this scope.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90a)  # Hopper (wgmma), as the library's default
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

add_library(kvsift_python_cuda_ops STATIC src/cuda/cuda_ops.cu)
set_target_properties(kvsift_python_cuda_ops PROPERTIES POSITION_INDEPENDENT_CODE ON
                                                        CUDA_VISIBILITY_PRESET hidden)
target_link_libraries(kvsift_python_cuda_ops PUBLIC kvsift::cuda)

pybind11_add_module(kvsift_python_cuda src/cuda/cuda_module.cpp)
set_target_properties(kvsift_python_cuda PROPERTIES OUTPUT_NAME _kvsift_cuda
                                                    LIBRARY_OUTPUT_DIRECTORY "${kvsift_package_dir}")
target_link_libraries(kvsift_python_cuda PRIVATE kvsift_python_cuda_ops kvsift::kvsift
                                                 CUDA::cudart)
target_compile_options(kvsift_python_cuda PRIVATE -Wall -Wextra)
install(TARGETS kvsift_python_cuda LIBRARY DESTINATION kvsift COMPONENT python)
