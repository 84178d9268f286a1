#!/usr/bin/env bash
# Installs what is missing of kvsift's build, test and CI dependencies (Debian 12). Idempotent:
# nothing is downloaded when everything is already installed.
set -euo pipefail

# python3-dev, pybind11-dev, python3-numpy, python3-pytest: the Python module (python/) and
# its tests, built with CMake against Debian's python3 (no network needed at build time).
# libhnswlib-dev, libfaiss-dev: the optional peers of kvsift-bench (bench/peers/), so CI runs
# the peers' CTest too; kvsift itself never depends on them.
# libhdf5-dev: kvsift-bench --hdf5 (ann-benchmarks files) and its CTest; optional likewise.
packages=(build-essential cmake libeigen3-dev libxsimd-dev catch2 libbenchmark-dev clang-format
          python3 python3-dev pybind11-dev python3-numpy python3-pytest libhnswlib-dev
          libfaiss-dev libhdf5-dev)
# Extra packages a caller needs beyond these (e.g. .ci/run: clang and its fuzzer runtime).
packages+=("$@")

missing=()
for pkg in "${packages[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all dependencies present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
if [[ "$(id -u)" -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "install-deps: not root and sudo not found; install manually: ${missing[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
  "${missing[@]}"
