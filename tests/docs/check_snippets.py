#!/usr/bin/env python3
"""Checks that every C++ snippet in README.md and docs/ is code the tests compile.

A test file fences a region (as CUB does):

    // example-begin NAME
    ...code...
    // example-end NAME

and the doc marks its copy of that region with an HTML comment on the line before the block:

    <!-- example: NAME -->
    ```cpp
    ...code...
    ```

The check fails when a marked block differs from its region (compared after removing the
region's common indentation and trailing blanks), when a C++ block in the docs carries no marker,
when a marker names no region, when a region is unused, duplicated or not closed.

    python3 tests/docs/check_snippets.py [--root REPO]
    python3 tests/docs/check_snippets.py --self-test   # the check must fail on broken docs

Exit status 0 = all snippets match; 1 = a mismatch or a marking error (each is printed).
"""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BEGIN = re.compile(r"^\s*// example-begin ([A-Za-z0-9_.-]+)\s*$")
END = re.compile(r"^\s*// example-end ([A-Za-z0-9_.-]+)\s*$")
MARKER = re.compile(r"^<!-- example: ([A-Za-z0-9_.-]+) -->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([A-Za-z0-9_+-]*)")
CPP_LANGS = {"cpp", "c++", "cxx", "cu", "cuda"}
TEST_SUFFIXES = {".cpp", ".cu", ".hpp", ".cuh", ".inl"}


def normalise(lines: list[str]) -> list[str]:
    """Strips trailing blanks, surrounding empty lines and the common indentation."""
    lines = [ln.rstrip() for ln in lines]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    indents = [len(ln) - len(ln.lstrip(" ")) for ln in lines if ln]
    cut = min(indents, default=0)
    return [ln[cut:] for ln in lines]


def collect_regions(root: Path, errors: list[str]) -> dict[str, tuple[str, list[str]]]:
    regions: dict[str, tuple[str, list[str]]] = {}
    for path in sorted((root / "tests").rglob("*")):
        if path.suffix not in TEST_SUFFIXES or not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        open_name, open_line, body = None, 0, []
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if m := BEGIN.match(line):
                if open_name is not None:
                    errors.append(f"{rel}:{no}: example-begin {m[1]} inside region {open_name} "
                                  f"(opened at line {open_line})")
                open_name, open_line, body = m[1], no, []
            elif m := END.match(line):
                if open_name != m[1]:
                    errors.append(f"{rel}:{no}: example-end {m[1]} does not close "
                                  f"{open_name or 'any open region'}")
                else:
                    if open_name in regions:
                        errors.append(f"{rel}:{open_line}: region {open_name} already defined in "
                                      f"{regions[open_name][0]}")
                    regions[open_name] = (f"{rel}:{open_line}", normalise(body))
                open_name = None
            elif open_name is not None:
                body.append(line)
        if open_name is not None:
            errors.append(f"{rel}:{open_line}: region {open_name} is never closed")
    return regions


def doc_files(root: Path) -> list[Path]:
    return [root / "README.md"] + sorted((root / "docs").rglob("*.md"))


def collect_doc_blocks(root: Path, errors: list[str]) -> list[tuple[str, str, list[str]]]:
    """(location, name, lines) of every marked C++ block; unmarked ones are errors."""
    blocks = []
    for path in doc_files(root):
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        lines = path.read_text(encoding="utf-8").splitlines()
        i, pending = 0, None  # pending: (line number, name) of a marker awaiting its block
        while i < len(lines):
            if m := MARKER.match(lines[i]):
                if pending:
                    errors.append(f"{rel}:{pending[0]}: marker '{pending[1]}' has no code block")
                pending = (i + 1, m[1])
                i += 1
                continue
            f = FENCE.match(lines[i])
            if not f:
                if pending and lines[i].strip():
                    errors.append(f"{rel}:{pending[0]}: marker '{pending[1]}' is not directly "
                                  "followed by a code block")
                    pending = None
                i += 1
                continue
            indent, fence, lang = f[1], f[2], f[3].lower()
            start = i + 1
            j = start
            while j < len(lines) and not lines[j].strip().startswith(fence):
                j += 1
            body = [ln[len(indent):] if ln.startswith(indent) else ln for ln in lines[start:j]]
            if lang in CPP_LANGS:
                if pending is None:
                    errors.append(f"{rel}:{i + 1}: C++ block without '<!-- example: NAME -->': "
                                  "fence it in a test (// example-begin NAME ... // example-end "
                                  "NAME) and mark it")
                else:
                    blocks.append((f"{rel}:{i + 1}", pending[1], normalise(body)))
            elif pending is not None:
                errors.append(f"{rel}:{pending[0]}: marker '{pending[1]}' precedes a "
                              f"'{lang or 'plain'}' block, not a C++ one")
            pending = None
            i = j + 1
        if pending:
            errors.append(f"{rel}:{pending[0]}: marker '{pending[1]}' has no code block")
    return blocks


