// The one main of kvsift_cuda_tests: skips (exit 77, SKIP_RETURN_CODE in CMakeLists.txt) when
// no CUDA device is present, else runs every registered test and prints "N passed, M failed".
//
// Usage: kvsift_cuda_tests [substring]   runs only the tests whose name contains substring.

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <exception>

#include "cuda_test.cuh"

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  const char* filter = argc > 1 ? argv[1] : nullptr;
  int passed = 0;
  int failed = 0;
  for (const auto& t : kvsift::cuda_test::registry()) {
    if (filter != nullptr && std::strstr(t.name, filter) == nullptr) continue;
    kvsift::cuda_test::current_failures() = 0;
    std::printf("[ RUN  ] %s\n", t.name);
    std::fflush(stdout);
    try {
      t.fn();
    } catch (const std::exception& e) {
      kvsift::cuda_test::report_failure(__FILE__, __LINE__,
                                        std::string("uncaught exception: ") + e.what());
    } catch (...) {
      kvsift::cuda_test::report_failure(__FILE__, __LINE__, "uncaught non-std exception");
    }
    const int f = kvsift::cuda_test::current_failures();
    std::printf("[ %s ] %s (%d failed check%s)\n", f == 0 ? " OK " : "FAIL", t.name, f,
                f == 1 ? "" : "s");
    (f == 0 ? passed : failed) += 1;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
