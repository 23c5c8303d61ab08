"""The checked-in _core.pyi names exactly what the compiled module has."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pydflash
from pydflash import _core

STUB = Path(pydflash.__file__).with_name("_core.pyi")


def stub_names() -> dict[str, set[str]]:
    tree = ast.parse(STUB.read_text())
    names: dict[str, set[str]] = {"": set()}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            names[""].add(node.name)
        elif isinstance(node, ast.ClassDef):
            names[""].add(node.name)
            names[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)} | {
                n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[""].add(node.target.id)
    return names


def module_names() -> dict[str, set[str]]:
    names: dict[str, set[str]] = {"": {n for n in dir(_core) if not n.startswith("_")} | {"__version__"}}
    for n in list(names[""]):
        obj = getattr(_core, n)
        if inspect.isclass(obj):
            names[n] = {m for m in vars(obj) if not m.startswith("_")}
    return names


def test_stub_matches_module():
    stub, mod = stub_names(), module_names()
    assert stub[""] == mod[""]
    for cls in mod:
        if cls:
            assert stub[cls] - {"__init__"} == mod[cls], cls


def test_package_is_typed():
    assert STUB.with_name("py.typed").is_file()
