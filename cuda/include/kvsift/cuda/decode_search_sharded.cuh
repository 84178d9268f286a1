#pragma once
// Batched decode search over several GPUs of one host, from one host thread: each device
// searches the graphs it holds (its shard of a model's KV heads, or of a batch's requests) with
// its queries, on its own stream. Nothing crosses devices. For an engine whose process drives
// several GPUs; a process per GPU calls `decode_search` on its own device instead.
//
// Every shard is checked on its own device before any is enqueued, so a bad shard leaves every
// device as it was, and the error names the shard.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include <kvsift/cuda/decode_search.cuh>

namespace kvsift::cuda {

/// One device's share of a decode search: the arguments of `decode_search` for the graphs that
/// device holds. Keys = dense_keys_ref<T> or paged_kv_ref<T>.
template <class Keys>
struct decode_search_shard {
  int device = 0;               ///< the CUDA device every pointer and the stream belong to
  graph_set_ref set{};          ///< the shard's graphs
  Keys keys{};                  ///< their keys, dense or paged
  decode_queries queries{};     ///< the shard's queries, graph ids local to `set`
  std::int64_t m = 0;           ///< number of queries
  decode_search_outputs out{};  ///< the shard's outputs
  void* workspace = nullptr;    ///< decode_search_workspace_size(set, m, p)
  std::size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;  ///< a stream of `device`, or its default stream
};

/**
 * @brief `decode_search` of every shard on its own device and stream: shard i's outputs equal
 *        `decode_search` called on device shards[i].device with shard i's arguments.
 *
 * @param shards any number of shards, several per device allowed (each with its own workspace
 *               and outputs); empty does nothing
 * @param p      the search parameters, the same for every shard
 * @throw kvsift::invalid_argument (or the subclass decode_search throws) a shard's device outside
 *        [0, device count), or what decode_search throws for a shard's arguments on its device;
 *        the message starts with "decode_search_sharded: shard i (device d): ". Every shard is
 *        checked before any is enqueued.
 * @throw kvsift::cuda_error a device query or a launch failed
 * @note Asynchronous, never synchronises or allocates. Work as decode_search per shard, plus
 *       each shard's checks twice on the host. The calling thread's current device is the same
 *       on return, on every path. Thread safety: no state; concurrent calls need separate
 *       workspaces and outputs.
 */
template <class Keys>
void decode_search_sharded(std::span<const decode_search_shard<Keys>> shards,
                           const decode_search_params& p);

}  // namespace kvsift::cuda

#include <kvsift/cuda/detail/decode_search_sharded.inl>
