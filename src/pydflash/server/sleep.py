"""llama-server's ``--sleep-idle-seconds``: after that many seconds with no request
that uses the model, the model is freed (``Llama.sleep``: its options kept) and
the next such request reloads it before it runs. ``GET /health``, ``/props``,
``/models`` and ``/metrics`` neither wake it nor count as use: while it sleeps they
answer from a snapshot taken as it fell asleep (``/props`` with ``is_sleeping``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

if TYPE_CHECKING:
    from ..llama import Llama

__all__ = ["READ_ONLY", "Sleep", "WakeOnUse"]

log = logging.getLogger("pydflash.server")

# llama-server's endpoints that are answered during sleep (create_response(true))
READ_ONLY = frozenset(
    ("GET", p) for p in ("/health", "/v1/health", "/props", "/models", "/v1/models", "/metrics", "/v1/metrics")
)
_POLL_S = 0.05


class Sleep:
    """The model's sleep state. ``snapshot()`` (called as the model falls asleep, still
    loaded) gives what the read-only endpoints answer while it sleeps."""

    def __init__(self, llm: Llama, idle_s: float, snapshot: Callable[[], dict[str, Any]]) -> None:
        if idle_s <= 0:
            raise ValueError(f"sleep_idle_seconds must be > 0, got {idle_s}")
        self.llm = llm
        self.idle_s = idle_s
        self.snapshot = snapshot
        self.cached: dict[str, Any] = {}
        self.sleeping = False
        self._active = 0  # requests being served (each holds the model awake)
        self._last = time.monotonic()  # when the model was last used
        self._lock = threading.Lock()  # held across a sleep or a wake (a reload takes seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="pydflash-sleep", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def try_enter(self, wake: bool) -> bool:
        """Count one request in without blocking: False when the lock is busy, or the
        model sleeps and the request needs it (then ``enter`` in a thread)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if wake and self.sleeping:
                return False
            self._active += 1
            return True
        finally:
            self._lock.release()

    def enter(self, wake: bool) -> None:
        """Count one request in, reloading the model first when it needs it."""
        with self._lock:
            if wake and self.sleeping:
                log.info("the server is leaving its sleep: reloading the model")
                self.llm.wake()
                self.sleeping = False
            self._active += 1

    def leave(self, used: bool) -> None:
        with self._lock:
            self._active -= 1
            if used:
                self._last = time.monotonic()

    def _watch(self) -> None:
        while not self._stop.wait(_POLL_S):
            with self._lock:
                if self.sleeping or self._active or time.monotonic() - self._last < self.idle_s:
                    continue
                self.cached = self.snapshot()
                log.info("the server is entering its sleep: the model is freed")
                self.llm.sleep()
                self.sleeping = True


class WakeOnUse:
    """The middleware: each request holds the model awake while it is served; one that
    is not read-only reloads a sleeping model first and resets the idle clock."""

    def __init__(self, app: ASGIApp, sleep: Sleep) -> None:
        self.app = app
        self.sleep = sleep

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        used = (scope["method"], scope["path"]) not in READ_ONLY
        if not self.sleep.try_enter(used):
            await anyio.to_thread.run_sync(self.sleep.enter, used)
        try:
            await self.app(scope, receive, send)
        finally:
            self.sleep.leave(used)
