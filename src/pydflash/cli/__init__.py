"""The `pydflash` command line: generate, demo, bench, serve, info."""

from .main import main

__all__ = ["main"]
