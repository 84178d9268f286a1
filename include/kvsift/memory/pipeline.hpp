#pragma once
// Deprecated path, kept for one release: the contents moved to <kvsift/memory/offload.hpp> and
// <kvsift/decode/sparse_algorithm.hpp> (memory/ no longer depends on index/ or search/; composition
// lives in decode/).

#include "kvsift/core/deprecated_header.hpp"
KVSIFT_DEPRECATED_HEADER("deprecated header: include <kvsift/decode/sparse_algorithm.hpp> instead")

#include "kvsift/decode/sparse_algorithm.hpp"
#include "kvsift/memory/offload.hpp"
