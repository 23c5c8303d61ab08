"""What the engine thread sends a request's reader: raw step results, no text.

The engine puts ``EngineOutput``s (a step's or a run's ``StepResult``s, how many of
their tokens it counted, its finish reason, prompt progress, its clock) or the error
that ended the request into the request's ``Channel``; the output processor on the
reader's side (``generation.Generation``) turns them into text, stop-string hits,
logprobs and ``StreamStep``s. ``RequestHandle`` is what ``Engine.submit`` returns:
the channel, and cancel/abort back to the engine."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading
from collections.abc import AsyncIterator, Callable, Iterator

from .. import _core
from ..results import FinishReason

__all__ = ["Channel", "Clock", "EngineOutput", "RequestHandle"]


@dataclasses.dataclass(frozen=True, slots=True)
class Clock:
    """The engine's times for one request, as they stand when an output is sent."""

    t_start: float = 0.0  # admitted to a slot (perf_counter)
    n_cached: int = 0  # prompt tokens taken from the prompt cache
    prefill_s: float = 0.0
    n_prompt_done: int = 0  # prompt tokens evaluated so far (the cache's not counted)
    t_decode: float = 0.0  # the prompt evaluated: decoding starts


@dataclasses.dataclass(frozen=True, slots=True)
class EngineOutput:
    """One raw output of the engine for one request."""

    clock: Clock
    t: float  # when it was sent (perf_counter)
    steps: tuple[_core.StepResult, ...] = ()  # a step, or a run of plain steps taken in one call
    kept: tuple[int, ...] = ()  # per step: its tokens the engine counted (before an EOS, within the budget)
    finish: FinishReason | None = None  # "eos" or "length": the engine ended the request here
    processed: int | None = None  # prompt progress: prompt tokens processed (cache included)


Item = EngineOutput | BaseException


class Channel:
    """Outputs from the engine thread to one reader, blocking or async."""

    def __init__(self, quiet: bool = False) -> None:
        self._items: collections.deque[Item] = collections.deque()
        self._cv = threading.Condition()
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        # its reader waits for the end only (until_end): no wake-up per step
        self.quiet = quiet
        # an event that several readers' channels share, set whenever this one would
        # wake its reader: one thread waits on many (Generation.run_all)
        self.bell: threading.Event | None = None
        self._ended = False  # the last item (the engine's finish or an error) is in

    def put(self, item: Item) -> None:
        end = isinstance(item, BaseException) or item.finish is not None
        with self._cv:
            self._items.append(item)
            self._ended = self._ended or end
            waiter = None
            ring = end or not self.quiet
            if ring:
                self._cv.notify()
                waiter, self._waiter = self._waiter, None
        if ring and self.bell is not None:
            self.bell.set()
        if waiter is not None:
            loop, fut = waiter
            loop.call_soon_threadsafe(_wake, fut)

    def get(self, timeout: float | None = None) -> Item | None:
        """The next item (None: none came within ``timeout`` seconds)."""
        with self._cv:  # a lock wait: Ctrl-C interrupts it
            if not self._cv.wait_for(lambda: bool(self._items), timeout):
                return None
            return self._items.popleft()

    def until_end(self, timeout: float | None = None) -> list[Item] | None:
        """Every item up to the last, waiting for it asleep (None: not there after
        ``timeout`` seconds): a reader woken for each step would take the GIL and a
        core from the engine's thread while the next step computes."""
        with self._cv:  # a lock wait: Ctrl-C interrupts it
            self.quiet = True
            if not self._cv.wait_for(lambda: self._ended, timeout):
                return None
            items = list(self._items)
            self._items.clear()
            return items

    async def auntil_end(self) -> list[Item]:
        """``until_end`` for asyncio: the event loop is woken once, at the end."""
        while True:
            with self._cv:
                self.quiet = True
                if self._ended:
                    items = list(self._items)
                    self._items.clear()
                    return items
                loop = asyncio.get_running_loop()
                fut: asyncio.Future[None] = loop.create_future()
                self._waiter = (loop, fut)
            await fut

    async def aget(self) -> Item:
        while True:
            with self._cv:
                if self._items:
                    return self._items.popleft()
                loop = asyncio.get_running_loop()
                fut: asyncio.Future[None] = loop.create_future()
                self._waiter = (loop, fut)
            await fut


class RequestHandle:
    """A submitted request (``Engine.submit``): iterate it (or ``async for``) for its raw
    outputs up to the engine's end (its error raised), or ``wait()`` for all of them,
    asleep until then; ``cancel()`` (its reader left: GenerationInterrupted), ``abort()``
    (its output processor ended it: a stop string); ``done`` (the engine is through with
    it). Its reader may stop reading before the engine's end (a stop string)."""

    def __init__(
        self,
        channel: Channel,
        cancel: Callable[[RequestHandle, bool], None],
        cancel_check: Callable[[], bool] | None = None,
    ):
        self.channel = channel
        self._cancel = cancel
        self.cancel_check = cancel_check  # asked by the engine once, as it admits it
        self.cancelled = False  # the engine drops it (set under the engine's lock)
        self.admitted = False  # in a slot (set by the engine)
        self.done = False  # finished, failed or dropped (set by the engine)

    def __iter__(self) -> Iterator[EngineOutput]:
        while True:
            out = output_or_raise(self.channel.get())
            yield out
            if out.finish is not None:
                return

    async def __aiter__(self) -> AsyncIterator[EngineOutput]:
        while True:
            out = output_or_raise(await self.channel.aget())
            yield out
            if out.finish is not None:
                return

    def wait(self, timeout: float | None = None) -> list[EngineOutput] | None:
        """Its outputs up to the engine's end, asleep until then, its reader woken once
        (None: not there after ``timeout`` seconds; the error that ended it raised)."""
        items = self.channel.until_end(timeout)
        return None if items is None else [output_or_raise(i) for i in items]

    async def await_end(self) -> list[EngineOutput]:
        """``wait()`` for asyncio: the event loop is woken once, at the end."""
        return [output_or_raise(i) for i in await self.channel.auntil_end()]

    def cancel(self) -> None:
        """Stop it between steps (or abort its decode when it runs alone)."""
        self._cancel(self, True)

    def abort(self) -> None:
        """Stop it between steps, its sequence's cache kept (no decode interrupted)."""
        self._cancel(self, False)


def output_or_raise(item: Item | None) -> EngineOutput:
    """What the engine sent a reader: an output, or the error that ends it."""
    assert item is not None
    if isinstance(item, BaseException):
        raise item
    return item


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
