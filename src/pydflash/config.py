"""Typed, validated option sets, built once per call from keyword arguments."""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import Mapping, Optional, Sequence


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


ROLLBACK_KINDS = ("auto", "kv-trim", "recurrent-planes", "checkpoint")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """How the pair is loaded and its contexts are sized."""

    n_ctx: int = 4096
    n_batch: int = 512
    n_gpu_layers: int = 0
    n_threads: Optional[int] = None
    draft_max: Optional[int] = None
    seed: int = 0
    rollback: str = "auto"

    def __post_init__(self) -> None:
        _int("n_ctx", self.n_ctx, 8)
        _int("n_batch", self.n_batch, 1)
        _int("n_gpu_layers", self.n_gpu_layers, -1)
        if self.n_threads is not None:
            _int("n_threads", self.n_threads, 1)
        if self.draft_max is not None:
            _int("draft_max", self.draft_max, 0)
        _int("seed", self.seed, -(2**63))
        if not isinstance(self.rollback, str):
            raise TypeError(f"rollback must be a str, not {type(self.rollback).__name__}")
        if self.rollback not in ROLLBACK_KINDS:
            raise ValueError(f"rollback must be one of {', '.join(map(repr, ROLLBACK_KINDS))}, got {self.rollback!r}")


VERIFY_MODES = ("rejection", "match")


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Per-call sampling, verification, draft-length and stopping options of
    generate()/stream(). The same transform (penalties, bias, temperature,
    top-k, top-p, min-p) applies to the target's p and the drafter's q."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    logit_bias: tuple[tuple[int, float], ...] = ()
    seed: Optional[int] = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    verify: str = "rejection"   # at temperature > 0: "rejection" (speculative sampling) or "match"
    draft_max: Optional[int] = None
    draft_min: int = 0
    draft_p_min: float = 0.0

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
        _int("draft_min", self.draft_min, 0)
        if not 0.0 <= _float("draft_p_min", self.draft_p_min) <= 1.0:
            raise ValueError(f"draft_p_min must be in [0, 1], got {self.draft_p_min}")
        if not 0.0 <= _float("min_p", self.min_p) < 1.0:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")
        if _float("repeat_penalty", self.repeat_penalty) <= 0:
            raise ValueError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        _float("frequency_penalty", self.frequency_penalty)
        _float("presence_penalty", self.presence_penalty)
        _int("penalty_last_n", self.penalty_last_n, 0)
        for tok, bias in self.logit_bias:
            _int("logit_bias token", tok, 0)
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) or bias != bias:
                raise TypeError(f"logit_bias values must be numbers, got {bias!r}")
        if self.verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {VERIFY_MODES}, got {self.verify!r}")
        for s in self.stop:
            if not isinstance(s, str):
                raise TypeError(f"stop strings must be str, got {type(s).__name__}")

    @classmethod
    def build(cls, *, stop: str | Sequence[str] | None = (), logit_bias: Optional[Mapping[int, float]] = None,
              verify: Optional[str] = None, **kw: object) -> "SamplingConfig":
        """From the keyword arguments of generate()/stream()."""
        bias = tuple(sorted((operator.index(t), float(b)) for t, b in (logit_bias or {}).items()))
        return cls(stop=cls.normalise_stop(stop), logit_bias=bias,
                   verify="rejection" if verify is None else verify, **kw)  # type: ignore[arg-type]

    def sampling_args(self, seed: int) -> dict[str, object]:
        """Keyword arguments of ContextPair.set_sampling."""
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                    repeat_penalty=self.repeat_penalty, frequency_penalty=self.frequency_penalty,
                    presence_penalty=self.presence_penalty, penalty_last_n=self.penalty_last_n,
                    logit_bias=list(self.logit_bias), seed=seed & 0xFFFFFFFFFFFFFFFF, verify=self.verify)

    @staticmethod
    def normalise_stop(stop: str | Sequence[str] | None) -> tuple[str, ...]:
        if stop is None:
            return ()
        if isinstance(stop, str):
            return (stop,)
        return tuple(stop)
