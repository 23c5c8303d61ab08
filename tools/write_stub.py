#!/usr/bin/env python3
"""Writes the field lines of the option classes in src/pydflash/_core.pyi whose plain
fields come from an X-macro list (csrc/fields.h: SamplingParams, DraftControl), from the
compiled module, so that a field added to such a list needs no hand-written stub line.

    python tools/write_stub.py [--check]

Run it with the built module importable (``pip install .``, or ``PYTHONPATH=src`` with
the extension copied into src/pydflash). A class is one of these when the binding gives
it ``_plain_fields`` (the list's names, in order). Its field lines become its properties
in the binding's order: a plain field typed by its default's Python type, a field bound
by hand (``verify``, ``logit_bias``) as the stub already writes it. ``--check``: change
nothing, exit 1 when the stub differs. tests/test_stub.py runs the same check.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import sys
from pathlib import Path
from types import ModuleType

STUB = Path(__file__).resolve().parent.parent / "src" / "pydflash" / "_core.pyi"
PLAIN_TYPES = (bool, int, float, str)


def field_lines(cls: type, written: dict[str, str]) -> list[str]:
    """The stub's field lines of ``cls``; ``written``: the stub's lines now, by field name."""
    plain = cls._plain_fields  # type: ignore[attr-defined]
    default = cls()
    lines = []
    for name, attr in vars(cls).items():
        if not isinstance(attr, property):
            continue
        if name in plain:
            kind = type(getattr(default, name))
            if kind not in PLAIN_TYPES:
                raise ValueError(f"{cls.__name__}.{name}: a {kind.__name__} is no plain field (bind it by hand)")
            lines.append(f"    {name}: {kind.__name__}")
        elif name in written:
            lines.append(written[name])
        else:
            raise ValueError(f"{cls.__name__}.{name} is bound by hand: write its line in _core.pyi")
    return lines


def render(text: str, core: ModuleType) -> str:
    """``text`` (the stub) with the field lines of every class with ``_plain_fields`` rewritten."""
    lines = text.splitlines()
    classes = [n for n in ast.parse(text).body if isinstance(n, ast.ClassDef)]
    wanted = {name for name, obj in vars(core).items() if isinstance(obj, type) and hasattr(obj, "_plain_fields")}
    missing = wanted - {c.name for c in classes}
    if missing:
        raise ValueError(f"_core.pyi has no class {sorted(missing)}: write its class line and methods by hand")
    for node in reversed(classes):  # from the end, so the earlier line numbers still hold
        if node.name not in wanted:
            continue
        fields = [n for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
        if not fields:
            head = node.body[0]  # the first method: its lines start at its decorators
            first = last = min([head.lineno] + [d.lineno for d in getattr(head, "decorator_list", [])]) - 1
        else:
            first, last = fields[0].lineno - 1, fields[-1].lineno
            if last - first != len(fields):
                raise ValueError(f"{node.name}: its field lines in _core.pyi must be one per line, together")
        written = {n.target.id: lines[n.lineno - 1] for n in fields if isinstance(n.target, ast.Name)}
        lines[first:last] = field_lines(getattr(core, node.name), written)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the stub differs; write nothing")
    args = parser.parse_args(argv)
    from pydflash import _core

    old = STUB.read_text(encoding="utf-8")
    new = render(old, _core)
    if new == old:
        return 0
    if args.check:
        sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "_core.pyi", "new"))
        return 1
    STUB.write_text(new, encoding="utf-8")
    print(f"wrote {STUB}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
