"""The hybrid (recurrent + attention) test pairs, written by conftest's ``hybrid_models``,
and opening them."""

from __future__ import annotations

from pathlib import Path

from pydflash import Llama

# name: (target, drafter, rollback, expected rollback kind)
PAIRS = {
    "qwen35-b8": ("qwen35", "b8", "auto", "recurrent-planes"),
    "qwen35-b16": ("qwen35", "b16", "auto", "recurrent-planes"),
    "qwen35-b8-checkpoint": ("qwen35", "b8", "checkpoint", "checkpoint"),
    "qwen35moe-b8": ("qwen35moe", "b8", "auto", "recurrent-planes"),
    "qwen3next-b8": ("qwen3next", "b8", "auto", "checkpoint"),
}
THREADS = 1  # tiny models: a second thread only adds synchronisation


def open_pair(models: Path, name: str, **kw) -> Llama:
    arch, drafter, rollback, _ = PAIRS[name]
    return Llama(models / f"{arch}-target.gguf", draft=models / f"{arch}-drafter-{drafter}.gguf", n_ctx=1024,
                 n_threads=THREADS, rollback=rollback, **kw)  # fmt: skip
