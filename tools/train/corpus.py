"""The corpus: this interpreter's own standard library (PSF licence), split
into train and held-out by file (a stable hash of the relative path)."""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

SKIP_PARTS = {"site-packages", "test", "tests", "idle_test", "lib2to3", "__pycache__"}


def stdlib_files() -> list[Path]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in lib.rglob("*.py") if not SKIP_PARTS.intersection(p.relative_to(lib).parts)]
    return sorted(files, key=lambda p: str(p.relative_to(lib)))


def is_heldout(path: Path, percent: int = 5) -> bool:
    lib = Path(sysconfig.get_paths()["stdlib"])
    h = hashlib.sha256(str(path.relative_to(lib)).encode()).digest()
    return h[0] * 100 // 256 < percent


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def split() -> tuple[list[Path], list[Path]]:
    files = stdlib_files()
    return [p for p in files if not is_heldout(p)], [p for p in files if is_heldout(p)]
