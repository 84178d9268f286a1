#!/usr/bin/env bash
# Build kvsift (Release, with benchmarks) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

bash .ci/install-deps.sh

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKVSIFT_BUILD_BENCH=ON -DKVSIFT_NATIVE=OFF
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j2

# The Python module against Debian's python3 (the interpreter python3-numpy/-pytest belong to,
# which may not be the first python3 on PATH, e.g. under pyenv), then its pytest suite.
# `pip install ./python` builds the same CMake project through scikit-build-core.
debian_python=/usr/bin/python3
cmake -S python -B build/python -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$debian_python"
cmake --build build/python -j"$(nproc)"
# bench/data/test_dump_qk.py checks dump_qk.py's bad-input paths and the model-free parts of the
# Gemma-3 pass; its model tests skip where gguf is not installed (CI never downloads a model).
# bench/eval/test_evaluate.py runs the evaluation on the committed sample (--quick) and
# bench/peers/test_compare_roargraph.py the peer driver and kvsift-bench's --save-* flags,
# both with the kvsift-bench built above; bench/eval/test_pyeval.py runs the Python-module
# evaluation (pyeval.py --quick) on the sample with the module built above (its hnswlib /
# faiss rows are skipped, and said so, where those pip packages are not installed).
# PyTorch + transformers (python/tests/test_transformers.py, the torch DLPack tests) come from
# the directory .ci/install-deps.sh installed them into (same default; KVSIFT_NO_TORCH=1 there
# skips them, and those tests then skip).
pydeps="${KVSIFT_PYDEPS:-${XDG_CACHE_HOME:-$HOME/.cache}/kvsift/pydeps}"
KVSIFT_BENCH="$PWD/build/bin/kvsift-bench" PYTHONPATH="$PWD/build/python:$pydeps" "$debian_python" \
  -m pytest -q -p no:cacheprovider python/tests bench/data/test_dump_qk.py \
  bench/eval/test_evaluate.py bench/eval/test_pyeval.py bench/peers/test_compare_roargraph.py
