"""Deprecated alias of :mod:`pydflash.gguf_writers.drafters`, kept for one release."""

from ..gguf_writers.drafters import *  # noqa: F403
from ..gguf_writers.drafters import __all__ as __all__
