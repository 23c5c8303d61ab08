"""Deprecated alias of :mod:`pydflash.gguf_writers.padding`, kept for one release."""

from ..gguf_writers.padding import *  # noqa: F403
from ..gguf_writers.padding import __all__ as __all__
