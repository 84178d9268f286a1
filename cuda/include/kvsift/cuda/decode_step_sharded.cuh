#pragma once
// One layer's decode step over several GPUs of one host, from one host thread. An engine that
// shards a model's KV heads across GPUs (tensor parallelism) keeps each head's graph, K/V pages
// and queries on the GPU that owns the head; this call runs `decode_step` for every GPU's share
// (a shard) on that GPU and its stream, with no host synchronisation and nothing crossing
// devices: heads are independent, so no peer access or NCCL is needed. An engine that runs one
// process (rank) per GPU calls `decode_step` on its own device instead; this is for one process
// driving several GPUs.
//
// Every shard is checked on its own device before any is enqueued, so a bad shard (a pointer of
// another device, a too-small workspace, a device that does not exist) leaves every device as it
// was, and the error names the shard.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>

#include <kvsift/core/ids.hpp>
#include <kvsift/cuda/decode_search.cuh>
#include <kvsift/cuda/decode_step.cuh>
#include <kvsift/cuda/paged_kv_ref.cuh>

namespace kvsift::cuda {

/// One device's share of a layer's decode step: the arguments of `decode_step` for the KV heads
/// that device holds, all of them memory and a stream of `device`. `R`: the element type of the
/// routing vectors, when the shard routes its queries.
template <class T, class R = T>
struct decode_step_shard {
  int device = 0;             ///< the CUDA device every pointer and the stream belong to
  graph_set_ref set{};        ///< the shard's graphs, one per KV head it holds
  paged_kv_ref<T> kv{};       ///< the shard's K/V pages, one page-table row per graph
  const float* q = nullptr;   ///< [num_qo_heads][head_dim] f32
  int num_qo_heads = 0;       ///< query heads of the shard (a multiple of set.num_graphs)
  float* out_o = nullptr;     ///< [num_qo_heads][head_dim] f32
  float* out_lse = nullptr;   ///< [num_qo_heads] f32
  void* workspace = nullptr;  ///< decode_step_workspace_size(set, num_qo_heads, head_dim, p)
  std::size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;    ///< a stream of `device`, or its default stream
  std::uint32_t* status = nullptr;  ///< optional, as decode_step's
  id_t* carry = nullptr;            ///< optional warm start, as decode_step's
  /// Optional: the routing sets of the shard's graphs (memory of `device`) and the routing
  /// parameters, as decode_step's routes overload takes them; the workspace is then
  /// decode_step_workspace_size(set, num_qo_heads, head_dim, p, *routes). Each shard routes
  /// over its own sets, so shards may route or not independently.
  std::optional<decode_step_routes<R>> routes{};
};

/**
 * @brief `decode_step` of every shard on its own device and stream: shard i's outputs equal
 *        `decode_step` called on device shards[i].device with shard i's arguments.
 *
 * @param shards   any number of shards, several per device allowed (each with its own
 *                 workspace and outputs); empty does nothing. Not deduced: name the element
 *                 types, `decode_step_sharded<T>` (routing vectors of T too, or none) or
 *                 `decode_step_sharded<T, R>`, and pass any range of shards a span takes.
 * @param head_dim the query / key dimension, the same for every shard
 * @param p        the step's parameters, the same for every shard
 * @throw kvsift::invalid_argument (or the subclass decode_step throws) a shard's device outside
 *        [0, device count), or what decode_step throws for a shard's arguments on its device
 *        (a pointer or stream of another device among them; with `routes`, what decode_step
 *        with routes throws for them); the message starts with
 *        "decode_step_sharded: shard i (device d): ". Every shard is checked before any is
 *        enqueued.
 * @throw kvsift::cuda_error a device query or a launch failed
 * @note Asynchronous: returns once every shard is enqueued, never synchronises or allocates.
 *       Host work: the checks of each shard twice (about 20 pointer queries of ~0.14 us each
 *       per shard) and its launches; device work as decode_step per shard. The calling
 *       thread's current device is the same on return, on every path. Thread safety: no state;
 *       concurrent calls need separate workspaces and outputs.
 */
template <class T, class R = T>
void decode_step_sharded(std::type_identity_t<std::span<const decode_step_shard<T, R>>> shards,
                         int head_dim, const decode_step_params& p = {});

}  // namespace kvsift::cuda

#include <kvsift/cuda/detail/decode_step_sharded.inl>
