"""The small trained target + DFlash drafter pair shipped inside the package
(see models/MODEL_CARD.md): Python-code models trained on the standard library."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from .errors import PyDFlashError

TARGET = "stdlib-code-target.gguf"
DRAFTER = "stdlib-code-dflash.gguf"

__all__ = ["embedded_pair"]


def embedded_pair() -> tuple[str, str]:
    """Paths of the shipped (target, drafter) GGUF files."""
    base = Path(str(resources.files("pydflash") / "models"))
    target, drafter = base / TARGET, base / DRAFTER
    missing = [p.name for p in (target, drafter) if not p.is_file()]
    if missing:
        raise PyDFlashError(f"the embedded model pair is not installed ({', '.join(missing)} missing in {base})")
    return str(target), str(drafter)
