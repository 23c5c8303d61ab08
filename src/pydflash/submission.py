"""``Submission``: a generation handed to a ``Llama``'s engine
(``llm.submit(...)``), running beside the others in its own sequence slot.
Iterate it (``for``, or ``async for`` in asyncio without blocking the event
loop) for its steps, or wait for its ``result()``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

from ._generation import Generation
from .errors import PyDFlashError
from .results import GenerationResult, StreamStep

__all__ = ["Submission"]


class Submission:
    """One submitted generation. Its steps queue up as the engine produces
    them; read them once, by iterating (``StreamStep``s, the last with the
    finish reason) or with ``result()`` / ``await aresult()``. ``cancel()``
    stops it between steps; leaving an iteration early does the same."""

    def __init__(self, gen: Generation):
        self._gen = gen
        self._taken = False
        self._lock = threading.Lock()
        gen.submit()

    def _take(self) -> None:
        with self._lock:
            if self._taken:
                raise PyDFlashError("this submission's steps were already read (iterate it or ask result() once)")
            self._taken = True

    def __iter__(self) -> Iterator[StreamStep]:
        self._take()
        return iter(self._gen)

    def __aiter__(self) -> AsyncIterator[StreamStep]:
        self._take()
        return aiter(self._gen)

    def result(self) -> GenerationResult:
        """Wait for the end; its text, tokens, finish reason and stats. Raises the
        generation's error (GenerationInterrupted when cancelled)."""
        for _ in self:
            pass
        return self._gen.result()

    async def aresult(self) -> GenerationResult:
        """``result()`` for asyncio: waits without blocking the event loop."""
        async for _ in self:
            await asyncio.sleep(0)
        return self._gen.result()

    def cancel(self) -> None:
        """Stop it between steps (a lone long prefill is aborted at once); the
        reader gets GenerationInterrupted. Other generations are not touched."""
        self._gen.cancel()

    @property
    def done(self) -> bool:
        """Finished, failed or cancelled."""
        return self._gen.done

    @property
    def prompt_tokens(self) -> list[int]:
        return list(self._gen.prompt)

    def __repr__(self) -> str:
        state = "done" if self.done else "running"
        return f"<pydflash.Submission {len(self._gen.prompt)} prompt tokens, {state}>"
