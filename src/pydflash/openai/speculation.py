"""A stream's per-chunk ``speculative`` object (with ``timings_per_token``): which of the
tokens a chunk carries were drafted and accepted, which were the target's own, and the
target passes behind them, so that a client (the chat page) can show speculation at work
from the stream alone.

Work happens in the reader's thread, per released token: the engine's thread is not
touched. A token's kind comes from the generation's own step records: a step's tokens
are its accepted draft, then the target's token; EOS, max_tokens and stop strings only
ever cut the tail, so a kept token's place among its step's tokens is its kind."""

from __future__ import annotations

import codecs
from collections.abc import Generator, Iterator
from typing import TypeVar

from ..engine.generation import Generation
from ..results import StreamStep
from .types import ChatCompletionChunk, ChunkSpeculative, CompletionChunk, SpeculativePass

__all__ = ["StreamSpeculation"]

_Chunk = TypeVar("_Chunk", CompletionChunk, ChatCompletionChunk)


class StreamSpeculation:
    """Follows one generation's stream (``follow``) and puts the ``speculative`` of the
    tokens and passes since the previous chunk into each chunk that carries timings
    (``timed``, ``timed_now``, ``counted``). Off unless the generation was made with
    ``timings_per_token``: then the chunks are as before."""

    def __init__(self, gen: Generation):
        self.gen = gen
        self.on = gen.timings_per_token
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._n_seen = 0  # tokens released so far
        self._step = 0  # the step that holds the next token
        self._step_start = 0  # the position of that step's first token
        self._n_passes_sent = 0
        self._tokens: list[str] = []
        self._kinds: list[str] = []

    def follow(self, steps: Iterator[StreamStep]) -> Generator[StreamStep, None, None]:
        """``steps``, each noted before it is yielded (closing this closes them)."""
        try:
            for step in steps:
                if self.on and step.tokens:
                    self._note(self.gen.model.token_pieces(step.tokens, False))
                yield step
        finally:
            steps.close()  # type: ignore[attr-defined]  # the generation's run(): a generator

    def _note(self, pieces: list[bytes]) -> None:
        steps = self.gen.steps  # appended by the engine's thread before it released these tokens
        for piece in pieces:
            while self._n_seen >= self._step_start + len(steps[self._step].tokens):
                self._step_start += len(steps[self._step].tokens)
                self._step += 1
            drafted = self._n_seen - self._step_start < steps[self._step].n_accepted
            self._kinds.append("d" if drafted else "t")
            self._tokens.append(self._decoder.decode(piece))
            self._n_seen += 1

    def take(self) -> ChunkSpeculative:
        """The tokens and passes since the previous call."""
        steps = self.gen.steps
        n = len(steps)  # a step the engine adds meanwhile goes with the next chunk
        passes: list[SpeculativePass] = [
            {"n_drafted": s.n_drafted, "n_accepted": s.n_accepted, "draft_max": s.draft_max, "source": s.source}
            for s in steps[self._n_passes_sent : n]
        ]
        self._n_passes_sent = n
        out: ChunkSpeculative = {"tokens": self._tokens, "kinds": "".join(self._kinds), "passes": passes}
        self._tokens, self._kinds = [], []
        return out

    def timed(self, chunk: _Chunk, step: StreamStep) -> _Chunk:
        """A stream's chunk, with its step's ``timings`` (llama-server's ``timings_per_token``)
        and the ``speculative`` since the previous chunk."""
        if step.timings is not None:
            chunk["timings"] = step.timings
            if self.on:
                chunk["speculative"] = self.take()
        return chunk

    def timed_now(self, chunk: _Chunk) -> _Chunk:
        """A chunk after the last step (the reply's final parse), with the timings as they
        stand where the generation sends them per token: every chunk of text carries them."""
        if self.on:
            chunk["timings"] = self.gen.timings()
            chunk["speculative"] = self.take()
        return chunk

    def counted(self, last: _Chunk) -> _Chunk:
        """A stream's last chunk, with the generation's ``usage``, ``timings`` and
        ``speculative`` (per chunk too, with ``timings_per_token``)."""
        gen = self.gen
        last["usage"] = gen.usage()
        last["timings"] = gen.timings()
        stats = gen.speculative()
        if self.on:
            tail = self._decoder.decode(b"", final=True)  # an unfinished character: U+FFFD, as the text ends
            if tail and self._tokens:
                self._tokens[-1] += tail
            spec = self.take()
            spec["accepted_lengths"] = stats["accepted_lengths"]
            spec["draft_sources"] = stats["draft_sources"]
            last["speculative"] = spec
        else:
            last["speculative"] = stats
        return last
