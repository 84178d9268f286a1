#pragma once
// The two passes of the sharded calls (decode_search_sharded, decode_step_sharded; internal):
// every shard is checked on its own device before any shard is enqueued, then each is enqueued
// on its own device and stream. The caller's current device is restored on every path.

#include <cuda_runtime.h>

#include <cstddef>
#include <exception>
#include <span>

#include <kvsift/core/error.hpp>
#include <kvsift/cuda/detail/device_buffer.cuh>
#include <kvsift/cuda/error.cuh>

namespace kvsift::cuda::detail {

/// Throws unless every shard names a device of this machine (before any device is touched).
template <class Shard>
void require_shard_devices(std::span<const Shard> shards, const char* who) {
  int count = 0;
  KVSIFT_CUDA_CHECK(cudaGetDeviceCount(&count));
  for (std::size_t i = 0; i < shards.size(); ++i) {
    kvsift::detail::require(shards[i].device >= 0 && shards[i].device < count, who, ": shard ", i,
                            ": expected a device in [0, ", count, "), got ", shards[i].device);
  }
}

/// Runs `f`; a bad-input error comes out as the same type with "who: shard i (device d): " in
/// front of its message, so the caller learns which shard was refused.
template <class F>
void with_shard_context(const char* who, std::size_t i, int device, F&& f) {
  const auto say = [&](const std::exception& e) {
    return kvsift::detail::concat(who, ": shard ", i, " (device ", device, "): ", e.what());
  };
  try {
    f();
  } catch (const dimension_mismatch& e) {
    throw dimension_mismatch(say(e));
  } catch (const out_of_range& e) {
    throw out_of_range(say(e));
  } catch (const non_finite_value& e) {
    throw non_finite_value(say(e));
  } catch (const invalid_argument& e) {
    throw invalid_argument(say(e));
  }
}

/// The two passes of a sharded call: `run(shard, false)` (every check, no launch) for each shard
/// on its device, then `run(shard, true)` for each. A refused shard leaves every device as it
/// was; an error of a launch itself (cuda_error) can still come after earlier shards were
/// enqueued, as it can within one call.
template <class Shard, class Run>
void run_sharded(std::span<const Shard> shards, const char* who, Run&& run) {
  require_shard_devices(shards, who);
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const device_guard guard(shards[i].device);
    with_shard_context(who, i, shards[i].device, [&] { run(shards[i], false); });
  }
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const device_guard guard(shards[i].device);
    run(shards[i], true);
  }
}

}  // namespace kvsift::cuda::detail
