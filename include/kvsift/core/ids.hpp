#pragma once
// Id type and the sentinel for missing results.

#include <cstdint>
#include <limits>

namespace kvsift {

/// Vector / node / token id. 32 bits: a KV head holds far fewer than 4G tokens.
using id_t = std::uint32_t;

/// Marks a missing result (fewer results than asked for) or an empty adjacency slot.
inline constexpr id_t invalid_id = std::numeric_limits<id_t>::max();

}  // namespace kvsift
