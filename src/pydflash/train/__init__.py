"""Train a DFlash drafter for a GGUF target (``pip install 'pydflash[train]'``: torch).

``train_drafter(target, output, ...)`` (and ``pydflash train-drafter``) makes the data
with pydflash itself (the target's own replies, its features captured through
llama.cpp), trains with torch and writes the best drafter by online tau, in
upstream llama.cpp's ``dflash`` layout. Importing this package needs no torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import PromptsFileError, TrainingInputError

if TYPE_CHECKING:
    from .report import TrainReport

__all__ = ["PromptsFileError", "TrainingInputError", "train_drafter"]


def train_drafter(target: Any, output: Any, **options: Any) -> TrainReport:
    """Train a drafter for ``target`` and write it to ``output``: see ``pydflash.train.run.train_drafter``."""
    from .run import train_drafter as run

    return run(target, output, **options)
