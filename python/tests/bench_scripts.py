"""Runs a Python benchmark of bench/python/ as its users do, for the smoke tests
(test_bench_python.py, and test_cuda.py for the CUDA ones): `python3 bench/python/<script>.py`
with this package on PYTHONPATH."""

import os
import pathlib
import subprocess
import sys

import kvsift as ks

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE_DIR = str(pathlib.Path(ks.__file__).resolve().parents[1])


def run_bench(script, *args, **env):
    """stdout of bench/python/`script` run with `args` (and `env` added to the environment);
    fails the calling test with the script's stderr when it exits with an error."""
    e = dict(os.environ, PYTHONPATH=PACKAGE_DIR, **env)
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "python" / script), *args], env=e,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout
