"""pydflash: DFlash speculative decoding of GGUF models, in-process, from Python.

from pydflash import Llama
llm = Llama("target.gguf", draft="drafter.gguf")
print(llm.generate("def fib(n):", max_tokens=64).text)
llm.create_chat_completion([{"role": "user", "content": "hi"}])   # OpenAI-shaped
"""

from __future__ import annotations

# _backends before any use of _core: it loads ggml's backends in the CUDA build
from . import _backends, _core  # noqa: F401  (_backends is imported for that effect only)
from .config import Grammar, NgramConfig
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
)
from .llama import Llama
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
    "MemoryReport",
    "MemoryRow",
    "ModelLoadError",
    "NgramConfig",
    "PyDFlashError",
    "RollbackError",
    "SourceStats",
    "StepResult",
    "StreamStep",
    "Submission",
    "TokenLogprob",
    "__version__",
    "backends",
    "embedded_pair",
    "inspect",
]


def inspect(path: str) -> dict[str, object]:
    """A GGUF file's architecture, metadata and tensor names (no weights load)."""
    import os

    return _core.inspect_gguf(os.fspath(path))
