"""pydflash.testing, the GGUF writers' old name: a deprecated alias of pydflash.gguf_writers
for one release. Importing it (or one of its modules) warns once, attributed to the importing
line, and gives the very same functions and classes."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from pydflash import gguf_writers

MODULES = ("archs", "drafters", "models", "mtp", "padding")


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget any earlier import of the alias, so that importing it runs it (and warns) again."""
    for name in ("pydflash.testing", *(f"pydflash.testing.{m}" for m in MODULES)):
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_importing_the_old_name_warns_at_the_importing_line(fresh: None) -> None:
    with pytest.warns(DeprecationWarning, match=r"pydflash\.testing is deprecated.*pydflash\.gguf_writers") as rec:
        import pydflash.testing  # noqa: F401
    assert len(rec) == 1 and rec[0].filename == __file__  # stacklevel: the user's import, not importlib's


def test_the_old_names_are_the_new_objects(fresh: None) -> None:
    with pytest.warns(DeprecationWarning):
        old = importlib.import_module("pydflash.testing")
    assert old.__all__ == gguf_writers.__all__
    assert all(getattr(old, n) is getattr(gguf_writers, n) for n in gguf_writers.__all__)
    for m in MODULES:
        old_mod = importlib.import_module(f"pydflash.testing.{m}")
        new_mod = importlib.import_module(f"pydflash.gguf_writers.{m}")
        assert old_mod.__all__ == new_mod.__all__, m
        assert all(getattr(old_mod, n) is getattr(new_mod, n) for n in new_mod.__all__), m


def test_a_users_script_sees_the_warning_under_pythons_default_filters() -> None:
    lines = ["from pydflash.testing.padding import pad_ffn", "from pydflash.testing import write_pair"]
    code = "\n".join([*lines, "print(pad_ffn.__module__)"])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert proc.stdout.strip() == "pydflash.gguf_writers.padding"
    assert proc.stderr.count("DeprecationWarning: pydflash.testing is deprecated") == 1, proc.stderr
