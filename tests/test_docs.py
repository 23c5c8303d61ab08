"""The docs stay true: every Python block of README.md and docs/*.md runs on the shipped pair,
every public name has a docstring and a place in the API reference, the command-line page lists
every flag `--help` prints, the README keeps its two commands and its length, and every module,
object and repository path that the pages or the package's own docstrings and comments name
exists."""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

import pydflash

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
SKIP = re.compile(r"<!--\s*skip:\s*(.*?)\s*-->\s*$")
PAGE_TIMEOUT = 300  # seconds for all of a page's blocks (the shipped pair loads in well under one)


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the block's first code line
    code: str
    skip: str | None  # the reason given in `<!-- skip: reason -->` right before the fence


def python_blocks(page: Path) -> list[Block]:
    """The ```python blocks of a page, each with the skip reason written right before it."""
    text = page.read_text()
    blocks = []
    for m in FENCE.finditer(text):
        if m.group(1) != "python":
            continue
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.search(before)
        line = text.count("\n", 0, m.start()) + 2
        blocks.append(Block(page, line, m.group(2), skip.group(1) if skip else None))
    return blocks


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_block_parser_reads_skips_and_lines(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "# t\n\n```python\nx = 1\n```\n\n<!-- skip: needs a GPU -->\n```python\ny = 2\n```\n```sh\nls\n```\n"
    )
    b = python_blocks(page)
    assert [(x.line, x.code, x.skip) for x in b] == [(4, "x = 1\n", None), (9, "y = 2\n", "needs a GPU")]


RUNNER = textwrap.dedent(
    """
    import sys, traceback
    blocks = {blocks!r}
    ns = {{"__name__": "__main__"}}
    for where, code in blocks:
        try:
            exec(compile(code, where, "exec"), ns)
        except BaseException:
            traceback.print_exc()
            print(f"DOCS BLOCK FAILED: {{where}}", file=sys.stderr)
            sys.exit(1)
    """
)


def run_page(page: Path, cwd: Path, label: str | None = None) -> subprocess.CompletedProcess[str]:
    """A page's runnable blocks in order, in one fresh interpreter (later blocks may use what
    earlier ones defined), from an empty temporary directory."""
    label = label or _name(page)
    blocks = [(f"{label}:{b.line}", b.code) for b in python_blocks(page) if b.skip is None]
    script = cwd / "run_blocks.py"
    script.write_text(RUNNER.format(blocks=blocks))
    return subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True, text=True, timeout=PAGE_TIMEOUT)


RUNNABLE = [p for p in PAGES if any(b.skip is None for b in python_blocks(p))]
SKIPPED = [b for p in PAGES for b in python_blocks(p) if b.skip is not None]


