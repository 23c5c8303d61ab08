"""llama.cpp's log, handed to the Python logger ``pydflash.llama_cpp``; with
``verbose=True`` also printed to stderr as llama.cpp wrote it (llama-cpp-python's
behaviour). Quiet, nothing is printed unless the application configured logging.

The C++ side queues messages (llama.cpp logs from worker threads, where calling
into Python could deadlock); ``flush()`` moves them out after each call. Only
warnings and errors are queued unless verbose.
"""

from __future__ import annotations

import logging
import sys

from . import _core

logger = logging.getLogger("pydflash.llama_cpp")
# a library prints nothing by itself: without this, logging's last resort prints warnings
logging.getLogger("pydflash").addHandler(logging.NullHandler())

# ggml_log_level -> logging level
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}


class _Stderr(logging.Handler):
    """Each line as llama.cpp wrote it, on the current ``sys.stderr``."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(record.getMessage() + "\n")
        except Exception:
            self.handleError(record)


_stderr = _Stderr()


def set_verbose(verbose: bool) -> None:
    """verbose: llama.cpp's messages from its info level up, also on stderr; quiet:
    only warnings and errors, to logging alone."""
    _core.set_log_level(2 if verbose else 3)
    if verbose:
        if _stderr not in logger.handlers:
            logger.addHandler(_stderr)
        logger.setLevel(logging.INFO)
    else:
        logger.removeHandler(_stderr)
        logger.setLevel(logging.NOTSET)


def flush() -> None:
    for level, text in _core.drain_logs():
        text = text.rstrip()
        if text:
            logger.log(_LEVELS.get(level, logging.INFO), "%s", text)