def check(root: Path) -> int:
    errors: list[str] = []
    regions = collect_regions(root, errors)
    blocks = collect_doc_blocks(root, errors)
    used = set()
    for where, name, body in blocks:
        if name not in regions:
            errors.append(f"{where}: '{name}' names no example region in tests/")
            continue
        used.add(name)
        origin, region = regions[name]
        if body != region:
            diff = "\n".join(difflib.unified_diff(region, body, origin, where, lineterm=""))
            errors.append(f"{where}: snippet '{name}' differs from {origin}:\n{diff}")
    for name in sorted(set(regions) - used):
        errors.append(f"{regions[name][0]}: region '{name}' is shown in no doc (README.md, "
                      "docs/*.md); remove its fence or show it")
    for e in errors:
        print(f"check_snippets: {e}")
    if errors:
        print(f"check_snippets: FAILED ({len(errors)} problem(s))")
        return 1
    print(f"check_snippets: {len(blocks)} C++ snippet(s) in the docs equal their test regions")
    return 0


def self_test(root: Path) -> int:
    """Runs the check on copies of the repository's docs, broken on purpose: each must fail."""
    script = Path(__file__).resolve()

    def run(tmp: Path) -> int:
        return subprocess.run([sys.executable, str(script), "--root", str(tmp)],
                              stdout=subprocess.DEVNULL).returncode

    blocks = collect_doc_blocks(root, [])
    if not blocks:
        print("check_snippets --self-test: no marked snippet to break")
        return 1
    where, name, body = blocks[0]
    doc = where.rsplit(":", 1)[0]
    line = next(ln for ln in body if ln.strip())
    mutations = {
        "a changed line": lambda s: s.replace(line, line + " // drift", 1),
        "a deleted marker": lambda s: s.replace(f"<!-- example: {name} -->\n", "", 1),
        "an unknown name": lambda s: s.replace(f"<!-- example: {name} -->",
                                               "<!-- example: no-such-region -->", 1),
    }
    failures = 0
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        shutil.copytree(root / "tests", tmp / "tests",
                        ignore=shutil.ignore_patterns("*.fbin", "*.bin", "*.npy", "corpus*"))
        shutil.copytree(root / "docs", tmp / "docs")
        shutil.copy(root / "README.md", tmp / "README.md")
        if run(tmp) != 0:
            print("check_snippets --self-test: the unmodified copy does not pass")
            return 1
        original = (tmp / doc).read_text(encoding="utf-8")
        for what, mutate in mutations.items():
            broken = mutate(original)
            assert broken != original, what
            (tmp / doc).write_text(broken, encoding="utf-8")
            rc = run(tmp)
            print(f"check_snippets --self-test: {what} in {doc} ('{name}'): "
                  f"{'fails as it must' if rc == 1 else f'NOT DETECTED (exit {rc})'}")
            failures += rc != 1
        (tmp / doc).write_text(original, encoding="utf-8")
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2],
                    help="repository root (default: two levels above this script)")
    ap.add_argument("--self-test", action="store_true",
                    help="check that broken copies of the docs fail the check")
    args = ap.parse_args()
    return self_test(args.root) if args.self_test else check(args.root)


if __name__ == "__main__":
    sys.exit(main())
