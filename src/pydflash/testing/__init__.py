"""Deprecated alias of :mod:`pydflash.gguf_writers` (the GGUF writers), kept for one release.

``import pydflash.testing`` (or any of its modules: ``archs``, ``drafters``, ``models``,
``mtp``, ``padding``) warns with a ``DeprecationWarning`` once per process and gives the
same functions and classes as ``pydflash.gguf_writers``."""

import warnings

from ..gguf_writers import *  # noqa: F403
from ..gguf_writers import __all__ as __all__

warnings.warn(
    "pydflash.testing is deprecated and will be removed in the next release: "
    "import pydflash.gguf_writers instead (the same writers under the name that says what they are)",
    DeprecationWarning,
    stacklevel=2,
)
