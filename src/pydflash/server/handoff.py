"""Items from a request's worker thread to the event loop that answers it.

``put`` never waits for the loop: a stream's chunk costs the worker one append and,
only where the loop is waiting for it, one wake-up (a round trip into the loop per
chunk, as anyio's ``from_thread.run`` makes, costs two thread switches and a task per
token of every stream, which the engine's thread waits out for the GIL). What a slow
client has not read waits here, as it would in the generation's own channel; a
generation's output is bounded."""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Generic, TypeVar

__all__ = ["Handoff", "HandoffClosed"]

T = TypeVar("T")


class HandoffClosed(Exception):
    """The reader left: nothing more is taken."""


class Handoff(Generic[T]):
    """One writer thread, one reader on ``loop``; ``end()`` after the last item."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._items: collections.deque[T] = collections.deque()
        self._lock = threading.Lock()
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False  # the writer is done
        self._closed = False  # the reader is gone

    # -- the writer (any thread) --

    def put(self, item: T) -> None:
        """Queue ``item``; HandoffClosed when the reader has left."""
        with self._lock:
            if self._closed:
                raise HandoffClosed
            self._items.append(item)
            waiter, self._waiter = self._waiter, None
        self._wake(waiter)

    def end(self) -> None:
        """After the last item (a reader that left has nothing more to learn)."""
        with self._lock:
            self._ended = True
            waiter, self._waiter = self._waiter, None
        self._wake(waiter)

    def _wake(self, waiter: asyncio.Future[None] | None) -> None:
        if waiter is not None:  # the loop waits for this item: the one wake-up
            self._loop.call_soon_threadsafe(_wake, waiter)

    # -- the reader (the event loop) --

    async def get(self) -> T:
        """The next item; StopAsyncIteration after the last."""
        while True:
            with self._lock:
                if self._items:
                    return self._items.popleft()
                if self._ended:
                    raise StopAsyncIteration
                fut = self._waiter = self._loop.create_future()
            await fut

    def drain(self) -> list[T]:
        """The items that wait now, without waiting for more."""
        with self._lock:
            items = list(self._items)
            self._items.clear()
            return items

    def __aiter__(self) -> Handoff[T]:
        return self

    async def __anext__(self) -> T:
        return await self.get()

    def close(self) -> None:
        """The reader leaves: a later ``put`` raises HandoffClosed."""
        with self._lock:
            self._closed = self._ended = True
            self._items.clear()


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
