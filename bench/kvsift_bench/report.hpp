#pragma once
// kvsift-bench's text output: the result table and the attention-quality table on stdout.

#include <cstdio>
#include <vector>

#include "kvsift_bench/datasets.hpp"
#include "kvsift_bench/measure.hpp"
#include "kvsift_bench/quality.hpp"

namespace kvsift_bench {

inline void print_table(const std::vector<row>& rows) {
  std::printf("%-10s %-9s %-16s %8s %9s %10s %10s %10s %9s %9s\n", "index", "query", "param",
              "recall", "scanned", "mean_us", "p50_us", "p99_us", "size", "exact");
  for (const auto& r : rows) {
    const bool d = r.query == "dipr";
    std::printf("%-10s %-9s %-16s %8.4f %9.5f %10.1f %10.1f %10.1f ", r.index.c_str(),
                r.query.c_str(), r.param.c_str(), r.recall, r.scanned, r.mean_us, r.p50_us,
                r.p99_us);
    if (d)
      std::printf("%9.1f %9.1f\n", r.size, r.exact_size);
    else
      std::printf("%9s %9s\n", "-", "-");
  }
}

inline void print_quality(const std::vector<quality_row>& rows, const workload& w) {
  std::printf(
      "\nattention quality: %zu causal queries at positions %zu..%zu, window 128 + 512, "
      "retrieval from the middle; vs full attention (scale 1/sqrt(%zu))\n",
      w.eval.rows(), w.eval_first, w.eval_first + w.eval.rows() - 1, w.keys.cols());
  std::printf("%-16s %-20s %9s %9s %9s %9s %9s\n", "method", "param", "retrieved", "attended",
              "recovery", "rel_err", "scanned");
  for (const auto& r : rows) {
    std::printf("%-16s %-20s %9.1f %9.1f %9.4f %9.4f %9.4f\n", r.method.c_str(), r.param.c_str(),
                r.retrieved, r.attended, r.recovery, r.error, r.scanned);
  }
}

}  // namespace kvsift_bench
