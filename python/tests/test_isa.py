"""ISA dispatch (kvsift/_isa.py, python/CMakeLists.txt): the package imports the fastest build of
the extension the CPU runs, KVSIFT_ISA overrides the choice and is refused for a build the CPU
cannot run or that is missing, each build really has its instruction set (vector width), and
every build the machine runs answers as the baseline does: searches bit for bit (integer data,
exact dot products), attention to float rounding; a pickle moves between builds."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import kvsift as ks
from kvsift import _isa

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / "isa_worker.py"
WIDTH = {"avx512": 16, "avx2": 8, "sse2": 4}
ALL = {"sse2": True, "avx": True, "fma": True, "f16c": True, "avx2": True, "avx512f": True,
       "avx512dq": True, "avx512bw": True, "avx512vl": True}
HASWELL = {**ALL, "avx512f": False, "avx512dq": False, "avx512bw": False, "avx512vl": False}
X86 = _isa.BASELINE == "sse2"
FEATURES = _isa.cpu_features("kvsift")
BUILT = _isa.built("kvsift")
VARIANTS = [v for v in ks._kvsift._variants_built.split(",") if v]


def runnable(isa):
    return isa in BUILT and all(FEATURES.get(f, False) for f in _isa.BUILDS[isa][1])


RUNNABLE = [i for i in _isa.BUILDS if runnable(i)]


def env(isa):
    e = dict(os.environ)
    e["KVSIFT_ISA"] = isa
    e["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return e


def python(isa, *args):
    return subprocess.run([sys.executable, *args], env=env(isa), capture_output=True, text=True,
                          timeout=300)


# ------------------------------------------------------------------ the choice, as a function


def test_auto_picks_the_fastest_build_the_cpu_runs():
    every = set(_isa.BUILDS)
    assert _isa.choose(None, ALL, every) == "avx512"
    assert _isa.choose("auto", HASWELL, every) == "avx2"
    assert _isa.choose("", {"sse2": True}, every) == "sse2"
    assert _isa.choose(None, {}, every) == "sse2"  # no probe (other architectures)
    assert _isa.choose(None, ALL, {"sse2", "avx2"}) == "avx2"  # avx512 not built
    assert _isa.choose(None, ALL, {"sse2"}) == "sse2"
    # One missing feature is enough to rule a build out.
    assert _isa.choose(None, {**ALL, "avx512vl": False}, every) == "avx2"
    assert _isa.choose(None, {**HASWELL, "fma": False}, every) == "sse2"


def test_an_explicit_choice_is_taken_or_refused_with_the_reason():
    every = set(_isa.BUILDS)
    assert _isa.choose("sse2", ALL, every) == "sse2"
    assert _isa.choose("baseline", ALL, every) == "sse2"
    assert _isa.choose(" AVX2 ", ALL, every) == "avx2"
    with pytest.raises(ImportError, match="lacks avx512f, avx512bw, avx512dq, avx512vl"):
        _isa.choose("avx512", HASWELL, every)
    with pytest.raises(ImportError, match="lacks avx2, fma, f16c"):
        _isa.choose("avx2", {"sse2": True}, every)
    with pytest.raises(ImportError, match="_kvsift_avx512 module is not built"):
        _isa.choose("avx512", ALL, {"sse2", "avx2"})
    with pytest.raises(ImportError, match="expected one of auto, avx512, avx2, sse2"):
        _isa.choose("avx1024", ALL, every)


# --------------------------------------------------------------- the builds on this machine


def test_this_process_loaded_the_best_build_with_its_vector_width():
    want = _isa.choose(os.environ.get("KVSIFT_ISA"), FEATURES, BUILT)
    assert ks.isa == (_isa.BASELINE if want == "sse2" else want)
    assert ks._kvsift.__name__ == "kvsift." + _isa.BUILDS[want][0]
    if X86:
        assert ks._kvsift._simd_width == WIDTH[want]
    # Everything public came from that build; classes still report as kvsift.X.
    assert ks.RoarGraphIndex is ks._kvsift.RoarGraphIndex
    assert ks.RoarGraphIndex.__module__ == "kvsift" and ks.InvalidArgument.__module__ == "kvsift"


def test_every_variant_cmake_built_is_there():
    assert set(VARIANTS) <= BUILT
    if X86 and os.environ.get("KVSIFT_PY_ISA_VARIANTS", "ON").upper() != "OFF":
        # CI must build (and so test) the variants: a build without them fails here unless the
        # environment says it was meant (KVSIFT_PY_ISA_VARIANTS=OFF, as the CMake option).
        assert set(VARIANTS) == {"avx2", "avx512"}, VARIANTS
        assert FEATURES.get("sse2") is True  # the probe is built and answers


@pytest.mark.parametrize("isa", list(_isa.BUILDS))
def test_the_environment_selects_a_build_or_refuses_it(isa):
    r = python(isa, "-c", "import kvsift as ks; print(ks.isa, ks._kvsift._simd_width)")
    if isa in RUNNABLE:
        assert r.returncode == 0, r.stderr
        name, width = r.stdout.split()
        assert name == (_isa.BASELINE if isa == "sse2" else isa)
        if X86:
            assert int(width) == WIDTH[isa]
    else:
        # Not built, or the CPU lacks what it is compiled for: an ImportError, never SIGILL.
        assert r.returncode != 0 and "ImportError: kvsift: KVSIFT_ISA" in r.stderr, r.stderr


def test_an_unknown_isa_is_refused():
    r = python("sse4", "-c", "import kvsift")
    assert r.returncode != 0 and "expected one of auto" in r.stderr


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """The worker's results under each build this machine runs; the baseline also pickles its
    first index, which every other build unpickles."""
    tmp = tmp_path_factory.mktemp("isa")
    pick = tmp / "graph.pkl"
    out = {}
    for isa in ["sse2"] + [i for i in RUNNABLE if i != "sse2"]:
        path = tmp / f"{isa}.npz"
        extra = [str(pick)] if isa == "sse2" else [str(tmp / "unused.pkl"), str(pick)]
        r = python(isa, str(WORKER), str(path), *extra)
        assert r.returncode == 0, r.stderr
        out[isa] = dict(np.load(path))
    return out


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_each_build_answers_as_the_baseline_does(results, isa):
    if isa not in results:
        pytest.skip(f"{isa}: not built here or this CPU cannot run it")
    base, got = results["sse2"], results[isa]
    assert got["width"] == WIDTH[isa] and base["width"] == WIDTH["sse2"]
    # Exact dot products: the same graph, the same walk, the same ids and scores.
    for key in ("search_ids", "search_scores", "flat_ids", "flat_scores", "dipr_ids",
                "dipr_counts"):
        np.testing.assert_array_equal(got[key], base[key], err_msg=key)
    # Attention sums in another order (4, 8 or 16 lanes): equal to rounding.
    for dt in ("f32", "f16"):
        for key in (f"sparse_o_{dt}", f"sparse_lse_{dt}", f"step_o_{dt}", f"step_lse_{dt}"):
            np.testing.assert_allclose(got[key], base[key], rtol=1e-5, atol=1e-6, err_msg=key)
    # The baseline's pickle loads in this build and answers as both builds' own indexes do.
    for key in ("ids", "scores"):
        np.testing.assert_array_equal(got[f"unpickled_{key}"], got[f"own_{key}"])
        np.testing.assert_array_equal(got[f"own_{key}"], base[f"own_{key}"])
