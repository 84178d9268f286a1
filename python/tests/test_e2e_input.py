"""Bad input of the end-to-end example (examples/python/e2e_generation.py): a prompt longer
than the model context and a window larger than the prompt raise before any model work.
(An index for another head dim is tested in test_kvsift.py.)"""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def e2e():
    path = ROOT / "examples" / "python" / "e2e_generation.py"
    spec = importlib.util.spec_from_file_location("e2e_generation", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # imports bench/data/dump_qk.py (numpy only at import time)
    return mod


def test_prompt_fitting_the_context_is_accepted(e2e):
    e2e.check_fits(8185, 7, 8192)
    e2e.check_fits(641, 1, 8192)


def test_prompt_longer_than_context_raises(e2e):
    with pytest.raises(e2e.E2EError, match="prompt of 8190 tokens \\+ 7 new tokens exceeds the model context 8192"):
        e2e.check_fits(8190, 7, 8192)
    with pytest.raises(ValueError):
        e2e.check_fits(9000, 0, 8192)


def test_window_larger_than_prompt_raises(e2e):
    with pytest.raises(e2e.E2EError, match="window of 128 \\+ 512 tokens is not smaller than the prompt \\(600 tokens\\)"):
        e2e.check_fits(600, 7, 8192)
    with pytest.raises(e2e.E2EError, match="window of 128 \\+ 512"):
        e2e.check_fits(640, 7, 8192)
    with pytest.raises(e2e.E2EError, match="window of 16 \\+ 64"):
        e2e.check_fits(50, 1, 8192, sink=16, recent=64)
