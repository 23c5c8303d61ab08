"""A prefill long enough to interrupt on this machine: sized from the measured prefill
rate (tests/test_reliability.py; its subprocesses import this module too), and a watch on
how much of it the context evaluated (the interrupt tests' evidence: counts, not time)."""

from __future__ import annotations

import threading

# seconds the prefill to interrupt lasts at least: its second half (a chunk) outlasts by far
# the few milliseconds an interrupt takes to reach the decode in flight
MIN_PREFILL = 1.0
PROBE = 2048  # prompt tokens of the rate measurement


def long_prompt(n: int) -> list[int]:
    return [(i * 7919) % 380 for i in range(n)]


def tokens_for(seconds: float, rate: float) -> int:
    """Prompt tokens whose prefill lasts ``seconds`` at ``rate`` tokens/s (a
    lower bound: attention makes longer prompts slower per token)."""
    return int(min(max(rate * seconds, 4096), 2**18))


class PrefillWatch:
    """While entered: for generations whose prompt has ``n`` tokens, the prompt tokens the
    context had evaluated after each chunk of the prefill (``processed``, from the engine's
    record of a running request, ``_Running.prefill_progress``) and whether the prefill
    completed (``completed``: ``_Running.prefilled`` ran). ``first_chunk`` is set once the first chunk is evaluated:
    the prefill is under way and the engine is decoding its next chunk."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.processed: list[int] = []
        self.completed = False
        self.first_chunk = threading.Event()

    def __enter__(self) -> PrefillWatch:
        from pydflash.engine.engine import _Running

        self._saved = _Running.prefill_progress, _Running.prefilled
        progress, prefilled = self._saved
        watch = self

        def on_progress(run, n_left: int) -> None:
            progress(run, n_left)
            if len(run.req.prompt) == watch.n:
                watch.processed.append(len(run.req.prompt) - 1 - n_left)
                watch.first_chunk.set()

        def on_prefilled(run) -> None:
            prefilled(run)
            if len(run.req.prompt) == watch.n:
                watch.completed = True

        _Running.prefill_progress, _Running.prefilled = on_progress, on_prefilled  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        from pydflash.engine.engine import _Running

        _Running.prefill_progress, _Running.prefilled = self._saved  # type: ignore[method-assign]

    def then(self, action) -> threading.Thread:
        """Run ``action`` on a thread of its own once the first chunk is evaluated (a
        hang guard, not a time limit: it gives up after 300 s and does nothing)."""
        thread = threading.Thread(target=lambda: self.first_chunk.wait(300) and action())
        thread.start()
        return thread
