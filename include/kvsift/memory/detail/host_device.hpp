#pragma once
// Marks small inline functions callable from host and device code when compiled by nvcc;
// plain C++ elsewhere, so the memory headers stay host-compiler clean.

#if defined(__CUDACC__)
#define KVSIFT_HOST_DEVICE __host__ __device__
#else
#define KVSIFT_HOST_DEVICE
#endif
