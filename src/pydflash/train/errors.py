"""The errors ``train_drafter`` refuses bad input with, before it writes anything."""

from __future__ import annotations

from ..errors import PyDFlashError

__all__ = ["PromptsFileError", "TrainingInputError"]


class TrainingInputError(PyDFlashError, ValueError):
    """An input of ``train_drafter`` cannot work: an output path that cannot be written, a device
    this build or torch lacks, a cache that would not fit on its disk, a bad option."""


class PromptsFileError(TrainingInputError):
    """The prompts file does not parse; the message names the file and the line."""
