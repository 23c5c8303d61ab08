"""The watcher: one daemon thread that processes the outputs of generations nobody reads
yet, as they come (a ``Submission`` not iterated or waited on, the later choices of a
streamed ``n`` > 1 completion). Their stop strings are searched on the reader's side, off
the engine's thread; unread, a generation would run past its stop string until its reader
came. A reader that starts reading takes it over (``Generation._claim``). The thread starts
with the first generation watched and ends after a second with none."""

from __future__ import annotations

import threading
from collections.abc import Callable

from .channel import Channel

__all__ = ["WATCHER", "Watcher"]

IDLE_EXIT_S = 1.0


class Watcher:
    """See the module docstring. ``pump()`` processes what its channel holds without
    waiting and says whether the watcher is through with it (ended, or claimed)."""

    def __init__(self) -> None:
        self._bell = threading.Event()
        self._lock = threading.Lock()
        self._pumps: list[Callable[[], bool]] = []
        self._thread: threading.Thread | None = None

    def watch(self, channel: Channel, pump: Callable[[], bool]) -> None:
        channel.bell = self._bell  # rung whenever the engine puts an output there
        with self._lock:
            self._pumps.append(pump)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pydflash-watcher", daemon=True)
                self._thread.start()
        self._bell.set()

    def _run(self) -> None:
        while True:
            rung = self._bell.wait(IDLE_EXIT_S)
            self._bell.clear()  # before reading: an output put after this rings again
            with self._lock:
                pumps = list(self._pumps)
                if not pumps and not rung:
                    self._thread = None
                    return
            through = [p for p in pumps if p()]
            if through:
                with self._lock:
                    self._pumps = [p for p in self._pumps if p not in through]


WATCHER = Watcher()
