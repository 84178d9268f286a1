"""Which build of the extension kvsift imports: the ISA dispatch of kvsift/__init__.py.

On x86-64 the extension is built up to three times from the same sources (python/CMakeLists.txt):
``_kvsift`` for the baseline (SSE2), ``_kvsift_avx2`` and ``_kvsift_avx512``. Exactly one is
imported per process: each registers the same classes with pybind11, and a second registration
of a class is an error. The choice is made here, before any of them is loaded, from the
features the tiny ``_cpu`` module reports (CPUID + XGETBV: what the CPU and the OS support).
"""

import importlib.util
import platform

#: Builds, fastest first: name -> (module, CPU features it is compiled for). The features must
#: match the -m flags of python/CMakeLists.txt (kvsift_isa_*_flags).
BUILDS = {
    "avx512": ("_kvsift_avx512", ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq",
                                  "avx512vl")),
    "avx2": ("_kvsift_avx2", ("avx2", "fma", "f16c")),
    "sse2": ("_kvsift", ()),
}
#: KVSIFT_ISA values meaning "the best this CPU runs".
AUTO = ("", "auto")
#: The baseline build's name on other architectures (its SIMD is NEON on AArch64); "sse2" and
#: "baseline" both name it everywhere.
BASELINE = "sse2" if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686") else "baseline"


def cpu_features(package):
    """Features of the running CPU and OS, {name: bool}; empty where _cpu is not built (other
    architectures, or KVSIFT_PY_ISA_VARIANTS=OFF)."""
    if importlib.util.find_spec(package + "._cpu") is None:
        return {}
    return importlib.import_module(package + "._cpu").features()


def built(package):
    """Names of the builds present next to this file."""
    return {isa for isa, (mod, _) in BUILDS.items()
            if isa == "sse2" or importlib.util.find_spec(package + "." + mod) is not None}


def choose(requested, features, available):
    """-> the build to import (a key of BUILDS).

    requested: the KVSIFT_ISA value (None, "" or "auto": the best the CPU runs); features:
    {name: bool} of the CPU; available: builds present. An explicit request for a build that is
    missing or that the CPU cannot run raises ImportError (running it would die on an illegal
    instruction) naming what is missing. O(1)."""
    req = (requested or "").strip().lower()
    if req == "baseline":
        req = "sse2"
    if req in AUTO:
        for isa, (_, needs) in BUILDS.items():
            if isa in available and all(features.get(f, False) for f in needs):
                return isa
        return "sse2"
    if req not in BUILDS:
        raise ImportError(f"kvsift: KVSIFT_ISA={requested!r}: expected one of auto, "
                          f"{', '.join(BUILDS)}, baseline")
    missing = [f for f in BUILDS[req][1] if not features.get(f, False)]
    if missing:
        raise ImportError(f"kvsift: KVSIFT_ISA={requested!r}: this CPU (or OS) lacks "
                          f"{', '.join(missing)}; unset KVSIFT_ISA to get the best build it runs")
    if req not in available:
        raise ImportError(f"kvsift: KVSIFT_ISA={requested!r}: the {BUILDS[req][0]} module is not "
                          f"built (x86-64 only, and KVSIFT_PY_ISA_VARIANTS=ON); built: "
                          f"{', '.join(sorted(available))}")
    return req
