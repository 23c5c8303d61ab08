"""GGUF writers (no downloads): tiny random-weight targets and drafters of every kind
(DFlash, DFlash2, DSpark, reduced vocabularies, MTP heads) for tests and experiments, and
the FFN-padded, memory-bound copy of a target that the benchmarks use.

Formerly ``pydflash.testing``, which stays importable for one release (deprecated)."""

from .models import *  # noqa: F403
from .models import __all__ as __all__
