#pragma once
// Host dispatch behind <kvsift/cuda/decode_search_sharded.cuh> (internal).

#include <span>

#include <kvsift/cuda/detail/sharded.inl>

namespace kvsift::cuda {

template <class Keys>
void decode_search_sharded(std::span<const decode_search_shard<Keys>> shards,
                           const decode_search_params& p) {
  detail::run_sharded(
      shards, "decode_search_sharded", [&](const decode_search_shard<Keys>& s, bool enqueue) {
        detail::run_decode_search(s.set, s.keys, s.queries, s.m, p, s.out, s.workspace,
                                  s.workspace_bytes, s.stream, enqueue);
      });
}

}  // namespace kvsift::cuda
