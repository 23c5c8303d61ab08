"""Deprecated alias of :mod:`pydflash.gguf_writers.archs`, kept for one release."""

from ..gguf_writers.archs import *  # noqa: F403
from ..gguf_writers.archs import __all__ as __all__
