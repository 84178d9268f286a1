// ktrace: where a CUDA program's GPU time goes, without Nsight Systems (the H200 machines have
// Nsight Compute but not nsys). A CUPTI injection library: the CUDA driver loads it into any
// program started with CUDA_INJECTION64_PATH set to it; it records every kernel, copy and memset
// (CUPTI's activity API) and prints at exit, to stderr:
//   - the span from the first activity to the last and the GPU's busy time (the union of the
//     activities' intervals: overlapping kernels count once);
//   - the 30 largest totals by kernel name (cut before its template arguments) or copy kind
//     (1 host to device, 2 device to host, 8 device to device);
//   - the busy milliseconds in every 100 ms from the first activity (what is idle, and when).
// KTRACE_SKIP_MS=T ignores the activities that start in the first T ms (a benchmark's setup).
//
// Build and use (CUDA 12.x / 13.x; the record layouts are CUDA 13's, see below):
// clang-format off
//   g++ -std=c++17 -O2 -shared -fPIC bench/cuda/tools/ktrace.cpp -I/usr/local/cuda/include -L/usr/local/cuda/targets/x86_64-linux/lib -lcupti -o libktrace.so
//   CUDA_INJECTION64_PATH=$PWD/libktrace.so ./kvsift-cuda-multi_device_bench --devices 1 ...
// clang-format on
// Not built by CMake: CUPTI is not part of every CUDA install the library supports.

#include <cupti.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace {

struct activity {
  std::uint64_t start, end;
  std::string name;
};

std::mutex mu;
std::vector<activity> activities;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = std::size_t{16} << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

// The record structs are CUDA 13's newest (Kernel10, Memcpy6, Memset4): CUPTI fills the newest
// layout of the version it was built with, so an older toolkit needs the older names here.
void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* r = nullptr;
  const std::lock_guard<std::mutex> lock(mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
      activities.push_back({k->start, k->end, k->name != nullptr ? k->name : "?"});
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
      activities.push_back({m->start, m->end, "memcpy kind " + std::to_string(m->copyKind)});
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
      activities.push_back({m->start, m->end, "memset"});
    }
  }
  std::free(buffer);
}

// A mangled or demangled kernel name up to its template arguments or parameters, at most its
// last 70 characters (the part that names the kernel in a mangled name).
std::string short_name(const std::string& name) {
  std::string s = name.substr(0, name.find_first_of("<("));
  return s.size() > 70 ? s.substr(s.size() - 70) : s;
}

void report() {
  cuptiActivityFlushAll(1);
  const std::lock_guard<std::mutex> lock(mu);
  if (activities.empty()) {
    std::fprintf(stderr, "ktrace: no GPU activity recorded\n");
    return;
  }
  std::sort(activities.begin(), activities.end(),
            [](const activity& a, const activity& b) { return a.start < b.start; });
  const char* skip = std::getenv("KTRACE_SKIP_MS");
  const std::uint64_t t0 =
      activities.front().start + (skip != nullptr ? std::strtoull(skip, nullptr, 10) : 0) * 1000000;
  constexpr std::uint64_t bucket = 100000000;  // 100 ms in ns
  std::map<std::string, std::pair<double, long>> totals;
  std::map<std::uint64_t, std::uint64_t> busy_per_bucket;
  std::uint64_t busy = 0, last = 0, run_start = 0, run_end = 0;
  bool in_run = false;
  auto close_run = [&] {  // a maximal busy interval [run_start, run_end)
    busy += run_end - run_start;
    for (std::uint64_t x = run_start; x < run_end;) {
      const std::uint64_t b = (x - t0) / bucket;
      const std::uint64_t y = std::min(t0 + (b + 1) * bucket, run_end);
      busy_per_bucket[b] += y - x;
      x = y;
    }
  };
  for (const auto& a : activities) {
    if (a.start < t0) continue;
    auto& t = totals[short_name(a.name)];
    t.first += static_cast<double>(a.end - a.start) * 1e-6;
    ++t.second;
    last = std::max(last, a.end);
    if (in_run && a.start <= run_end) {
      run_end = std::max(run_end, a.end);
      continue;
    }
    if (in_run) close_run();
    run_start = a.start;
    run_end = a.end;
    in_run = true;
  }
  if (in_run) close_run();
  const double span = static_cast<double>(last - t0) * 1e-6;
  std::fprintf(stderr,
               "ktrace: %zu activities; span %.1f ms; GPU busy (union of intervals) %.1f ms = "
               "%.1f%%\n",
               activities.size(), span, static_cast<double>(busy) * 1e-6,
               100.0 * static_cast<double>(busy) * 1e-6 / span);
  std::vector<std::pair<double, std::string>> order;
  for (const auto& [name, t] : totals) order.emplace_back(t.first, name);
  std::sort(order.rbegin(), order.rend());
  for (std::size_t i = 0; i < order.size() && i < 30; ++i) {
    std::fprintf(stderr, "ktrace: %10.1f ms %8ld x  %s\n", order[i].first,
                 totals[order[i].second].second, order[i].second.c_str());
  }
  std::fprintf(stderr, "ktrace: busy ms per 100 ms (index: ms):");
  for (const auto& [b, t] : busy_per_bucket) {
    std::fprintf(stderr, " %llu:%.0f", static_cast<unsigned long long>(b),
                 static_cast<double>(t) * 1e-6);
  }
  std::fprintf(stderr, "\n");
}

}  // namespace

extern "C" int InitializeInjection(void) {
  cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
  std::atexit(report);
  return 1;
}
