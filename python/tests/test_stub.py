"""python/kvsift/__init__.pyi describes the package as built: every public name, method and
property is in the stub and nothing else is, and every function's parameters (names, order,
keyword-only marker, defaults) equal those pybind11 reports in its signature. Submodules
(kvsift.transformers, once imported) are not names of the extension and have their own code."""

import ast
import inspect
import types
from pathlib import Path

import kvsift as ks

STUB = Path(__file__).resolve().parent.parent / "kvsift" / "__init__.pyi"
ALIASES = {"ArrayLike", "Filter", "PathLike"}  # the stub's own helpers
DUNDERS = {"__init__", "__getstate__", "__setstate__", "__len__"}


def stub_tree():
    return ast.parse(STUB.read_text())


def public(names):
    return {n for n in names if not n.startswith("_") or n in DUNDERS}


def pybind_params(fn):
    """[(name, default or None, keyword_only)] from the first line of a pybind11 docstring."""
    line = fn.__doc__.split("\n")[0]
    inner = line[line.index("(") + 1 : line.rindex(")", 0, line.index(" -> "))]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    out, kw = [], False
    for p in parts:
        if p == "*":
            kw = True
            continue
        name = p.split(":")[0].strip()
        default = p.split(" = ")[1] if " = " in p else None
        if name != "self":
            out.append((name, default, kw))
    return out


def stub_params(node):
    a = node.args
    pos = [x for x in a.posonlyargs + a.args if x.arg != "self"]
    defaults = [None] * (len(pos) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    out = [(x.arg, d, False) for x, d in zip(pos, defaults)]
    out += [
        (x.arg, None if d is None else ast.unparse(d), True)
        for x, d in zip(a.kwonlyargs, a.kw_defaults)
    ]
    return out


def test_stub_names_equal_the_modules():
    tree = stub_tree()
    top = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            top.add(node.target.id)
        elif isinstance(node, ast.Assign):
            top.update(t.id for t in node.targets)
    names = [n for n in dir(ks) if not n.startswith("_")]
    module = {n for n in names if not isinstance(getattr(ks, n), types.ModuleType)} | {"__version__"}
    assert top - ALIASES == module


def test_stub_classes_and_signatures_equal_the_modules():
    checked = 0
    for node in stub_tree().body:
        if isinstance(node, ast.FunctionDef):
            assert stub_params(node) == pybind_params(getattr(ks, node.name)), node.name
            checked += 1
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(ks, node.name)
        if issubclass(cls, Exception):
            continue
        members = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef)}
        names = public(vars(cls))
        if (vars(cls)["__init__"].__doc__ or "").startswith("Initialize self"):
            names.discard("__init__")  # no constructor bound: results made by kvsift only
        assert set(members) == names, node.name
        for name, m in members.items():
            attr = vars(cls)[name]
            if isinstance(attr, property):
                decorators = [ast.unparse(d) for d in m.decorator_list]
                assert "property" in decorators, (node.name, name)
            elif name not in ("__getstate__", "__setstate__", "__len__"):
                fn = attr.__func__ if isinstance(attr, staticmethod) else getattr(cls, name)
                assert stub_params(m) == pybind_params(fn), (node.name, name)
                checked += 1
    assert checked > 30
