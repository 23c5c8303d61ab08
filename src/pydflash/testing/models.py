"""Deprecated alias of :mod:`pydflash.gguf_writers.models`, kept for one release."""

from ..gguf_writers.models import *  # noqa: F403
from ..gguf_writers.models import __all__ as __all__
