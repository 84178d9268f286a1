#pragma once
// Deprecated path, kept for one release: the contents moved to
// <kvsift/decode/graph_token_retrieval.hpp> (memory/ no longer depends on index/ or search/;
// composition lives in decode/).

#include "kvsift/core/deprecated_header.hpp"
KVSIFT_DEPRECATED_HEADER(
    "deprecated header: include <kvsift/decode/graph_token_retrieval.hpp> instead")

#include "kvsift/decode/graph_token_retrieval.hpp"
