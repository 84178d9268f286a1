// Per-call cost of a small merge from C++: the baseline the Python layer (kvsift.cuda) is
// measured against. One decode step's merge is tiny ([rows = 1, 32 heads, 128] f16), so what
// a caller pays is the host side of the call (argument checks + launch), not the kernel.
//
// Reports, for N back-to-back calls on one stream: host microseconds per call (wall time of
// the loop, synchronised once at the end) and device microseconds per call (CUDA events
// around the loop). bench/cuda/merge_overhead.py measures the same from Python in the same
// run.
//
// Usage: kvsift-cuda-merge_overhead_bench [--rows 1] [--heads 32] [--dim 128] [--calls 5000]
#include <cuda_fp16.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <kvsift/cuda/merge.cuh>

int main(int argc, char** argv) {
  int rows = 1, heads = 32, dim = 128, calls = 5000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const int v = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--rows"))
      rows = v;
    else if (!std::strcmp(argv[i], "--heads"))
      heads = v;
    else if (!std::strcmp(argv[i], "--dim"))
      dim = v;
    else if (!std::strcmp(argv[i], "--calls"))
      calls = v;
  }
  const std::size_t n = std::size_t(rows) * heads * dim, ns = std::size_t(rows) * heads;
  __half *va, *vb, *vo;
  float *sa, *sb, *so;
  cudaMalloc(&va, n * 2);
  cudaMalloc(&vb, n * 2);
  cudaMalloc(&vo, n * 2);
  cudaMalloc(&sa, ns * 4);
  cudaMalloc(&sb, ns * 4);
  cudaMalloc(&so, ns * 4);
  cudaMemset(va, 0, n * 2);
  cudaMemset(vb, 0, n * 2);
  cudaMemset(sa, 0, ns * 4);
  cudaMemset(sb, 0, ns * 4);
  cudaStream_t s;
  cudaStreamCreate(&s);
  auto once = [&] { kvsift::cuda::merge_state(va, sa, vb, sb, vo, so, rows, heads, dim, s); };
  for (int i = 0; i < 200; ++i) once();
  cudaStreamSynchronize(s);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  double best_host = 1e30;
  float best_dev = 1e30f;
  for (int rep = 0; rep < 5; ++rep) {
    cudaEventRecord(e0, s);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) once();
    const auto t1 = std::chrono::steady_clock::now();
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    best_host = std::min(best_host, std::chrono::duration<double, std::micro>(t1 - t0).count());
    best_dev = std::min(best_dev, ms);
  }
  std::printf(
      "C++ kvsift::cuda::merge_state [%d, %d, %d] f16: host %.2f us/call (enqueue), stream %.2f "
      "us/call (events), best of 5 x %d calls\n",
      rows, heads, dim, best_host / calls, 1e3 * best_dev / calls, calls);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
