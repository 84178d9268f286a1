#!/usr/bin/env bash
# Exact commands of the GPU connectivity device run (H100): build the CUDA tests (one
# nvcc per file, in parallel) and build_bench with nvcc, run the CUDA tests, build_bench, then
# the graph-search tests under compute-sanitizer (memcheck with leak check, racecheck,
# synccheck). Run from the repository root with the header-only dependencies under
# .devdeps/include. Logs go to $OUT (default /tmp/out).
set -u -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/obj
D=$PWD/.devdeps/include
F="-std=c++20 -O3 -arch=sm_90 -DEIGEN_NO_CUDA -Iinclude -Icuda/include -I$D -I$D/eigen3
   -Xcompiler=-march=native,-Wno-unknown-pragmas"
nproc; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
t0=$(date +%s)
for f in tests/cuda/*.cu; do
  nvcc $F -c "$f" -o "/tmp/obj/$(basename "$f" .cu).o" > "$OUT/build_$(basename "$f" .cu).txt" 2>&1 &
done
nvcc $F bench/cuda/build_bench.cu -o /tmp/build_bench -lcublas > "$OUT/build_build_bench.txt" 2>&1 &
wait
nvcc -arch=sm_90 /tmp/obj/*.o -o /tmp/kvsift_cuda_tests -lcublas > "$OUT/build_link.txt" 2>&1
ls -la /tmp/kvsift_cuda_tests /tmp/build_bench
cat "$OUT"/build_*.txt | grep -i -B2 -A6 error | head -40; rm -f "$OUT"/build_*.txt
echo "built in $(( $(date +%s) - t0 )) s"
timeout 150 /tmp/kvsift_cuda_tests 2>&1 | tee "$OUT/h100_cuda_tests.txt" | tail -45
echo "tests done at $(( $(date +%s) - t0 )) s"
timeout 240 /tmp/build_bench --pipeline-heads 4 --pipeline-keys 16384 2>&1 |
  tee "$OUT/h100_build_bench.txt"
echo "bench done at $(( $(date +%s) - t0 )) s"
left=$(( 550 - ($(date +%s) - t0) ))
for filter in graph_search connectivity; do
  left=$(( 550 - ($(date +%s) - t0) ))
  [ "$left" -gt 10 ] && timeout "$left" compute-sanitizer --tool memcheck --leak-check full \
    /tmp/kvsift_cuda_tests $filter 2>&1 | tail -25 | tee -a "$OUT/h100_graph_search_memcheck.txt"
done
for tool in racecheck synccheck; do
  left=$(( 585 - ($(date +%s) - t0) ))
  [ "$left" -gt 5 ] && timeout "$left" compute-sanitizer --tool $tool /tmp/kvsift_cuda_tests \
    graph_search_small 2>&1 | tail -6 | tee -a "$OUT/h100_graph_search_memcheck.txt"
done
echo "total $(( $(date +%s) - t0 )) s"
