#!/usr/bin/env bash
# Build kvsift-bench for this machine and run its demo. Extra arguments go to kvsift-bench.
set -euo pipefail
cd "$(dirname "$0")/.."

bash .ci/install-deps.sh

# -march=native is fine here: the binary runs on the machine that built it.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKVSIFT_BUILD_BENCH=ON -DKVSIFT_NATIVE=ON
if ! cmake --build build -j"$(nproc)" --target kvsift-bench; then
  if [[ ! -f bench/kvsift_bench.cpp ]]; then
    echo "demo: bench/kvsift_bench.cpp does not exist yet, so there is no kvsift-bench" >&2
  fi
  exit 1
fi
exec build/bin/kvsift-bench --demo "$@"
