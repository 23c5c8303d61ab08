"""Deprecated alias of :mod:`pydflash.gguf_writers.mtp`, kept for one release."""

from ..gguf_writers.mtp import *  # noqa: F403
from ..gguf_writers.mtp import __all__ as __all__
