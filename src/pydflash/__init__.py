"""pydflash: DFlash speculative decoding of GGUF models, in-process, from Python.

from pydflash import Llama
llm = Llama("target.gguf", draft="drafter.gguf")
print(llm.generate("def fib(n):", max_tokens=64).text)
llm.create_chat_completion([{"role": "user", "content": "hi"}])   # OpenAI-shaped
"""

from __future__ import annotations

import os
import warnings

# _backends before any use of _core: it loads ggml's backends in the CUDA build
from . import _backends, _core  # noqa: F401  (_backends is imported for that effect only)
from .config import Grammar, LlamaGrammar, NgramConfig
from .devices import backends
from .embedded import embedded_pair
from .engine.submission import Submission
from .errors import (
    ChatTemplateError,
    ContextLimitError,
    DecodeError,
    DraftCompatibilityError,
    GenerationInterrupted,
    GrammarError,
    ModelLoadError,
    PyDFlashError,
    RollbackError,
    SlotBusyError,
)
from .llama import Llama
from .llama_cache import BaseLlamaCache, LlamaDiskCache, LlamaRAMCache, LlamaState
from .pair import ContextPair
from .results import (
    GenerationResult,
    GenerationStats,
    MemoryReport,
    MemoryRow,
    SourceStats,
    StepResult,
    StreamStep,
    TokenLogprob,
)

__version__: str = _core.__version__

__all__ = [
    "BaseLlamaCache",
    "ChatTemplateError",
    "ContextLimitError",
    "ContextPair",
    "DecodeError",
    "DraftCompatibilityError",
    "GenerationInterrupted",
    "GenerationResult",
    "GenerationStats",
    "Grammar",
    "GrammarError",
    "Llama",
    "LlamaDiskCache",
    "LlamaGrammar",
    "LlamaRAMCache",
    "LlamaState",
    "MemoryReport",
    "MemoryRow",
    "ModelLoadError",
    "NgramConfig",
    "PyDFlashError",
    "RollbackError",
    "SlotBusyError",
    "SourceStats",
    "StepResult",
    "StreamStep",
    "Submission",
    "TokenLogprob",
    "__version__",
    "backends",
    "embedded_pair",
    "inspect_gguf",
]


def inspect_gguf(path: str | os.PathLike[str]) -> dict[str, object]:
    """A GGUF file's architecture, metadata and tensor names (no weights load)."""
    return _core.inspect_gguf(os.fspath(path))


def inspect(path: str | os.PathLike[str]) -> dict[str, object]:
    """Deprecated name of ``inspect_gguf`` (outside ``__all__``: a star import would
    shadow the standard library's ``inspect``)."""
    warnings.warn("pydflash.inspect is deprecated: use pydflash.inspect_gguf", DeprecationWarning, stacklevel=2)
    return inspect_gguf(path)
