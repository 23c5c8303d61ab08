"""``pydflash bench``: pydflash (target alone and DFlash) side by side with
llama.cpp's own DFlash loop and llama-cpp-python, on one machine in one run."""

from __future__ import annotations

from .run import BenchConfig, run

__all__ = ["BenchConfig", "run"]
