#pragma once
// Host dispatch behind <kvsift/cuda/decode_step_sharded.cuh> (internal).

#include <span>
#include <type_traits>

#include <kvsift/cuda/detail/sharded.inl>

namespace kvsift::cuda {

template <class T, class R>
void decode_step_sharded(std::type_identity_t<std::span<const decode_step_shard<T, R>>> shards,
                         int head_dim, const decode_step_params& p) {
  detail::run_sharded(
      shards, "decode_step_sharded", [&](const decode_step_shard<T, R>& s, bool enqueue) {
        detail::run_decode_step(s.set, s.kv, s.q, s.num_qo_heads, head_dim, s.out_o, s.out_lse,
                                s.workspace, s.workspace_bytes, s.stream, p, s.status, s.carry,
                                nullptr, enqueue, s.routes ? &*s.routes : nullptr);
      });
}

}  // namespace kvsift::cuda
