"""Exception classes. The C++ core raises these through the binding layer."""

from __future__ import annotations

__all__ = [
    "ChatTemplateError",
    "ContextLimitError",
    "DecodeError",
    "DraftCompatibilityError",
    "GenerationInterrupted",
    "GrammarError",
    "ModelLoadError",
    "PyDFlashError",
    "RollbackError",
    "SlotBusyError",
]


class PyDFlashError(Exception):
    """Base class of every pydflash error."""


class ModelLoadError(PyDFlashError):
    """A GGUF file cannot be loaded: missing, not a file, truncated, corrupt,
    or of an architecture llama.cpp does not know (including the old
    pre-merge ``dflash-draft`` format)."""


class DraftCompatibilityError(PyDFlashError):
    """The drafter loads but cannot drive this target (not ``dflash``, hidden
    or vocab size differs, target layer out of range, no mask token, ...)."""


class ContextLimitError(PyDFlashError, ValueError):
    """The prompt (or the generation) does not fit in the context window.
    ``n_prompt_tokens`` and ``n_ctx`` (one sequence's context) when known, as
    llama-server's ``exceed_context_size_error`` gives them (else 0)."""

    def __init__(self, message: str, *, n_prompt_tokens: int = 0, n_ctx: int = 0):
        super().__init__(message)
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx


class DecodeError(PyDFlashError):
    """llama.cpp failed a decode. The context pair was reset; the object is
    still usable after a new prefill."""


class RollbackError(DecodeError):
    """Rejected draft tokens could not be removed from the target's memory
    (llama.cpp refused a partial removal, or a recurrent-state checkpoint could
    not be saved or restored). The context pair was reset rather than continue
    from a wrong state."""


class GenerationInterrupted(PyDFlashError):
    """``interrupt()`` stopped a decode. The context pair was reset; the
    object is usable (Ctrl-C raises KeyboardInterrupt instead)."""


class ChatTemplateError(PyDFlashError, ValueError):
    """A chat template does not parse, or fails while rendering these messages
    (a jinja error, ``raise_exception`` in the template, ...). The model stays usable."""


class GrammarError(PyDFlashError, ValueError):
    """The output cannot continue under its grammar: a lazy (tool-call) grammar whose
    triggered text does not fit it, or a row where the grammar allows no token. The
    generation stops; the model stays usable."""


class SlotBusyError(PyDFlashError):
    """A slot's save, load or erase while a generation holds the slot (or another
    save or load of it runs). Nothing was done; retry once it is free (the server
    answers HTTP 503)."""
