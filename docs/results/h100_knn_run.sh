#!/usr/bin/env bash
# Exact commands of the issue-6 device runs (H100): build with nvcc, CUDA tests, the kNN tests
# under compute-sanitizer memcheck, then the benchmarks. Run from the repository root with the
# header-only dependencies under ../.devdeps/include. Logs go to $OUT (default /tmp/out).
# Usage: docs/results/h100_knn_run.sh [all|perhead]
set -u -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
D=../.devdeps/include
F="-std=c++20 -O3 -arch=sm_90 -DEIGEN_NO_CUDA -Iinclude -Icuda/include -I$D -I$D/eigen3
   -Xcompiler=-march=native,-Wno-unknown-pragmas -lcublas"
mode=${1:-all}
nproc; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
t0=$(date +%s)
if [ "$mode" = all ]; then
  nvcc $F tests/cuda/*.cu -o /tmp/kvsift_cuda_tests > "$OUT/build_tests.txt" 2>&1 &
  nvcc $F bench/cuda/knn_bench.cu -o /tmp/knn_bench > "$OUT/build_knn.txt" 2>&1 &
fi
nvcc $F bench/cuda/build_bench.cu -o /tmp/build_bench > "$OUT/build_build.txt" 2>&1 &
wait
tail -5 "$OUT"/build_*.txt
echo "built in $(( $(date +%s) - t0 )) s"
if [ "$mode" = all ]; then
  timeout 90 /tmp/kvsift_cuda_tests 2>&1 | tee "$OUT/h100_knn_tests.txt"
  timeout 100 compute-sanitizer --tool memcheck --leak-check full /tmp/kvsift_cuda_tests knn \
    2>&1 | tail -40 | tee "$OUT/h100_knn_memcheck.txt"
  timeout 90 /tmp/knn_bench 2>&1 | tee "$OUT/h100_knn_bench.txt"
  timeout 120 /tmp/build_bench --per-head 0 --pipeline-heads 4 --pipeline-keys 16384 2>&1 |
    tee "$OUT/h100_knn_build_bench.txt"
else
  timeout 280 /tmp/build_bench --pipeline-heads 0 2>&1 | tee "$OUT/h100_knn_build_perhead.txt"
fi
echo "total $(( $(date +%s) - t0 )) s"