@pytest.mark.parametrize("page", RUNNABLE, ids=_name)
def test_page_code_blocks_run(page: Path, tmp_path: Path) -> None:
    proc = run_page(page, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


@pytest.mark.parametrize("block", SKIPPED, ids=lambda b: f"{_name(b.page)}:{b.line}")
def test_marked_code_block(block: Block) -> None:
    compile(block.code, f"{_name(block.page)}:{block.line}", "exec")  # a skipped block still parses
    pytest.skip(block.skip)


def test_a_failing_block_fails_its_page(tmp_path: Path) -> None:
    page = tmp_path / "bad.md"
    page.write_text("```python\nx = 1\n```\n\n```python\nassert x == 2, 'x is 1'\n```\n")
    proc = run_page(page, tmp_path, label="bad.md")
    assert proc.returncode == 1 and "x is 1" in proc.stderr and "bad.md:6" in proc.stderr


# -- docstrings and the API reference ---------------------------------------------------------


# The modules a user imports. engine/, draft_length/, cli/ and the server's and the OpenAI layer's
# other modules are the floors below Llama (ARCHITECTURE.md), not API.
PUBLIC_MODULES = (
    "pydflash",
    "pydflash.bench",
    "pydflash.config",
    "pydflash.devices",
    "pydflash.embedded",
    "pydflash.errors",
    "pydflash.hub",
    "pydflash.llama",
    "pydflash.openai",
    "pydflash.openai.chat",
    "pydflash.openai.completions",
    "pydflash.openai.types",
    "pydflash.options",
    "pydflash.pair",
    "pydflash.results",
    "pydflash.server",
    "pydflash.server.metrics",
    "pydflash.gguf_writers",
    "pydflash.gguf_writers.padding",
)


def public_modules() -> list[ModuleType]:
    """The public modules, each with its __all__."""
    mods = [importlib.import_module(name) for name in PUBLIC_MODULES]
    assert all(hasattr(m, "__all__") for m in mods), [m.__name__ for m in mods if not hasattr(m, "__all__")]
    return mods


def _ours(obj: object) -> bool:
    return (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", "").startswith("pydflash")


def public_names() -> list[tuple[str, object]]:
    """(dotted name, object) for each class and function in a public module's __all__."""
    return [(f"{m.__name__}.{n}", getattr(m, n)) for m in public_modules() for n in m.__all__ if _ours(getattr(m, n))]


def _has_doc(obj: object) -> bool:
    doc = (getattr(obj, "__doc__", None) or "").strip()
    # a dataclass without a docstring gets its signature as __doc__: that is not documentation
    return bool(doc) and not (inspect.isclass(obj) and doc.startswith(f"{obj.__name__}("))


def missing_docstrings() -> list[str]:
    missing = []
    for name, obj in public_names():
        if not _has_doc(obj):
            missing.append(name)
        if not inspect.isclass(obj):
            continue
        for attr, value in vars(obj).items():
            if attr.startswith("_"):
                continue
            fn = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            if (isinstance(value, property) or inspect.isfunction(fn)) and not _has_doc(fn):
                missing.append(f"{name}.{attr}")
    return sorted(set(missing))


def test_every_public_name_has_a_docstring() -> None:
    assert len(public_names()) > 40  # the walk found the public modules
    assert missing_docstrings() == []


def test_the_docstring_check_sees_a_missing_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pydflash.Llama.generate, "__doc__", None)
    assert "pydflash.Llama.generate" in missing_docstrings()


def documented_paths() -> set[str]:
    """The `::: path` directives of docs/api.md."""
    return set(re.findall(r"^::: ([\w.]+)\s*$", (ROOT / "docs" / "api.md").read_text(), re.M))


def test_every_public_name_is_in_the_api_reference() -> None:
    paths = documented_paths()
    top = {n: getattr(pydflash, n) for n in pydflash.__all__}
    absent = []
    for name, obj in public_names():
        module = name.rsplit(".", 1)[0]
        # documented by its own path, its whole module, or the same object's top-level name
        if name in paths or (module in paths and module != "pydflash"):
            continue
        if any(f"pydflash.{n}" in paths and o is obj for n, o in top.items()):
            continue
        absent.append(name)
    assert absent == []


# -- the command line ------------------------------------------------------------------------


def _hooks() -> ModuleType:
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        return importlib.import_module("hooks")
    finally:
        sys.path.pop(0)


def _help(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "pydflash", *args, "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_cli_page_lists_every_flag_of_every_subcommand() -> None:
    rendered = _hooks().render()
    subs = re.findall(r"^    ([a-z][\w-]*)", _help(), re.M)  # the subcommands listed under COMMAND
    assert len(subs) >= 5
    for sub in subs:
        assert f"## `pydflash {sub}`" in rendered
        section = rendered.split(f"## `pydflash {sub}`", 1)[1].split("\n## ", 1)[0]
        usage = _help(sub).split("\n\n", 1)[0]  # argparse's usage names every option, never mid-word
        flags = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", usage))
        assert "-h" in flags
        absent = sorted(f for f in flags - {"-h", "--help"} if f"`{f}`" not in section)
        assert absent == [], f"pydflash {sub}: {absent}"


# -- the README ------------------------------------------------------------------------------

INSTALL = "python3 -m venv .venv && . .venv/bin/activate && pip install . && pydflash demo"
TEST = 'python3 -m venv .venv && . .venv/bin/activate && pip install ".[test]" && python -m pytest'


def test_readme_is_short_and_keeps_its_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert INSTALL in readme and TEST in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install ".[test' in ci and "\npython -m pytest" in ci


# -- names that exist ----------------------------------------------------------------------------

# Where a module, an object or a file of this repository is named in prose: the pages, and the
# package's own docstrings, comments and model card.
NAMING = [
    ROOT / "README.md",
    ROOT / "ARCHITECTURE.md",
    ROOT / "benchmarks" / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted(p for p in (ROOT / "src").rglob("*") if p.suffix in (".py", ".pyi", ".md")),
]
DOTTED = re.compile(r"(?<![\w./-])pydflash(?:\.[A-Za-z_]\w*)+")
REPO_PATH = re.compile(r"(?<![\w./-])(?:src/pydflash|tools|csrc|tests|benchmarks|examples)/[\w.*/{},-]*")
# dotted names that are not modules or objects
NOT_OBJECTS = {
    "pydflash.llama_cpp": "the logger of llama.cpp's log (_logging.py)",
    "pydflash.serve": "pydflash serve's logger",
}


def _module(name: str) -> ModuleType | None:
    """The module ``name``, or None where no such module exists."""
    try:
        with warnings.catch_warnings():  # a deprecated alias exists all the same
            warnings.simplefilter("ignore", DeprecationWarning)
            return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
            return None
        raise  # a dependency of the module is missing: not a wrong name


def _has(obj: object, attr: str) -> bool:
    # a dataclass field or a TypedDict key without a default is an annotation, not an attribute
    return hasattr(obj, attr) or any(attr in getattr(k, "__annotations__", {}) for k in getattr(obj, "__mro__", ()))


def name_exists(dotted: str) -> bool:
    """Whether ``pydflash.a.b.c`` is a module or an object reached from one by attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        obj: object = _module(".".join(parts[:i]))
        if obj is not None:
            break
    else:
        return False
    for attr in parts[i:]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            if not _has(obj, attr):
                return False
            obj = getattr(obj, attr, None)
    return True


def path_exists(path: str) -> bool:
    """Whether a repository path (a glob, ``{a,b}`` alternatives) names at least one file or folder."""
    path = path.rstrip(".,-")
    alts = re.fullmatch(r"(.*)\{([^{}]*)\}(.*)", path)
    if alts:
        return all(path_exists(alts[1] + a + alts[3]) for a in alts[2].split(","))
    return any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()


def stale_names(files: list[Path]) -> list[str]:
    """``file:line: name`` for each module, object or repository path named there that does not exist."""
    out = []
    for f in files:
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            found = [m for m in DOTTED.findall(line) if m not in NOT_OBJECTS and not name_exists(m)]
            found += [m.rstrip(".,-") for m in REPO_PATH.findall(line) if not path_exists(m)]
            out += [f"{f.relative_to(ROOT) if f.is_relative_to(ROOT) else f}:{n}: {m}" for m in found]
    return out


def test_every_module_object_and_path_named_exists() -> None:
    assert stale_names(NAMING) == []


def test_the_name_check_finds_wrong_names(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "`pydflash.policies.DraftPolicy`, `pydflash.Llama.no_such_method`, pydflash.gguf_writers.nope and\n"
        "tools/no_such_script.py, src/pydflash/testing/nope.py, csrc/nope.cpp, tests/test_nope.py, tools/nope-*.py\n"
        "exist not; pydflash.draft_length.DraftPolicy.choose, pydflash.GenerationStats.n_steps,\n"
        "tools/build_native.py, csrc/*.h, `benchmarks/results/long-context-4k-fa-{auto,off}-cpu-2core.json`\n"
        "and the logger pydflash.serve do.\n"
    )
    found = [s.split(": ", 1)[1] for s in stale_names([page])]
    assert found == [
        "pydflash.policies.DraftPolicy",
        "pydflash.Llama.no_such_method",
        "pydflash.gguf_writers.nope",
        "tools/no_such_script.py",
        "src/pydflash/testing/nope.py",
        "csrc/nope.cpp",
        "tests/test_nope.py",
        "tools/nope-*.py",
    ]
