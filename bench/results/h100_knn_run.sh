#!/usr/bin/env bash
# Exact commands of the GPU kNN / build device runs (H100): build with nvcc, CUDA tests, the kNN tests
# under compute-sanitizer memcheck, then the benchmarks. Run from the repository root with the
# header-only dependencies under ../.devdeps/include. Logs go to $OUT (default /tmp/out).
# Run 1: `bench/results/h100_knn_run.sh` with build_bench given --per-head 0 (first version).
# Run 2: FALLBACK=../.dev-knn1 bench/results/h100_knn_run.sh: FALLBACK is a tree whose
# build_bench is used instead if this tree's CUDA tests fail (a kernel change under test).
set -u -o pipefail
OUT=${OUT:-/tmp/out}
FALLBACK=${FALLBACK:-}
mkdir -p "$OUT"
D=$PWD/../.devdeps/include
F="-std=c++20 -O3 -arch=sm_90 -DEIGEN_NO_CUDA -Iinclude -Icuda/include -I$D -I$D/eigen3
   -Xcompiler=-march=native,-Wno-unknown-pragmas -lcublas"
nproc; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
t0=$(date +%s)
nvcc $F tests/cuda/*.cu -o /tmp/kvsift_cuda_tests > "$OUT/build_tests.txt" 2>&1 &
nvcc $F bench/cuda/knn_bench.cu -o /tmp/knn_bench > "$OUT/build_knn.txt" 2>&1 &
nvcc $F bench/cuda/build_bench.cu -o /tmp/build_bench > "$OUT/build_build.txt" 2>&1 &
if [ -n "$FALLBACK" ]; then
  (cd "$FALLBACK" && nvcc $F bench/cuda/build_bench.cu -o /tmp/build_bench_fallback) \
    > "$OUT/build_fallback.txt" 2>&1 &
fi
wait
ls -la /tmp/kvsift_cuda_tests /tmp/knn_bench /tmp/build_bench
echo "built in $(( $(date +%s) - t0 )) s"
BB=/tmp/build_bench
if timeout 90 /tmp/kvsift_cuda_tests 2>&1 | tee "$OUT/h100_knn_tests.txt"; then
  timeout 100 compute-sanitizer --tool memcheck --leak-check full /tmp/kvsift_cuda_tests knn \
    2>&1 | tail -40 | tee "$OUT/h100_knn_memcheck.txt"
  for tool in racecheck synccheck; do
    timeout 40 compute-sanitizer --tool $tool /tmp/kvsift_cuda_tests knn_device_views 2>&1 |
      tail -6 | tee -a "$OUT/h100_knn_memcheck.txt"
  done
  timeout 90 /tmp/knn_bench 2>&1 | tee "$OUT/h100_knn_bench.txt"
elif [ -n "$FALLBACK" ]; then
  echo "CUDA tests failed: build_bench from $FALLBACK" | tee "$OUT/h100_knn_fallback.txt"
  BB=/tmp/build_bench_fallback
fi
left=$(( 285 - ($(date +%s) - t0) ))
echo "build_bench with ${left} s left"
timeout "$left" "$BB" --pipeline-heads 4 --pipeline-keys 16384 2>&1 |
  tee "$OUT/h100_knn_build_bench.txt"
echo "total $(( $(date +%s) - t0 )) s"
