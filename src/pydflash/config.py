"""Typed, validated option sets, built once per call from keyword arguments."""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import Optional, Sequence


def _int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not bool")
    try:
        v = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an int, not {type(value).__name__}") from None
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def _float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """How the pair is loaded and its contexts are sized."""

    n_ctx: int = 4096
    n_batch: int = 512
    n_gpu_layers: int = 0
    n_threads: Optional[int] = None
    draft_max: Optional[int] = None
    seed: int = 0

    def __post_init__(self) -> None:
        _int("n_ctx", self.n_ctx, 8)
        _int("n_batch", self.n_batch, 1)
        _int("n_gpu_layers", self.n_gpu_layers, -1)
        if self.n_threads is not None:
            _int("n_threads", self.n_threads, 1)
        if self.draft_max is not None:
            _int("draft_max", self.draft_max, 0)
        _int("seed", self.seed, -(2**63))


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Per-call sampling and stopping options of generate()/stream()."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: Optional[int] = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    draft_max: Optional[int] = None

    def __post_init__(self) -> None:
        _int("max_tokens", self.max_tokens, 0)
        if _float("temperature", self.temperature) < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        _int("top_k", self.top_k, 0)
        p = _float("top_p", self.top_p)
        if not 0.0 < p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {p}")
        if self.seed is not None:
            _int("seed", self.seed, -(2**63))
        if self.draft_max is not None:
            _int("draft_max", self.draft_max, 0)
        for s in self.stop:
            if not isinstance(s, str):
                raise TypeError(f"stop strings must be str, got {type(s).__name__}")

    @staticmethod
    def normalise_stop(stop: str | Sequence[str] | None) -> tuple[str, ...]:
        if stop is None:
            return ()
        if isinstance(stop, str):
            return (stop,)
        return tuple(stop)
