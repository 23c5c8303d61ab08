"""The `pydflash` command line: generate, demo, bench, serve, info."""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
