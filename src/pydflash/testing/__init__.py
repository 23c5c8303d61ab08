"""Tiny GGUF models written on the spot (no downloads): random-weight targets and
drafters of every kind for tests, and the padded target the benchmarks use."""

from .models import *  # noqa: F403
from .models import __all__ as __all__
