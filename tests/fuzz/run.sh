#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, KVSIFT_FUZZ=ON) and runs each for a while.
#   tests/fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]
# Defaults: 60 s (what CI runs) and every target. A longer local run, e.g. an hour each:
#   tests/fuzz/run.sh 3600
# Seeds are written by kvsift_fuzz_make_seeds from files the library writes, plus the tiny
# committed seeds in tests/fuzz/corpus/<target>/; new interesting inputs accumulate in
# build-fuzz/corpus/<target>/ (kept between runs). A crash leaves its input as
# build-fuzz/crash-* (reproduce: build-fuzz/bin/kvsift_fuzz_<target> build-fuzz/crash-...)
# and makes this script exit non-zero.
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds="${1:-60}"
shift || true
build="${KVSIFT_FUZZ_BUILD:-build-fuzz}"
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=()
  for f in tests/fuzz/*_fuzz.cpp; do
    name="$(basename "$f" _fuzz.cpp)"
    targets+=("$name")
  done
fi

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DKVSIFT_FUZZ=ON -DKVSIFT_BUILD_TESTS=OFF -DKVSIFT_BUILD_BENCH=OFF -DKVSIFT_BUILD_EXAMPLES=OFF \
  -DKVSIFT_CUDA=OFF "${launcher[@]}" >/dev/null
build_targets=(kvsift_fuzz_make_seeds)
for t in "${targets[@]}"; do build_targets+=("kvsift_fuzz_$t"); done
cmake --build "$build" -j"$(nproc)" --target "${build_targets[@]}"

seeds="$build/seeds"
rm -rf "$seeds"
"$build/bin/kvsift_fuzz_make_seeds" "$seeds"

status=0
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"
  mkdir -p "$corpus"
  dirs=("$corpus")
  [[ -d "$seeds/$t" ]] && dirs+=("$seeds/$t")
  [[ -d "tests/fuzz/corpus/$t" ]] && dirs+=("tests/fuzz/corpus/$t")
  echo "== fuzzing $t for ${seconds} s"
  # -rss_limit_mb / -malloc_limit_mb: an allocation sized by unchecked input is a crash.
  rc=0
  "$build/bin/kvsift_fuzz_$t" -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=2048 \
    -malloc_limit_mb=1024 -timeout=10 -artifact_prefix="$build/" "${dirs[@]}" \
    >"$build/fuzz-$t.log" 2>&1 || rc=$?
  grep -E "^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)" \
    "$build/fuzz-$t.log" || true
  if ((rc != 0)); then
    grep -E "==[0-9]+==ERROR|SUMMARY|deadly signal|uncaught|Test unit written" "$build/fuzz-$t.log" >&2 || true
    echo "!! $t failed (exit $rc): see $build/fuzz-$t.log" >&2
    status=1
  fi
done
exit "$status"
