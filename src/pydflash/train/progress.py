"""What a run shows while it works: the data being made, then a bar over the
training steps with its ETA, the loss, tokens/s and the last online tau."""

from __future__ import annotations

from typing import Any

__all__ = ["Progress"]


class Progress:
    """tqdm bars on stderr, or nothing when ``enabled`` is False."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._bar: Any = None
        self._tau = float("nan")

    def _tqdm(self, **kw: Any) -> Any:
        from tqdm import tqdm  # type: ignore[import-untyped]

        return tqdm(dynamic_ncols=True, **kw)

    def data(self, n_sequences: int, n_tokens: int) -> None:
        """A chunk of sequences is ready (made or read from the cache)."""
        if not self.enabled:
            return
        if self._bar is None:
            self._bar = self._tqdm(desc="data", unit=" seq")
        self._bar.update(n_sequences - self._bar.n)
        self._bar.set_postfix(tokens=n_tokens, refresh=False)

    def start_training(self, total: int, done: int) -> None:
        self.close()
        if self.enabled:
            self._bar = self._tqdm(desc="train", total=total, initial=done, unit=" step")

    def step(self, step: int, loss: float, tokens_per_s: float) -> None:
        if self._bar is not None:
            self._bar.update(step - self._bar.n)
            self._bar.set_postfix(
                loss=f"{loss:.3f}", tok_s=f"{tokens_per_s:.0f}", tau=f"{self._tau:.2f}", refresh=False
            )

    def tau(self, tau: float) -> None:
        self._tau = tau

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
