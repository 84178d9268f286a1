#pragma once
// Host dispatch behind <kvsift/cuda/decode_step_sharded.cuh> (internal).

#include <span>

#include <kvsift/cuda/detail/sharded.inl>

namespace kvsift::cuda {

template <class T>
void decode_step_sharded(std::span<const decode_step_shard<T>> shards, int head_dim,
                         const decode_step_params& p) {
  detail::run_sharded(shards, "decode_step_sharded",
                      [&](const decode_step_shard<T>& s, bool enqueue) {
                        detail::run_decode_step(s.set, s.kv, s.q, s.num_qo_heads, head_dim, s.out_o,
                                                s.out_lse, s.workspace, s.workspace_bytes, s.stream,
                                                p, s.status, s.carry, nullptr, enqueue);
                      });
}

}  // namespace kvsift::cuda
