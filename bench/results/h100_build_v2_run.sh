#!/usr/bin/env bash
# Exact commands of the connectivity speed-up device run (H100): build
# build_bench and the CUDA tests with nvcc in parallel, run build_bench (before/after in one
# run), then the CUDA tests with what time is left. Run from the repository root with the
# header-only dependencies under ../.devdeps/include. Logs go to $OUT (default /tmp/out).
set -u -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
D=$PWD/../.devdeps/include
F="-std=c++20 -O3 -arch=sm_90 -DEIGEN_NO_CUDA -Iinclude -Icuda/include -I$D -I$D/eigen3
   -Xcompiler=-march=native,-Wno-unknown-pragmas -lcublas"
nproc; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
t0=$(date +%s)
nvcc $F bench/cuda/build_bench.cu -o /tmp/build_bench > "$OUT/build_build.txt" 2>&1 &
nvcc $F tests/cuda/*.cu -o /tmp/kvsift_cuda_tests > "$OUT/build_tests.txt" 2>&1 &
wait
ls -la /tmp/build_bench /tmp/kvsift_cuda_tests
echo "built in $(( $(date +%s) - t0 )) s"
left=$(( 200 - ($(date +%s) - t0) ))
timeout "$left" /tmp/build_bench --pipeline-heads 4 --pipeline-keys 16384 2>&1 |
  tee "$OUT/h100_build_bench_v2.txt"
left=$(( 228 - ($(date +%s) - t0) ))
[ "$left" -gt 5 ] && timeout "$left" /tmp/kvsift_cuda_tests 2>&1 | tail -30 | tee "$OUT/h100_cuda_tests_v2.txt"
echo "total $(( $(date +%s) - t0 )) s"
