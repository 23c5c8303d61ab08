"""The prompts of `pydflash bench --workloads`: three kinds of work that favour
different drafters, all from Python standard-library files the embedded pair
did not train on (its held-out split, see workload.py).

- ``code``: code completion, windows of held-out code (what the bench's other
  modes use);
- ``edit``: copy-heavy editing: a held-out function, then a comment asking for
  it again and its first line, so the model re-emits code from its context
  (n-gram drafters find it there);
- ``prose``: English documentation (pydoc's topic texts), far from what the
  code model and its drafter learned."""

from __future__ import annotations

import ast
from collections.abc import Callable

from .workload import WORKLOADS as CORPORA
from .workload import is_heldout, make_prompts, stdlib_files

WORKLOADS = ("code", "edit", "prose")
EDIT_ASK = "\n\n# The same function again, unchanged:\n"

Tokenize = Callable[[str], list[int]]
Detokenize = Callable[[list[int]], str]


def prompts(kind: str, tokenize: Tokenize, detokenize: Detokenize, isl: int, count: int) -> list[str]:
    """``count`` prompts of one workload, about ``isl`` tokens each (exactly, for
    code and prose)."""
    if kind == "edit":
        return edit_prompts(tokenize, isl, count)
    if kind in CORPORA:
        return make_prompts(tokenize, detokenize, isl, count, CORPORA[kind]())
    raise ValueError(f"unknown workload {kind!r}; choose from {', '.join(WORKLOADS)}")


def heldout_functions() -> list[str]:
    """Module-level functions of the held-out files, as written, in a stable order."""
    out = []
    for path in stdlib_files():
        if not is_heldout(path):
            continue
        src = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        lines = src.splitlines()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.end_lineno is not None:
                out.append("\n".join(lines[node.lineno - 1 : node.end_lineno]) + "\n")
    return out


def edit_prompts(tokenize: Tokenize, isl: int, count: int) -> list[str]:
    """Functions whose edit prompt is closest to ``isl`` tokens (within half of it)."""
    scored: list[tuple[int, int, str]] = []
    for fn in heldout_functions():
        # no trailing newline: llama.cpp's tools drop one from a prompt file
        text = fn + EDIT_ASK + fn.split("\n", 1)[0]
        n = len(tokenize(text))
        if isl // 2 <= n <= isl * 3 // 2:
            scored.append((abs(n - isl), len(scored), text))
    if len(scored) < count:
        raise RuntimeError(f"only {len(scored)} held-out functions make an edit prompt of about {isl} tokens")
    return [t for *_, t in sorted(scored)[:count]]
