#!/usr/bin/env bash
# Build kvsift (Release, with benchmarks) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

bash .ci/install-deps.sh

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKVSIFT_BUILD_BENCH=ON -DKVSIFT_NATIVE=OFF
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j2
