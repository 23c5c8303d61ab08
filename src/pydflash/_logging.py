"""llama.cpp's log, routed to the Python logger ``pydflash``.

The C++ side queues messages (llama.cpp logs from worker threads, where calling
into Python could deadlock); ``flush()`` moves them into ``logging`` after each
call. Quiet by default: only warnings and errors are queued unless verbose.
"""

from __future__ import annotations

import logging

from . import _core

logger = logging.getLogger("pydflash")

# ggml_log_level -> logging level
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}


def set_verbose(verbose: bool) -> None:
    """Queue llama.cpp's info messages too (verbose) or only warnings and errors."""
    _core.set_log_level(2 if verbose else 3)
    if verbose and logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


def flush() -> None:
    for level, text in _core.drain_logs():
        text = text.rstrip()
        if text:
            logger.log(_LEVELS.get(level, logging.INFO), "%s", text)
