"""``Submission``: a generation handed to a ``Llama``'s engine
(``llm.submit(...)``), running beside the others in its own sequence slot.
Iterate it (``for``, or ``async for`` in asyncio without blocking the event
loop) for its steps, or wait for its ``result()``."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator

from ..errors import GenerationInterrupted, PyDFlashError
from ..results import GenerationResult, StreamStep
from .generation import Generation

__all__ = ["Submission"]


class Submission:
    """One submitted generation. Its steps queue up as the engine produces
    them; read them by iterating (``StreamStep``s, the last with the finish
    reason; a later iteration goes on where an earlier one stopped) and/or wait
    for ``result()`` / ``await aresult()``, which reads what is left.
    ``cancel()`` stops it between steps."""

    def __init__(self, gen: Generation):
        self._gen = gen
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._it: Iterator[StreamStep] | None = None
        self._ait: AsyncIterator[StreamStep] | None = None
        gen.submit()
        gen.watch()  # its stop strings searched as its steps come, until it is read

    def __iter__(self) -> Iterator[StreamStep]:
        with self._lock:
            if self._it is None:
                self._it = self._steps()
            return self._it

    def __aiter__(self) -> AsyncIterator[StreamStep]:
        with self._lock:
            if self._ait is None:
                self._ait = self._asteps()
            return self._ait

    def _steps(self) -> Iterator[StreamStep]:
        try:
            yield from self._gen
        except BaseException as e:
            self._error = _kept(e)
            raise

    async def _asteps(self) -> AsyncIterator[StreamStep]:
        try:
            async for step in self._gen:
                yield step
        except BaseException as e:
            self._error = _kept(e)
            raise

    def _finished(self) -> GenerationResult:
        if self._error is not None:
            raise self._error
        if self._gen.finish is None:
            raise PyDFlashError("this submission's steps are being read elsewhere (by an async iteration)")
        return self._gen.result()

    def _claim(self) -> bool:
        """True where nothing iterated it: the caller reads it to the end, and a later
        iteration yields nothing, as after a loop."""
        with self._lock:
            unread = self._it is None and self._ait is None
            if unread:
                self._it, self._ait = iter(()), _no_steps()
            return unread

    def result(self) -> GenerationResult:
        """Wait for the end; its text, tokens, finish reason and stats. Raises the
        generation's error (GenerationInterrupted when cancelled)."""
        if self._claim():
            try:
                self._gen.wait()  # asleep until the end, not woken for each step
            except BaseException as e:
                self._error = _kept(e)
                raise
        elif self._error is None and self._gen.finish is None:
            for _ in self:
                pass
        return self._finished()

    async def aresult(self) -> GenerationResult:
        """``result()`` for asyncio: waits without blocking the event loop (woken
        once, at the end, where nothing iterated it). Cancelling the awaiting task
        cancels the generation."""
        if self._claim():
            try:
                await self._gen.await_end()
            except BaseException as e:
                self._error = _kept(e)
                raise
        elif self._error is None and self._gen.finish is None:
            async for _ in self:
                pass
        return self._finished()

    def cancel(self) -> None:
        """Stop it between steps (a lone long prefill is aborted at once); its
        reader gets GenerationInterrupted. Other generations are not touched."""
        self._gen.cancel()

    @property
    def done(self) -> bool:
        """Finished, failed or cancelled."""
        return self._gen.done

    def __repr__(self) -> str:
        state = "done" if self.done else "running"
        return f"<pydflash.Submission {len(self._gen.prompt)} prompt tokens, {state}>"


def _kept(e: BaseException) -> BaseException:
    """The error a later ``result()`` raises: the generation's own, or (where its reader
    was interrupted: Ctrl-C, a cancelled task) that it was cancelled."""
    return e if isinstance(e, Exception) else GenerationInterrupted("the generation was cancelled")


async def _no_steps() -> AsyncIterator[StreamStep]:
    return
    yield  # an async generator that yields nothing
