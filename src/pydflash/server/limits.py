"""A prompt far longer than the context is refused before it is tokenized: a
32 MB prompt would otherwise cost tens of seconds and gigabytes to count, for a
400. No token is longer than the vocabulary's longest piece, so a prompt of more
bytes than ``n_ctx x longest piece`` cannot fit."""

from __future__ import annotations

import math
import threading

from ..errors import ContextLimitError
from ..llama import Llama

__all__ = ["PromptLimit"]


class PromptLimit:
    """``check(n_bytes)``: ContextLimitError (with an estimated token count) when a
    prompt of ``n_bytes`` UTF-8 bytes cannot fit one sequence's context."""

    def __init__(self, llm: Llama):
        self.llm = llm
        self._lock = threading.Lock()
        self._longest: int | None = None

    def longest_piece(self) -> int:
        """Bytes of the vocabulary's longest token (found once, on first use)."""
        with self._lock:
            if self._longest is None:
                model = self.llm.core_model
                self._longest = max(1, max(map(len, model.token_pieces(range(model.n_vocab), True))))
            return self._longest

    def check(self, n_bytes: int) -> None:
        n_ctx = self.llm.n_ctx_slot
        if n_bytes <= n_ctx:  # fewer bytes than the context: always fits, nothing to find
            return
        bound = n_ctx * self.longest_piece()
        if n_bytes <= bound:
            return
        raise ContextLimitError(
            f"the prompt ({n_bytes} bytes, at least {math.ceil(n_bytes / self.longest_piece())} tokens) exceeds "
            f"the available context size ({n_ctx} tokens)",
            n_prompt_tokens=math.ceil(n_bytes / self.longest_piece()),
            n_ctx=n_ctx,
        )
