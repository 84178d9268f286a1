#!/usr/bin/env bash
# Installs what is missing of kvsift's build, test and CI dependencies (Debian 12). Idempotent:
# nothing is downloaded when everything is already installed.
set -euo pipefail

# python3-dev, pybind11-dev, python3-numpy, python3-pytest: the Python module (python/) and
# its tests, built with CMake against Debian's python3 (no network needed at build time).
# libhnswlib-dev, libfaiss-dev: the optional peers of kvsift-bench (bench/peers/), so CI runs
# the peers' CTest too; kvsift itself never depends on them.
# libhdf5-dev: kvsift-bench --hdf5 (ann-benchmarks files) and its CTest; optional likewise.
# python3-pip: installs PyTorch + transformers from PyPI for the Python tests (see the end).
packages=(build-essential cmake libeigen3-dev libxsimd-dev catch2 libbenchmark-dev clang-format
          python3 python3-dev pybind11-dev python3-numpy python3-pytest libhnswlib-dev
          libfaiss-dev libhdf5-dev python3-pip)
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
else
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
fi

# PyTorch + transformers for Debian's python3 (kvsift.transformers and the torch tests), from
# PyPI, every version and hash pinned in python/requirements-ci.txt. They go into their own
# directory (KVSIFT_PYDEPS, put on PYTHONPATH by .ci/test.sh), never into dist-packages, so
# Debian's NumPy and other users of /usr/bin/python3 are unaffected; --no-deps because the file
# is the complete resolved set. Cost, measured on the build machine: 2.72 GB downloaded and
# unpacked in 89 s wall (download 100-200 MB/s that time; an earlier download ran at ~25 MB/s,
# ~2 min more), 4.2 GB on disk, 0.2 s when already installed. PyPI's Linux torch is the CUDA
# build, whose nvidia-* libraries (~2.1 GB of the download) it needs just to load, CPU only or
# not (the CPU wheel index, download.pytorch.org, is not reachable from our build machines).
# Idempotent: a stamp holding the requirements' hash skips everything when it matches; the set
# is unpacked next to the old one and swapped in only when complete. KVSIFT_NO_TORCH=1 skips
# it (offline machines: the torch tests then skip, and say so).
reqs="$(dirname "$0")/../python/requirements-ci.txt"
pydeps="${KVSIFT_PYDEPS:-${XDG_CACHE_HOME:-$HOME/.cache}/kvsift/pydeps}"
if [[ "${KVSIFT_NO_TORCH:-0}" == 1 ]]; then
  echo "install-deps: KVSIFT_NO_TORCH=1, not installing torch/transformers"
  exit 0
fi
want="$(sha256sum "$reqs" | cut -d' ' -f1)"
if [[ -f "$pydeps/.kvsift-stamp" && "$(cat "$pydeps/.kvsift-stamp")" == "$want" ]]; then
  echo "install-deps: torch + transformers present in $pydeps"
  exit 0
fi
echo "install-deps: installing torch + transformers into $pydeps (2.7 GB download)"
mkdir -p "$(dirname "$pydeps")"
rm -rf "$pydeps.partial"
/usr/bin/python3 -m pip install --disable-pip-version-check --no-cache-dir --no-compile \
  --no-deps --require-hashes --only-binary=:all: --target "$pydeps.partial" -r "$reqs"
echo "$want" >"$pydeps.partial/.kvsift-stamp"
rm -rf "$pydeps"
mv "$pydeps.partial" "$pydeps"
