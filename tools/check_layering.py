#!/usr/bin/env python3
"""Checks kvsift's header layering (docs/architecture.md): which directory of
include/kvsift may include which, that no CUDA header reaches Eigen, and that the standard
headers which cost every includer a large share of its compile time are included only where
they are needed (HEAVY_STD).

Every `#include "kvsift/..."` / `#include <kvsift/...>` of every header under include/kvsift
and cuda/include/kvsift is checked against the allowed layers of its directory. Headers kept
at an old path for one release (they contain KVSIFT_DEPRECATED_HEADER) are exempt: they
forward to the new place, wherever it is. Exit status 1 and one line per violation if any.

    tools/check_layering.py            # from anywhere; paths are found from this file
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](kvsift/[^>"]+)[>"]', re.M)
ANY_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)

# The search vocabulary: what index/ may know of search/ (no search algorithm).
SEARCH_VOCABULARY = {
    "search/vocabulary.hpp",
    "search/search_workspace.hpp",
    "search/search_params.hpp",
    "search/predicate.hpp",
    "search/graph.hpp",
    "search/detail/query_checks.hpp",
    "search/detail/dipr_answer.hpp",
}
# The light index/ headers a CUDA header may include (concepts and result types, no Eigen).
INDEX_CONCEPTS = {"index/knn_engine.hpp", "index/knn_result.hpp", "index/connectivity.hpp"}

# layer -> the other layers it may include (its own is always allowed). The index/ concept
# headers form a layer of their own ("index-concepts") so that CUDA code can include them
# without the rest of index/.
ALLOWED = {
    "core": set(),
    "io": {"core"},
    "search-vocabulary": {"core"},
    "search": {"core", "search-vocabulary"},
    "index-concepts": {"core"},
    "index": {"core", "io", "search-vocabulary", "index-concepts"},
    "memory": {"core"},
    "attention": {"core"},
    "reorder": {"core"},
    "testing": {"core"},
    "decode": {"core", "io", "search-vocabulary", "search", "index-concepts", "index", "memory",
               "attention"},
    "cuda": {"core", "memory", "attention", "index-concepts"},
}
# A RoarGraph build runs beam searches (step 3 and the reachability repair), and so does an
# insert (the new key's search for its neighbours): the builder, what composes it and the
# insertable graph may include the search algorithms; no other index/ header may.
INDEX_MAY_SEARCH = {
    "index/roargraph_builder.hpp",
    "index/detail/roargraph_builder.inl",
    "index/build_pipeline.hpp",
    "index/insertable_graph.hpp",
    "index/detail/insertable_graph.inl",
}

# Standard headers that cost an includer 0.1-0.4 s each with g++ 12 (docs/architecture.md,
# "Compile cost"), and the only headers allowed to include them: the fallbacks of the light
# replacements (used where pthreads, POSIX clocks or libstdc++'s <bits/std_function.h> are
# missing), the reader-writer lock of the shared insertable graph, the test-data generator,
# and the CUDA kNN's per-device handle cache.
HEAVY_STD = {
    "thread": {"core/detail/threads.hpp"},
    "atomic": {"core/detail/threads.hpp"},
    "chrono": {"core/detail/clock.hpp"},
    "functional": {"core/detail/std_function.hpp"},
    "mutex": {"core/detail/threads.hpp", "index/shared_insertable_graph.hpp", "cuda/detail/knn.inl"},
    "shared_mutex": {"index/shared_insertable_graph.hpp"},
    "random": {"testing/ood_generator.hpp"},
    "filesystem": set(),
    "future": set(),
    "sstream": set(),
    "iostream": set(),
    "regex": set(),
    "condition_variable": set(),
}


def layer_of(rel: str) -> str:
    if rel.startswith("cuda/"):
        return "cuda"
    if rel in SEARCH_VOCABULARY:
        return "search-vocabulary"
    if rel in INDEX_CONCEPTS:
        return "index-concepts"
    return rel.split("/")[0]


def allowed(src: str, dst: str) -> bool:
    if dst == "kvsift.hpp":
        return False
    src_layer, dst_layer = layer_of(src), layer_of(dst)
    if src_layer == dst_layer or dst_layer in ALLOWED.get(src_layer, set()):
        return True
    return src in INDEX_MAY_SEARCH and dst_layer == "search"


def headers() -> dict[str, Path]:
    out = {}
    for base in (ROOT / "include" / "kvsift", ROOT / "cuda" / "include" / "kvsift"):
        for p in base.rglob("*"):
            if p.suffix in (".hpp", ".cuh", ".inl"):
                out[p.relative_to(base).as_posix()] = p
    return out


def main() -> int:
    files = headers()
    problems = []
    for rel, path in sorted(files.items()):
        if rel == "kvsift.hpp":
            continue
        text = path.read_text()
        if "KVSIFT_DEPRECATED_HEADER(" in text and rel != "core/deprecated_header.hpp":
            continue
        for inc in INCLUDE.findall(text):
            dst = inc[len("kvsift/"):]
            if dst not in files:
                problems.append(f"{rel}: includes <{inc}>, which does not exist")
            elif not allowed(rel, dst):
                problems.append(f"{rel} ({layer_of(rel)}) must not include <{inc}> "
                                f"({layer_of(dst)})")

    # No CUDA header may reach Eigen, directly or through the host headers it includes.
    def reaches_eigen(rel: str, seen: set[str]) -> str | None:
        if rel in seen or rel not in files:
            return None
        seen.add(rel)
        for inc in ANY_INCLUDE.findall(files[rel].read_text()):
            if inc.startswith("Eigen/") or inc.startswith("eigen3/"):
                return rel
            if inc.startswith("kvsift/"):
                hit = reaches_eigen(inc[len("kvsift/"):], seen)
                if hit:
                    return hit
        return None

    for rel, path in sorted(files.items()):
        for inc in ANY_INCLUDE.findall(path.read_text()):
            if inc in HEAVY_STD and rel not in HEAVY_STD[inc]:
                where = ", ".join(sorted(HEAVY_STD[inc])) or "no kvsift header"
                problems.append(f"{rel} includes <{inc}>, which only {where} may include "
                                f"(compile cost; see docs/architecture.md)")

    for rel in sorted(files):
        if rel.startswith("cuda/"):
            hit = reaches_eigen(rel, set())
            if hit:
                problems.append(f"{rel} reaches Eigen through {hit} (CUDA headers must not)")

    for p in problems:
        print(p)
    print(f"check_layering: {len(files)} headers, {len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
