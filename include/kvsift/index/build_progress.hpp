#pragma once
// Progress reporting of long builds: a single RoarGraph build
// (<kvsift/index/roargraph_builder.hpp>) and the multi-head build pipeline
// (<kvsift/index/build_pipeline.hpp>) report through it.

#include <cstddef>
#include <string_view>

#include "kvsift/core/detail/std_function.hpp"

namespace kvsift {

/// Where a long build stands, passed to a progress callback after every step. For one build
/// the steps are: kNN, projection, each connectivity round (rounds grow from 32 keys to
/// `roargraph_params::batch`, so early rounds are quick), reachability repair. Multi-head
/// pipelines (<kvsift/index/build_pipeline.hpp>) count heads instead.
struct build_progress {
  std::size_t done = 0;        ///< steps finished, 1..total
  std::size_t total = 0;       ///< steps of the whole job, constant during it
  double elapsed_seconds = 0;  ///< since the job started
  std::string_view phase;      ///< the step just finished: "knn", "projection", ...
};

/// Called on the building thread, never concurrently; an exception thrown from it abandons
/// the build and propagates to the caller.
using build_progress_callback = std::function<void(const build_progress&)>;

}  // namespace kvsift
