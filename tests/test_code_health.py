"""Structure checks that keep the code easy to change (issue #18).

- No import cycle among the modules of src/pydflash. Every import counts,
  module level or inside a function, except those under ``if TYPE_CHECKING:``
  (never run; the type checker alone reads them). An edge goes to the module
  named: ``from .x import y`` -> pydflash.x (and pydflash.x.y when that is a
  module), ``from . import x`` -> pydflash.x when x is a module, else the
  package. Importing pydflash.x also runs the package's ``__init__`` first;
  that implicit parent edge is left out (every module would otherwise sit in
  a cycle with ``__init__``, which imports the public modules).
- No module uses another pydflash module's private members. A private name
  is a single-underscore name (not a dunder) that a module defines: a
  module-level def/class/assignment, a class-body member, or an attribute it
  assigns on ``self``/``cls`` (``self._x = ...``). A module may use the
  private names it defines itself; it may not ``from .other import _name``
  nor read or write ``anything._name`` when ``_name`` is defined by another
  pydflash module and not by it. Private *modules* (``_core``,
  ``_generation``) are the package's own and may be imported. Names the
  standard library keeps private (``os._exit``) are not pydflash's and are
  not checked. A name both modules define passes (a known blind spot).
- No module imports a name from the package root (``from .. import Llama``):
  the layer contract in pyproject.toml (``lint-imports``, TYPE_CHECKING
  imports included) ignores imports of the root, since ``from . import _core``
  (a compiled module it cannot see) reads as one.
- The engine is the core pair's only owner: outside ``pydflash.engine`` (and
  ``pydflash.pair``, the step API the engine makes over it) no module names
  ``_core.ContextPair`` (to build one, type one or import it) nor a
  ``_pair_core`` attribute; callers reach the pair through the engine's methods.
- No function over 80 lines: Python by its ast; C++ by a brace-matching
  scanner over namespace-/class-level function bodies (comments and literals
  blanked first). The pybind11 ``register_*`` functions are exempt by name:
  they are declarative tables (one ``.def`` per bound member).

- No test file imports another test file or conftest.py (a module, in its
  code or in a script it runs in a subprocess): what several files share lives in
  tests/support/ (helpers, constants) or tests/conftest.py (fixtures, which pytest
  finds without an import).

Each check is a function of plain data so that tests below can show it fails
on a synthetic violation.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "pydflash"
CSRC = ROOT / "csrc"
MAX_FUNCTION_LINES = 80
CPP_EXEMPT = re.compile(r"(^|::)register_\w+$")  # pybind11 declarative tables


# -- modules and their imports ---------------------------------------------------


def package_sources(root: Path = SRC, package: str = "pydflash") -> dict[str, tuple[str, bool]]:
    """{module name: (source, is_package)} for every .py file under ``root``, and
    the stub of each compiled module (``_core.pyi``: a module to import from)."""
    out: dict[str, tuple[str, bool]] = {}
    for path in sorted(root.rglob("*.py*")):
        if path.suffix not in (".py", ".pyi") or (path.suffix == ".pyi" and path.with_suffix(".py").exists()):
            continue
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join([package, *parts])] = (path.read_text(encoding="utf-8"), is_pkg)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST) -> Iterable[ast.AST]:
    """Every node except the bodies of ``if TYPE_CHECKING:`` (their else runs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            stack.append(node.test)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _resolve(module: str, is_pkg: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def import_graph(sources: Mapping[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """{module: modules of ``sources`` it imports at run time} (see the docstring)."""
    graph: dict[str, set[str]] = {m: set() for m in sources}
    for mod, (text, is_pkg) in sources.items():
        for node in _runtime_nodes(ast.parse(text)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, is_pkg, node.level, node.module)
                targets = [base]
                targets += [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in sources]
                if node.module is None and len(targets) > 1:
                    targets = targets[1:]  # `from . import x` of modules: not the package itself
            graph[mod].update(t for t in targets if t in sources and t != mod)
    return graph


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


# -- private members --------------------------------------------------------------


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_definitions(text: str) -> set[str]:
    """The private names a module defines (see the docstring)."""
    tree = ast.parse(text)
    out: set[str] = set()

    def targets(t: ast.expr) -> Iterable[str]:
        if isinstance(t, ast.Name):
            yield t.id
        elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in ("self", "cls"):
            yield t.attr
        elif isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                yield from targets(e)

    scopes: list[list[ast.stmt]] = [tree.body]
    scopes += [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    for body in scopes:
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(stmt.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                out.update(targets(t))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            out.update(targets(node.target))
    return {n for n in out if _private(n)}


def private_reads(sources: Mapping[str, tuple[str, bool]]) -> list[str]:
    """'module:line: name' for each use of another pydflash module's private member."""
    own = {m: private_definitions(text) for m, (text, _) in sources.items()}
    found: list[str] = []
    for mod, (text, is_pkg) in sources.items():
        others = set().union(*(names for m, names in own.items() if m != mod)) - own[mod]
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom):
                base = _resolve(mod, is_pkg, node.level, node.module)
                if base not in sources:
                    continue
                found += [f"{mod}:{node.lineno}: from {base} import {a.name}" for a in node.names
                          if _private(a.name) and f"{base}.{a.name}" not in sources]
            elif isinstance(node, ast.Attribute) and node.attr in others:
                found.append(f"{mod}:{node.lineno}: .{node.attr}")
    return sorted(found)


# -- the core pair's owner --------------------------------------------------------

CORE_PAIR_OWNERS = ("pydflash.engine", "pydflash.pair")  # a package, or a module, and what is in it
_STRING_ANNOTATION = re.compile(r"[\w.\[\], |]*\b_core\.ContextPair\b[\w.\[\], |]*")  # not prose


def core_pair_reaches(sources: Mapping[str, tuple[str, bool]], owners: Iterable[str] = CORE_PAIR_OWNERS) -> list[str]:
    """'module:line: what' for each reach to the core pair outside its owners: ``_core.ContextPair``
    (any use: a call, an annotation, ``from ._core import ContextPair``) or a ``_pair_core``
    attribute (TYPE_CHECKING code and string annotations included)."""
    owned = tuple(owners)
    found: list[str] = []
    for mod, (text, is_pkg) in sources.items():
        if any(mod == o or mod.startswith(o + ".") for o in owned):
            continue
        for node in ast.walk(ast.parse(text)):
            if (isinstance(node, ast.Attribute) and node.attr == "_pair_core") or (
                    isinstance(node, ast.Name) and node.id == "_pair_core"):
                found.append(f"{mod}:{node.lineno}: ._pair_core")
            elif (isinstance(node, ast.Attribute) and node.attr == "ContextPair"
                  and isinstance(node.value, ast.Name) and node.value.id == "_core"):
                found.append(f"{mod}:{node.lineno}: _core.ContextPair")
            elif isinstance(node, ast.ImportFrom) and _resolve(mod, is_pkg, node.level, node.module).endswith("._core"):
                found += [f"{mod}:{node.lineno}: from _core import ContextPair" for a in node.names
                          if a.name == "ContextPair"]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if _STRING_ANNOTATION.fullmatch(node.value):
                    found.append(f"{mod}:{node.lineno}: '_core.ContextPair'")
    return sorted(found)


def test_core_pair_check_finds_synthetic_reaches():
    fake = {
        "pkg.engine": ("", True),
        "pkg.engine.engine": ("from .. import _core\nclass E:\n    def __init__(self, t):\n"
                              "        self._core = _core.ContextPair(t, None, None)\n", False),
        "pkg.pair": ("from . import _core\ndef f(core: _core.ContextPair) -> None: ...\n", False),
        "pkg.llama": ("from . import _core\nclass L:\n    def f(self, t):\n"
                      "        self._pair_core = _core.ContextPair(t, None, None)\n"
                      "        self._pair_core.interrupt()\n", False),
        "pkg.cache": ("from ._core import ContextPair\ndef g(core: '_core.ContextPair') -> None: ...\n", False),
        "pkg.api": ("class A:\n    _pair_core: object = None\n", False),
        "pkg.ok": ("from .engine.engine import E\ndef h(e: E) -> None:\n    e.interrupt()  # not _core.ContextPair\n",
                   False),
    }
    got = core_pair_reaches(fake, ("pkg.engine", "pkg.pair"))
    assert got == ["pkg.api:2: ._pair_core", "pkg.cache:1: from _core import ContextPair",
                   "pkg.cache:2: '_core.ContextPair'", "pkg.llama:4: ._pair_core", "pkg.llama:4: _core.ContextPair",
                   "pkg.llama:5: ._pair_core"], got


def test_only_the_engine_reaches_the_core_pair():
    assert core_pair_reaches(package_sources()) == []


# -- sizes ------------------------------------------------------------------------


def source_files() -> list[Path]:
    files = [p for p in SRC.rglob("*") if p.suffix in (".py", ".pyi")]
    files += [p for p in CSRC.rglob("*") if p.suffix in (".cpp", ".h")]
    return sorted(files)


def long_python_functions(text: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(qualified name, lines) of each def longer than ``limit`` lines (def line to last line)."""
    out: list[tuple[str, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    n = (child.end_lineno or child.lineno) - child.lineno + 1
                    if n > limit:
                        out.append((name, n))
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(text), "")
    return out


_CPP_TOKENS = re.compile(r'//[^\n]*|/\*.*?\*/|R"(?P<d>[^(]*)\(.*?\)(?P=d)"|"(?:\\.|[^"\\\n])*"|'
                         r"'(?:\\.|[^'\\\n])*'", re.S)
_CPP_CONTROL = re.compile(r"\b(if|for|while|switch|catch|do|else|try|return)\b")


def _blank(text: str) -> str:
    """Comments and string/char literals blanked (newlines kept, so line numbers hold)."""
    return _CPP_TOKENS.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def long_cpp_functions(text: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(name, lines) of each namespace- or class-level function body longer than
    ``limit`` lines (from the line of its opening brace's header to its closing
    brace). A brace opens a function when its header (the text since the last
    ; { or } at that level) has a parameter list and is not a control statement;
    braces inside a function (blocks, lambdas, initializers) belong to it."""
    code = _blank(text)
    code = re.sub(r"^\s*#[^\n]*", lambda m: re.sub(r"[^\n]", " ", m.group(0)), code, flags=re.M)
    out: list[tuple[str, int]] = []
    stack: list[tuple[str, str, int]] = []  # (kind, name, start line)
    header_start = 0
    for i, ch in enumerate(code):
        if ch in ";{}":
            header = code[header_start:i]
            if ch == "{":
                in_function = any(kind == "function" for kind, _, _ in stack)
                kind, name = "block", ""
                if not in_function:
                    h = " ".join(header.split())
                    if re.search(r"\b(namespace|extern)\b", h) and "(" not in h:
                        kind = "namespace"
                    elif re.search(r"\b(class|struct|union|enum)\b", h) and "(" not in h:
                        kind = "class"
                    elif "(" in h and not _CPP_CONTROL.match(h) and not h.endswith("="):
                        m = re.search(r"([~\w:]+)\s*\(", h)
                        kind, name = "function", m.group(1) if m else h[:40]
                start = code.count("\n", 0, header_start + len(header) - len(header.lstrip())) + 1
                stack.append((kind, name, start))
            elif ch == "}" and stack:
                kind, name, start = stack.pop()
                end = code.count("\n", 0, i) + 1
                if kind == "function" and end - start + 1 > limit and not CPP_EXEMPT.search(name):
                    out.append((name, end - start + 1))
            header_start = i + 1
    return out


# -- the checks on synthetic data: each can fail ----------------------------------


def test_cycle_check_finds_a_synthetic_cycle():
    fake = {
        "pkg": ("from .a import A\n", True),
        "pkg.a": ("from . import b\nA = 1\n", False),
        "pkg.b": ("def f():\n    from .c import g  # lazily\n", False),
        "pkg.c": ("import pkg.a\ng = 2\n", False),
        "pkg.d": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n", False),
    }
    graph = import_graph(fake)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.c"} and graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.d"] == set()  # TYPE_CHECKING imports never run
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    fake["pkg.c"] = ("g = 2\n", False)
    assert find_cycle(import_graph(fake)) is None


def test_private_check_finds_a_synthetic_read():
    fake = {
        "pkg.a": ("import os\nclass A:\n    def __init__(self):\n        self._x = 1\n"
                  "    def _m(self):\n        return self._x\n_helper = 1\nos._exit\n", False),
        "pkg.b": ("from .a import A, _helper\n\ndef f(a: A):\n    return a._m() + a._x\n", False),
        "pkg.c": ("from .a import A\n\nclass C:\n    def _m(self):\n        return A()._m()\n", False),
    }
    got = private_reads(fake)
    assert got == ["pkg.b:1: from pkg.a import _helper", "pkg.b:4: ._m", "pkg.b:4: ._x"], got
    # pkg.c defines a _m of its own (the blind spot), os._exit is not pydflash's


def test_size_checks_find_synthetic_long_functions():
    long_py = "def f():\n" + "    x = 1\n" * 90 + "\ndef g():\n    return 1\n"
    assert long_python_functions(long_py) == [("f", 91)]
    body = "    x += 1;\n" * 85
    cpp = ("// a comment with { braces }\nnamespace n {\nstruct S {\n    int m(int a) const {\n" + body
           + "        return a;\n    }\n};\nint f(int x) {\n    if (x) {\n        return 1;\n    }\n"
           '    const char* s = "}";\n    return 0;\n}\n'
           "void register_things(M& m) {\n" + body + "}\n}  // namespace n\n")
    assert long_cpp_functions(cpp) == [("m", 88)]


# -- the tree ---------------------------------------------------------------------


def test_no_import_cycle():
    cycle = find_cycle(import_graph(package_sources()))
    assert cycle is None, " -> ".join(cycle or [])


def test_no_module_uses_another_modules_private_members():
    assert private_reads(package_sources()) == []


def root_imports(sources: Mapping[str, tuple[str, bool]], package: str = "pydflash") -> list[str]:
    """``module:line`` of each import of a name from the package root itself
    (``from .. import Llama``) inside the package: the import contract (pyproject,
    ``lint-imports``) cannot see those, since it ignores ``from . import _core``."""
    out = []
    for mod, (text, is_pkg) in sources.items():
        if mod == package:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and _resolve(mod, is_pkg, node.level, node.module) == package:
                if any(f"{package}.{a.name}" not in sources for a in node.names):
                    out.append(f"{mod}:{node.lineno}")
            elif isinstance(node, ast.Import) and any(a.name == package for a in node.names):
                out.append(f"{mod}:{node.lineno}")
    return out


def test_root_import_check_finds_a_synthetic_one():
    sources = {"p": ("from .a import A\n", True), "p.a": ("A = 1\n", False),
               "p.b": ("from . import a\n", False), "p.c": ("from . import A\n", False)}
    assert root_imports(sources, "p") == ["p.c:1"]


def test_no_module_imports_names_from_the_package_root():
    assert root_imports(package_sources()) == []


TESTS = ROOT / "tests"
# a script a test runs in a subprocess is a string: its import lines
_SCRIPT_IMPORT = re.compile(r"^\s*(?:from\s+(\w+)[\w.]*\s+import|import\s+(\w+))", re.MULTILINE)


def imports_of_test_files(text: str, test_modules: Iterable[str]) -> list[str]:
    """``line: module`` of each import of a test file or of conftest (by its top-level
    name) in ``text``, in its code or in a string constant (a subprocess's script)."""
    banned = {*test_modules, "conftest"}
    out = []
    for node in ast.walk(ast.parse(text)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [a or b for a, b in _SCRIPT_IMPORT.findall(node.value)]
        out += [f"{node.lineno}: {n}" for n in names if n.split(".")[0] in banned]
    return out


def test_test_import_check_finds_synthetic_ones():
    text = ("import os\nimport test_a as ta\nfrom test_b import x\nfrom support.pairs import PAIRS\n"
            "def f():\n    from conftest import TARGET\n"
            'SCRIPT = """\nimport sys\nfrom test_a import y\n"""\n'
            "from .test_a import z  # relative: a package's own module, not a test file\n")
    assert imports_of_test_files(text, ["test_a", "test_b"]) == [
        "2: test_a", "3: test_b", "6: conftest", "7: test_a"], imports_of_test_files(text, ["test_a", "test_b"])


def test_no_test_file_imports_another_test_file():
    test_modules = [p.stem for p in TESTS.glob("test_*.py")]
    files = [p for p in sorted(TESTS.rglob("*.py")) if p != Path(__file__)]  # this file's synthetic ones are data
    bad = [f"{p.relative_to(ROOT)}:{hit}" for p in files
           for hit in imports_of_test_files(p.read_text(encoding="utf-8"), test_modules)]
    assert bad == [], "move what several test files share to tests/support/ or tests/conftest.py: " + ", ".join(bad)


def test_no_python_function_over_80_lines():
    long = {f"{p.relative_to(ROOT)}:{name}": n for p in source_files() if p.suffix == ".py"
            for name, n in long_python_functions(p.read_text(encoding="utf-8"))}
    assert not long, long


def test_no_cpp_function_over_80_lines():
    long = {f"{p.relative_to(ROOT)}:{name}": n for p in source_files() if p.suffix in (".cpp", ".h")
            for name, n in long_cpp_functions(p.read_text(encoding="utf-8"))}
    assert not long, long


@pytest.mark.parametrize("path", [p for p in source_files() if p.suffix in (".cpp", ".h")],
                         ids=lambda p: str(p.relative_to(CSRC)))
def test_cpp_scanner_balances_braces(path):
    # the scanner's view of every C++ file must balance, or its function lengths mean nothing
    code = _blank(path.read_text(encoding="utf-8"))
    assert code.count("{") == code.count("}")


def test_the_draft_length_policy_stays_within_400_lines_with_its_cost_model():
    """Issue #50's bound: the policy is a thing one can hold in one's head."""
    files = sorted((SRC / "draft_length").glob("*.py"))
    assert {f.name for f in files} >= {"policy.py", "cost.py"}
    assert sum(len(f.read_text().splitlines()) for f in files) <= 400
