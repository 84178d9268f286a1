#pragma once
// Former header of `paged_kv_ref`, kept for one release: include <kvsift/cuda/paged_kv_ref.cuh>.
// The deprecated alias `paged_kv_view` is declared there.

#include <kvsift/cuda/paged_kv_ref.cuh>
