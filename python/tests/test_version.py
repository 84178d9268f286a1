"""kvsift.__version__ is the library's version and the package's (pyproject.toml)."""

import pathlib
import re

import kvsift


def test_version_matches_pyproject_and_cmake():
    root = pathlib.Path(__file__).resolve().parents[2]
    pyproject = (root / "python" / "pyproject.toml").read_text()
    cmake = (root / "CMakeLists.txt").read_text()
    package = re.search(r'^version\s*=\s*"([^"]+)"', pyproject, re.M).group(1)
    library = re.search(r"project\(kvsift VERSION ([0-9.]+)", cmake).group(1)
    assert kvsift.__version__ == package == library
