#pragma once
// Deprecated path, kept for one release: dataset and file I/O moved to kvsift/io/
// (<kvsift/io/vector_io.hpp>), a layer of its own that index/ does not need.

#include "kvsift/core/deprecated_header.hpp"
KVSIFT_DEPRECATED_HEADER("deprecated header: include <kvsift/io/vector_io.hpp> instead")

#include "kvsift/io/vector_io.hpp"
