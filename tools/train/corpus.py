"""The corpus: this interpreter's own standard library (PSF licence), split
into train and held-out by file (a stable hash of the relative path)."""

from __future__ import annotations

from pathlib import Path

# one split rule for training and for the benchmark's held-out prompts
from pydflash.bench.workload import SKIP_PARTS, is_heldout, stdlib_files

__all__ = ["SKIP_PARTS", "is_heldout", "read", "split", "stdlib_files"]


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def split() -> tuple[list[Path], list[Path]]:
    files = stdlib_files()
    return [p for p in files if not is_heldout(p)], [p for p in files if is_heldout(p)]
