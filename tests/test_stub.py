"""The checked-in _core.pyi names exactly what the compiled module has, and
each function and method there has the compiled one's signature.

pybind11 writes a function's signature as the first line of its __doc__
("step(self: ContextPair, draft_max: int = -1, ...) -> StepResult"). A
signature here is the parameters in order: name, kind (*args, **kwargs) and
default. Defaults are compared where they are printable literals; a default
that is an object (pybind11 prints its repr, e.g. ``PairParams(...)``) must be
``...`` in the stub. Annotations are not compared (pybind11 spells C++ types
its own way). Properties and classes are compared by name."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
import types
from pathlib import Path

import pytest

import pydflash
from pydflash import _core

STUB = Path(pydflash.__file__).with_name("_core.pyi")
TOOL = Path(__file__).resolve().parent.parent / "tools" / "write_stub.py"
_spec = importlib.util.spec_from_file_location("write_stub", TOOL)
assert _spec is not None and _spec.loader is not None
write_stub = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(write_stub)
NOT_PRINTABLE = "<object>"

Signature = list[tuple[str, str | None]]  # (name with * or ** for var args, default or None)


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


def _default(node: ast.expr | None) -> str | None:
    if node is None:
        return None
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return NOT_PRINTABLE
    return NOT_PRINTABLE if value is Ellipsis else repr(value)


def signature_of(fn: ast.FunctionDef) -> Signature:
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    sig = [(p.arg, _default(d)) for p, d in zip(positional, defaults, strict=True)]
    if a.vararg:
        sig.append(("*" + a.vararg.arg, None))
    sig += [(p.arg, _default(d)) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    if a.kwarg:
        sig.append(("**" + a.kwarg.arg, None))
    return sig


def parse_pybind_signature(doc: str, name: str) -> Signature:
    """The signature pybind11 wrote as ``doc``'s first line."""
    first = (doc or "").splitlines()[0] if doc else ""
    if not first.startswith(name + "("):
        raise AssertionError(f"{name}: no pybind11 signature in its docstring: {first!r}")
    if "Overloaded function" in doc:
        raise AssertionError(f"{name} is overloaded: compare each overload (this test does not yet)")
    text = re.sub(r"=\s*<[^<>]*>", "= ...", first)  # a repr like <X object at 0x...>
    tree = ast.parse(f"def {text}: ...")
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    return signature_of(fn)


def stub_functions() -> dict[str, ast.FunctionDef]:
    """'name' and 'Class.name' of every function in the stub that is not a property."""
    out: dict[str, ast.FunctionDef] = {}
    tree = ast.parse(STUB.read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for m in node.body:
                if isinstance(m, ast.FunctionDef) and not any(
                        isinstance(d, ast.Name) and d.id == "property" for d in m.decorator_list):
                    out[f"{node.name}.{m.name}"] = m
    return out


def runtime_doc(qualname: str) -> str:
    obj = _core
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj.__doc__ or ""


def test_stub_matches_module():
    stub, mod = stub_names(), module_names()
    assert stub[""] == mod[""]
    for cls in mod:
        if cls:
            # private members (the test-only _inject_fault) are listed but not compared
            assert {n for n in stub[cls] if not n.startswith("_")} == mod[cls], cls


def test_pybind_signature_parser():
    # the parser this test relies on: order, defaults (printable or not), var args
    doc = ("step(self: pydflash._core.ContextPair, draft_max: typing.SupportsInt = -1, tag: str = 'x', "
           "params: pydflash._core.P = P(a=1), obj: object = <pydflash._core.X object at 0x7f00>, "
           "*args, **kwargs) -> None\n\nDoes a step.")
    assert parse_pybind_signature(doc, "step") == [
        ("self", None), ("draft_max", "-1"), ("tag", "'x'"), ("params", NOT_PRINTABLE), ("obj", NOT_PRINTABLE),
        ("*args", None), ("**kwargs", None)]
    stub = ast.parse("def step(self, draft_max: int = -1, tag: str = 'x', params: P = ..., obj: object = ..., "
                     "*args: int, **kwargs: object) -> None: ...").body[0]
    assert isinstance(stub, ast.FunctionDef)
    assert signature_of(stub) == parse_pybind_signature(doc, "step")
    swapped = ast.parse("def step(self, tag: str = 'x', draft_max: int = -1, params: P = ..., obj: object = ..., "
                        "*args: int, **kwargs: object) -> None: ...").body[0]
    assert isinstance(swapped, ast.FunctionDef)
    assert signature_of(swapped) != parse_pybind_signature(doc, "step")


@pytest.mark.parametrize("qualname", sorted(stub_functions()))
def test_stub_signature_matches_module(qualname):
    want = parse_pybind_signature(runtime_doc(qualname), qualname.rsplit(".", 1)[-1])
    assert signature_of(stub_functions()[qualname]) == want


def test_every_bound_constructor_is_in_the_stub():
    bound = [n for n in module_names() if inspect.isclass(obj := getattr(_core, n, None))
             and (obj.__init__.__doc__ or "").startswith("__init__(")]
    assert bound  # the check sees pybind11's constructors at all
    missing = [n for n in bound if f"{n}.__init__" not in stub_functions()]
    assert not missing, missing


def test_package_is_typed():
    assert STUB.with_name("py.typed").is_file()


def test_stub_fields_of_the_x_macro_classes_are_written_by_the_tool():
    # SamplingParams' and DraftControl's plain fields come from X-macro lists (csrc/fields.h):
    # their stub lines are derived from the compiled module, not edited by hand
    assert {"SamplingParams", "DraftControl"} <= {
        n for n in dir(_core) if hasattr(getattr(_core, n), "_plain_fields")}
    text = STUB.read_text()
    if write_stub.render(text, _core) != text:
        pytest.fail("_core.pyi's option fields differ from the compiled module's: run python tools/write_stub.py")


class _Opts:
    """A bound option class as write_stub sees it: properties in binding order."""

    _plain_fields = ("temperature", "top_k", "added")
    temperature = property(lambda self: 0.0)
    top_k = property(lambda self: 0)
    added = property(lambda self: False)
    verify = property(lambda self: "rejection")


def test_write_stub_rewrites_plain_fields_and_keeps_hand_written_ones():
    stub = ("class _Opts:\n    top_k: float\n    verify: Literal['x']\n    temperature: float\n"
            "    @staticmethod\n    def make() -> _Opts: ...\n\nclass Other:\n    a: int\n")
    core = types.SimpleNamespace(_Opts=_Opts, Other=type("Other", (), {}))
    assert write_stub.render(stub, core) == (
        "class _Opts:\n    temperature: float\n    top_k: int\n    added: bool\n    verify: Literal['x']\n"
        "    @staticmethod\n    def make() -> _Opts: ...\n\nclass Other:\n    a: int\n")
    with pytest.raises(ValueError, match="verify is bound by hand"):
        write_stub.render("class _Opts:\n    def f(self) -> None: ...\n", core)
